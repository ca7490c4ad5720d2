"""Webhook deliveries (seed 003, "Webhooks"): the signature header, the
receiver's genuine() check, the retry schedule, and which URLs are admitted.
Pure functions: the delivering actor is in the door."""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from urllib.parse import urlsplit

from .envelope import RedsynError

FIRST_RETRY_SECONDS = 10.0
MAX_RETRY_SECONDS = 3600.0
MAX_ATTEMPTS = 10
GENUINE_WINDOW_SECONDS = 300
MAX_SECRET = 256


def signature_header(secret: str, t: int, body: bytes) -> str:
    mac = hmac.new(secret.encode(), str(t).encode() + b"." + body, hashlib.sha256).hexdigest()
    return f"t={t},v1={mac}"


def genuine(headers, body: bytes, key: str, now: float) -> bool:
    """The seed's genuine(): v1 is the HMAC-SHA256 of "<t>.<body>" and t is recent."""
    parts = {}
    for p in str(headers.get("redsyn-signature", "")).split(","):
        k, _, v = p.partition("=")
        parts[k.strip()] = v.strip()
    if "t" not in parts or "v1" not in parts:
        return False
    try:
        t = int(parts["t"])
    except ValueError:
        return False
    if abs(now - t) > GENUINE_WINDOW_SECONDS:
        return False
    expected = hmac.new(key.encode(), parts["t"].encode() + b"." + body,
                        hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, parts["v1"])


def retry_delay(failures: int, first: float = FIRST_RETRY_SECONDS) -> float | None:
    """Seconds to wait after the n-th failed attempt (n >= 1) before the next,
    or None when the delivery is given up (ten attempts made): 10, 20, 40, ...
    capped at an hour. `first` is 10 s but for tests (--redsyn-webhook-first-retry)."""
    if failures < 1:
        raise ValueError("retry_delay counts failed attempts from 1")
    if failures >= MAX_ATTEMPTS:
        return None
    return min(first * 2 ** (failures - 1), MAX_RETRY_SECONDS)


def check_webhook(value, allow_loopback: bool) -> dict:
    """An announce's webhook {url, secret}: https with a public host name, or
    http://127.0.0.1:PORT/... when the hub admits loopback webhooks (tests)."""
    if not isinstance(value, dict) or not isinstance(value.get("url"), str) \
            or not isinstance(value.get("secret"), str):
        raise RedsynError(400, "webhook must be {\"url\": \"https://...\", \"secret\": \"...\"}")
    secret = value["secret"]
    if not 16 <= len(secret) <= MAX_SECRET:
        raise RedsynError(400, f"webhook secret must be 16 to {MAX_SECRET} characters")
    url = value["url"]
    if len(url) > 2048:
        raise RedsynError(400, "webhook url is too long")
    parts = urlsplit(url)
    host = parts.hostname or ""
    if allow_loopback and parts.scheme in ("http", "https") and host == "127.0.0.1":
        return {"url": url, "secret": secret}
    if parts.scheme != "https":
        raise RedsynError(400, "a webhook url must be https")
    if not public_host_name(host):
        raise RedsynError(400, f"a webhook url needs a public host name, not {host!r}")
    return {"url": url, "secret": secret}


def public_host_name(host: str) -> bool:
    """A DNS name with a dot that is not an address literal or a local name."""
    if not host or "." not in host:
        return False
    try:
        ipaddress.ip_address(host.strip("[]"))
        return False
    except ValueError:
        pass
    lowered = host.lower().rstrip(".")
    return not (lowered == "localhost" or lowered.endswith((".localhost", ".local",
                                                           ".internal", ".home.arpa")))

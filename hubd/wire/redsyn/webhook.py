"""Webhook deliveries (seed 003, "Webhooks"): the signature header, the
receiver's genuine() check, the retry schedule, and the announce's webhook
(which URLs and addresses: webhook_address.py).
Pure functions: the delivering actor is in the door."""

from __future__ import annotations

import hashlib
import hmac

from .envelope import RedsynError
from .webhook_address import url_refusal

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


def retry_delay(failures: int, first: float) -> float | None:
    """Seconds to wait after the n-th failed attempt (n >= 1) before the next,
    or None when the delivery is given up (ten attempts made): `first`, twice
    that, four times ... capped at an hour. `first` is the seed's 10 s
    (timing.redsyn_webhook_first_retry) but for tests."""
    if failures < 1:
        raise ValueError("retry_delay counts failed attempts from 1")
    if failures >= MAX_ATTEMPTS:
        return None
    return min(first * 2 ** (failures - 1), MAX_RETRY_SECONDS)


def check_webhook(value, allow_loopback: bool) -> dict:
    """An announce's webhook {url, secret}: https with a public host name
    (webhook_address.url_refusal), or a loopback URL when the hub admits
    loopback webhooks (tests)."""
    if not isinstance(value, dict) or not isinstance(value.get("url"), str) \
            or not isinstance(value.get("secret"), str):
        raise RedsynError(400, "webhook must be {\"url\": \"https://...\", \"secret\": \"...\"}")
    secret = value["secret"]
    if not 16 <= len(secret) <= MAX_SECRET:
        raise RedsynError(400, f"webhook secret must be 16 to {MAX_SECRET} characters")
    refused = url_refusal(value["url"], allow_loopback)
    if refused is not None:
        raise RedsynError(400, refused)
    return {"url": value["url"], "secret": secret}

"""Which webhook URLs the hub admits, and which addresses it may connect to
to deliver them (seed 003: "https with a public host name"). Pure.

Two checks, because a name is not an address:

* At announce time, `url_refusal` reads the URL as the HTTP client will
  (yarl, which aiohttp uses) and its host as the system resolver will. A
  host that is an address in any spelling the resolver accepts is refused:
  `127.1`, `0177.0.0.1`, `0x7f.0.0.1`, `127.000.000.001`, `2130706433`,
  `192.0.513` (inet_aton's forms), with or without a trailing dot, and IPv6
  literals. So is a host that is not a plain DNS name (`%`-escapes, a
  label that is not letters, digits and '-') and the local names
  (`localhost`, `.localhost`, `.local`, `.internal`, `.localdomain`,
  `.arpa`).
* At send time, `address_refusal` judges the address the socket is about to
  connect to, whatever the name resolved to (DNS can answer 127.0.0.1 for
  a public-looking name, and change its answer after the announce): no
  loopback, private, link-local (cloud metadata at 169.254.169.254),
  shared, multicast, reserved or unspecified address, IPv6 included, nor an
  IPv6 address that embeds one (IPv4-mapped, 6to4, NAT64).

`--redsyn-allow-loopback-webhooks` (tests) admits loopback hosts and
addresses, and plain http to them; nothing else.
"""

from __future__ import annotations

import ipaddress
import re

from yarl import URL

MAX_URL = 2048
LOCAL_NAMES = ("localhost",)
LOCAL_SUFFIXES = (".localhost", ".local", ".internal", ".localdomain", ".arpa")
_LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")
# a label the resolver may read as a number: decimal, octal (leading 0) or hex
_NUMERIC = re.compile(r"(?:0x[0-9a-f]*|[0-9]+)")
_HEX_PART = re.compile(r"0[xX][0-9a-fA-F]+")
_OCTAL_PART = re.compile(r"0[0-7]*")
_DECIMAL_PART = re.compile(r"[1-9][0-9]*")
NAT64 = ipaddress.IPv6Network("64:ff9b::/96")

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


def inet_aton(host: str) -> ipaddress.IPv4Address | None:
    """The IPv4 address the C library's inet_aton (and so getaddrinfo) reads
    in `host`, or None: one to four parts, each decimal, octal (a leading 0)
    or hex (0x); the last part fills the bytes the others left."""
    parts = host.split(".")
    if not 1 <= len(parts) <= 4:
        return None
    numbers = []
    for part in parts:
        if _HEX_PART.fullmatch(part):
            numbers.append(int(part[2:], 16))
        elif _OCTAL_PART.fullmatch(part):
            numbers.append(int(part, 8))
        elif _DECIMAL_PART.fullmatch(part):
            numbers.append(int(part))
        else:
            return None
    *leading, last = numbers
    if any(n > 255 for n in leading) or last >= 256 ** (4 - len(leading)):
        return None
    value = last
    for i, n in enumerate(leading):
        value += n << (8 * (3 - i))
    return ipaddress.IPv4Address(value)


def host_address(host: str) -> Address | None:
    """The address a URL's host is written as, however it is spelled, or
    None when it is a name. A host whose last label is numeric but is no
    address the resolver reads raises ValueError (it is neither)."""
    if ":" in host:
        return ipaddress.IPv6Address(host.strip("[]").split("%")[0])
    bare = host[:-1] if host.endswith(".") else host
    if _NUMERIC.fullmatch(bare.rsplit(".", 1)[-1].lower()):
        found = inet_aton(bare)
        if found is None:
            raise ValueError(f"{host!r} is neither a host name nor an address")
        return found
    return None


def embedded_ipv4(address: Address) -> ipaddress.IPv4Address | None:
    if isinstance(address, ipaddress.IPv4Address):
        return None
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address in NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def address_refusal(address: Address | str, allow_loopback: bool = False) -> str | None:
    """Why the hub may not connect to this address to deliver a webhook, or
    None when it is a public one (or loopback, when admitted)."""
    if isinstance(address, str):
        address = ipaddress.ip_address(address.split("%")[0])
    inner = embedded_ipv4(address)
    if inner is not None:
        refused = address_refusal(inner, allow_loopback)
        return None if refused is None else f"{address} embeds {inner}: {refused}"
    if address.is_loopback:
        return None if allow_loopback else f"{address} is a loopback address"
    for what, flag in (("unspecified", address.is_unspecified),
                       ("link-local", address.is_link_local),
                       ("multicast", address.is_multicast),
                       ("reserved", address.is_reserved),
                       ("private", address.is_private),
                       ("not globally reachable", not address.is_global)):
        if flag:
            return f"{address} is a {what} address" if what != "not globally reachable" \
                else f"{address} is {what}"
    return None


def url_refusal(url: object, allow_loopback: bool = False) -> str | None:
    """Why an announce's webhook url is refused, or None."""
    if not isinstance(url, str) or not url:
        return "webhook url must be a string"
    if len(url) > MAX_URL:
        return "webhook url is too long"
    try:
        parsed = URL(url)
    except ValueError as exc:
        return f"webhook url is not a URL: {exc}"
    if not parsed.absolute or parsed.raw_host is None:
        return "webhook url must be an absolute https URL"
    if parsed.user is not None or parsed.password is not None:
        return "webhook url carries no user or password"
    host = parsed.raw_host.lower()
    try:
        address = host_address(host)
    except ValueError as exc:
        return f"webhook url: {exc}"
    loopback = (address is not None and address.is_loopback) or \
        (address is None and host.rstrip(".") in LOCAL_NAMES)
    if allow_loopback and loopback:
        return None if parsed.scheme in ("http", "https") else \
            "a loopback webhook url is http or https"
    if parsed.scheme != "https":
        return "a webhook url must be https"
    if address is not None:
        return f"a webhook url needs a public host name, not the address {host!r}"
    return name_refusal(host)


def name_refusal(host: str) -> str | None:
    """A public DNS name: LDH labels, at least two, not a local name."""
    name = host[:-1] if host.endswith(".") else host
    labels = name.split(".")
    if len(name) > 253 or len(labels) < 2 or not all(_LABEL.fullmatch(l) for l in labels):
        return f"a webhook url needs a public host name (a DNS name with a dot), not {host!r}"
    if name in LOCAL_NAMES or name.endswith(LOCAL_SUFFIXES):
        return f"a webhook url needs a public host name, not the local name {host!r}"
    return None

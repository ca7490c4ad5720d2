"""Which HTTP Host authorities this hub trusts (the DNS-rebinding guard).

A browser tricked by DNS rebinding sends the attacker's name in `Host`, so a
hub that only answers requests naming an authority it knows cannot be driven
from a web page. The decision is a pure function of the bind address, the
`--advertised-host` authorities and the request's Host headers:

* loopback bind: the loopback names (any port) and every advertised authority;
* any other bind with `--advertised-host`: only the advertised authorities;
* any other bind without it: no Host check (the operator chose to expose the
  port; `--advertised-host` is how to make the check fail-closed there too).

An advertised authority matches exactly as written, the host part without
regard to case: `west.example:8443` matches `Host: west.example:8443` only,
`west.example` matches `Host: west.example` only (the reference hub's rule).
Anything but exactly one Host header is refused.
"""

from __future__ import annotations

import ipaddress
import re

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "[::1]"})

_HOSTNAME = re.compile(r"^(?=.{1,253}$)[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
                       r"(?:\.[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?)*$")


class AuthorityError(ValueError):
    """An --advertised-host value that is not HOST[:PORT]."""


def is_loopback_bind(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def split_authority(authority: str) -> tuple[str, int | None] | None:
    """(lower-cased host, port or None) of a Host header value, or None if it
    is not a well-formed authority. IPv6 hosts keep their brackets."""
    if not authority or authority != authority.strip():
        return None
    if authority.startswith("["):
        end = authority.find("]")
        if end < 0:
            return None
        host, rest = authority[:end + 1], authority[end + 1:]
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            return None
    else:
        host, sep, port_text = authority.partition(":")
        rest = sep + port_text
        if not _HOSTNAME.match(host.lower()):
            return None
    if not rest:
        return host.lower(), None
    if not rest.startswith(":") or not rest[1:].isdigit() or len(rest) > 6:
        return None
    port = int(rest[1:])
    if not 0 < port < 65536:
        return None
    return host.lower(), port


def parse_advertised(value: str) -> tuple[str, int | None]:
    """An --advertised-host value: HOST[:PORT] with a concrete host name or
    address (no scheme, path or wildcard)."""
    parsed = split_authority(value)
    if parsed is None:
        raise AuthorityError(f"--advertised-host {value!r}: expected HOST[:PORT] (a host name, "
                             "IPv4 address or [IPv6] address, and an optional port 1-65535)")
    host, _ = parsed
    if host in ("0.0.0.0", "[::]"):
        raise AuthorityError(f"--advertised-host {value!r}: a wildcard address names no host")
    return parsed


def host_trusted(bind_host: str, advertised: frozenset, host_headers: list[str]) -> bool:
    """advertised: (host, port-or-None) pairs from parse_advertised."""
    loopback = is_loopback_bind(bind_host)
    if not loopback and not advertised:
        return True
    if len(host_headers) != 1:
        return False
    parsed = split_authority(host_headers[0])
    if parsed is None:
        return False
    if parsed in advertised:
        return True
    return loopback and parsed[0] in LOOPBACK_NAMES

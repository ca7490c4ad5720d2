"""DNS-rebinding and browser guard for every HTTP request a hub serves."""

from __future__ import annotations

import ipaddress

from aiohttp import web

LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1", "[::1]"})


def is_loopback_bind(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _host_name(authority: str) -> str:
    if authority.startswith("["):
        return authority.split("]")[0] + "]"
    return authority.rsplit(":", 1)[0] if authority.count(":") == 1 else authority


def guard(hub, request: web.Request) -> web.Response | None:
    """For a loopback hub the Host header must name loopback, and a browser
    Origin is refused unless allow-listed."""
    config = hub.config
    origin = request.headers.get("Origin")
    if origin is not None and origin not in config.allow_origins:
        return web.Response(status=403, text="Origin not allowed\n")
    if is_loopback_bind(config.host):
        hosts = request.headers.getall("Host", [])
        if len(hosts) != 1 or _host_name(hosts[0]) not in LOOPBACK_HOSTS:
            return web.Response(status=403, text="Host must name the loopback interface\n")
    return None

"""DNS-rebinding and browser guard for every HTTP request a hub serves."""

from __future__ import annotations

from aiohttp import web

from hubd.http.host_trust import host_trusted, is_loopback_bind

__all__ = ["guard", "is_loopback_bind"]


def guard(hub, request: web.Request) -> web.Response | None:
    """The Host header must name an authority this hub trusts
    (hubd/http/host_trust.py: loopback names on a loopback bind, and the
    --advertised-host authorities), and a browser Origin is refused unless
    allow-listed."""
    config = hub.config
    origin = request.headers.get("Origin")
    if origin is not None and origin not in config.allow_origins:
        return web.Response(status=403, text="Origin not allowed\n")
    if not host_trusted(config.host, config.advertised_hosts, request.headers.getall("Host", [])):
        if is_loopback_bind(config.host) and not config.advertised_hosts:
            return web.Response(status=403, text="Host must name the loopback interface\n")
        return web.Response(status=403, text="Host is not an authority this hub trusts "
                                             "(see --advertised-host)\n")
    return None

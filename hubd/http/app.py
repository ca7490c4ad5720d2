"""aiohttp application: the WebSocket door (any path), /health, /readyz, /metrics."""

from __future__ import annotations

import hmac
import ipaddress
import time

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from hubd.actors.connection import Connection
from hubd.wire.envelope import PROTOCOL_VERSION

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
    """DNS-rebinding and browser guard for a loopback hub: the Host header must
    name loopback, and a browser Origin is refused unless allow-listed."""
    config = hub.config
    origin = request.headers.get("Origin")
    if origin is not None and origin not in config.allow_origins:
        return web.Response(status=403, text="Origin not allowed\n")
    if is_loopback_bind(config.host):
        hosts = request.headers.getall("Host", [])
        if len(hosts) != 1 or _host_name(hosts[0]) not in LOOPBACK_HOSTS:
            return web.Response(status=403, text="Host must name the loopback interface\n")
    return None


def make_app(hub) -> web.Application:
    config = hub.config

    def authorised(request: web.Request) -> bool:
        if config.metrics_token is None:
            return True
        header = request.headers.get("Authorization", "")
        expected = f"Bearer {config.metrics_token}"
        return hmac.compare_digest(header.encode(), expected.encode())

    def probe(handler, needs_token: bool):
        """The Host/Origin guard, then the bearer token where it applies."""
        async def guarded(request: web.Request) -> web.Response:
            refused = guard(hub, request)
            if refused is not None:
                return refused
            if needs_token and not authorised(request):
                return web.Response(status=401, text="Unauthorized\n")
            return handler()
        return guarded

    def health() -> web.Response:
        return web.json_response(health_document(hub))

    def readyz() -> web.Response:
        if hub.ready:
            return web.json_response({"ready": True, "journal_replayed": True})
        return web.json_response({"ready": False, "journal_replayed": False}, status=503)

    def metrics() -> web.Response:
        body = generate_latest(hub.metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def websocket(request: web.Request) -> web.StreamResponse:
        refused = guard(hub, request)
        if refused is not None:
            return refused
        ws = web.WebSocketResponse(max_msg_size=config.max_msg_bytes, compress=False,
                                   autoping=True)
        if not ws.can_prepare(request).ok:
            return web.Response(status=426, text="This port speaks WebSocket (and serves "
                                                 "/health, /readyz, /metrics).\n")
        if not hub.ready:
            return web.Response(status=503, text="Hub is starting (journal replay).\n")
        stream = await ws.prepare(request)
        peer = request.remote or "unknown"
        conn = Connection(ws, stream, peer, hub)
        ssl_object = request.transport.get_extra_info("ssl_object") if request.transport else None
        if ssl_object is not None:
            conn.peer_cert = ssl_object.getpeercert(binary_form=True)
        await conn.run()
        return ws

    app = web.Application()
    app.router.add_get("/health", probe(health, needs_token=True))
    app.router.add_get("/readyz", probe(readyz, needs_token=False))
    app.router.add_get("/metrics", probe(metrics, needs_token=True))
    app.router.add_get("/{tail:.*}", websocket)
    return app


def health_document(hub) -> dict:
    router = hub.router
    presence = router.presence if router is not None else None
    document = {
        "status": "degraded" if hub.corrupt_rows else "ok",
        "hub_id": hub.hub_id,
        "version": f"hubd {__import__('hubd').__version__}",
        "protocol_version": PROTOCOL_VERSION,
        "uptime_seconds": round(time.time() - hub.started, 3),
        "ready": hub.ready,
        "connections": len(presence.sockets) if presence else 0,
        "online_agents": len(presence.by_name) if presence else 0,
        "journal_seq": hub.writer.committed_seq,
        "journal_corrupt_rows": len(hub.corrupt_rows),
        "message_forward": hub.forwarding.health() if hub.forwarding is not None else {},
    }
    if hub.authority is not None:
        document["multihub"] = hub.authority.health()
    for name, section in HEALTH_SECTIONS.items():
        document[name] = section(hub)
    return document


# Other modules add /health sections: name -> builder(hub).
HEALTH_SECTIONS: dict = {}

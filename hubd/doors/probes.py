"""The operator's HTTP probes: /health (JSON status), /readyz (journal
replayed?) and /metrics (Prometheus). Each request passes the Host/Origin
guard; /health and /metrics also need the bearer token when one is set."""

from __future__ import annotations

import hmac
import time

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from hubd.wire.envelope import PROTOCOL_VERSION

from hubd.http.guard import guard


def add_probes(app: web.Application, hub) -> None:
    config = hub.config

    def authorised(request: web.Request) -> bool:
        if config.metrics_token is None:
            return True
        header = request.headers.get("Authorization", "")
        expected = f"Bearer {config.metrics_token}"
        return hmac.compare_digest(header.encode(), expected.encode())

    def probe(handler, needs_token: bool):
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

    app.router.add_get("/health", probe(health, needs_token=True))
    app.router.add_get("/readyz", probe(readyz, needs_token=False))
    app.router.add_get("/metrics", probe(metrics, needs_token=True))


def health_document(hub) -> dict:
    router = hub.router
    presence = router.presence if router is not None else None
    document = {
        "status": "degraded" if hub.corrupt_rows or hub.unknown_kinds.events else "ok",
        "hub_id": hub.hub_id,
        "version": f"hubd {__import__('hubd').__version__}",
        "protocol_version": PROTOCOL_VERSION,
        "uptime_seconds": round(time.time() - hub.started, 3),
        "ready": hub.ready,
        "connections": len(presence.endpoints) if presence else 0,
        "online_agents": len(presence.by_name) if presence else 0,
        "journal_seq": hub.writer.committed_seq,
        "journal_corrupt_rows": len(hub.corrupt_rows),
        # events of kinds this hubd does not know (a newer hubd wrote them)
        "journal_unknown_events": hub.unknown_kinds.events,
        "journal_unknown_kinds": hub.unknown_kinds.names(),
        "identity": hub.identity.summary(),
    }
    # the plugins' sections (federation's message_forward and multihub, the
    # core's active_claims); a section with nothing to say is left out
    for name, section in hub.installed.health_sections.items():
        value = section(hub)
        if value is not None:
            document[name] = value
    return document

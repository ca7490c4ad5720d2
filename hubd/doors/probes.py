"""The operator's HTTP probes: /health (JSON status), /readyz (journal
replayed?), /metrics (Prometheus), and the status page (`/` from a browser,
hubd/doors/status_page.py; its view as JSON on /status). Each request passes
the Host/Origin guard; all but /readyz also need the bearer token when one is
set.

/health, /status and /metrics are the Router's answers to a Request
(`hub.health`, `hub.status`, `hub.metrics`: hubd/handlers/status.py), so
this door reads no Router state.
While the Router does not serve (the journal replay, the shutdown) they are
made here from what is not the Router's: the hub's own facts, and the metrics
registry (nothing else reads or writes it then).
"""

from __future__ import annotations

import asyncio
import hmac

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from hubd.core.commands import Request
from hubd.doors import status_page
from hubd.http.guard import guard

# the Router answers between two commands; one stuck longer than this is
# reported as such rather than holding the probe
ANSWER_SECONDS = 5.0


def add_probes(app: web.Application, hub):
    """Add the probes' routes; returns the status page's handler (app.py
    serves it on `/` to browsers)."""
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
            return await handler()
        return guarded

    async def health() -> web.Response:
        document = await ask_router(hub, "hub.health")
        if document is _UNANSWERED:
            return web.json_response({**hub.health_base(), "status": "router_unresponsive"},
                                     status=503)
        if document is None:  # the Router does not serve (yet, or any more)
            document = {**hub.health_base(), "connections": 0, "online_agents": 0}
        return web.json_response(document)

    async def status_view() -> dict | None:
        view = await ask_router(hub, "hub.status")
        if view is _UNANSWERED:
            return None
        if view is None:  # the Router does not serve (yet, or any more)
            view = {**hub.health_base(), "connections": 0, "online_agents": 0}
        return view

    async def status() -> web.Response:
        view = await status_view()
        if view is None:
            return web.json_response({**hub.health_base(), "status": "router_unresponsive"},
                                     status=503)
        return web.json_response(view)

    async def page() -> web.Response:
        view, code = await status_view(), 200
        if view is None:
            view = {**hub.health_base(), "status": "router_unresponsive",
                    "reasons": ["the hub's router did not answer"]}
            code = 503
        return web.Response(text=status_page.render(view), content_type="text/html",
                            headers=status_page.HEADERS, status=code)

    async def readyz() -> web.Response:
        if hub.ready:
            return web.json_response({"ready": True, "journal_replayed": True})
        return web.json_response({"ready": False, "journal_replayed": False}, status=503)

    async def metrics() -> web.Response:
        body = await ask_router(hub, "hub.metrics")
        if body is _UNANSWERED:
            return web.Response(status=503, text="The hub's router did not answer.\n")
        if body is None:
            body = generate_latest(hub.metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    app.router.add_get("/health", probe(health, needs_token=True))
    app.router.add_get("/readyz", probe(readyz, needs_token=False))
    app.router.add_get("/metrics", probe(metrics, needs_token=True))
    app.router.add_get("/status", probe(status, needs_token=True))
    return probe(page, needs_token=True)


_UNANSWERED = object()


async def ask_router(hub, verb: str):
    """The Router's answer to a status request; None while it does not serve."""
    router = hub.router
    if router is None or not hub.ready:
        return None
    reply = asyncio.get_running_loop().create_future()
    router.post_control(Request(None, verb, {}, reply))  # never blocks, answered next round
    try:
        return await asyncio.wait_for(reply, ANSWER_SECONDS)
    except TimeoutError:
        return _UNANSWERED

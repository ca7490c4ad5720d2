"""The aiohttp application: the probes on their paths, the plugins' routes
(the REDSYN door under /redsyn/v1 unless --no-redsyn), the WebSocket door on
every other path."""

from __future__ import annotations

from aiohttp import web

from hubd.doors import websocket
from hubd.doors.probes import add_probes


def make_app(hub) -> web.Application:
    app = web.Application()
    add_probes(app, hub)
    for add_routes in hub.installed.hooks("http_routes"):
        add_routes(app)  # before the WebSocket door's catch-all
    app.router.add_get("/{tail:.*}", websocket.make_handler(hub))
    return app

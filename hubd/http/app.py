"""The aiohttp application: the probes on their paths, the plugins' routes
(the REDSYN door under /redsyn/v1 unless --no-redsyn), the WebSocket door on
every other path. `/` is the WebSocket door's too, except for a browser
asking for HTML (no upgrade, Accept: text/html): that gets the status page."""

from __future__ import annotations

from aiohttp import web

from hubd.doors import status_page, websocket
from hubd.doors.probes import add_probes


def make_app(hub) -> web.Application:
    app = web.Application()
    page = add_probes(app, hub)
    for add_routes in hub.installed.hooks("http_routes"):
        add_routes(app)  # before the WebSocket door's catch-all
    door = websocket.make_handler(hub)

    async def front(request: web.Request) -> web.StreamResponse:
        return await (page if status_page.wants_page(request.headers) else door)(request)

    app.router.add_get("/", front)
    app.router.add_get("/{tail:.*}", door)
    return app

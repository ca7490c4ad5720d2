"""PeerLink's dead-link detection over real sockets: a peer that accepts the
link and then goes silent (reads nothing, answers no ping, the way a
black-holed connection looks) is closed for silence and redialled; a peer
that answers pings keeps its link, and its pongs count as inbound activity."""

import asyncio
import json
import time

from aiohttp import WSMsgType, web

from federation.config import PeerRoute
from federation.actors.link import SILENT, PeerLink
from hubd.timing import Timing

# Silence found in well under a second instead of production's two.
QUICK = Timing(link_ping=0.1, link_silence=0.4)


class FakePeer:
    """A hub-shaped WebSocket server: welcomes a link; the first `silent`
    connections then read nothing at all (so no pong is ever sent)."""

    def __init__(self, silent: int):
        self.silent = silent
        self.connections = 0
        self.runner = None
        self.port = None
        self.held: list = []

    async def handler(self, request):
        ws = web.WebSocketResponse(autoping=True)
        await ws.prepare(request)
        self.connections += 1
        msg = await ws.receive()
        assert json.loads(msg.data)["sender"] == "east"
        await ws.send_str(json.dumps({"type": "welcome", "protocol_version": 7,
                                      "timestamp": time.time()}))
        if self.connections <= self.silent:
            request.transport.pause_reading()  # a black hole: nothing read, nothing answered
            self.held.append(ws)
            await asyncio.Event().wait()
        async for msg in ws:
            if msg.type == WSMsgType.CLOSE:
                break
        return ws

    async def start(self):
        app = web.Application()
        app.router.add_get("/", self.handler)
        self.runner = web.AppRunner(app, shutdown_timeout=0.5)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.port = self.runner.addresses[0][1]

    async def stop(self):
        await self.runner.cleanup()


async def wait_until(check, what, timeout=30.0):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():
        assert loop.time() < deadline, what
        await asyncio.sleep(0.02)


async def test_a_silent_peer_is_closed_for_silence_and_redialled():
    peer = FakePeer(silent=1)
    await peer.start()
    ups, downs = [], []
    link = PeerLink(PeerRoute("west", f"ws://127.0.0.1:{peer.port}/", None, None), "east", None,
                    QUICK, on_up=ups.append, on_down=lambda p, cause: downs.append(cause))
    task = asyncio.get_running_loop().create_task(link.run())
    try:
        await wait_until(lambda: link.up, "link never came up")
        assert link.state == "up" and link.last_inbound is not None
        await wait_until(lambda: downs, "the silent link was never closed")
        assert downs == [SILENT] and link.silence_closes == 1
        assert link.last_error["cause"] == SILENT
        assert "pings unanswered" in link.last_error["detail"]
        await wait_until(lambda: link.up and link.connects == 2, "no redial after the silence")
        # The second connection answers pings: it stays up, and pongs are life.
        heard = link.last_inbound
        await wait_until(lambda: link.last_inbound > heard, "no pong counted as inbound")
        assert link.silence_closes == 1 and downs == [SILENT] and ups == ["west", "west"]
        health = link.health()
        assert health["state"] == "up" and health["silence_closes"] == 1
        assert health["last_inbound"] >= heard and health["up_since"] is not None
    finally:
        link.stop()
        task.cancel()
        await peer.stop()


async def test_wake_skips_the_reconnect_backoff():
    """A refused peer: the link waits out a backoff between dials; wake()
    (a sign of life from elsewhere) makes it dial again at once."""
    import socket

    with socket.socket() as reserved:
        reserved.bind(("127.0.0.1", 0))
        port = reserved.getsockname()[1]  # nothing listens: every dial is refused
        # a backoff far longer than the test may take: only wake() can end it
        link = PeerLink(PeerRoute("west", f"ws://127.0.0.1:{port}/", None, None), "east", None,
                        Timing(link_backoff_first=3600.0, link_backoff_max=3600.0))
        task = asyncio.get_running_loop().create_task(link.run())
        try:
            await wait_until(lambda: link.last_error is not None, "no dial")
            first = link.last_error["at"]
            link.wake()  # the backoff (30-60 min) cannot end by itself within the test
            await wait_until(lambda: link.last_error["at"] > first, "wake() did not redial")
            assert link.last_error["cause"] == "refused" and link.last_inbound is not None
        finally:
            link.stop()
            task.cancel()

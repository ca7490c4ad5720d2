"""The PeerLink's real socket: an aiohttp WebSocket over (m)TLS.

The link (federation/actors/link.py) speaks to a Connection and dials through
a Dialer; this module is the one that knows aiohttp. Its errors become the
link's typed causes (LinkError), so the link's loop handles one exception
type. The actor tests dial an in-memory pair instead (tests/support/memlink.py).
"""

from __future__ import annotations

import asyncio
import ssl
from typing import Protocol

import aiohttp

from federation.config import PeerRoute
from federation.pins import peer_certificate_der
from hubd.timing import Timing

MAX_FRAME = 16 * 1024 * 1024

# the kinds of message Connection.receive returns (its `.type`); any other
# kind (close, closing, closed, error) means the connection ended
TEXT, BINARY = aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY
PING, PONG = aiohttp.WSMsgType.PING, aiohttp.WSMsgType.PONG

# causes reported in /health and logs
TLS = "tls"
PIN_MISMATCH = "pin_mismatch"
REFUSED = "refused"
TIMEOUT = "timeout"
SILENT = "silent"  # up, but nothing heard from the peer within the deadline
STALLED = "stalled"  # up, but a write to the peer did not complete within the deadline
CLOSED = "closed"
BUSY = "busy"  # the link's inbox is at its bound
AUTH = "auth_denied"
PROTOCOL = "protocol"


class LinkError(Exception):
    def __init__(self, cause: str, detail: str):
        super().__init__(f"{cause}: {detail}")
        self.cause = cause
        self.detail = detail


class Connection(Protocol):
    """One open WebSocket to a peer, as the link uses it."""

    close_code: int | None

    async def send_text(self, data: bytes) -> None:
        """Write one text frame; ConnectionError if the connection is gone."""

    async def ping(self) -> None: ...

    async def pong(self, data: bytes) -> None: ...

    async def receive(self):
        """The next message: `.type` (TEXT, BINARY, PING, PONG, or another
        kind once the connection ended) and `.data`, as aiohttp's WSMessage."""

    async def close(self, code: int, message: bytes) -> None:
        """A graceful close, bounded by timing.link_close_wait."""

    def abort(self) -> None:
        """Drop the connection now (a write that cannot drain)."""

    def certificate_der(self) -> bytes | None: ...


class SocketConnection:
    def __init__(self, ws: aiohttp.ClientWebSocketResponse):
        self.ws = ws
        # aiohttp's own: the link's reader calls it once per message, with no
        # frame of this module in between
        self.receive = ws.receive

    @property
    def close_code(self) -> int | None:
        return self.ws.close_code

    async def send_text(self, data: bytes) -> None:
        try:
            await self.ws.send_frame(data, aiohttp.WSMsgType.TEXT)
        except (ConnectionError, aiohttp.ClientError, RuntimeError) as exc:
            raise ConnectionError(str(exc)) from exc

    async def ping(self) -> None:
        try:
            await self.ws.ping()
        except (ConnectionError, aiohttp.ClientError, RuntimeError) as exc:
            raise ConnectionError(str(exc)) from exc

    async def pong(self, data: bytes) -> None:
        try:
            await self.ws.pong(data)
        except (ConnectionError, aiohttp.ClientError, RuntimeError) as exc:
            raise ConnectionError(str(exc)) from exc

    async def close(self, code: int = 1000, message: bytes = b"") -> None:
        try:
            await self.ws.close(code=code, message=message)
        except (ConnectionError, aiohttp.ClientError, RuntimeError):
            pass  # gone already: nothing left to close

    def abort(self) -> None:
        connection = self.ws._response.connection
        transport = connection.transport if connection is not None else None
        if transport is not None:
            transport.abort()
        else:
            self.ws._response.close()

    def certificate_der(self) -> bytes | None:
        return peer_certificate_der(self.ws)


class SocketDialer:
    """Dials a route with aiohttp: the TCP connect bounded by
    timing.link_dial, TLS with the route's context (pins are checked by
    the link on the open connection), the WebSocket upgrade. autoping is off:
    pongs are the link's evidence of life."""

    def __init__(self, timing: Timing):
        self.timing = timing
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> "SocketDialer":
        timeout = aiohttp.ClientTimeout(sock_connect=self.timing.link_dial)
        self._session = aiohttp.ClientSession(timeout=timeout)
        return self

    async def __aexit__(self, *exc) -> None:
        await self._session.close()

    async def dial(self, route: PeerRoute, ssl_context) -> SocketConnection:
        context = ssl_context.for_route(route) if route.secure else False
        try:
            ws = await self._session.ws_connect(
                route.uri, ssl=context, max_msg_size=MAX_FRAME, compress=0, autoping=False,
                timeout=aiohttp.ClientWSTimeout(ws_close=self.timing.link_close_wait))
        except (aiohttp.ClientError, OSError) as exc:
            raise LinkError(*classify(exc)) from exc
        return SocketConnection(ws)


def classify(exc: BaseException) -> tuple[str, str]:
    text = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError)):
        return TIMEOUT, "connect or welcome timed out"
    if isinstance(exc, (aiohttp.ClientSSLError, ssl.SSLError)):
        return TLS, text
    if isinstance(exc, aiohttp.WSServerHandshakeError):
        return REFUSED, text
    if isinstance(exc, (aiohttp.ClientConnectorError, ConnectionRefusedError)):
        return REFUSED, text
    return CLOSED, text

"""How the hub ends a WebSocket: always with a close frame, code and reason.

Two things used to end connections without a close frame the client could
read (it saw 1006):

* aiohttp closes the TCP socket as soon as it has written its close frame
  after a protocol error (an over-cap frame, bad UTF-8, a bad opcode). A
  client still sending, e.g. frames pipelined behind the bad one, then gets a
  TCP reset, and Linux discards what the client had not read yet: the close
  frame. So the hub *lingers*: after its close frame it shuts its write side
  (FIN after the close frame, plain TCP) and goes on reading and discarding
  for up to the linger (timing.close_linger), until the client's close frame or its FIN.
* A stalled consumer was aborted outright. Now it gets one graceful attempt:
  the close frame (1013 "outbound delivery timeout") behind what is already
  buffered and the write side shut; only if that has not drained within
  timing.graceful_close is the transport aborted (the seed's rule).

Once both close frames have crossed (the closing handshake is complete), the
hub closes the TCP connection at once, as RFC 6455 (7.1.1) asks of a server:
the client sends nothing more, and a client that waits for the server to
close first (the `websockets` library, the reference hub's peer links) would
otherwise wait out the linger. Over TLS there is no half-close to tell it
anything, so that cost a full linger per connection (issue 22: a
reference hub opening one peer link per forward crawled at one forward a
second).

aiohttp's own closes (protocol errors) carry only a code; HubWebSocket adds
the documented reason (CLOSE_REASONS). The table of every code the hub sends
is in docs/operations.md ("Close codes").
"""

from __future__ import annotations

import asyncio
import struct

from aiohttp import EofStream, WebSocketError, WSMsgType, web

# Reasons for the codes aiohttp chooses itself (the hub's own closes name theirs).
CLOSE_REASONS = {
    1000: "normal closure",
    1001: "going away",
    1002: "protocol error",
    1003: "unsupported data",
    1006: "abnormal closure",
    1007: "invalid UTF-8",
    1008: "policy violation",
    1009: "message too big",
    1011: "internal error",
    1013: "try again later",
}


def close_frame(code: int, reason: str) -> bytes:
    """A server-to-client (unmasked) close frame."""
    payload = struct.pack("!H", code) + reason.encode()[:123]
    return bytes((0x88, len(payload))) + payload


def lingering_shutdown(transport: asyncio.BaseTransport | None) -> None:
    """Stop writing after what is buffered (FIN where TCP allows it) and keep
    reading, so data still arriving from the client is discarded instead of
    answered with a reset. The transport is closed by whoever waits on it
    (HubWebSocket.finish) or by aiohttp once the handler returns."""
    if transport is None or transport.is_closing():
        return
    if isinstance(transport, asyncio.WriteTransport) and transport.can_write_eof():
        try:
            transport.write_eof()
        except (OSError, RuntimeError):
            transport.close()
            return
    if isinstance(transport, asyncio.ReadTransport) and not transport.is_reading():
        transport.resume_reading()


class HubWebSocket(web.WebSocketResponse):
    """aiohttp's WebSocketResponse with the hub's close rules: every close
    frame carries a reason, and the TCP socket is shut down gracefully
    (lingering_shutdown, then finish) instead of closed under a client still
    sending. `linger` and `close_reply` are timing.close_linger and
    timing.close_reply (hubd/timing.py)."""

    def __init__(self, *, linger: float, close_reply: float, **kwargs) -> None:
        # aiohttp's `timeout`: how long its close waits for the client's close frame
        super().__init__(timeout=close_reply, **kwargs)
        self.linger = linger
        self.close_started: float | None = None  # loop time the hub's close began
        self.close_finished = False
        self._in_close = False  # close() was called and has not returned yet
        self._close_done = asyncio.Event()
        # the client's close frame has been read (by the door's receive loop,
        # or the linger below): with the hub's own (aiohttp answers one at
        # once), the closing handshake is complete
        self.peer_closed = False

    async def finish(self) -> None:
        """End the TCP connection once the handler is done with the socket:
        at once if the closing handshake is complete, else after reading and
        discarding what the client still sends until its close frame, its
        FIN, or the linger."""
        request = self._req
        transport = request.transport if request is not None else None
        if transport is None:
            return
        if not self.peer_closed and not transport.is_closing():
            await self._await_peer_close(transport, self.linger)
        if not transport.is_closing():
            transport.close()

    async def _await_peer_close(self, transport: asyncio.BaseTransport, seconds: float) -> None:
        """The linger: the client's frames are read from aiohttp's frame queue
        (as its receive() reads them; receive() itself answers nothing once
        the hub has closed) and discarded, until its close frame."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        reader = self._reader
        try:
            async with asyncio.timeout(seconds):
                if self._in_close:
                    # One reader at a time: a close under way reads the
                    # client's reply itself when no receive() was waiting
                    # (the door's reader held back by a full Router inbox).
                    # Having read it, it leaves nothing for this loop, which
                    # then runs out the linger: rare, and no worse than that.
                    await self._close_done.wait()
                while reader is not None and not self.peer_closed:
                    if (await reader.read()).type is WSMsgType.CLOSE:
                        self.peer_closed = True
            return
        except TimeoutError:
            return  # the client never answered: closed under it (the linger's bound)
        except (EofStream, ConnectionError):
            return  # the client closed its side (or the connection is gone)
        except (WebSocketError, RuntimeError):
            # The frames can no longer be read: the parser failed (the
            # protocol error the hub closed for), or aiohttp released it
            # with frames still parked (its RuntimeError "stalled reader").
            # Only the client's FIN can still end the linger early.
            pass
        while not transport.is_closing() and loop.time() < deadline:
            await asyncio.sleep(0.02)

    async def close(self, *, code: int = 1000, message: bytes = b"", drain: bool = True) -> bool:
        if not message:
            message = CLOSE_REASONS.get(int(code), "").encode()
        if self.close_started is None:
            self.close_started = asyncio.get_running_loop().time()
        self._in_close = True
        try:
            return await super().close(code=code, message=message, drain=drain)
        finally:
            self._in_close = False
            self.close_finished = True
            self._close_done.set()

    def _close_transport(self) -> None:
        request = self._req
        lingering_shutdown(request.transport if request is not None else None)

"""How the hub ends a WebSocket: always with a close frame, code and reason.

Two things used to end connections without a close frame the client could
read (it saw 1006):

* aiohttp closes the TCP socket as soon as it has written its close frame
  after a protocol error (an over-cap frame, bad UTF-8, a bad opcode). A
  client still sending, e.g. frames pipelined behind the bad one, then gets a
  TCP reset, and Linux discards what the client had not read yet: the close
  frame. So the hub *lingers*: after its close frame it shuts its write side
  (FIN after the close frame, plain TCP) and goes on reading and discarding
  for up to LINGER_SECONDS, until the client closes too.
* A stalled consumer was aborted outright. Now it gets one graceful attempt:
  the close frame (1013 "outbound delivery timeout") behind what is already
  buffered and the write side shut; only if that has not drained within
  GRACEFUL_CLOSE_SECONDS is the transport aborted (the seed's rule).

aiohttp's own closes (protocol errors) carry only a code; HubWebSocket adds
the documented reason (CLOSE_REASONS). The table of every code the hub sends
is in docs/operations.md ("Close codes").
"""

from __future__ import annotations

import asyncio
import struct

from aiohttp import web

LINGER_SECONDS = 1.0
GRACEFUL_CLOSE_SECONDS = 1.0
# How long the hub waits for the client's close frame after sending its own.
CLOSE_REPLY_SECONDS = 1.0

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
    (linger) or by aiohttp once the handler returns."""
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


async def linger(transport: asyncio.BaseTransport | None, seconds: float = LINGER_SECONDS) -> None:
    """Wait (bounded) for the client to close its side after the hub's close
    frame, then close the transport."""
    if transport is None:
        return
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while not transport.is_closing() and loop.time() < deadline:
        await asyncio.sleep(0.02)
    if not transport.is_closing():
        transport.close()


class HubWebSocket(web.WebSocketResponse):
    """aiohttp's WebSocketResponse with the hub's close rules: every close
    frame carries a reason, and the TCP socket is shut down gracefully
    (lingering_shutdown) instead of closed under a client still sending."""

    def __init__(self, **kwargs) -> None:
        kwargs.setdefault("timeout", CLOSE_REPLY_SECONDS)
        super().__init__(**kwargs)
        self.close_started: float | None = None  # loop time the hub's close began
        self.close_finished = False

    async def close(self, *, code: int = 1000, message: bytes = b"", drain: bool = True) -> bool:
        if not message:
            message = CLOSE_REASONS.get(int(code), "").encode()
        if self.close_started is None:
            self.close_started = asyncio.get_running_loop().time()
        try:
            return await super().close(code=code, message=message, drain=drain)
        finally:
            self.close_finished = True

    def _close_transport(self) -> None:
        request = self._req
        lingering_shutdown(request.transport if request is not None else None)

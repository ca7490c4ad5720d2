"""A raw WebSocket probe for wire-level hardening checks (aiohttp only).

The probe speaks the hub's wire protocol by hand: it sends exactly the bytes a
test gives it (well-formed or not) and exposes every frame it receives,
including the close code and reason. It never uses the reference client, so it
works against any hub listening on a loopback port.

Typical use::

    async with WsProbe.connect(hub.url) as p:
        welcome = await p.recv_type("welcome")
        await p.send_json({"sender": "probe/a", "target": "System",
                           "type": "heartbeat", "payload": "online"})
        await p.send_text("{not json")
        err = await p.recv_type("error")
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import aiohttp

Frame = dict[str, Any]


class ProbeTimeout(AssertionError):
    """No matching frame arrived before the deadline."""


@dataclass
class Closed:
    """How the connection ended, as seen by the probe."""

    code: int | None
    reason: str


@dataclass
class WsProbe:
    """One raw WebSocket connection to a hub."""

    session: aiohttp.ClientSession
    ws: aiohttp.ClientWebSocketResponse
    frames: list[Frame] = field(default_factory=list)
    raw: list[str | bytes] = field(default_factory=list)
    closed: Closed | None = None
    _cursor: int = 0

    # -- lifecycle -----------------------------------------------------------------

    @classmethod
    async def open(cls, url: str, *, timeout: float = 5.0, headers: dict | None = None,
                   ssl: Any = None, local_addr: tuple[str, int] | None = None) -> "WsProbe":
        """ssl: an SSLContext (e.g. presenting a client certificate); for wss://
        without one, the test hub's self-signed certificate is not verified.
        local_addr: the source address, e.g. ("127.0.0.2", 0) to be another host."""
        session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(local_addr=local_addr) if local_addr else None)
        if ssl is None and url.startswith("wss://"):
            ssl = False
        try:
            ws = await asyncio.wait_for(
                session.ws_connect(url, autoclose=False, autoping=True, headers=headers,
                                   max_msg_size=16 * 1024 * 1024,
                                   ssl=ssl if ssl is not None else True), timeout)
        except BaseException:
            await session.close()
            raise
        return cls(session, ws)

    @classmethod
    def connect(cls, url: str, **kw: Any) -> "_ProbeCM":
        return _ProbeCM(url, kw)

    async def close(self, code: int = 1000) -> None:
        try:
            if not self.ws.closed:
                await asyncio.wait_for(self.ws.close(code=code), 3.0)
        except (asyncio.TimeoutError, aiohttp.ClientError, ConnectionError):
            pass
        finally:
            await self.session.close()

    # -- sending -------------------------------------------------------------------

    async def send_json(self, obj: Any) -> None:
        await self.ws.send_str(json.dumps(obj))

    async def send_text(self, text: str) -> None:
        await self.ws.send_str(text)

    async def send_bytes(self, data: bytes) -> None:
        await self.ws.send_bytes(data)

    async def register(self, name: str, **extra: Any) -> None:
        """Bind a name the way the reference client does (a heartbeat to System)."""
        frame = {"sender": name, "target": "System", "type": "heartbeat", "payload": "online",
                 "timestamp": time.time()}
        frame.update(extra)
        await self.send_json(frame)

    async def chat(self, sender: str, target: str, payload: str, **extra: Any) -> None:
        frame = {"sender": sender, "target": target, "type": "chat", "payload": payload,
                 "timestamp": time.time()}
        frame.update(extra)
        await self.send_json(frame)

    # -- receiving -----------------------------------------------------------------

    async def _pull(self, timeout: float) -> bool:
        """Read one message into ``frames``; False on timeout or after close."""
        if self.closed is not None:
            return False
        try:
            msg = await asyncio.wait_for(self.ws.receive(), timeout)
        except asyncio.TimeoutError:
            return False
        if msg.type in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY):
            self.raw.append(msg.data)
            try:
                obj = json.loads(msg.data)
            except ValueError:
                obj = {"__unparsed__": msg.data if isinstance(msg.data, str) else repr(msg.data)}
            if not isinstance(obj, dict):
                obj = {"__non_object__": obj}
            self.frames.append(obj)
            return True
        if msg.type == aiohttp.WSMsgType.CLOSE:
            self.closed = Closed(msg.data, msg.extra or "")
            try:
                await asyncio.wait_for(self.ws.close(), 2.0)
            except (asyncio.TimeoutError, aiohttp.ClientError, ConnectionError):
                pass
            return False
        if msg.type in (aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.CLOSING, aiohttp.WSMsgType.ERROR):
            if self.closed is None:
                self.closed = Closed(self.ws.close_code, "")
            return False
        return True  # ping/pong are handled by aiohttp

    async def recv(self, pred: Callable[[Frame], bool] | None = None, timeout: float = 5.0) -> Frame:
        """Return the next not-yet-consumed frame matching ``pred`` (waiting up to timeout).

        Frames skipped over stay in ``frames`` (see ``seen``) but are consumed
        for later ``recv`` calls.
        """
        deadline = time.monotonic() + timeout
        while True:
            while self._cursor < len(self.frames):
                f = self.frames[self._cursor]
                self._cursor += 1
                if pred is None or pred(f):
                    return f
            left = deadline - time.monotonic()
            if left <= 0 or self.closed is not None and self._cursor >= len(self.frames):
                break
            await self._pull(left)
        raise ProbeTimeout(f"no matching frame within {timeout}s; closed={self.closed}; "
                           f"seen={json.dumps(self.frames[-12:], default=str)[:3000]}")

    async def recv_type(self, type_: str, timeout: float = 5.0, **match: Any) -> Frame:
        def pred(f: Frame) -> bool:
            return f.get("type") == type_ and all(f.get(k) == v for k, v in match.items())
        return await self.recv(pred, timeout)

    async def drain(self, quiet: float = 0.3) -> list[Frame]:
        """Read until no frame arrives for ``quiet`` seconds; return the new frames."""
        start = len(self.frames)
        while await self._pull(quiet):
            pass
        self._cursor = len(self.frames)
        return self.frames[start:]

    async def wait_closed(self, timeout: float = 5.0) -> Closed:
        """Read (and keep) frames until the peer closes; return the close code/reason."""
        deadline = time.monotonic() + timeout
        while self.closed is None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ProbeTimeout(f"socket still open after {timeout}s; "
                                   f"seen={json.dumps(self.frames[-12:], default=str)[:3000]}")
            await self._pull(left)
        return self.closed

    def seen(self, type_: str | None = None) -> list[Frame]:
        return [f for f in self.frames if type_ is None or f.get("type") == type_]


class _ProbeCM:
    def __init__(self, url: str, kw: dict) -> None:
        self.url, self.kw = url, kw
        self.probe: WsProbe | None = None

    async def __aenter__(self) -> WsProbe:
        self.probe = await WsProbe.open(self.url, **self.kw)
        return self.probe

    async def __aexit__(self, *exc: Any) -> None:
        if self.probe is not None:
            await self.probe.close()


async def joined(url: str, name: str, **extra: Any) -> WsProbe:
    """A probe registered as `name` (extra registration fields allowed), once
    the hub has announced it."""
    probe = await WsProbe.open(url)
    await probe.recv_type("welcome")
    await probe.register(name, **extra)
    await probe.recv_type("presence_update", agent=name)
    return probe

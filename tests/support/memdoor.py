"""A fourth door, in memory: it speaks only the shared vocabulary.

A door is a translator: its wire in, commands out; the Router's door-neutral
messages in, its wire out. This one's wire is Python: an agent opens an
endpoint (Opened, door "memory"), speaks for a name (Register) and sends to
any target by name (Send); what the Router sends it arrives as messages on
its endpoint, which it keeps as plain dicts. It has no dialect of its own, so
the hub gives it the core's (a seat, and chats from it); it imports nothing
of the hub but the command vocabulary and the endpoint ids, and it is not
installed anywhere: it needs only the Router's inbox and the hub's endpoint
table, as any door does.
"""

from __future__ import annotations

import asyncio

import orjson

from hubd.core.commands import Closed, Opened, Register, Send
from hubd.core.endpoints import next_endpoint_id

DOOR = "memory"


class MemoryAgent:
    """One agent on the memory door: an endpoint of the hub."""

    def __init__(self, hub, principal: str = "memory:test"):
        self.hub = hub
        self.id = next_endpoint_id()
        self.principal = principal
        self.frames: asyncio.Queue = asyncio.Queue(1000)
        self.closed: tuple | None = None
        self.name: str | None = None

    async def _ask(self, command):
        await self.hub.router.inbox.put(command)
        return await asyncio.wait_for(command.reply, 10.0)

    def _future(self) -> asyncio.Future:
        return asyncio.get_running_loop().create_future()

    async def open(self, name: str, **fields) -> dict:
        """Open the endpoint and speak for `name` (a local agent: this door runs
        in the hub's own process)."""
        self.hub.endpoints.add(self)
        await self.hub.router.inbox.put(Opened(self.id, self.principal, "127.0.0.1",
                                               door=DOOR))
        answer = await self._ask(Register(self.id, name, fields, self._future()))
        self.name = name
        return answer

    async def send(self, target: str, body, **fields) -> dict:
        """A message to `target`, whatever door (or hub) serves it."""
        return await self._ask(Send(self.id, self.name, target, body, fields, self._future()))

    async def ask(self, kind, *args) -> object:
        """Any command of the vocabulary from this endpoint (its answer, or the
        refusal it carries)."""
        return await self._ask(kind(self.id, *args, self._future()))

    async def leave(self) -> None:
        await self.hub.router.inbox.put(Closed(self.id))
        self.hub.endpoints.remove(self)

    async def recv(self, type_: str, timeout: float = 10.0, **match) -> dict:
        """The next message of this type (and these field values) it was sent."""
        while True:
            frame = await asyncio.wait_for(self.frames.get(), timeout)
            if frame.get("type") == type_ and all(frame.get(k) == v for k, v in match.items()):
                return frame

    # Endpoint: the Router's messages, after their commit
    def deliver(self, message) -> None:
        # this door's wire: a copy of the frame, as a receiver on any wire would see it
        self.frames.put_nowait(orjson.loads(message.json))

    def close(self, code: int, reason: str) -> None:
        self.closed = (code, reason)

    def write_stalled_for(self, now: float) -> float:
        return 0.0

    def abort(self) -> None:
        self.closed = (1013, "aborted")

"""Delivery proof: a pushed message counts as delivered once its tag appears in
the session's transcript (docs/broker.md, "Delivery proof").

After a push to a session that gave a `transcriptPath`, the door looks for
`[murmur m<id>` in the tail of that file every timing.broker_proof_check, for
at most timing.broker_proof_window (the seed's 120 s). A tag found moves the
delivery to `delivered` through the Router (journaled like a `delivered`
line); one not found leaves it `sent`.
Bounded: at most MAX_PENDING proofs are watched (past it the oldest is dropped
and counted), and only the last TAIL_BYTES of a transcript are read.

The watcher is an endpoint of the hub (door "broker-proofs"): the Router
sends it what to look for once the push is out (a message); a tag it finds
goes back as an Ack of that handle's delivery.
"""

from __future__ import annotations

import asyncio
import re
from collections import OrderedDict
import structlog

from hubd.core.commands import Ack, Opened
from hubd.core.endpoints import Listener
from hubd.core.message import Message
from hubd.state import broker as bs
from hubd.wire import broker as wire

log = structlog.get_logger("hubd.broker")

MAX_PENDING = 4096
TAIL_BYTES = 256 * 1024


def read_tail(path: str, size: int = TAIL_BYTES) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            end = f.tell()
            f.seek(max(0, end - size))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def found_tags(text: str, message_ids) -> set[int]:
    """Which of the message ids have their tag in the text (m12 is not m123)."""
    present = {int(m) for m in re.findall(r"\[murmur m(\d+)(?!\d)", text)}
    return present & set(message_ids)


class ProofWatcher(Listener):
    def __init__(self, hub):
        super().__init__()
        self.hub = hub
        timing = hub.config.timing
        self.every = timing.broker_proof_check
        self.poll_seconds = timing.broker_proof_window
        # (handle, message id) -> (transcript path, deadline on the loop clock)
        self.pending: OrderedDict = OrderedDict()
        self.dropped = 0

    async def open(self, principal: str) -> None:
        self.hub.endpoints.add(self)
        await self.hub.router.inbox.put(Opened(self.id, principal, "local", door=wire.PROOFS_DOOR))

    # Endpoint: the Router's "watch for this" (after the push's commit)
    def deliver(self, message: Message) -> None:
        frame = message.frame
        self.expect(frame["handle"], frame["messageId"], frame["path"])

    def expect(self, handle: str, message_id: int, path: str) -> None:
        loop = asyncio.get_running_loop()
        self.pending[(handle, message_id)] = (path, loop.time() + self.poll_seconds)
        while len(self.pending) > MAX_PENDING:
            self.pending.popitem(last=False)
            self.dropped += 1

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.every)
            if not self.pending:
                continue
            now = loop.time()
            by_path: dict[str, list] = {}
            for key, (path, deadline) in list(self.pending.items()):
                if now > deadline:
                    del self.pending[key]
                    continue
                by_path.setdefault(path, []).append(key)
            proven: dict[str, list[int]] = {}
            for path, keys in by_path.items():
                text = await asyncio.to_thread(read_tail, path)
                hits = found_tags(text, [message_id for _, message_id in keys])
                for handle, message_id in keys:
                    if message_id in hits:
                        self.pending.pop((handle, message_id), None)
                        proven.setdefault(handle, []).append(message_id)
            for handle, ids in proven.items():
                await self.hub.router.inbox.put(Ack(self.id, handle, ids, {}))

"""ForwardOutbox: sends journaled forwards to their peers until each settles.

Rows come from the Router after the chat and its outbox row are committed
(never on the sender's path), and from the journal at start. Per peer, one
sender task keeps up to WINDOW forwards in flight on the peer's link and hands
every settlement back to the Router, which journals it and tells the sender.

Retries: a forward that timed out or was refused for a transient reason waits
1, 2, 4 ... 300 s (jittered) before its next attempt. A link that went down
and came back drains everything at once: the backoff clock is for a peer that
answers "not now", not for a peer that was away. The attempt counter of a
forward resets only after its link has been up for a while, so a flapping link
cannot turn into a tight retry loop.
"""

from __future__ import annotations

import asyncio
import heapq
import random
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Callable

import structlog

from federation.state import PendingForward

log = structlog.get_logger("hubd.federation.outbox")

WINDOW = 1024  # forwards in flight per peer
BATCH = 256  # forwards per frame, to a peer that takes batches
ANSWER_TIMEOUT = 10.0
RETRY_START = 1.0
RETRY_MAX = 300.0
STABLE_LINK = 30.0
SWEEP = 0.5

# dispositions a peer answers
ACCEPTED = "accepted"
DUPLICATE = "duplicate"
REFUSED = "refused"
EXPIRED = "expired"
# refusals a later attempt may overcome (the seed: "succeeds on a later retry")
TRANSIENT = frozenset({"chat_refused", "journal_recovery_required", "quota_exceeded"})


@dataclass(slots=True)
class Attempt:
    item: PendingForward
    attempts: int = 0
    sent_at: float | None = None  # monotonic time of the attempt in flight
    # waiting because the peer said "not now" (its quota, its journal), not
    # because no answer came: a sign of life does not cut that backoff short
    refused_for_now: bool = False


@dataclass
class PeerQueue:
    items: OrderedDict = field(default_factory=OrderedDict)  # forward_id -> Attempt, oldest first
    ready: deque = field(default_factory=deque)  # forward_ids to send now
    delayed: list = field(default_factory=list)  # heap of (due, forward_id)
    in_flight: dict = field(default_factory=dict)  # forward_id -> Attempt
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    last_success: float | None = None


class ForwardOutbox:
    def __init__(self, origin_hub: str, links: dict, metrics,
                 settle: Callable[[PendingForward, str, str, str, dict], None],
                 pending_notice: Callable[[PendingForward, str], None]):
        self.origin = origin_hub
        self.links = links
        self.metrics = metrics
        self._settle = settle
        self._pending_notice = pending_notice
        self.queues: dict[str, PeerQueue] = {peer: PeerQueue() for peer in links}

    def add_peer(self, peer: str) -> None:
        self.queues.setdefault(peer, PeerQueue())

    # -- rows in

    def submit(self, item: PendingForward) -> None:
        queue = self.queues[item.peer]
        if item.forward_id in queue.items:
            return
        queue.items[item.forward_id] = Attempt(item)
        queue.ready.append(item.forward_id)
        queue.wake.set()

    def load(self, items: list[PendingForward]) -> None:
        for item in items:
            if item.peer in self.queues:
                self.submit(item)

    # -- link events

    def link_up(self, peer: str) -> None:
        """Everything pending goes out now, whatever its backoff said."""
        self._release_delayed(peer)

    def peer_alive(self, peer: str) -> None:
        """The peer showed life (its inbound link, a forward, a log pull):
        retries waiting out a backoff because no answer came go now, if the
        link is up (else link_up() sends them when it is). Retries the peer
        itself asked to wait keep their backoff."""
        link = self.links.get(peer)
        if peer in self.queues and link is not None and link.up and self.queues[peer].delayed:
            self._release_delayed(peer, unanswered_only=True)

    def _release_delayed(self, peer: str, unanswered_only: bool = False) -> None:
        queue = self.queues[peer]
        keep = []
        for due, forward_id in queue.delayed:
            attempt = queue.items.get(forward_id)
            if attempt is None or forward_id in queue.in_flight:
                continue
            if unanswered_only and attempt.refused_for_now:
                keep.append((due, forward_id))
                continue
            queue.ready.append(forward_id)
        heapq.heapify(keep)
        queue.delayed = keep
        queue.wake.set()

    def link_down(self, peer: str, cause: str) -> None:
        queue = self.queues[peer]
        # In-flight forwards go back to the front: the peer may or may not have
        # them; a resend is answered `duplicate` if it did.
        returning = list(queue.in_flight)
        queue.in_flight.clear()
        for forward_id in reversed(returning):
            attempt = queue.items.get(forward_id)
            if attempt is not None:
                attempt.sent_at = None
                queue.ready.appendleft(forward_id)
        for attempt in queue.items.values():
            self._pending_notice(attempt.item, f"link to {peer} is down ({cause})")

    def on_result(self, peer: str, frame: dict) -> None:
        queue = self.queues.get(peer)
        forward_id = frame.get("forward_id")
        attempt = queue.in_flight.pop(forward_id, None) if queue else None
        if attempt is None:
            return  # an answer to a forward already settled or re-sent
        disposition = frame.get("disposition")
        reason = str(frame.get("reason_code") or "")
        detail = str(frame.get("detail") or "")[:512]
        result = frame.get("result") if isinstance(frame.get("result"), dict) else {}
        started = attempt.sent_at
        if disposition in (ACCEPTED, DUPLICATE):
            queue.last_success = time.time()
            if started is not None:
                self.metrics.forward_latency(peer, time.monotonic() - started)
            self._finish(queue, attempt, disposition, "", detail, result)
        elif disposition == REFUSED and reason in TRANSIENT:
            self.metrics.forward_outcome(peer, "retried")
            attempt.refused_for_now = True
            self._retry_later(queue, attempt, f"{peer} refused for now: {reason} {detail}".strip())
        elif disposition == REFUSED:
            self._finish(queue, attempt, REFUSED, reason or "refused", detail, result)
        else:
            self._finish(queue, attempt, REFUSED, "peer_invalid_answer",
                         f"{peer} answered disposition {disposition!r}", {})

    def peer_rejected(self, peer: str, text: str) -> None:
        """A peer older than wire v5: every forward to it is refused, no retries."""
        queue = self.queues[peer]
        for attempt in list(queue.items.values()):
            self._finish(queue, attempt, REFUSED, "peer_rejected", text[:512], {})

    # -- internals

    def _finish(self, queue: PeerQueue, attempt: Attempt, state: str, reason: str, detail: str,
                result: dict) -> None:
        item = attempt.item
        queue.items.pop(item.forward_id, None)
        queue.in_flight.pop(item.forward_id, None)
        self.metrics.forward_outcome(item.peer, state)
        self._settle(item, state, reason, detail, result)

    def _retry_later(self, queue: PeerQueue, attempt: Attempt, why: str) -> None:
        attempt.sent_at = None
        link = self.links[attempt.item.peer]
        if link.up_since is not None and time.monotonic() - link.up_since > STABLE_LINK \
                and attempt.attempts > 6:
            attempt.attempts = 0  # a steady link that still says "not now": start over
        delay = min(RETRY_START * 2 ** attempt.attempts, RETRY_MAX)
        attempt.attempts += 1
        due = time.monotonic() + delay * (0.75 + random.random() / 2)
        heapq.heappush(queue.delayed, (due, attempt.item.forward_id))
        self._pending_notice(attempt.item, why)

    async def run_peer(self, peer: str) -> None:
        queue = self.queues[peer]
        link = self.links[peer]
        while True:
            await queue.wake.wait()
            queue.wake.clear()
            if not link.up:
                continue  # link_up() wakes us again
            while queue.ready and len(queue.in_flight) < WINDOW and link.up:
                batch = []
                limit = BATCH if link.batching else 1
                now = time.monotonic()
                while queue.ready and len(batch) < limit and \
                        len(queue.in_flight) < WINDOW:
                    forward_id = queue.ready.popleft()
                    attempt = queue.items.get(forward_id)
                    if attempt is None or forward_id in queue.in_flight:
                        continue
                    attempt.sent_at = now
                    queue.in_flight[forward_id] = attempt
                    batch.append(attempt)
                if not batch:
                    break
                if len(batch) == 1:
                    frame = batch[0].item.frame(self.origin)
                else:
                    frame = {"sender": self.origin, "target": "System",
                             "type": "multihub_message_forward_batch", "payload": "",
                             "forwards": [a.item.entry() for a in batch]}
                if not await link.send(frame):
                    for attempt in reversed(batch):
                        queue.in_flight.pop(attempt.item.forward_id, None)
                        attempt.sent_at = None
                        queue.ready.appendleft(attempt.item.forward_id)
                    break

    def time_out_unanswered(self, peer: str, now_mono: float) -> None:
        queue = self.queues[peer]
        for forward_id, attempt in list(queue.in_flight.items()):
            if now_mono - attempt.sent_at > ANSWER_TIMEOUT:
                del queue.in_flight[forward_id]
                self.metrics.forward_outcome(peer, "timeout")
                attempt.refused_for_now = False
                self._retry_later(queue, attempt,
                                  f"{peer} did not answer within {ANSWER_TIMEOUT:g}s")

    async def sweep(self) -> None:
        """Twice a second: answers that never came, due retries, expired rows."""
        while True:
            await asyncio.sleep(SWEEP)
            now_mono = time.monotonic()
            now = time.time()
            for peer, queue in self.queues.items():
                self.time_out_unanswered(peer, now_mono)
                while queue.delayed and queue.delayed[0][0] <= now_mono:
                    _, forward_id = heapq.heappop(queue.delayed)
                    if forward_id in queue.items and forward_id not in queue.in_flight:
                        queue.ready.append(forward_id)
                        queue.wake.set()
                for attempt in list(queue.items.values()):
                    if attempt.item.expires_at > now:
                        break  # rows are in creation order, and so in expiry order
                    self._finish(queue, attempt, EXPIRED, "forward_expired",
                                 f"not accepted by {peer} within its TTL", {})
                if queue.ready:
                    queue.wake.set()

    # -- figures

    def backlog(self, peer: str) -> tuple[int, float]:
        queue = self.queues[peer]
        first = next(iter(queue.items.values()), None)
        oldest = time.time() - first.item.created if first is not None else 0.0
        return len(queue.items), max(oldest, 0.0)

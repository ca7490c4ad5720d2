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
cannot turn into a tight retry loop. A sign of life from the peer sends the
forwards that got no answer again at once, but not those the peer refused for
now (hubd/state/delivery.py: WAITING vs HELD).
"""

from __future__ import annotations

import asyncio
import heapq
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Callable

import structlog

from federation.clock import SYSTEM, next_retry
from federation.state import PendingForward
from hubd.state import delivery as dl
from hubd.state.delivery import ACCEPTED, DUPLICATE, EXPIRED, REFUSED, forward_step

log = structlog.get_logger("hubd.federation.outbox")

WINDOW = 1024  # forwards in flight per peer
BATCH = 256  # forwards per frame, to a peer that takes batches
ANSWER_TIMEOUT = 10.0
SWEEP = 0.5


@dataclass(slots=True)
class Attempt:
    item: PendingForward
    attempts: int = 0
    sent_at: float | None = None  # monotonic time of the attempt in flight
    state: str = dl.QUEUED  # hubd.state.delivery's forward states

    def step(self, event: str) -> str:
        self.state = forward_step(self.state, event)
        return self.state


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
                 pending_notice: Callable[[PendingForward, str], None], clock=SYSTEM):
        self.origin = origin_hub
        self.clock = clock
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
        self._release_delayed(peer, dl.LINK_UP)

    def peer_alive(self, peer: str) -> None:
        """The peer showed life (its inbound link, a forward, a log pull):
        retries waiting out a backoff because no answer came go now, if the
        link is up (else link_up() sends them when it is). Retries the peer
        itself asked to wait keep their backoff (the table keeps them HELD)."""
        link = self.links.get(peer)
        if peer in self.queues and link is not None and link.up and self.queues[peer].delayed:
            self._release_delayed(peer, dl.PEER_ALIVE)

    def _release_delayed(self, peer: str, event: str) -> None:
        """Step every backing-off forward with `event`; those the table sends
        back to QUEUED go out now, the rest stay in the heap with their due time."""
        queue = self.queues[peer]
        keep = []
        for due, forward_id in queue.delayed:
            attempt = queue.items.get(forward_id)
            if attempt is None or attempt.state not in dl.BACKING_OFF:
                continue  # a stale entry: settled, or queued again since
            if attempt.step(event) == dl.QUEUED:
                queue.ready.append(forward_id)
            else:
                keep.append((due, forward_id))
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
                attempt.step(dl.LINK_DOWN)
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
        event = dl.answer_event(disposition, reason)
        state = attempt.step(event)
        if state in (ACCEPTED, DUPLICATE):
            queue.last_success = self.clock.wall()
            if started is not None:
                self.metrics.forward_latency(peer, self.clock.monotonic() - started)
            self._finish(queue, attempt, "", detail, result)
        elif state == dl.HELD:
            self.metrics.forward_outcome(peer, "retried")
            self._retry_later(queue, attempt, f"{peer} refused for now: {reason} {detail}".strip())
        elif event == dl.ANSWER_REFUSED:
            self._finish(queue, attempt, reason or "refused", detail, result)
        else:
            self._finish(queue, attempt, "peer_invalid_answer",
                         f"{peer} answered disposition {disposition!r}", {})
        if queue.ready and len(queue.in_flight) < WINDOW:
            queue.wake.set()  # a window slot came free: refill now, not at the next sweep

    def peer_rejected(self, peer: str, text: str) -> None:
        """A peer older than wire v5: every forward to it is refused, no retries."""
        queue = self.queues[peer]
        for attempt in list(queue.items.values()):
            attempt.step(dl.PEER_REJECTED)
            self._finish(queue, attempt, "peer_rejected", text[:512], {})

    # -- internals

    def _finish(self, queue: PeerQueue, attempt: Attempt, reason: str, detail: str,
                result: dict) -> None:
        """Settle a forward that reached one of the table's settled states."""
        item = attempt.item
        state = attempt.state
        assert state in dl.SETTLED, state
        queue.items.pop(item.forward_id, None)
        queue.in_flight.pop(item.forward_id, None)
        self.metrics.forward_outcome(item.peer, state)
        self._settle(item, state, reason, detail, result)

    def _retry_later(self, queue: PeerQueue, attempt: Attempt, why: str) -> None:
        attempt.sent_at = None
        link = self.links[attempt.item.peer]
        now = self.clock.monotonic()
        up_for = now - link.up_since if link.up_since is not None else None
        due, attempt.attempts = next_retry(attempt.attempts, now, up_for, self.clock.jitter())
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
                now = self.clock.monotonic()
                while queue.ready and len(batch) < limit and \
                        len(queue.in_flight) < WINDOW:
                    forward_id = queue.ready.popleft()
                    attempt = queue.items.get(forward_id)
                    if attempt is None or attempt.state != dl.QUEUED:
                        continue  # a stale entry: settled, or queued again since
                    attempt.step(dl.SEND)
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
                        if attempt.state == dl.IN_FLIGHT:
                            attempt.step(dl.SEND_FAILED)
                        elif attempt.state != dl.QUEUED:
                            continue  # settled meanwhile (expired, or the peer was rejected)
                        attempt.sent_at = None
                        queue.ready.appendleft(attempt.item.forward_id)
                    break

    def time_out_unanswered(self, peer: str, now_mono: float) -> None:
        queue = self.queues[peer]
        for forward_id, attempt in list(queue.in_flight.items()):
            if now_mono - attempt.sent_at > ANSWER_TIMEOUT:
                del queue.in_flight[forward_id]
                attempt.step(dl.ANSWER_TIMEOUT)
                self.metrics.forward_outcome(peer, "timeout")
                self._retry_later(queue, attempt,
                                  f"{peer} did not answer within {ANSWER_TIMEOUT:g}s")

    async def sweep(self) -> None:
        """Twice a second: answers that never came, due retries, expired rows."""
        while True:
            await self.clock.sleep(SWEEP)
            self.sweep_once()

    def sweep_once(self) -> None:
        now_mono = self.clock.monotonic()
        now = self.clock.wall()
        for peer, queue in self.queues.items():
            self.time_out_unanswered(peer, now_mono)
            while queue.delayed and queue.delayed[0][0] <= now_mono:
                _, forward_id = heapq.heappop(queue.delayed)
                attempt = queue.items.get(forward_id)
                if attempt is not None and attempt.state in dl.BACKING_OFF:
                    attempt.step(dl.RETRY_DUE)
                    queue.ready.append(forward_id)
                    queue.wake.set()
            for attempt in list(queue.items.values()):
                if attempt.item.expires_at > now:
                    break  # rows are in creation order, and so in expiry order
                attempt.step(dl.TTL)
                self._finish(queue, attempt, "forward_expired",
                             f"not accepted by {peer} within its TTL", {})
            if queue.ready:
                queue.wake.set()

    # -- figures

    def backlog(self, peer: str) -> tuple[int, float]:
        queue = self.queues[peer]
        first = next(iter(queue.items.values()), None)
        oldest = self.clock.wall() - first.item.created if first is not None else 0.0
        return len(queue.items), max(oldest, 0.0)

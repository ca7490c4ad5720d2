"""WatchFollower: the actor that follows one watched peer's event log.

One per `--multihub-watch` peer. It pulls the peer's log over the peer's link
(bounded pages, an overlap re-read so a rewritten history is caught), checks
the pages' hash chain and signed checkpoints (federation/log_chain.py), merges
it (federation/merge.py), folds it (fold.py) and sends what the peer asserts
as a message (Observed, or Equivocated) to whoever started it; the Router
turns those into journaled partition, heal and equivocation rows. It never
grants anything (observe-only).

Its inbox (bounded: one pending wake is as good as many) takes PollNow, sent
when the peer's link comes up, so a reconnected peer is looked at at once
rather than an interval later, and SetQuarantine after the Router restored
the quarantines from the journal. Otherwise it polls every
timing.watch_interval of its clock. Its merged log and status are its own: others get copies of the
status in its messages.
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass
from typing import Callable

import structlog

from federation.clock import SYSTEM, wait_for
from federation.fold import FOLDED_KINDS, asserting_hubs, fold
from federation.actors.link_socket import LinkError
from federation.log_chain import ChainWatch
from federation.log_model import Equivocation, MergeError
from federation.log_snapshot import decode_snapshot
from federation.merge import MergedLog
from hubd.timing import Timing

log = structlog.get_logger("hubd.federation.watch")

PAGE = 1000  # events per pull request
# Every poll re-reads this many already-accepted events: a peer that rewrote
# its recent history (a restore from another backup, a tampered journal) is
# caught as equivocation instead of going unnoticed behind the cursor.
OVERLAP = 64
# Fingerprints of events the fold does not need are kept only this far back.
FINGERPRINT_WINDOW = 4 * OVERLAP
MAX_PAGES = 50  # per poll round; the rest waits for the next round


@dataclass(frozen=True, slots=True)
class PollNow:
    reason: str


@dataclass(frozen=True, slots=True)
class SetQuarantine:
    quarantined: bool


@dataclass
class WatchStatus:
    peer: str
    cursor: int = 0
    log_end: int | None = None
    last_success: float | None = None
    last_error: str | None = None
    quarantined: bool = False
    polls: int = 0

    @property
    def lag(self) -> int | None:
        return (self.log_end - self.cursor) if self.log_end is not None else None

    def to_json(self, link) -> dict:
        return {"cursor": self.cursor, "log_end_seq": self.log_end, "lag_events": self.lag,
                "last_success": self.last_success, "last_error": self.last_error,
                "quarantined": self.quarantined, "polls": self.polls,
                "clock_skew_seconds": round(link.clock_skew, 3)
                if link.clock_skew is not None else None, "link": "up" if link.up else "down",
                # why the link is down (pin_mismatch, tls, ...): a poll only says "link down"
                "link_error": link.last_error,
                # the follower's negotiated wire version (federation/versions.py)
                "negotiated_protocol_version": link.versions.effective}


@dataclass(frozen=True, slots=True)
class Observed:
    """A poll's outcome: `asserting` is None when the poll failed (the last
    good observation stands)."""

    peer: str
    asserting: object
    refreshed_ok: bool
    non_empty: bool
    status: WatchStatus


@dataclass(frozen=True, slots=True)
class Equivocated:
    peer: str
    error: Equivocation
    status: WatchStatus


class WatchFollower:
    def __init__(self, peer: str, link, timing: Timing, tell: Callable[[object], None],
                 hub_id: str, *, clock=SYSTEM, quarantined: bool = False):
        self.peer = peer
        self.link = link
        self.interval = timing.watch_interval
        self.pull_timeout = timing.log_pull_answer
        self.tell = tell
        self.hub_id = hub_id
        self.clock = clock
        self.inbox: asyncio.Queue = asyncio.Queue(1)
        self._merged = MergedLog(retain=FOLDED_KINDS.__contains__)
        self._chain = ChainWatch(peer)  # the peer's hash chain and checkpoints, as served
        self._status = WatchStatus(peer, quarantined=quarantined)

    # -- messages in (from other tasks on this loop; never block)

    def post(self, message) -> None:
        try:
            self.inbox.put_nowait(message)
        except asyncio.QueueFull:
            if isinstance(message, SetQuarantine):  # must not be lost behind a wake
                self.inbox.get_nowait()
                self.inbox.put_nowait(message)
            # a PollNow behind another pending message: that one wakes us too

    def link_up(self, peer: str) -> None:
        self.post(PollNow("link up"))

    # -- the actor

    async def run(self) -> None:
        while True:
            if not self._status.quarantined and await self.poll_once():
                # a wake that came before or during a good poll is answered by it
                while not self.inbox.empty():
                    self._take(self.inbox.get_nowait())
            try:
                message = await wait_for(self.clock, self.inbox.get(), self.interval)
            except TimeoutError:
                continue
            self._take(message)

    def _take(self, message) -> None:
        if isinstance(message, SetQuarantine):
            self._status.quarantined = message.quarantined

    def snapshot(self) -> WatchStatus:
        return dataclasses.replace(self._status)

    async def poll_once(self) -> bool:
        """Pull until caught up (bounded), then report what the peer asserts.
        A failed poll reports a failure: the last good observation stands.
        True when the peer answered (even if it refused the pull)."""
        status = self._status
        status.polls += 1
        result = None
        try:
            first = True
            for _ in range(MAX_PAGES):
                after = self._merged.cursor(self.peer)
                if first:
                    after = max(0, after - OVERLAP)
                    first = False
                answer = await wait_for(self.clock, self.link.request(
                    {"sender": self.hub_id, "target": "all", "type": "multihub_log_request",
                     "payload": "", "after_seq": after, "limit": PAGE},
                    None, reply_type="multihub_log_snapshot"), self.pull_timeout)
                snapshot = decode_snapshot(answer)
                self._chain.check(after, snapshot.events, answer.get("chain"))
                result = self._merged.accept(self.peer, after, snapshot.events,
                                             snapshot.next_cursor, snapshot.log_end_seq)
                if result.refused or result.caught_up:
                    break
        except Equivocation as exc:  # a conflicting offer, a broken chain, two signed heads
            status.quarantined = True
            status.last_error = f"{exc.reason.replace('_', ' ')} at seq {exc.seq}"
            log.error("peer equivocated; quarantined until an operator recovers it",
                      peer=self.peer, reason=exc.reason, seq=exc.seq, error=str(exc),
                      accepted=exc.accepted_fingerprint, offered=exc.offered_fingerprint)
            self.tell(Equivocated(self.peer, exc, self.snapshot()))
            return True
        except (LinkError, MergeError, TimeoutError) as exc:
            status.last_error = str(exc) or f"no answer within {self.pull_timeout:g}s"
            log.warning("watch poll failed; keeping the last good observation", peer=self.peer,
                        error=status.last_error)
            self.tell(Observed(self.peer, None, False, False, self.snapshot()))
            return False
        status.cursor = self._merged.cursor(self.peer)
        status.log_end = self._merged.log_end(self.peer)
        self._merged.compact(self.peer, status.cursor - FINGERPRINT_WINDOW)
        if result is None or result.refused:
            status.last_error = "the peer refused the pull (empty answer, log_end_seq null)"
            self.tell(Observed(self.peer, None, False, False, self.snapshot()))
            return True
        now = self.clock.wall()
        status.last_success = now
        status.last_error = None
        asserting = asserting_hubs(fold(self._merged.ordered()), now, hub=self.peer)
        self.tell(Observed(self.peer, asserting, True, result.complete, self.snapshot()))
        return True

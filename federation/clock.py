"""Time for the federation actors, injected, and the retry schedule as pure functions.

The actors read time and wait only through a Clock. A hub uses SystemClock;
the actor tests use ManualClock, whose time moves only when the test says so,
so a ten-second answer timeout or a five-minute back-off is tested by
advancing the clock, never by sleeping.

A forward that gets no answer, or a "not now", waits 1, 2, 4 ... 300 s
(jittered) before its next attempt (next_retry). Each peer's schedule, as far
as its attempt count and kind go, is journaled (PeerRetry, the
`forward_retry` event: docs/federation.md, "Retries across a restart"), so a
restarted hub holds a refusing peer's backlog until the retry that was due
rather than sending it all at once.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import random
import time
from dataclasses import dataclass
from typing import Awaitable, TypeVar

from hubd.timing import Timing

T = TypeVar("T")

# After this many attempts on a link that has been up
# timing.forward_retry_stable_link and still answers "not now", the schedule
# starts over instead of staying at the cap.
RESET_AFTER_ATTEMPTS = 6


def retry_delay(attempts: int, jitter: float, timing: Timing) -> float:
    """Seconds before attempt `attempts + 1`: timing.forward_retry_first (1),
    doubling (2, 4 ...) up to timing.forward_retry_max (300), times 0.75-1.25.
    `jitter` is a number in [0, 1) (random.random() in a hub, fixed in tests)."""
    if not 0.0 <= jitter < 1.0:
        raise ValueError(f"jitter must be in [0, 1), not {jitter!r}")
    return min(timing.forward_retry_first * 2 ** attempts,
               timing.forward_retry_max) * (0.75 + jitter / 2)


def next_retry(attempts: int, now: float, link_up_for: float | None,
               jitter: float, timing: Timing) -> tuple[float, int]:
    """(when the next attempt is due, the attempt count after this one).

    A flapping link does not reset the count (it would become a tight retry
    loop); a link up for a while that still says "not now" starts over."""
    if link_up_for is not None and link_up_for > timing.forward_retry_stable_link \
            and attempts > RESET_AFTER_ATTEMPTS:
        attempts = 0
    return now + retry_delay(attempts, jitter, timing), attempts + 1


@dataclass(frozen=True, slots=True)
class PeerRetry:
    """A peer's retry schedule as journaled: the attempt count its backoff
    reached, when the next attempt is due (wall time), and whether the peer
    said "not now" (refused) or did not answer."""

    attempts: int
    retry_at: float
    refused: bool


def retry_to_journal(journaled: PeerRetry | None, attempts: int, retry_at: float,
                     refused: bool) -> PeerRetry | None:
    """A forward of the peer backed off to attempt count `attempts`, due at
    `retry_at`: the schedule to journal, or None when the journaled one
    already says as much (same count, same kind). Only a change of count or
    kind is journaled, so a peer refusing a stream of forwards at one level
    costs one row, not one per forward."""
    if journaled is not None and journaled.attempts == attempts and \
            journaled.refused == refused:
        return None
    return PeerRetry(attempts, retry_at, refused)


def restored_wait(journaled: PeerRetry | None, now: float) -> float:
    """Seconds a restarted hub holds the peer's backlog back: until the
    journaled retry is due, 0 if it is past (or nothing was journaled)."""
    if journaled is None:
        return 0.0
    return max(0.0, journaled.retry_at - now)


class SystemClock:
    """The event loop's monotonic clock and the wall clock."""

    def monotonic(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()

    def jitter(self) -> float:
        return random.random()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    def timeout(self, seconds: float):
        """`async with clock.timeout(s)`: TimeoutError once s seconds passed."""
        return asyncio.timeout(seconds)


SYSTEM = SystemClock()


class ManualClock:
    """A clock that moves only on advance(); sleepers wake in due order."""

    def __init__(self, start: float = 1000.0, wall_offset: float = 1_700_000_000.0,
                 jitter: float = 0.5):
        self._now = start
        self._wall_offset = wall_offset
        self._jitter = jitter
        self._sleepers: list = []  # heap of (due, n, future)
        self._order = itertools.count()

    def monotonic(self) -> float:
        return self._now

    def wall(self) -> float:
        return self._now + self._wall_offset

    def jitter(self) -> float:
        return self._jitter

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        future = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self._now + seconds, next(self._order), future))
        await future

    def timeout(self, seconds: float) -> "_ManualTimeout":
        """As asyncio.timeout, on this clock: the block is cancelled and
        TimeoutError raised once `seconds` of this clock have passed."""
        return _ManualTimeout(self, seconds)

    @property
    def sleepers(self) -> int:
        return sum(1 for _, _, f in self._sleepers if not f.done())

    async def advance(self, seconds: float) -> None:
        """Move time on, waking every sleeper due on the way (in order), and
        let the woken tasks run until they wait again."""
        target = self._now + seconds
        while self._sleepers and self._sleepers[0][0] <= target:
            due, _, future = heapq.heappop(self._sleepers)
            self._now = max(self._now, due)
            if not future.done():
                future.set_result(None)
            await settle()
        self._now = target
        await settle()


class _ManualTimeout:
    def __init__(self, clock: ManualClock, seconds: float):
        self.clock, self.seconds = clock, seconds
        self.fired = False

    async def __aenter__(self) -> "_ManualTimeout":
        self.task = asyncio.current_task()
        self.due = asyncio.get_running_loop().create_future()
        clock = self.clock
        heapq.heappush(clock._sleepers, (clock._now + self.seconds, next(clock._order), self.due))
        self.due.add_done_callback(self._fire)
        return self

    def _fire(self, due: asyncio.Future) -> None:
        if not due.cancelled():
            self.fired = True
            self.task.cancel()

    async def __aexit__(self, exc_type, exc, tb) -> None:
        if not self.due.done():
            self.due.cancel()
        if self.fired and exc_type is asyncio.CancelledError and self.task.uncancel() == 0:
            raise TimeoutError(f"no answer within {self.seconds:g}s") from exc


async def settle(rounds: int = 20) -> None:
    """Let ready tasks run until the loop has nothing left to do right now
    (bounded: a task that keeps rescheduling itself cannot hang a test)."""
    for _ in range(rounds):
        await asyncio.sleep(0)


async def wait_for(clock, awaitable: Awaitable[T], timeout: float) -> T:
    """asyncio.wait_for on an injected clock: TimeoutError once `timeout`
    seconds of that clock have passed without an answer."""
    task = asyncio.ensure_future(awaitable)
    timer = asyncio.ensure_future(clock.sleep(timeout))
    try:
        await asyncio.wait({task, timer}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        timer.cancel()
    if task.done():
        return task.result()
    task.cancel()
    raise TimeoutError(f"no answer within {timeout:g}s")

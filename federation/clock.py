"""Time for the federation actors, injected, and the retry schedule as a pure function.

The actors read time and wait only through a Clock. A hub uses SystemClock;
the actor tests use ManualClock, whose time moves only when the test says so,
so a ten-second answer timeout or a five-minute back-off is tested by
advancing the clock, never by sleeping.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import random
import time
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

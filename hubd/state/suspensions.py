"""Whose changes the Router refuses for a while, and for how long.

When a command fails after it changed the Router's state (a handler or an
applier raised mid-mutation, or SQLite refused a row of it), the state is
rebuilt from the journal, and until snapshots that replays the whole
journal. A client able to cause that at will could keep a hub replaying. The
first time is forgiven (a bug met once should not lock a principal out), but
from the second time within the hour the principal whose command it was may
not change state for a while: 20 times what the rebuild took, doubling with
each repeat (at most an hour). So the replays one principal causes take one
rebuild, then at most 5% of the hub's time, and less the more it repeats.
Reads still work meanwhile.

A key is the principal the failed command's events record (a token's
principal, `open-host:<address>` on an open hub: the ingress quota's
principal), or None for the hub's own work. Live state, like presence: a
restart forgets it.
"""

from __future__ import annotations

RATIO = 20  # a suspension is this many times the rebuild that caused it
MAX_SECONDS = 3600.0
# an offence this long after the last suspension ended counts as a first one
FORGET_SECONDS = 3600.0
MAX_KEYS = 10_000


def suspension_seconds(offences: int, rebuild_seconds: float) -> float:
    """How long a principal's changes are refused after its `offences`-th
    rebuild (counted from 1) that took `rebuild_seconds`."""
    if offences <= 1:
        return 0.0
    return min(MAX_SECONDS, RATIO * rebuild_seconds * 2 ** (offences - 2))


class Suspensions:
    def __init__(self) -> None:
        # key -> [offences, time its suspension ends], least recent offence first
        self.entries: dict = {}
        self.evicted_live = 0  # live suspensions dropped at the MAX_KEYS bound

    def suspend(self, key, now: float, rebuild_seconds: float) -> float:
        """Record an offence of `key`; how long its changes are now refused."""
        offences, until = self.entries.pop(key, (0, 0.0))
        if now - until > FORGET_SECONDS:
            offences = 0
        seconds = suspension_seconds(offences + 1, rebuild_seconds)
        self.entries[key] = [offences + 1, now + seconds]
        if len(self.entries) > MAX_KEYS:
            self._evict(now, key)
        return seconds

    def refused_until(self, key, now: float) -> float | None:
        """When key's suspension ends, if it is suspended at `now`."""
        entry = self.entries.get(key)
        if entry is None or now >= entry[1]:
            return None
        return entry[1]

    def live(self, now: float) -> int:
        return sum(1 for _, until in self.entries.values() if until > now)

    def _evict(self, now: float, keep) -> None:
        """Drop the least recent entry (other than `keep`, just recorded) whose
        suspension has ended, or else the least recent one (counted: each
        entry cost a rebuild to make)."""
        for key, (_, until) in self.entries.items():
            if until <= now and key != keep:
                del self.entries[key]
                return
        del self.entries[next(iter(self.entries))]
        self.evicted_live += 1

"""Crash points for the crash tests, off unless HUBD_FAULT is set.

The exactly-once tests need a hub to die at one precise moment — after a
forwarded chat is durable but before its answer left, after a peer's answer
arrived but before the settlement is durable — which a SIGKILL from outside
cannot aim at. The points are the JournalWriter's commit:

    HUBD_FAULT=kill-before-commit:<selector>[:<n>]
    HUBD_FAULT=kill-after-commit:<selector>[:<n>]

The hub SIGKILLs itself just before (or just after, and before any frame of
that commit is released to a socket) the n-th commit (default 1) that holds
an event matching <selector>: an event kind (`chat`, `forward_settled`, ...),
optionally `+key` for a kind whose route carries that key
(`chat+forwarded`: a chat that arrived from a peer hub). Unset or empty means
no fault; anything else that does not parse stops the hub at start.

And a snapshot's write (hubd/snapshot_worker.py):

    HUBD_SNAPSHOT_FAULT=kill-midway

Once half of the snapshot file is written and synced, the worker SIGKILLs
its process group: itself and the hub that started it (tests start each hub
in a session of its own), as a crash of the host would.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass

import structlog

log = structlog.get_logger("hubd.faults")

ENV = "HUBD_FAULT"
STAGES = {"kill-before-commit": "before", "kill-after-commit": "after"}


class FaultSpecError(ValueError):
    """HUBD_FAULT is set but does not say a known fault."""


@dataclass
class CommitFault:
    stage: str  # "before" or "after"
    kind: str
    route_key: str | None
    nth: int
    seen: int = 0

    def matches(self, event) -> bool:
        if event.kind != self.kind:
            return False
        return self.route_key is None or (event.route is not None and self.route_key in event.route)

    def reached(self, stage: str, events) -> None:
        """Called by the JournalWriter around each commit; kills on the n-th match."""
        if stage != self.stage or not any(self.matches(e) for e in events):
            return
        self.seen += 1
        if self.seen == self.nth:
            log.warning("fault injected: killing this hub", fault=os.environ.get(ENV),
                        first_seq=events[0].seq, last_seq=events[-1].seq)
            os.kill(os.getpid(), signal.SIGKILL)


def parse(spec: str) -> CommitFault | None:
    spec = spec.strip()
    if not spec:
        return None
    parts = spec.split(":")
    if len(parts) not in (2, 3) or parts[0] not in STAGES or not parts[1]:
        raise FaultSpecError(f"{ENV}={spec!r}: expected kill-before-commit:<kind>[+<route key>]"
                             "[:<n>] or kill-after-commit:<kind>[+<route key>][:<n>]")
    kind, _, route_key = parts[1].partition("+")
    nth = 1
    if len(parts) == 3:
        if not parts[2].isdigit() or int(parts[2]) < 1:
            raise FaultSpecError(f"{ENV}={spec!r}: <n> must be a positive integer")
        nth = int(parts[2])
    return CommitFault(STAGES[parts[0]], kind, route_key or None, nth)


def from_env() -> CommitFault | None:
    fault = parse(os.environ.get(ENV, ""))
    if fault is not None:
        log.warning("fault injection armed (crash tests only)", fault=os.environ[ENV])
    return fault


SNAPSHOT_ENV = "HUBD_SNAPSHOT_FAULT"


def snapshot_midway():
    """The hook a snapshot write runs halfway (None: no fault)."""
    spec = os.environ.get(SNAPSHOT_ENV, "").strip()
    if not spec:
        return None
    if spec != "kill-midway":
        raise FaultSpecError(f"{SNAPSHOT_ENV}={spec!r}: the only fault is kill-midway")

    def kill() -> None:
        log.warning("fault injected: killing the hub mid-snapshot", fault=spec)
        os.killpg(os.getpgrp(), signal.SIGKILL)
    return kill

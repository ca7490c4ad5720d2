"""The ForwardOutbox's messages (federation/actors/outbox.py).

What the outbox tells the Router (settlements, "still pending" notices, the
peer's retry schedule to journal, roster answers), what others tell it (rows,
the link's events, signs of life, roster requests, resyncs, its own ticks,
all held by its Mailbox), and what a backlog load returns.
"""

from __future__ import annotations

from typing import Awaitable, Callable, NamedTuple

from federation.clock import PeerRetry
from federation.state import PendingForward


# -- what the actor tells the Router

class Settled(NamedTuple):
    item: PendingForward
    state: str  # one of hubd.state.forward_table.SETTLED
    reason: str
    detail: str
    result: dict


class StillPending(NamedTuple):
    item: PendingForward
    why: str


class RetrySchedule(NamedTuple):
    """The peer's retry schedule changed (None: it answers again): journal it."""

    peer: str
    retry: PeerRetry | None


class RosterAnswer(NamedTuple):
    reply_to: int  # the asker's endpoint
    name: str
    type: str  # who_snapshot or error
    text: str
    fields: dict


# -- what others tell the actor

class LinkUp(NamedTuple):
    batching: bool  # the peer takes batched forwards (from its welcome)
    since: float  # monotonic time the link came up


class LinkDown(NamedTuple):
    cause: str
    error: dict | None  # the link's last error: {cause, detail, at}


class Answer(NamedTuple):
    frame: dict


class Rejected(NamedTuple):
    text: str


class PeerAlive(NamedTuple):
    pass


class Roster(NamedTuple):
    reply_to: int
    name: str


class Resync(NamedTuple):
    """The Router rebuilt its state: read the unsettled rows again from the start."""


class Tick(NamedTuple):
    pass


TICK = Tick()


class Backlog(NamedTuple):
    """What a load read: the next unsettled forwards after a seq, in seq
    order; whether that was every one (those not committed yet excepted: the
    Router posts them once they are); and the peer's journaled retry schedule."""

    rows: list[PendingForward]
    complete: bool
    retry: PeerRetry | None


# load(peer, after_seq, limit) -> Backlog
Load = Callable[[str, int, int], Awaitable[Backlog]]

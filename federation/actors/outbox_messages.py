"""The ForwardOutbox's messages and its mailbox (federation/actors/outbox.py).

What the outbox tells the Router (settlements, "still pending" notices, the
peer's retry schedule to journal, roster answers), what others tell it (rows,
the link's events, signs of life, roster requests, resyncs, its own ticks),
what a backlog load returns, and the Mailbox that holds them: bounded, never
blocking a poster.
"""

from __future__ import annotations

import asyncio
from collections import deque
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


class Mailbox:
    """The actor's inbox, bounded, never blocking a poster (the Router, the link).

    Rows past `max_rows` are not kept: only the lowest seq dropped, and the
    actor reads them from the journal. Answers past `max_events` are dropped
    and counted: their forwards time out and go again, and the peer answers
    `duplicate`. A tick or a sign of life already waiting is not queued again
    (the Router reports one per forward it gets from the peer); link
    transitions and resyncs are always kept (a few per reconnect); roster
    requests past the bound are refused."""

    def __init__(self, max_rows: int, max_events: int):
        self.max_rows, self.max_events = max_rows, max_events
        self.rows: list[PendingForward] = []
        self.rows_dropped_from: int | None = None
        self.events: deque = deque()
        self.dropped = {"row": 0, "answer": 0, "roster": 0}
        self._waiting_once: set = set()  # the coalesced kinds queued since the last take
        self._ready = asyncio.Event()

    def post_rows(self, items: list[PendingForward]) -> None:
        room = 0 if self.rows_dropped_from is not None else self.max_rows - len(self.rows)
        if len(items) > room:
            self.dropped["row"] += len(items) - room
            if self.rows_dropped_from is None:
                self.rows_dropped_from = items[room].seq
            items = items[:room]
        self.rows.extend(items)
        self._ready.set()

    def post(self, event) -> bool:
        """False if the event was dropped at the bound (answers, roster requests)."""
        kind = type(event)
        if kind is Tick or kind is PeerAlive:
            if kind in self._waiting_once:
                return True
            self._waiting_once.add(kind)
        elif kind in (Answer, Roster) and len(self.events) >= self.max_events:
            self.dropped["answer" if kind is Answer else "roster"] += 1
            return False
        self.events.append(event)
        self._ready.set()
        return True

    async def wait(self) -> None:
        await self._ready.wait()

    def take(self) -> tuple[list, int | None, deque]:
        rows, dropped_from, events = self.rows, self.rows_dropped_from, self.events
        self.rows, self.rows_dropped_from, self.events = [], None, deque()
        self._waiting_once.clear()
        self._ready.clear()
        return rows, dropped_from, events


class Backlog(NamedTuple):
    """What a load read: the next unsettled forwards after a seq, in seq
    order; whether that was every one (those not committed yet excepted: the
    Router posts them once they are); and the peer's journaled retry schedule."""

    rows: list[PendingForward]
    complete: bool
    retry: PeerRetry | None


# load(peer, after_seq, limit) -> Backlog
Load = Callable[[str, int, int], Awaitable[Backlog]]

"""JournalWriter: owns the SQLite write connection; group commit, then release.

Batches of outcomes arrive from the Router in seq order. Whatever has queued up
while the previous commit ran is committed together in one transaction on the
writer's own thread (sqlite3 releases the GIL while it waits on the disk), and
only then are the outcomes' messages handed to their endpoints, in seq order. That is
commit-before-publish, with one fsync shared by every event in the group.

A failed commit fails every outcome in the group and every later one until the
Router, told about the failure, has rebuilt its state from the journal and sent
a Resync marker. Outcomes without events (replies to reads) still go out.

A row SQLite refuses (a constraint, a value it cannot bind: ROW_ERRORS) is not
a journal failure: the group's outcomes are committed one by one, the one
whose row is refused fails alone (its seqs hold journal_row_refused rows, so
the log stays contiguous), and the Router, told with RowsRefused, rebuilds its
state from the journal. The Router makes every row before it applies the
event (Router.event), so text SQLite cannot store never gets this far.

The writer's vocabulary is here: what the Router hands it (Outcome batches,
Flush, Resync markers), what it tells the Router (JournalFailed,
RowsRefused).
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path
from typing import Callable

import structlog

from hubd import faults
from hubd.core.endpoints import Endpoints
from hubd.core.message import CloseEndpoint, Message
from hubd.core.refusals import CommitFailed
from hubd.journal.store import JournalStore
from hubd.journal.thread import DbThread
from hubd.state.events import refused_row


log = structlog.get_logger("hubd.journal")

QUEUE_BATCHES = 256
MAX_GROUP_EVENTS = 20_000
# what a row can make SQLite (or the binding of its values) refuse, as opposed
# to what stops the journal itself (full disk, I/O error, a damaged file)
ROW_ERRORS = (sqlite3.IntegrityError, sqlite3.DataError, sqlite3.InterfaceError,
              sqlite3.ProgrammingError, ValueError, TypeError, OverflowError)


class Outcome:
    """The result of handling one command.

    `sends` are (destination, item, frame type): a destination is one
    endpoint id or a tuple of them; an item is a core Message, or a
    CloseEndpoint. If committing `events` fails, the `failure` entries go out
    instead of `sends` (a private error to whoever asked); their items are
    usually callables, so the message is built only then. `answers` are
    (reply future, value): each future gets its value once the events are
    committed, or CommitFailed if they are not. `after_release` runs once
    the sends are on their endpoints' queues; `if_failed` instead of it when
    the events could not be committed.
    """

    __slots__ = ("events", "sends", "failure", "answers", "after_release", "if_failed")

    def __init__(self, events=None, sends=None, failure=None,
                 after_release: Callable[[], None] | None = None):
        self.events = events if events is not None else []
        self.sends = sends if sends is not None else []
        self.failure = failure if failure is not None else []
        self.answers: list = []
        self.after_release = after_release
        self.if_failed: Callable[[], None] | None = None


class Resync:
    """Marks the point in the writer's queue after which the Router's state is
    rebuilt from the journal again (end of a failed-commit episode)."""

    __slots__ = ()


class Flush:
    """Resolved once everything queued before it is committed and released."""

    __slots__ = ("done",)

    def __init__(self, done):
        self.done = done


class JournalFailed:
    """For the Router: a commit failed. `recovered`: a commit succeeded since
    the last failure it was told of (its refusal back-off starts short again)."""

    __slots__ = ("error", "recovered")

    def __init__(self, error: BaseException, recovered: bool = True):
        self.error = error
        self.recovered = recovered


class RowsRefused:
    """For the Router: the events of one command were not journaled (their
    rows were refused) though its state applied them."""

    __slots__ = ("principal", "seqs")

    def __init__(self, principal: str | None, seqs: list[int]):
        self.principal, self.seqs = principal, seqs


def release(outcomes: list[Outcome], use_failure: bool, endpoints: Endpoints,
            frames_out: dict, failing: set | None = None) -> None:
    """Hand each outcome's (destination, item, type) sends to their endpoints,
    in order: a destination is one endpoint id or a tuple of them; an item is
    a Message, a callable that builds one (a failure reply, made only when
    needed) or a CloseEndpoint. An id whose endpoint has gone is skipped. An
    outcome with events sends its failure replies instead if use_failure, or
    if it is one of `failing`, and its reply futures get CommitFailed
    instead of their answers."""
    get = endpoints.get
    for outcome in outcomes:
        failed = (use_failure or (failing is not None and outcome in failing)) and outcome.events
        for dest, item, type_ in outcome.failure if failed else outcome.sends:
            if type(item) is not Message:
                if type(item) is CloseEndpoint:
                    for endpoint_id in (dest if type(dest) is tuple else (dest,)):
                        endpoint = get(endpoint_id)
                        if endpoint is not None:
                            endpoint.close(item.code, item.reason)
                    continue
                item = item()
            if type(dest) is tuple:
                for endpoint_id in dest:
                    endpoint = get(endpoint_id)
                    if endpoint is not None:
                        endpoint.deliver(item)
                frames_out[type_] = frames_out.get(type_, 0) + len(dest)
            else:
                endpoint = get(dest)
                if endpoint is not None:
                    endpoint.deliver(item)
                frames_out[type_] = frames_out.get(type_, 0) + 1
        for future, value in outcome.answers:
            if not future.done():
                if failed:
                    future.set_exception(CommitFailed())
                else:
                    future.set_result(value)
        if failed:
            if outcome.if_failed is not None:
                outcome.if_failed()
        elif outcome.after_release is not None:
            outcome.after_release()


class JournalWriter:
    def __init__(self, path: str | Path, metrics, endpoints: Endpoints,
                 on_failure: Callable[[JournalFailed], None]):
        self.path = Path(path)
        self.endpoints = endpoints
        self.inbox: asyncio.Queue = asyncio.Queue(QUEUE_BATCHES)
        self.metrics = metrics
        self._on_failure = on_failure
        # a commit succeeded since the last JournalFailed
        self._recovered = True
        self._thread = DbThread("journal-writer")
        self.store: JournalStore | None = None
        self.failed = False
        self.committed_seq = 0
        self._fault = faults.from_env()  # None unless a crash test armed HUBD_FAULT

    async def call(self, fn, *args):
        """Run fn on the writer thread (the write connection lives there)."""
        return await self._thread.call(fn, *args)

    async def open(self) -> JournalStore:
        self.store = await self.call(JournalStore, self.path)
        self.committed_seq = await self.call(self.store.max_seq)
        return self.store

    async def close(self) -> None:
        if self.store is not None:
            await self.call(self.store.close)
            self.store = None
        self._thread.stop()

    async def run(self) -> None:
        inbox = self.inbox
        while True:
            items = [await inbox.get()]
            while True:
                try:
                    items.append(inbox.get_nowait())
                except asyncio.QueueEmpty:
                    break
            await self._process(items)

    async def _process(self, items: list) -> None:
        group: list[Outcome] = []
        for item in items:
            if isinstance(item, list):
                group.extend(item)
                if sum(len(o.events) for o in group) < MAX_GROUP_EVENTS:
                    continue
            await self._commit(group)
            group = []
            if isinstance(item, Resync):
                self.failed = False
            elif isinstance(item, Flush):
                if not item.done.done():
                    item.done.set_result(self.committed_seq)
        if group:
            await self._commit(group)

    async def _commit(self, group: list[Outcome]) -> None:
        if not group:
            return
        events = [event for outcome in group for event in outcome.events]
        failed = self.failed
        failing = None
        if events and not failed:
            if self._fault is not None:
                self._fault.reached("before", events)
            started = time.perf_counter()
            try:
                # the rows were made on the loop (Router.event), not on the
                # writer's thread, which then needs the GIL only to start and
                # to end the statement
                await self.call(self.store.append, [event.row() for event in events])
            except ROW_ERRORS as exc:
                failing = await self._commit_one_by_one(group, exc)
            except Exception as exc:  # sqlite3.OperationalError, OSError: the disk said no
                failed = True
                self._fail(events, exc)
            else:
                self._committed(events, started)
        release(group, failed, self.endpoints, self.metrics.frames_out, failing)

    async def _commit_one_by_one(self, group: list[Outcome], error: BaseException) -> set:
        """SQLite refused a row of the group: commit each outcome alone, so
        that only one whose own row is refused fails. The outcomes that fail."""
        log.warning("a journal row was refused; committing the group's commands one by one",
                    outcomes=len(group), error=repr(error))
        failing: set = set()
        for outcome in group:
            events = outcome.events
            if not events:
                continue
            if self.failed:  # the journal itself failed on an earlier one
                failing.add(outcome)
                continue
            started = time.perf_counter()
            try:
                await self.call(self.store.append, [event.row() for event in events])
            except ROW_ERRORS as exc:
                failing.add(outcome)
                await self._hold_seqs(events, exc)
            except Exception as exc:
                failing.add(outcome)
                self._fail(events, exc)
            else:
                self._committed(events, started)
        return failing

    async def _hold_seqs(self, events: list, error: BaseException) -> None:
        """The command's rows were refused: journal_row_refused rows keep its
        seqs, and the Router rebuilds the state that applied its events."""
        try:
            await self.call(self.store.append, [refused_row(event, error) for event in events])
        except Exception as exc:
            self._fail(events, exc)
            return
        self.committed_seq = events[-1].seq
        self.metrics.rows_refused += len(events)
        log.error("journal rows refused; their command failed alone", kind=events[0].kind,
                  first_seq=events[0].seq, events=len(events), principal=events[0].principal,
                  error=repr(error))
        self._on_failure(RowsRefused(events[0].principal, [event.seq for event in events]))

    def _fail(self, events: list, exc: BaseException) -> None:
        self.failed = True
        self.metrics.journal_failures += 1
        log.error("journal commit failed; mutations refused until state is rebuilt",
                  events=len(events), first_seq=events[0].seq, error=repr(exc))
        self._on_failure(JournalFailed(exc, self._recovered))
        self._recovered = False

    def _committed(self, events: list, started: float) -> None:
        self.committed_seq = events[-1].seq
        if self._fault is not None:
            self._fault.reached("after", events)
        self.metrics.observe_commit(len(events), time.perf_counter() - started)
        self._recovered = True

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
import queue
import sqlite3
import threading
import time
from pathlib import Path
from typing import Callable

import structlog

from hubd import faults
from hubd.core.endpoints import Endpoints
from hubd.core.message import CloseEndpoint, Message
from hubd.core.refusals import CommitFailed
from hubd.journal.store import JournalStore
from hubd.journal.thread import resolve
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


class _Call:
    """A call of a store method on the writer's thread, in turn with the commits."""

    __slots__ = ("fn", "args", "future")

    def __init__(self, fn, args, future):
        self.fn, self.args, self.future = fn, args, future


_STOP = object()


class WriterThreadStopped(RuntimeError):
    """The writer's thread has ended (a bug, or the hub is closing): nothing
    more runs on the write connection."""


class JournalWriter:
    """Two halves. The loop half (`run`) hands each batch from the Router to the
    thread half at once, and releases what the thread reports committed. The
    thread half commits whatever has queued up while its last commit ran, and
    starts the next commit as soon as one returns: it never waits for the event
    loop to release the last group first. One hand-off in per drain of the
    inbox, one report out per group; release stays in seq order because the reports are
    made, and run, in the order of the commits."""

    def __init__(self, path: str | Path, metrics, endpoints: Endpoints,
                 on_failure: Callable[[JournalFailed], None]):
        self.path = Path(path)
        self.endpoints = endpoints
        self.inbox: asyncio.Queue = asyncio.Queue(QUEUE_BATCHES)
        self.metrics = metrics
        self._on_failure = on_failure
        # a commit succeeded since the last JournalFailed
        self._recovered = True
        self.store: JournalStore | None = None
        self.committed_seq = 0
        self._fault = faults.from_env()  # None unless a crash test armed HUBD_FAULT
        self._loop: asyncio.AbstractEventLoop | None = None
        # batches and markers handed to the thread and not yet reported back:
        # below 2 x QUEUE_BATCHES (a hand-off takes what the inbox holds), so
        # a slow disk holds the Router up at the inbox
        self._in_flight = 0
        self._space = asyncio.Event()  # set when _in_flight drops below the bound
        self._task: asyncio.Task | None = None
        self._death: BaseException | None = None
        # the thread's own: a commit failed and no Resync came since
        self._failed = False
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        # what ended the thread, if it ended otherwise than by close(); set
        # and read under the lock with the queue, so no call is put behind it
        self._jobs_lock = threading.Lock()
        self._thread_error: BaseException | None = None
        self._taken: list = []  # what the thread took from the queue last
        self._thread = threading.Thread(target=self._work, name="journal-writer", daemon=True)
        self._thread.start()

    # -- the loop half

    def call(self, fn, *args) -> asyncio.Future:
        """Run fn on the writer thread (the write connection lives there), after
        what was handed to it before. WriterThreadStopped once it has ended."""
        loop = self._loop = asyncio.get_running_loop()
        future = loop.create_future()
        with self._jobs_lock:
            if self._thread_error is not None:
                raise WriterThreadStopped("the journal writer's thread has ended") \
                    from self._thread_error
            self._jobs.put(_Call(fn, args, future))
        return future

    async def open(self) -> JournalStore:
        self.store = await self.call(JournalStore, self.path)
        self.committed_seq = await self.call(self.store.max_seq)
        return self.store

    async def close(self) -> None:
        """Close the write connection and end the thread. A thread that died
        took the connection with it: then there is nothing left to close."""
        store, self.store = self.store, None
        if store is not None:
            try:
                await self.call(store.close)
            except WriterThreadStopped:
                pass
        with self._jobs_lock:
            if self._thread_error is None:
                self._jobs.put(_STOP)
        self._thread.join()

    async def run(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.current_task()
        inbox, jobs = self.inbox, self._jobs
        try:
            while True:
                items = [await inbox.get()]
                while not inbox.empty():
                    items.append(inbox.get_nowait())
                while self._in_flight >= QUEUE_BATCHES:
                    self._space.clear()
                    await self._space.wait()
                self._in_flight += len(items)
                jobs.put(tuple(items))  # one hand-off for all that was waiting
        except asyncio.CancelledError:
            if self._death is not None:
                raise RuntimeError("the journal writer stopped") from self._death
            raise

    def _reported(self, group: list[Outcome], jobs: int, failed: bool, failing: set | None,
                  notices: list, flushes: list) -> None:
        """On the loop: what the thread did with one group (and the Flush
        markers right behind it), in commit order. A failure here is the
        writer's: it stops the hub, as it would inside `run`."""
        try:
            for notice, *args in notices:
                notice(*args)
            if group:
                release(group, failed, self.endpoints, self.metrics.frames_out, failing)
            for flush in flushes:
                if not flush.done.done():
                    flush.done.set_result(self.committed_seq)
        except BaseException as exc:
            self._stopped(exc, "releasing a committed group failed")
            raise
        finally:
            self._in_flight -= jobs
            if self._in_flight < QUEUE_BATCHES:
                self._space.set()

    # what the thread noted of a group, told on the loop (_reported)

    def _was_committed(self, seq: int, events: int, seconds: float) -> None:
        self.committed_seq = seq
        self.metrics.observe_commit(events, seconds)
        self._recovered = True

    def _commit_failed(self, exc: BaseException, events: int, first_seq: int) -> None:
        self.metrics.journal_failures += 1
        log.error("journal commit failed; mutations refused until state is rebuilt",
                  events=events, first_seq=first_seq, error=repr(exc))
        self._on_failure(JournalFailed(exc, self._recovered))
        self._recovered = False

    def _rows_were_refused(self, seq: int, kind: str, principal: str | None, seqs: list,
                           error: BaseException) -> None:
        self.committed_seq = seq
        self.metrics.rows_refused += len(seqs)
        log.error("journal rows refused; their command failed alone", kind=kind,
                  first_seq=seqs[0], events=len(seqs), principal=principal, error=repr(error))
        self._on_failure(RowsRefused(principal, seqs))

    def _stopped(self, exc: BaseException, what: str) -> None:
        """The writer cannot go on: `run` ends with this error (the hub stops)."""
        if self._death is None:
            self._death = exc
            log.error(what, error=repr(exc))
        if self._task is not None:
            self._task.cancel()

    # -- the thread half

    def _report(self, fn, *args) -> None:
        self._loop.call_soon_threadsafe(fn, *args)

    def _work(self) -> None:
        try:
            self._serve()
        except BaseException as exc:
            # no call may wait for this thread from now on: the queued ones
            # fail, later ones are refused (call)
            with self._jobs_lock:
                self._thread_error = exc
                left = list(self._taken)
                while not self._jobs.empty():
                    left.append(self._jobs.get_nowait())
            if self._loop is not None and not self._loop.is_closed():
                for job in left:
                    if type(job) is _Call and job.future is not None:
                        self._report(resolve, job.future, False,
                                     WriterThreadStopped("the journal writer's thread has ended"))
                self._report(self._stopped, exc, "the journal writer's thread stopped")
            raise

    def _serve(self) -> None:
        jobs = self._jobs
        while True:
            items: list = []
            while True:  # a hand-off from `run` is a tuple of inbox items
                job = jobs.get()
                if type(job) is tuple:
                    items += job
                else:
                    items.append(job)
                if jobs.empty():
                    break
            self._taken = items
            group: list[Outcome] = []
            events = handed = 0
            flushes: list[Flush] = []
            for item in items:
                if type(item) is list:
                    if flushes:
                        self._commit(group, handed, flushes)
                        group, events, handed, flushes = [], 0, 0, []
                    group.extend(item)
                    handed += 1
                    events += sum(len(outcome.events) for outcome in item)
                    if events >= MAX_GROUP_EVENTS:
                        self._commit(group, handed, flushes)
                        group, events, handed = [], 0, 0
                    continue
                if type(item) is Flush:
                    flushes.append(item)
                    handed += 1
                    continue
                if group or flushes:
                    self._commit(group, handed, flushes)
                    group, events, handed, flushes = [], 0, 0, []
                if item is _STOP:
                    return
                if type(item) is Resync:
                    self._failed = False
                    self._report(self._reported, [], 1, False, None, [], [])
                else:
                    self._run_call(item)
            if group or flushes:
                self._commit(group, handed, flushes)

    def _run_call(self, call: _Call) -> None:
        future, call.future = call.future, None  # answered (see _work)
        try:
            result = call.fn(*call.args)
        except BaseException as exc:  # handed to the awaiting coroutine
            self._report(resolve, future, False, exc)
        else:
            self._report(resolve, future, True, result)

    def _commit(self, group: list[Outcome], handed: int, flushes: list) -> None:
        events = [event for outcome in group for event in outcome.events]
        failed = self._failed
        failing = None
        notices: list = []
        if events and not failed:
            if self._fault is not None:
                self._fault.reached("before", events)
            started = time.perf_counter()
            try:
                # the rows were made on the loop (Router.event): here they are
                # only read
                self.store.append([event.row() for event in events])
            except ROW_ERRORS as exc:
                failing = self._commit_one_by_one(group, exc, notices)
            except Exception as exc:  # sqlite3.OperationalError, OSError: the disk said no
                failed = True
                self._fail(events, exc, notices)
            else:
                self._committed(events, started, notices)
        self._report(self._reported, group, handed, failed, failing, notices, flushes)

    def _commit_one_by_one(self, group: list[Outcome], error: BaseException,
                           notices: list) -> set:
        """SQLite refused a row of the group: commit each outcome alone, so
        that only one whose own row is refused fails. The outcomes that fail."""
        log.warning("a journal row was refused; committing the group's commands one by one",
                    outcomes=len(group), error=repr(error))
        failing: set = set()
        for outcome in group:
            events = outcome.events
            if not events:
                continue
            if self._failed:  # the journal itself failed on an earlier one
                failing.add(outcome)
                continue
            started = time.perf_counter()
            try:
                self.store.append([event.row() for event in events])
            except ROW_ERRORS as exc:
                failing.add(outcome)
                self._hold_seqs(events, exc, notices)
            except Exception as exc:
                failing.add(outcome)
                self._fail(events, exc, notices)
            else:
                self._committed(events, started, notices)
        return failing

    def _hold_seqs(self, events: list, error: BaseException, notices: list) -> None:
        """The command's rows were refused: journal_row_refused rows keep its
        seqs, and the Router rebuilds the state that applied its events."""
        try:
            self.store.append([refused_row(event, error) for event in events])
        except Exception as exc:
            self._fail(events, exc, notices)
            return
        notices.append((self._rows_were_refused, events[-1].seq, events[0].kind, events[0].principal,
                        [event.seq for event in events], error))

    def _fail(self, events: list, exc: BaseException, notices: list) -> None:
        self._failed = True
        notices.append((self._commit_failed, exc, len(events), events[0].seq))

    def _committed(self, events: list, started: float, notices: list) -> None:
        if self._fault is not None:
            self._fault.reached("after", events)
        notices.append((self._was_committed, events[-1].seq, len(events),
                        time.perf_counter() - started))


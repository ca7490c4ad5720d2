"""The JournalWriter's two halves on a real SQLite file and its real thread:
the thread starts the next commit as soon as one returns, without waiting for
the event loop to release the last group; release stays in commit order; a
failure on the loop's side of the writer stops it loudly."""

import asyncio
import contextlib
import sqlite3
import threading
import time

import pytest

from hubd.actors.journal_writer import Flush, JournalWriter, Outcome, WriterThreadStopped
from hubd.core.endpoints import Endpoints
from hubd.core.message import Message
from hubd.metrics import HubMetrics
from hubd.state.events import Event


class Recorder:
    def __init__(self, endpoint_id):
        self.id = endpoint_id
        self.got: list[str] = []

    def deliver(self, message):
        self.got.append(message.frame["text"])

    def close(self, code, reason):
        pass


def outcome(seq: int, to: int, text: str) -> Outcome:
    event = Event(seq, time.time(), "chat", {"type": "chat", "text": text})
    event.row()
    frame = {"type": "chat", "text": text}
    return Outcome(events=[event], sends=[(to, Message(frame, b"{}"), "chat")])


def rows(db) -> list[int]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return [seq for (seq,) in conn.execute("SELECT seq FROM events ORDER BY seq")]
    finally:
        conn.close()


@contextlib.asynccontextmanager
async def running_writer(db, *endpoints):
    known = Endpoints()
    for endpoint in endpoints:
        known.add(endpoint)
    writer = JournalWriter(db, HubMetrics(), known, on_failure=lambda failure: None)
    await writer.open()
    task = asyncio.create_task(writer.run())
    try:
        yield writer, task
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await writer.close()


async def handed_over(writer) -> None:
    """Until the writer's loop half has handed its inbox to the thread."""
    for _ in range(100):
        if writer.inbox.empty():
            return
        await asyncio.sleep(0)


async def test_the_next_commit_does_not_wait_for_the_loop_to_release_the_last(tmp_path):
    db = tmp_path / "j.db"
    bob = Recorder(7)
    first, second = threading.Event(), threading.Event()
    async with running_writer(db, bob) as (writer, _):
        # the thread's queue: hold, batch 1, hold, batch 2: two groups
        held = writer.call(first.wait)
        await writer.inbox.put([outcome(1, 7, "one")])
        await handed_over(writer)
        held_again = writer.call(second.wait)
        await writer.inbox.put([outcome(2, 7, "two")])
        await handed_over(writer)
        # the loop is held from here on (no await): nothing can be released
        first.set()
        second.set()
        deadline = time.monotonic() + 10
        while rows(db) != [1, 2] and time.monotonic() < deadline:
            time.sleep(0.005)
        assert rows(db) == [1, 2], "the second group was not committed while the loop was held"
        assert bob.got == []
        await held
        await held_again
        done = asyncio.get_running_loop().create_future()
        await writer.inbox.put(Flush(done))
        assert await asyncio.wait_for(done, 10) == 2
        assert bob.got == ["one", "two"]


async def test_release_follows_commit_order_across_many_groups(tmp_path):
    db = tmp_path / "j.db"
    bob = Recorder(7)
    async with running_writer(db, bob) as (writer, _):
        for seq in range(1, 301):
            await writer.inbox.put([outcome(seq, 7, str(seq))])
            if seq % 7 == 0:
                await asyncio.sleep(0)
        done = asyncio.get_running_loop().create_future()
        await writer.inbox.put(Flush(done))
        assert await asyncio.wait_for(done, 20) == 300
        assert bob.got == [str(seq) for seq in range(1, 301)]
        assert rows(db) == list(range(1, 301))


async def test_a_failing_release_stops_the_writer_with_its_error(tmp_path):
    class Broken(Recorder):
        def deliver(self, message):
            raise KeyError("a bug in a door")

    async with running_writer(tmp_path / "j.db", Broken(7)) as (writer, task):
        await writer.inbox.put([outcome(1, 7, "one")])
        with pytest.raises(RuntimeError, match="journal writer stopped") as caught:
            await asyncio.wait_for(task, 10)
        assert isinstance(caught.value.__cause__, KeyError)


# the thread's SystemExit is re-raised there on purpose (threading reports it)
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
async def test_a_dead_writer_thread_stops_the_writer_and_nothing_waits_for_it(tmp_path):
    """What a bug on the writer's thread leaves: run ends with its cause, calls
    already queued and calls made later fail at once, and close() returns
    (a hub closing after such a failure used to wait for it for ever)."""

    class Broken:
        def append(self, rows):
            raise SystemExit("a bug past the writer's handlers")

        def close(self):
            raise AssertionError("not called: the connection went with its thread")

    async with running_writer(tmp_path / "j.db") as (writer, task):
        real = writer.store
        writer.store = Broken()
        hold = threading.Event()
        held = writer.call(hold.wait)
        await writer.inbox.put([outcome(1, 7, "one")])
        await handed_over(writer)
        queued = writer.call(int, "5")  # behind the batch that kills the thread
        hold.set()
        await held
        with pytest.raises(RuntimeError, match="journal writer stopped") as caught:
            await asyncio.wait_for(task, 10)
        assert isinstance(caught.value.__cause__, SystemExit)
        with pytest.raises(WriterThreadStopped):
            await asyncio.wait_for(queued, 10)
        with pytest.raises(WriterThreadStopped):
            writer.call(int, "6")
        await asyncio.wait_for(writer.close(), 10)
        real.close()  # the test's own: the writer no longer can

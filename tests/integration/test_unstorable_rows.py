"""A row that cannot be stored fails only its own command, never the batch it
shares a commit with, nor the hub's writes after it (issue 30.1, the journal
half), on real hubs and real SQLite files.

Text that is not valid UTF-8 (a lone surrogate) is caught on the loop, before
the event is applied: its sender gets a typed error and nothing is replayed.
A row SQLite itself refuses at commit (here: longer than the connection's
SQLITE_LIMIT_LENGTH) fails its command alone; its seq keeps a
journal_row_refused row, so the log stays contiguous. The doors' own
refusals of such text come first in production; these tests reach the
journal anyway (a verb of the test's own lets the text through, as the
REDSYN door's JSON parser did, and the REDSYN door's own path).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import threading
from concurrent.futures import ThreadPoolExecutor

from tests.support.inproc import flushed as committed
from tests.support.inproc import running_hub
from tests.support.procs import hubd_process
from tests.support.redsyn_client import Client, login
from tests.support.wsprobe import joined

SURROGATE = "\ud800"


@contextlib.asynccontextmanager
async def writer_held(server):
    """Hold the journal writer's thread: what the Router decides meanwhile
    queues up and is committed as one group once it lets go."""
    hold = threading.Event()
    blocked = server.hub.writer.call(hold.wait)
    try:
        yield
    finally:
        hold.set()
        await blocked


async def handled(server, **frames: int) -> None:
    """Until the door has passed on `frames` (type=count) and the Router has
    decided them (its inbox is empty; its rounds do not pause midway)."""
    counts, router = server.hub.metrics.frames_in, server.hub.router
    for _ in range(1000):
        if all(counts.get(t, 0) >= n for t, n in frames.items()) and router.inbox.empty():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"frames {frames} not handled; counted {counts}")


def journal(db) -> list[tuple]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return conn.execute("SELECT seq, kind, payload FROM events ORDER BY seq").fetchall()
    finally:
        conn.close()


async def test_text_the_journal_cannot_store_fails_only_its_own_command(tmp_path, monkeypatch):
    def unvalidated_chat(router, session, frame, size):
        # a door that lets a lone surrogate through to the chat handler
        router.handlers["chat"](router, session, dict(frame, type="chat",
                                                      payload=frame["payload"] + SURROGATE),
                                size)

    async with running_hub(tmp_path) as server:
        monkeypatch.setitem(server.hub.router.handlers, "test_unvalidated_chat",
                            unvalidated_chat)
        carol = await joined(server.url, "p/carol")
        alice = await joined(server.url, "p/alice")
        mallory = await joined(server.url, "p/mallory")
        bob = await joined(server.url, "p/bob")
        async with writer_held(server):
            await carol.chat("p/carol", "all", "first")  # its commit waits for the writer
            await handled(server, chat=1)
            # at the same moment: mallory's unstorable chat and alice's good one
            await mallory.send_json({"sender": "p/mallory", "type": "test_unvalidated_chat",
                                     "target": "all", "payload": "bad", "client_msg_id": "m1"})
            await alice.chat("p/alice", "all", "good", client_msg_id="a1")
            await handled(server, chat=2, test_unvalidated_chat=1)
        refused = await mallory.recv_type("error")
        assert refused["error_code"] == "unstorable_event", refused
        assert "surrogates not allowed" in refused["payload"]
        assert (await bob.recv_type("chat", payload="good"))["client_msg_id"] == "a1"
        # the hub's writes after it go on, mallory's socket too
        await alice.chat("p/alice", "all", "after", client_msg_id="a2")
        await bob.recv_type("chat", payload="after")
        await mallory.chat("p/mallory", "all", "valid now")
        await bob.recv_type("chat", payload="valid now")
        assert [f["payload"] for f in bob.seen("chat")] == ["first", "good", "after",
                                                            "valid now"]
        await committed(server)
        assert [(kind, json.loads(p)["payload"]) for _, kind, p in journal(server.config.db)] \
            == [("chat", "first"), ("chat", "good"), ("chat", "after"), ("chat", "valid now")]
        metrics = server.hub.metrics
        assert metrics.unstorable_events == 1 and metrics.journal_failures == 0
        assert metrics.state_rebuilds == {} and metrics.handler_crashes == 0
        assert await server.hub.load_state() == server.hub.router.state
        for probe in (carol, alice, mallory, bob):
            await probe.close()


async def test_a_row_sqlite_refuses_fails_only_its_own_command(tmp_path):
    async with running_hub(tmp_path) as server:
        writer = server.hub.writer
        # any value longer than 4 KiB is now "string or blob too big" to SQLite
        await writer.call(writer.store.conn.setlimit, sqlite3.SQLITE_LIMIT_LENGTH, 4096)
        carol = await joined(server.url, "p/carol")
        alice = await joined(server.url, "p/alice")
        mallory = await joined(server.url, "p/mallory")
        bob = await joined(server.url, "p/bob")
        async with writer_held(server):
            await carol.chat("p/carol", "all", "first")
            await handled(server, chat=1)
            await mallory.chat("p/mallory", "all", "x" * 8000, client_msg_id="m1")
            await alice.chat("p/alice", "all", "good", client_msg_id="a1")
            await handled(server, chat=3)
        failed = await mallory.recv_type("error", client_msg_id="m1")
        assert "not journalled" in failed["payload"]
        await bob.recv_type("chat", payload="good")
        await alice.chat("p/alice", "all", "after", client_msg_id="a2")
        await bob.recv_type("chat", payload="after")
        assert [f["payload"] for f in bob.seen("chat")] == ["first", "good", "after"]
        await committed(server)
        rows = journal(server.config.db)
        # contiguous: the refused chat's seq holds what became of it
        assert [seq for seq, _, _ in rows] == list(range(1, len(rows) + 1))
        refused = [(seq, json.loads(p)) for seq, kind, p in rows if kind == "journal_row_refused"]
        assert len(refused) == 1 and refused[0][1]["kind"] == "chat"
        assert "too big" in refused[0][1]["error"]
        texts = [json.loads(p)["payload"] for _, kind, p in rows if kind == "chat"]
        assert texts == ["first", "good", "after"]
        metrics = server.hub.metrics
        assert metrics.rows_refused == 1 and metrics.journal_failures == 0
        assert metrics.state_rebuilds == {"row_refused": 1}
        assert await server.hub.load_state() == server.hub.router.state
        for probe in (carol, alice, mallory, bob):
            await probe.close()


def test_a_redsyn_write_with_a_lone_surrogate_stops_no_other_write(tmp_path):
    """The issue's own reproduction, over real HTTP to a hubd process: joel's
    announce carries a lone surrogate while ana writes at the same moment."""
    db = tmp_path / "hubd.db"
    joel = login(db, "acme/dev/joel", "laptop")
    ana = login(db, "acme/dev/ana", "laptop")
    hub = hubd_process(tmp_path, db=db).start()
    try:
        joel_client, ana_client = Client(hub.http_url, joel), Client(hub.http_url, ana)

        def good(i):
            return ana_client.announce(f"acme/dev/ana/s{i}", description=f"fine {i}").status

        with ThreadPoolExecutor(9) as pool:
            goods = [pool.submit(good, i) for i in range(8)]
            bad = pool.submit(joel_client.announce, "acme/dev/joel/s", description=SURROGATE)
            statuses = [f.result() for f in goods]
            answer = bad.result()
        assert answer.status == 400, answer.body
        assert statuses == [200] * 8
        # and the writes after it: nobody is refused for a while
        assert ana_client.announce("acme/dev/ana/after").status == 200
        assert joel_client.announce("acme/dev/joel/s", description="plain").status == 200
        metrics = hub.get_text("/metrics")
        assert "hubd_journal_commit_failures_total 0.0" in metrics
        # the door's wire layer refuses the text before any row is made (its
        # 400 names the escape); the journal's own refusal is the other tests'
        assert "hubd_unstorable_events_total 0.0" in metrics
        assert b"surrogate" in answer.body, answer.body
    finally:
        hub.stop()
    assert SURROGATE.encode("utf-8", "surrogatepass") not in db.read_bytes()

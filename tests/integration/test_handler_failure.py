"""A handler that fails must not cost a replay of the whole history (issue
22.2): on a real hub (in-process: actors, listener, SQLite) with a journal of
many events, the fault planted as a verb of the test's own. A command that
failed before it applied anything leaves no trace and replays nothing; one
that failed mid-mutation is undone by one rebuild; and one principal cannot
keep the hub replaying. Every time, the live state equals a replay from zero.

Replays are counted, not timed: hubd_journal_replayed_events_total grows by
the journal's length on every replay, and hubd_state_rebuilds_total says why.
"""

from __future__ import annotations

import aiohttp

from hubd.journal.store import JournalStore
from hubd.state import events as ev
from hubd.state.events import Event
from tests.support.inproc import running_hub
from tests.support.seats import online
from tests.support.wsprobe import joined

HISTORY = 20_000  # chats already in the journal when the hub starts


def write_history(db, events: int = HISTORY) -> None:
    """A journal of `events` broadcast chats, as a hub would have written them."""
    store = JournalStore(db)
    try:
        store.set_meta("hub_id", "test-hub")
        rows = []
        for seq in range(1, events + 1):
            frame = {"type": "chat", "sender": "p/old", "target": "all",
                     "payload": f"old chat {seq}", "timestamp": 1.0e9 + seq,
                     "hub_id": "test-hub", "msg_id": seq, "seq": seq}
            rows.append(Event(seq, 1.0e9 + seq, ev.CHAT, frame, {"recipients": []},
                              principal="open-host:127.0.0.1").row())
        store.append(rows)
    finally:
        store.close()


async def scrape(server) -> str:
    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://127.0.0.1:{server.port}/metrics") as response:
            return await response.text()


def sample(text: str, name: str) -> float:
    """The value of an unlabelled series in a /metrics page (0 if absent)."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


async def replays_from_zero(server) -> None:
    """The live state is what a replay of the whole journal makes."""
    assert await server.hub.load_state(use_snapshots=False) == server.hub.router.state


async def test_a_command_that_fails_before_applying_anything_replays_nothing(
        tmp_path, monkeypatch):
    write_history(tmp_path / "hub.db")

    def explode(router, session, frame, size):
        router.reply(session, "system", "half an answer")  # dropped with the command
        raise RuntimeError("bug in a handler, before any event")

    async with running_hub(tmp_path, allow_crashes=True) as server:
        monkeypatch.setitem(server.hub.router.handlers, "test_explode", explode)
        before = await scrape(server)
        assert sample(before, "hubd_journal_replayed_events_total") == HISTORY  # the start
        bystander = await joined(server.url, "p/bystander")
        victim = await joined(server.url, "p/victim")
        await victim.send_json({"sender": "p/victim", "type": "test_explode"})
        assert (await victim.wait_closed()).code == 1011
        assert victim.seen("system") == []  # its output went with it
        await bystander.chat("p/bystander", "all", "after")
        after = await bystander.recv_type("chat", payload="after")
        assert after["seq"] == HISTORY + 1
        metrics = await scrape(server)
        assert sample(metrics, "hubd_handler_crashes_total") == 1
        assert sample(metrics, "hubd_journal_replayed_events_total") == HISTORY
        assert "hubd_state_rebuilds_total{" not in metrics
        await replays_from_zero(server)
        await bystander.close()


async def test_an_applier_that_fails_midway_is_undone_by_one_rebuild(tmp_path, monkeypatch):
    write_history(tmp_path / "hub.db")

    def half_applied(state, event):
        # a bug in an applier: it changed the projection, then raised
        state.chat.dead_letters.record("p/ghost", event.payload["by"], event.ts)
        raise TypeError("unhashable type: 'list'")

    def explode(router, session, frame, size):
        router.event("test_half", {"by": session.name})

    async with running_hub(tmp_path, allow_crashes=True) as server:
        monkeypatch.setitem(server.hub.installed.appliers, "test_half", (half_applied,))
        monkeypatch.setitem(server.hub.router.handlers, "test_explode", explode)
        bystander = await joined(server.url, "p/bystander")
        victim = await joined(server.url, "p/victim")
        await victim.send_json({"sender": "p/victim", "type": "test_explode"})
        assert (await victim.wait_closed()).code == 1011
        await bystander.chat("p/bystander", "all", "after")
        assert (await bystander.recv_type("chat", payload="after"))["seq"] == HISTORY + 1
        # the event never made it into the journal, but its applier had run:
        # one replay takes the half-applied change back out
        assert server.hub.router.state.chat.dead_letters.listing() == []
        metrics = await scrape(server)
        assert 'hubd_state_rebuilds_total{reason="handler_failure"} 1.0' in metrics
        assert sample(metrics, "hubd_journal_replayed_events_total") == 2 * HISTORY
        await replays_from_zero(server)
        await bystander.close()


async def test_a_rebuild_replays_only_the_rows_after_the_newest_snapshot(tmp_path, monkeypatch):
    """Issue 29: the rebuild after a handler failure starts from the newest
    snapshot (written here by the code the hub's snapshot worker runs)."""
    import asyncio

    from hubd.journal.restore import take

    write_history(tmp_path / "hub.db")

    def explode(router, session, frame, size):
        router.event(ev.MAILBOX_WATERMARK, {"identity": session.name, "seq": 0})
        raise RuntimeError("bug in a handler, after an event")

    async with running_hub(tmp_path, allow_crashes=True) as server:
        hub = server.hub
        monkeypatch.setitem(hub.router.handlers, "test_explode", explode)
        taken = await asyncio.to_thread(take, hub.config.db, hub.fresh_state,
                                        hub.snapshot_policy, 2)
        assert taken.seq == HISTORY
        bystander = await joined(server.url, "p/bystander")
        victim = await joined(server.url, "p/victim")
        await bystander.chat("p/bystander", "all", "before")  # the tail: one row
        await bystander.recv_type("chat", payload="before")
        await victim.send_json({"sender": "p/victim", "type": "test_explode"})
        assert (await victim.wait_closed()).code == 1011
        await bystander.chat("p/bystander", "all", "after")
        assert (await bystander.recv_type("chat", payload="after"))["seq"] == HISTORY + 2
        metrics = await scrape(server)
        assert 'hubd_state_rebuilds_total{reason="handler_failure"} 1.0' in metrics
        assert hub.projected.from_snapshot == HISTORY and hub.projected.applied == 1
        assert sample(metrics, "hubd_journal_replayed_events_total") == HISTORY + 1
        await replays_from_zero(server)
        await bystander.close()


async def test_one_principal_cannot_keep_the_hub_replaying(tmp_path, monkeypatch):
    from hubd.journal import principals as store

    db = tmp_path / "hub.db"
    write_history(db)
    tokens = {}
    for name in ("alice", "mallory"):
        store.add(db, name, [f"p/{name}"])
        tokens[name] = store.new_token(db, name, "laptop")

    def explode(router, session, frame, size):
        # one event applied, then a bug: only a replay can take it back
        router.event(ev.MAILBOX_WATERMARK, {"identity": session.name, "seq": 0})
        raise RuntimeError("bug in a handler, after an event")

    async with running_hub(tmp_path, allow_crashes=True) as server:
        monkeypatch.setitem(server.hub.router.handlers, "test_explode", explode)
        alice = await online(server.url, "p/alice", tokens["alice"])
        for attempt in range(2):
            # the first failure is forgiven; the second costs mallory her changes for
            # 20 times its rebuild (seconds here: 20,000 events), so the rest are
            # refused, typed and privately, on a socket that stays open
            mallory = await online(server.url, "p/mallory", tokens["mallory"])
            await mallory.send_json({"sender": "p/mallory", "type": "test_explode"})
            assert (await mallory.wait_closed()).code == 1011
        mallory = await online(server.url, "p/mallory", tokens["mallory"])
        for attempt in range(3):
            await mallory.send_json({"sender": "p/mallory", "type": "test_explode"})
            refused = await mallory.recv_type("error")
            assert refused["error_code"] == "mutations_suspended", refused
            assert "principal mallory" in refused["payload"]
        await mallory.chat("p/mallory", "all", "may I?")
        assert (await mallory.recv_type("error"))["error_code"] == "mutations_suspended"
        # her reads still work; everyone else's writes too
        await mallory.send_json({"sender": "p/mallory", "type": "who_request",
                                 "target": "System"})
        assert "p/alice" in (await mallory.recv_type("who_snapshot"))["online_agents"]
        await alice.chat("p/alice", "all", "still here")
        got = await alice.recv_type("chat", payload="still here")
        assert got["seq"] == HISTORY + 1
        metrics = await scrape(server)
        assert 'hubd_state_rebuilds_total{reason="handler_failure"} 2.0' in metrics
        assert sample(metrics, "hubd_journal_replayed_events_total") == 3 * HISTORY
        assert sample(metrics, "hubd_mutation_suspensions_total") == 1
        assert sample(metrics, "hubd_mutations_suspended") == 1
        assert sample(metrics, "hubd_handler_crashes_total") == 2
        await replays_from_zero(server)
        await mallory.close()
        await alice.close()

"""Dead-letter escalation over a real hub process (docs/dead-letters.md): off
unless a threshold is set; with one, every connected agent is told once per
target per window, the escalation is journaled, its window survives a
restart, a reconnect of the target starts a new episode; a chat that matched
only stale seats, or whose every write failed, is a dead letter too; bad
flags stop the hub before it serves anything. The failed-write test runs the
hub in process (it reads the endpoint's write state to know the socket is
stalled)."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import subprocess
import sys

import pytest

from hubd.timing import Timing
from tests.support.inproc import running_hub
from tests.support.procs import free_port, hubd_process
from tests.support.rawws import RawWs, text
from tests.support.wsprobe import WsProbe

ESCALATION = "dead_letter_escalation"


async def joined(url: str, name: str) -> WsProbe:
    probe = await WsProbe.open(url)
    await probe.recv_type("welcome")
    await probe.register(name)
    await probe.recv_type("presence_update", agent=name)
    return probe


async def settled(probe: WsProbe, name: str) -> None:
    """Everything the hub sent `probe` before now has arrived: the answer to a
    later request comes after it on the same socket (no waiting on a clock)."""
    await probe.send_json({"sender": name, "target": "System", "type": "who_request"})
    await probe.recv_type("who_snapshot")


def rows(db, kind: str) -> list[dict]:
    conn = sqlite3.connect(db)
    try:
        found = conn.execute("SELECT payload FROM events WHERE kind = ? ORDER BY seq",
                             (kind,)).fetchall()
    finally:
        conn.close()
    return [json.loads(payload) for (payload,) in found]


async def test_off_unless_a_threshold_is_set(tmp_path):
    hub = hubd_process(tmp_path).start()
    try:
        alice = await joined(hub.url, "p/alice")
        for i in range(4):
            await alice.chat("p/alice", "p/ghost", f"m{i}")
        await settled(alice, "p/alice")
        assert alice.seen(ESCALATION) == []
        assert hub.metric("hubd_dead_letters_total") == 4
        assert hub.metric("hubd_dead_letter_escalations_total") == 0
        await alice.close()
    finally:
        hub.stop()
    assert rows(tmp_path / "hubd.db", ESCALATION) == []


async def test_window_zero_escalates_at_each_multiple_like_the_reference(tmp_path):
    hub = hubd_process(tmp_path, "--dead-letter-escalation-threshold", "2",
                       "--dead-letter-escalation-window", "0").start()
    try:
        alice = await joined(hub.url, "p/alice")
        bob = await joined(hub.url, "p/bob")
        for i in range(5):
            await alice.chat("p/alice", "p/ghost", f"m{i}")
        await settled(alice, "p/alice")
        await settled(bob, "p/bob")
        for probe in (alice, bob):  # every connected agent is told, the sender too
            told = probe.seen(ESCALATION)
            assert [f["escalation_count"] for f in told] == [2, 4]
            first = told[0]
            assert first["target"] == "all" and first["escalation_target"] == "p/ghost"
            assert first["last_sender"] == "p/alice"
            assert first["payload"] == (
                "dead-letter escalation: 2 directed messages to 'p/ghost' have reached no live "
                "connection (most recent from 'p/alice'); nobody is draining that name")
        await alice.close()
        await bob.close()
    finally:
        hub.stop()
    assert [(r["target"], r["count"], r["threshold"]) for r in
            rows(tmp_path / "hubd.db", ESCALATION)] == [("p/ghost", 2, 2), ("p/ghost", 4, 2)]


async def test_once_per_target_per_window_across_a_restart_and_per_episode(tmp_path):
    flags = ("--dead-letter-escalation-threshold", "2", "--dead-letter-escalation-window",
             "3600")
    db = tmp_path / "hubd.db"
    hub = hubd_process(tmp_path, *flags, db=db).start()
    try:
        alice = await joined(hub.url, "p/alice")
        for i in range(5):
            await alice.chat("p/alice", "p/ghost", f"m{i}")
        await alice.chat("p/alice", "p/other", "x")  # another target has its own count
        await alice.chat("p/alice", "p/other", "y")
        await settled(alice, "p/alice")
        told = [(f["escalation_target"], f["escalation_count"]) for f in alice.seen(ESCALATION)]
        assert told == [("p/ghost", 2), ("p/other", 2)]
        assert hub.metric("hubd_dead_letter_escalations_suppressed_total") == 1  # p/ghost at 4
        await alice.close()
    finally:
        hub.stop()

    # the window is the journal's: a restarted hub still holds p/ghost back
    hub = hubd_process(tmp_path, *flags, db=db, port=hub.port).start()
    try:
        alice = await joined(hub.url, "p/alice")
        for i in range(3):
            await alice.chat("p/alice", "p/ghost", f"again{i}")
        await settled(alice, "p/alice")
        assert alice.seen(ESCALATION) == []
        # p/ghost connects (its ledger entry clears) and goes: a new episode
        ghost = await joined(hub.url, "p/ghost")
        await ghost.close()
        await alice.recv_type("presence_update", agent="p/ghost")
        await alice.chat("p/alice", "p/ghost", "one")
        await alice.chat("p/alice", "p/ghost", "two")
        told = await alice.recv_type(ESCALATION)
        assert (told["escalation_target"], told["escalation_count"]) == ("p/ghost", 2)
        state = None
        await alice.send_json({"sender": "p/alice", "target": "System",
                               "type": "state_request"})
        state = await alice.recv_type("state_snapshot")
        ledger = state.get("snapshot", state)["dead_letters"]
        # the snapshot's ledger keeps the reference's four fields
        assert {tuple(sorted(e)) for e in ledger} == {
            ("count", "last_sender", "last_ts", "target")}
        await alice.close()
    finally:
        hub.stop()
    assert [(r["target"], r["count"]) for r in rows(db, ESCALATION)] == [
        ("p/ghost", 2), ("p/other", 2), ("p/ghost", 2)]


@pytest.mark.parametrize("flag,value", [
    ("--dead-letter-escalation-threshold", "-1"),
    ("--dead-letter-escalation-threshold", "x"),
    ("--dead-letter-escalation-window", "-5"),
    ("--dead-letter-escalation-window", "nan"),
])
def test_bad_flags_stop_the_hub(tmp_path, flag, value):
    result = subprocess.run([sys.executable, "-m", "hubd", "--port", str(free_port()), "--db",
                             str(tmp_path / "h.db"), flag, value],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert flag in result.stderr
    assert not (tmp_path / "h.db").exists()


async def test_a_local_agent_cannot_send_a_pointer(tmp_path):
    """dead_letter_forwarding is a hub-to-hub verb: from an agent it is a typed
    error and nothing is journaled."""
    hub = hubd_process(tmp_path, "--dead-letter-escalation-threshold", "1").start()
    try:
        alice = await joined(hub.url, "p/alice")
        await alice.send_json({"sender": "p/alice", "target": "System",
                               "type": "dead_letter_forwarding",
                               "forwarding": {"target": "p/x", "count": 3,
                                              "origin_hub_id": "h1", "owner_hub_id": "test-hub"}})
        error = await alice.recv_type("error")
        assert error["error_code"] == "dead_letter_forwarding_refused", error
        assert error["reason_code"] == "not_a_peer"
        await settled(alice, "p/alice")
        assert alice.seen("dead_letter_forwarding") == []
        await alice.close()
    finally:
        hub.stop()
    assert rows(tmp_path / "hubd.db", "dead_letter_forwarding") == []


async def ledger_of(probe: WsProbe, name: str) -> dict:
    await probe.send_json({"sender": name, "target": "System", "type": "state_request"})
    state = await probe.recv_type("state_snapshot")
    return {e["target"]: e["count"] for e in state.get("snapshot", state)["dead_letters"]}


async def test_a_chat_that_matches_only_stale_seats_is_a_dead_letter(tmp_path):
    """The seed: a directed message that matched no live connection is a dead
    letter. bob is connected but stale (no reaction within the window, no
    -rx waiter): chats to him are counted and escalate; chats to carol, who
    reacts, are not. The journaled route says so: a restart counts the same."""
    flags = ("--recipient-liveness-window", "0.3", "--dead-letter-escalation-threshold", "2",
             "--dead-letter-escalation-window", "0")
    db = tmp_path / "hubd.db"
    hub = hubd_process(tmp_path, *flags, db=db).start()
    try:
        bob = await joined(hub.url, "p/bob")
        alice = await joined(hub.url, "p/alice")
        await asyncio.sleep(0.4)  # bob's reaction window (shortened to 0.3 s) lapses
        carol = await joined(hub.url, "p/carol")  # registered just now: live
        await alice.chat("p/alice", "p/bob", "one")
        await alice.chat("p/alice", "p/carol", "live")
        await alice.chat("p/alice", "p/bob", "two", receipt_requested=True, client_msg_id="r2")
        receipt = await alice.recv_type("delivery_receipt", client_msg_id="r2")
        assert (receipt["delivered"], receipt["reason"], receipt["stale_recipients"],
                receipt["dead_lettered"]) == (False, "no_live_recipient", ["p/bob"], True)
        told = await carol.recv_type(ESCALATION)
        assert (told["escalation_target"], told["escalation_count"]) == ("p/bob", 2)
        await bob.recv_type("chat", payload="two")  # still sent to the stale socket
        await settled(alice, "p/alice")
        assert await ledger_of(alice, "p/alice") == {"p/bob": 2}
        assert hub.metric("hubd_dead_letters_total") == 2
        for probe in (alice, bob, carol):
            await probe.close()
    finally:
        hub.stop()
    hub = hubd_process(tmp_path, *flags, db=db, port=hub.port).start()
    try:
        dave = await joined(hub.url, "p/dave")
        assert await ledger_of(dave, "p/dave") == {"p/bob": 2}
        await dave.close()
    finally:
        hub.stop()
    assert [(r["target"], r["count"]) for r in rows(db, ESCALATION)] == [("p/bob", 2)]


async def test_a_chat_whose_every_write_failed_is_a_dead_letter(tmp_path):
    """bob registers and never reads: once his socket has stalled past the
    drain deadline (one second here), a receipted chat to him reports
    recipient_transport_unavailable, and the hub journals it as a dead letter
    (`dead_letter_unwritten`), counts it and escalates; a replay of the
    journal holds the same ledger."""
    async with running_hub(tmp_path, timing=Timing(sweep=0.1, send_stall=1.0),
                           dead_letter_escalation_threshold=1,
                           dead_letter_escalation_window=0.0) as server:
        alice = await joined(server.url, "p/alice")
        bob = await RawWs.connect(server.port, rcvbuf=4096)
        await bob.send(text(json.dumps({"sender": "p/bob", "target": "System",
                                        "type": "heartbeat", "payload": "online"})))
        await alice.recv_type("presence_update", agent="p/bob")
        router = server.hub.router
        conn = server.hub.endpoints.get(router.presence.session_of("p/bob").endpoint)
        loop = asyncio.get_running_loop()
        while conn.write_stalled_for(loop.time()) == 0:
            await alice.chat("p/alice", "p/bob", "x" * 60_000)
            await asyncio.sleep(0.01)
        assert router.state.chat.dead_letters.by_target == {}  # bob was live: none so far
        await alice.chat("p/alice", "p/bob", "lost?", client_msg_id="w1", receipt_requested=True)
        receipt = await alice.recv_type("delivery_receipt", client_msg_id="w1", timeout=15)
        assert (receipt["delivered"], receipt["reason"]) == \
            (False, "recipient_transport_unavailable")
        await settled(alice, "p/alice")
        told = [(f["escalation_target"], f["escalation_count"]) for f in alice.seen(ESCALATION)]
        assert told == [("p/bob", 1)]
        assert router.state.chat.dead_letters.by_target["p/bob"]["count"] == 1
        bob.close()
        await alice.close()
    unwritten = rows(tmp_path / "hub.db", "dead_letter_unwritten")
    assert [(r["target"], r["sender"]) for r in unwritten] == [("p/bob", "p/alice")]
    async with running_hub(tmp_path) as server:  # the replay
        ledger = server.hub.router.state.chat.dead_letters.by_target
        assert {t: e["count"] for t, e in ledger.items()} == {"p/bob": 1}

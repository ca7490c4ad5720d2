"""Receipts that tell the truth (docs/receipts.md), over real hubs and real
sockets: a stale recipient, a stalled write and an evicted pending receipt
each give the seed's verdict, and a receipt committed but not yet written
when the hub is SIGKILLed reaches its sender after the restart."""

from __future__ import annotations

import asyncio
import json
import sqlite3

from hubd.handlers.receipts import DarkSeats
from hubd.timing import Timing
from tests.support.inproc import running_hub
from tests.support.procs import hubd_process
from tests.support.rawws import RawWs, text
from tests.support.wsprobe import WsProbe


async def joined(url: str, name: str, **extra) -> WsProbe:
    probe = await WsProbe.open(url)
    await probe.recv_type("welcome")
    await probe.register(name, **extra)
    await probe.recv_type("presence_update", agent=name)
    return probe


async def who(probe: WsProbe, name: str) -> dict:
    await probe.send_json({"sender": name, "target": "System", "type": "who_request"})
    return await probe.recv_type("who_snapshot")


def events_of(db, *kinds: str) -> list[tuple[int, str, dict]]:
    conn = sqlite3.connect(db)
    try:
        marks = ",".join("?" * len(kinds))
        rows = conn.execute(f"SELECT seq, kind, payload FROM events WHERE kind IN ({marks}) "
                            "ORDER BY seq", kinds).fetchall()
    finally:
        conn.close()
    return [(seq, kind, json.loads(payload)) for seq, kind, payload in rows]


async def test_a_stale_recipient_gets_no_live_recipient_and_a_waiter_vouches(tmp_path):
    # a two-second reaction window, so "idle" is reached in a test's time (and
    # a reaction followed by a chat stays inside it even on a loaded box)
    async with running_hub(tmp_path,
                           timing=Timing(reaction_window=2.0, waiter_window=5.0)) as server:
        alice = await joined(server.url, "p/alice")
        bob = await joined(server.url, "p/bob")
        liveness = (await who(alice, "p/alice"))["agent_liveness"]
        assert liveness["p/bob"]["proven_live"] is True
        assert liveness["p/bob"]["has_live_waiter"] is False
        # bob only keeps his socket alive: keepalives are no reaction
        while (await who(alice, "p/alice"))["agent_liveness"]["p/bob"]["proven_live"]:
            await bob.send_json({"sender": "p/bob", "target": "System", "type": "heartbeat",
                                 "payload": "online"})
            await asyncio.sleep(0.2)

        await alice.chat("p/alice", "p/bob", "are you there", client_msg_id="s1",
                         receipt_requested=True)
        receipt = await alice.recv_type("delivery_receipt", client_msg_id="s1")
        assert receipt["delivered"] is False and receipt["reason"] == "no_live_recipient"
        assert receipt["dead_lettered"] is True and receipt["recipients"] == []
        assert receipt["matched_recipients"] == ["p/bob"]
        assert receipt["stale_recipients"] == ["p/bob"]
        seq = receipt["message_seq"]
        assert receipt["receipt_notification_id"] == f"delivery-receipt:{seq}:pending"
        warning = await alice.recv_type("recipient_liveness_warning")
        assert warning["stale_recipients"] == ["p/bob"] and warning["delivered"] is False
        assert warning["reason"] == "no_live_recipient" and warning["message_target"] == "p/bob"
        # the chat still went to bob's socket (best effort, durable)
        assert (await bob.recv_type("chat", client_msg_id="s1"))["seq"] == seq
        # journaled: the aggregate with the chat, the verdict with its outbox row
        found = events_of(server.config.db, "chat", "delivery_receipt_requested",
                          "delivery_receipt_immediate")
        mine = [(k, p) for s, k, p in found if s in (seq, seq + 1, seq + 2)]
        assert [k for k, _ in mine] == ["chat", "delivery_receipt_requested",
                                        "delivery_receipt_immediate"]
        assert mine[1][1]["stale_recipients"] == ["p/bob"]
        assert mine[2][1]["verdict"] == "no_live_recipient" and mine[2][1]["pending"] is True

        # bob reads it and acks: the stale verdict is followed by a deferred one
        await bob.send_json({"sender": "p/bob", "target": "all", "type": "ack", "payload": "",
                             "seq": seq, "mailbox_for": "p/bob"})
        deferred = await alice.recv_type("delivery_receipt", deferred=True)
        assert deferred["delivered"] is True and deferred["recipients"] == ["p/bob"]
        assert deferred["receipt_notification_id"] == f"delivery-receipt:{seq}:deferred"
        assert events_of(server.config.db, "delivery_receipt_deferred")[-1][2]["chat_seq"] == seq

        # the ack was a reaction: bob is live again, and a chat is delivered
        await alice.chat("p/alice", "p/bob", "now?", client_msg_id="s2", receipt_requested=True)
        now = await alice.recv_type("delivery_receipt", client_msg_id="s2")
        assert now["delivered"] is True and now["recipients"] == ["p/bob"]
        assert now["stale_recipients"] == [] and now["reason"] == ""

        # a seat that reacts to nothing but has a fresh -rx waiter counts as live
        carol = await joined(server.url, "p/carol")
        waiter = await joined(server.url, "p/carol-rx")
        while True:
            await waiter.send_json({"sender": "p/carol-rx", "target": "System",
                                    "type": "heartbeat", "payload": "online"})
            entry = (await who(alice, "p/alice"))["agent_liveness"]["p/carol"]
            if entry["last_reaction_age"] > 2.0:
                break
            await asyncio.sleep(0.2)
        assert entry["proven_live"] is True and entry["has_live_waiter"] is True
        assert "p/carol-rx" not in (await who(alice, "p/alice"))["agent_liveness"]
        await alice.chat("p/alice", "p/carol", "wake", client_msg_id="s3", receipt_requested=True)
        woke = await alice.recv_type("delivery_receipt", client_msg_id="s3")
        assert woke["delivered"] is True and woke["recipients"] == ["p/carol"]
        for probe in (alice, bob, carol, waiter):
            await probe.close()


async def test_with_the_gate_off_a_stale_socket_still_counts(tmp_path):
    async with running_hub(tmp_path, warn_stale_recipients=False,
                           timing=Timing(reaction_window=1.0, waiter_window=1.0)) as server:
        alice = await joined(server.url, "p/alice")
        bob = await joined(server.url, "p/bob")
        while (await who(alice, "p/alice"))["agent_liveness"]["p/bob"]["last_reaction_age"] <= 1:
            await asyncio.sleep(0.2)
        await alice.chat("p/alice", "p/bob", "hi", client_msg_id="c1", receipt_requested=True)
        receipt = await alice.recv_type("delivery_receipt", client_msg_id="c1")
        assert receipt["delivered"] is True and receipt["stale_recipients"] == []
        assert alice.seen("recipient_liveness_warning") == []
        await alice.close()
        await bob.close()


def register(name: str) -> bytes:
    return text(json.dumps({"sender": name, "target": "System", "type": "heartbeat",
                            "payload": "online"}))


async def test_a_stalled_write_gives_recipient_transport_unavailable(tmp_path):
    # a one-second drain deadline (production's is five), swept ten times a second
    async with running_hub(tmp_path, private_directed=True,
                           timing=Timing(sweep=0.1, send_stall=1.0)) as server:
        alice = await joined(server.url, "p/alice")
        bob = await RawWs.connect(server.port, rcvbuf=4096)  # registers, then never reads
        await bob.send(register("p/bob"))
        await alice.recv_type("presence_update", agent="p/bob")
        session = server.hub.router.presence.session_of("p/bob")
        conn = server.hub.endpoints.get(session.endpoint)
        loop = asyncio.get_running_loop()
        big = "x" * 60_000
        while conn.write_stalled_for(loop.time()) == 0:
            await alice.chat("p/alice", "p/bob", big)
            await asyncio.sleep(0.01)
        # bob is live (he registered just now), his socket is matched, but the
        # write cannot complete: the drain deadline decides the verdict
        await alice.chat("p/alice", "p/bob", "stuck", client_msg_id="t1", receipt_requested=True)
        receipt = await alice.recv_type("delivery_receipt", client_msg_id="t1", timeout=15)
        assert receipt["delivered"] is False
        assert receipt["reason"] == "recipient_transport_unavailable"
        assert receipt["matched_recipients"] == ["p/bob"] and receipt["stale_recipients"] == []
        assert receipt["recipients"] == [] and receipt["dead_lettered"] is True
        assert server.hub.metrics.send_timeouts >= 1
        assert server.hub.metrics.receipts.get("recipient_transport_unavailable") == 1
        # the chat stays durable, and retryable with the same client_msg_id: the
        # retry is routed again (no duplicate answer), with a receipt of its own
        assert events_of(server.config.db, "chat")[-1][2]["client_msg_id"] == "t1"
        await alice.chat("p/alice", "p/bob", "stuck", client_msg_id="t1", receipt_requested=True)
        again = await alice.recv(lambda f: f.get("type") in ("delivery_receipt", "system")
                                 and f.get("client_msg_id") == "t1", timeout=15)
        assert again["type"] == "delivery_receipt" and again["delivered"] is False
        assert again["message_seq"] > receipt["message_seq"]
        bob.close()
        await alice.close()


async def test_an_evicted_pending_receipt_is_settled_expired_and_told(tmp_path):
    async with running_hub(tmp_path, pending_receipts=2) as server:
        alice = await joined(server.url, "p/alice")
        seqs = []
        for i in range(3):
            await alice.chat("p/alice", "p/nobody", f"m{i}", client_msg_id=f"e{i}",
                             receipt_requested=True)
            receipt = await alice.recv_type("delivery_receipt", client_msg_id=f"e{i}",
                                            reason="no_online_recipient")
            seqs.append(receipt["message_seq"])
        await alice.drain(0.3)
        [expired] = [r for r in alice.seen("delivery_receipt") if r["reason"] == "receipt_expired"]
        assert expired["message_seq"] == seqs[0] and expired["client_msg_id"] == "e0"
        assert expired["delivered"] is False and expired["deferred"] is True
        assert expired["receipt_notification_id"] == f"delivery-receipt:{seqs[0]}:expired"
        assert list(server.hub.router.state.receipts.pending) == seqs[1:]
        # the expiry and the third pending verdict are one commit's neighbours
        rows = events_of(server.config.db, "delivery_receipt_expired",
                         "delivery_receipt_immediate")
        expiry = [s for s, k, p in rows if k == "delivery_receipt_expired"]
        third = [s for s, k, p in rows if k == "delivery_receipt_immediate"
                 and p["chat_seq"] == seqs[2]]
        assert expiry == [third[0] - 1]
        await alice.close()
    # after a restart the window is re-seeded from the journal: the expired
    # one stays expired, a later ack still gives the deferred verdict
    async with running_hub(tmp_path, pending_receipts=2) as server:
        assert list(server.hub.router.state.receipts.pending) == seqs[1:]
        nobody = await joined(server.url, "p/nobody")
        for seq in (seqs[0], seqs[2]):
            await nobody.send_json({"sender": "p/nobody", "target": "all", "type": "ack",
                                    "payload": "", "seq": seq, "mailbox_for": "p/nobody"})
        alice = await joined(server.url, "p/alice")  # its receipts come before presence
        await alice.drain(0.5)
        assert [r["message_seq"] for r in alice.seen("delivery_receipt")
                if r["delivered"]] == [seqs[2]]
        await alice.close()
        await nobody.close()


def test_a_receipt_committed_before_a_sigkill_is_delivered_after_restart(tmp_path):
    hub = hubd_process(tmp_path, "--no-durable-ingress-quota",
                       env={"HUBD_FAULT": "kill-after-commit:delivery_receipt_immediate"})
    hub.start()

    async def send_and_die() -> int:
        alice = await joined(hub.url, "p/alice")
        bob = await joined(hub.url, "p/bob")
        await alice.chat("p/alice", "p/bob", "before the kill", client_msg_id="k1",
                         receipt_requested=True)
        chat = await bob.recv_type("chat", client_msg_id="k1")
        await alice.wait_closed(timeout=10)
        assert alice.seen("delivery_receipt") == []
        return chat["seq"]

    try:
        seq = asyncio.run(send_and_die())
        hub.proc.wait(10)
        assert hub.proc.returncode == -9
        verdicts = events_of(tmp_path / "hubd.db", "delivery_receipt_immediate")
        assert [p["chat_seq"] for _, _, p in verdicts] == [seq]
        hub.env = {k: v for k, v in hub.env.items() if k != "HUBD_FAULT"}
        hub.start()

        async def reconnect() -> tuple[dict, list]:
            alice = await joined(hub.url, "p/alice")  # its receipts come before presence
            await alice.drain(0.3)
            [receipt] = alice.seen("delivery_receipt")
            await alice.close()
            # once written, the outbox row is settled: the next session gets nothing
            while not events_of(tmp_path / "hubd.db", "receipt_notified"):
                await asyncio.sleep(0.05)
            again = await joined(hub.url, "p/alice")
            await again.drain(0.5)
            await again.close()
            return receipt, again.seen("delivery_receipt")

        receipt, later = asyncio.run(reconnect())
        assert receipt["delivered"] is True and receipt["recipients"] == ["p/bob"]
        assert receipt["receipt_notification_id"] == f"delivery-receipt:{seq}:immediate_delivered"
        assert later == []
    finally:
        hub.stop()


async def test_a_seat_owning_work_without_a_waiter_gets_one_dark_seat_alert(tmp_path):
    # dark after a second, swept five times a second (production: 30 s, every second)
    async with running_hub(tmp_path, timing=Timing(dark_seat_after=1.0, sweep=0.2)) as server:
        alice = await joined(server.url, "p/alice")
        carol = await joined(server.url, "p/carol")
        await carol.send_json({"sender": "p/carol", "target": "System", "type": "claim",
                               "payload": "t-1", "task_id": "t-1", "ttl_seconds": 600,
                               "paths": ["x.py"], "worktree": "/r"})
        await carol.recv_type("claim_granted", task_id="t-1")
        await alice.send_json({"sender": "p/alice", "target": "all", "type": "ledger_task",
                               "payload": "", "task_id": "b-1", "title": "T",
                               "suggested_owner": "p/dave"})
        alerts = [await alice.recv_type("dark_seat_alert", timeout=10) for _ in range(2)]
        by_identity = {a["identity"]: a for a in alerts}
        assert by_identity["p/carol"]["claims"] == ["t-1"]
        assert by_identity["p/carol"]["tasks"] == []
        assert by_identity["p/dave"]["tasks"] == ["b-1"]
        assert by_identity["p/carol"]["missing_for_seconds"] >= 1.0
        assert "synapse arm --name=p/carol" in by_identity["p/carol"]["remedy"]
        assert by_identity["p/carol"]["target"] == "all"
        # re-arming the waiter ends carol's episode: no second alert meanwhile
        waiter = await joined(server.url, "p/carol-rx")
        while "p/carol" in server.hub.router.live_of(DarkSeats).episodes:
            await waiter.send_json({"sender": "p/carol-rx", "target": "System",
                                    "type": "heartbeat", "payload": "online"})
            await asyncio.sleep(0.2)
        assert server.hub.metrics.dark_seat_alerts == 2
        assert len(alice.seen("dark_seat_alert")) == 2
        # the alert changed no authority: carol still holds her claim
        await carol.send_json({"sender": "p/carol", "target": "System", "type": "state_request"})
        snapshot = (await carol.recv_type("state_snapshot"))["snapshot"]
        assert [c["task_id"] for c in snapshot["active_claims"]] == ["t-1"]
        # the waiter goes: a new episode, a new alert
        await waiter.close()
        again = await alice.recv_type("dark_seat_alert", identity="p/carol", timeout=10)
        assert again["claims"] == ["t-1"]
        for probe in (alice, carol):
            await probe.close()

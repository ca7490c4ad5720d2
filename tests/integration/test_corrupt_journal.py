"""A journal with rows that cannot be decoded, on a real hubd process: the
rows are quarantined (kept as they are, never applied), /health says
degraded, every mutation is refused (journal_recovery_required to a peer)
and reads are still served."""

from __future__ import annotations

import asyncio
import json
import sqlite3

from federation.tls import peer_client_context
from tests.support.federation import make_pki, site_flags, write_serving_policy
from tests.support.procs import hubd_process
from tests.support.wsprobe import WsProbe, joined


def journal(db_path):
    db = sqlite3.connect(db_path)
    try:
        return db.execute("SELECT seq, kind, payload, route FROM events ORDER BY seq").fetchall()
    finally:
        db.close()


def test_corrupt_rows_are_quarantined_reads_served_mutations_refused(tmp_path):
    pki = make_pki(tmp_path / "pki", ["east", "west"])
    policy = write_serving_policy(tmp_path / "policy", pki, {"east": ["PROJ"]})
    hub = hubd_process(tmp_path / "west", *site_flags(pki, "west", policy).serve, hub_id="west",
                       scheme="wss")
    db_path = hub.argv[hub.argv.index("--db") + 1]
    hub.start()
    try:
        async def history():
            bob = await joined(hub.url, "PROJ/bob")
            for text in ("one", "two", "three", "four"):
                await bob.chat("PROJ/bob", "all", text)
            await bob.chat("PROJ/bob", "PROJ/carol", "for carol")  # carol is offline
            await bob.send_json({"sender": "PROJ/bob", "type": "who_request", "target": "System"})
            await bob.recv_type("who_snapshot")
            await bob.close()
        asyncio.run(history())
    finally:
        hub.stop()

    rows = journal(db_path)
    chats = {json.loads(p)["payload"]: seq for seq, kind, p, _ in rows if kind == "chat"}
    db = sqlite3.connect(db_path)
    db.execute("UPDATE events SET payload = ? WHERE seq = ?", ('{"payload": "tw', chats["two"]))
    db.execute("UPDATE events SET payload = ? WHERE seq = ?", ("[3]", chats["three"]))
    db.commit()
    db.close()
    before = journal(db_path)

    hub.start()
    try:
        health = hub.get_json("/health")
        assert health["status"] == "degraded" and health["journal_corrupt_rows"] == 2
        assert hub.get_json("/readyz")["ready"] is True
        assert "quarantined undecodable rows" in hub.log()

        async def degraded():
            # reads: presence, history without the quarantined rows, mailbox replay
            bob = await joined(hub.url, "PROJ/bob")
            await bob.send_json({"sender": "PROJ/bob", "type": "history_request",
                                 "target": "System"})
            snapshot = await bob.recv_type("history_snapshot")
            texts = [m.get("payload") for m in snapshot["history"]]
            assert "one" in texts and "four" in texts
            assert "tw" not in str(texts) and "three" not in texts
            carol = await joined(hub.url, "PROJ/carol", mailbox=True, since_seq=0)
            replayed = await carol.recv_type("chat", replayed=True)
            assert replayed["payload"] == "for carol"
            # mutations: a chat, a claim
            await bob.chat("PROJ/bob", "all", "five", client_msg_id="c5")
            error = await bob.recv_type("error")
            assert "journal recovery required" in error["payload"], error
            await bob.send_json({"sender": "PROJ/bob", "target": "System", "type": "claim",
                                 "payload": "t-1", "task_id": "t-1", "worktree": "/repo",
                                 "paths": ["src"], "ttl_seconds": 60})
            denied = await bob.recv(lambda f: f.get("type") in ("claim_denied", "error"))
            assert "journal recovery required" in denied["payload"], denied
            # a peer's forward: a typed, transient refusal (the origin retries later)
            context = peer_client_context(pki.file("east", "client", "cert"),
                                          pki.file("east", "client", "key"))
            peer = await WsProbe.open(hub.url, ssl=context)
            await peer.send_json({"sender": "east", "target": "System",
                                  "type": "multihub_message_forward", "forward_id": "f-1",
                                  "kind": "chat", "sender_seat": "PROJ/alice",
                                  "target_seat": "PROJ/bob", "body": {"payload": "from east"}})
            result = await peer.recv_type("multihub_message_result")
            assert (result["disposition"], result["reason_code"]) == \
                ("refused", "journal_recovery_required"), result
            await bob.send_json({"sender": "PROJ/bob", "type": "who_request", "target": "System"})
            await bob.recv_type("who_snapshot")
            assert [c["payload"] for c in bob.seen("chat")] == []  # nothing was routed
            for probe in (bob, carol, peer):
                await probe.close()
        asyncio.run(degraded())
        assert hub.get_json("/health")["journal_seq"] == health["journal_seq"]
    finally:
        hub.stop()
    # quarantined means kept byte for byte, and nothing was added
    assert journal(db_path) == before

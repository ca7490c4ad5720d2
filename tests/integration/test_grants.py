"""Grants, the seat-level ACL, with real hub processes (docs/identity.md,
"Grants"): the claim grant gates claim and handoff, the board grant the board
writes, the mailbox grant mailbox_for beyond the session's own seat. A refusal
is typed (reason_code NOT_GRANTED; error_code not_granted on an `error`),
journaled as evidence before it is answered (claim_denial for a claim,
acl_denial otherwise) and changes nothing else; after a restart the grant
still refuses, the evidence is still there and no refused request left a
lease, task, note or watermark. The defaults let a principal claim and post in
its own namespaces; an explicit grant narrows or widens them. A hub without
principals of its own behaves as before."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time

from hubd.journal import principals as store
from tests.support.procs import hubd_process
from tests.support.seats import online
from tests.support.wsprobe import WsProbe

PRINCIPALS = {
    # name: (seats, grants)
    "alice": (["PROJ/alice"], None),  # the defaults: claim and board in PROJ
    "bob": (["PROJ/bob"], None),
    "ci": (["PROJ/ci/*"], {"claim": [], "board": ["OPS"]}),  # narrowed, and moved
    "ops": (["OPS/*"], {"claim": ["*"], "mailbox": ["PROJ/bob"]}),  # widened
}


async def send(probe: WsProbe, sender: str, type_: str, **fields) -> None:
    await probe.send_json({"sender": sender, "target": "all", "type": type_, "payload": "",
                           "timestamp": time.time(), **fields})


async def not_granted(probe: WsProbe, type_: str = "error", **match) -> dict:
    frame = await probe.recv_type(type_, reason_code="NOT_GRANTED", **match)
    if type_ == "error":
        assert frame["error_code"] == "not_granted", frame
    return frame


def events(db, kind: str) -> list[tuple[str, dict]]:
    conn = sqlite3.connect(db)
    try:
        return [(p, json.loads(t)) for p, t in conn.execute(
            "SELECT principal, payload FROM events WHERE kind = ? ORDER BY seq", (kind,))]
    finally:
        conn.close()


async def snapshot(probe: WsProbe, sender: str) -> tuple[dict, dict]:
    await send(probe, sender, "state_request", target="System")
    state = (await probe.recv_type("state_snapshot"))["snapshot"]
    await send(probe, sender, "board_request", target="System")
    board = (await probe.recv_type("board_snapshot"))["board"]
    board["tasks"] = {t["task_id"]: t for t in board["tasks"]}
    return state, board


async def test_grants_refuse_and_permit_across_a_restart(tmp_path):
    db = tmp_path / "hubd.db"
    tokens = {}
    for name, (seats, grants) in PRINCIPALS.items():
        store.add(db, name, seats, grants)
        tokens[name] = store.new_token(db, name, "laptop")
    proc = hubd_process(tmp_path / "hub", db=db).start()
    try:
        alice = await online(proc.url, "PROJ/alice", tokens["alice"])
        ci = await online(proc.url, "PROJ/ci/1", tokens["ci"])
        ops = await online(proc.url, "OPS/x", tokens["ops"])

        # -- claims: the defaults permit the own namespace, an explicit grant
        # narrows (ci: none) or widens (ops: everywhere)
        await send(alice, "PROJ/alice", "claim", task_id="A-1", paths=["a"])
        await alice.recv_type("claim_granted", task_id="A-1")
        await send(ci, "PROJ/ci/1", "claim", task_id="CI-1", paths=["ci"], note="secret note",
                   idem_key="k1")
        denied = await not_granted(ci, "claim_denied", task_id="CI-1")
        assert denied["grant"] == "claim" and denied["namespace"] == "PROJ"
        assert "Principal 'ci' may not claim in namespace 'PROJ'" in denied["payload"]
        await send(ops, "OPS/x", "claim", task_id="O-1", paths=["o"])
        await ops.recv_type("claim_granted", task_id="O-1")
        # handoff gives a lease: alice may not give hers into OPS ...
        await send(alice, "PROJ/alice", "handoff", task_id="A-1", to_agent="OPS/x")
        denied = await not_granted(alice, "handoff_denied", task_id="A-1")
        assert denied["namespace"] == "OPS"
        # ... ops, granted everywhere, may give its lease to alice
        await send(ops, "OPS/x", "handoff", task_id="O-1", to_agent="PROJ/alice")
        await ops.recv_type("handoff_granted", task_id="O-1", owner="PROJ/alice")
        # releasing a lease one holds needs no grant
        await send(alice, "PROJ/alice", "release", task_id="O-1")
        await alice.recv_type("release_granted", task_id="O-1")

        # -- the board: ci's grant is OPS only; alice's the default PROJ
        await send(ci, "PROJ/ci/1", "ledger_task", task_id="T-CI", title="secret title")
        denied = await not_granted(ci, task_id="T-CI")
        assert denied["grant"] == "board" and denied["namespace"] == "PROJ"
        assert "nothing was changed" in denied["payload"]
        await send(ci, "PROJ/ci/1", "ledger_task", task_id="T-OPS", title="ops task",
                   project="OPS")
        await ci.recv_type("ledger_task_posted", payload="Task 'T-OPS' declared by PROJ/ci/1.")
        await send(alice, "PROJ/alice", "ledger_task", task_id="T-P", title="proj task")
        await alice.recv_type("ledger_task_posted", payload="Task 'T-P' declared by PROJ/alice.")
        # an existing task's namespace is its project (else its creator's)
        await send(alice, "PROJ/alice", "ledger_task_update", task_id="T-OPS", status="done")
        assert (await not_granted(alice, task_id="T-OPS"))["namespace"] == "OPS"
        await send(ci, "PROJ/ci/1", "ledger_progress", task_id="T-P", text="secret progress")
        assert (await not_granted(ci, task_id="T-P"))["namespace"] == "PROJ"
        # moving a task needs the grant where it is and where it goes
        await send(alice, "PROJ/alice", "ledger_task_update", task_id="T-P", project="OPS")
        assert (await not_granted(alice, task_id="T-P"))["namespace"] == "OPS"
        await send(ops, "OPS/x", "ledger_progress", task_id="T-OPS", text="fine")
        await ops.recv_type("ledger_progress_posted", payload="Progress from OPS/x")

        # -- mailbox_for: bob is offline with a directed chat waiting
        await alice.chat("PROJ/alice", "PROJ/bob", "for bob only", receipt_requested=True)
        seq = (await alice.recv_type("delivery_receipt"))["message_seq"]
        await send(alice, "PROJ/alice", "heartbeat", target="System", mailbox=True,
                   mailbox_for="PROJ/bob", since_seq=seq)
        denied = await not_granted(alice, grant="mailbox")
        assert denied["mailbox_for"] == "PROJ/bob"
        assert "may not read the mailbox of 'PROJ/bob'" in denied["payload"]
        await send(alice, "PROJ/alice", "ack", seq=seq, mailbox_for="PROJ/bob")
        await not_granted(alice, grant="mailbox")
        # ops's grant names PROJ/bob: it reads bob's mailbox
        await send(ops, "OPS/x", "heartbeat", target="System", mailbox=True,
                   mailbox_for="PROJ/bob", since_seq=0)
        replayed = await ops.recv_type("chat", payload="for bob only")
        assert replayed["replayed"] is True
        assert not [f for f in alice.seen("chat") if f.get("replayed")]

        state, board = await snapshot(alice, "PROJ/alice")
        assert [c["task_id"] for c in state["active_claims"]] == ["A-1"]
        assert sorted(board["tasks"]) == ["T-OPS", "T-P"]
        assert board["tasks"]["T-OPS"]["status"] == "open"
        assert board["tasks"]["T-P"]["project"] == ""
        for probe in (alice, ci, ops):
            await probe.close()
    finally:
        proc.stop()

    # -- the evidence, committed before each answer, content-minimised
    def check_evidence():
        claims = events(db, "claim_denial")
        assert [(p, e["reason_code"], e["claimant"], e["namespace"]) for p, e in claims] == [
            ("ci", "NOT_GRANTED", "PROJ/ci/1", "PROJ")]
        acl = events(db, "acl_denial")
        assert [(p, e["verb"], e["grant"], e.get("namespace", e.get("mailbox")))
                for p, e in acl] == [
            ("alice", "handoff", "claim", "OPS"),
            ("ci", "ledger_task", "board", "PROJ"),
            ("alice", "ledger_task_update", "board", "OPS"),
            ("ci", "ledger_progress", "board", "PROJ"),
            ("alice", "ledger_task_update", "board", "OPS"),
            ("alice", "heartbeat", "mailbox", "PROJ/bob"),
            ("alice", "ack", "mailbox", "PROJ/bob"),
        ]
        for principal, row in acl:
            assert row["principal"] == principal and row["reason_code"] == "NOT_GRANTED"
        text = json.dumps(claims + acl)
        for secret in ("secret", "T-CI", "CI-1"):
            assert secret not in text
        # nothing was half-applied: no lease, task, note or watermark from a refusal
        assert {e["task_id"] for _, e in events(db, "claim")} == {"A-1", "O-1"}
        assert {e["task_id"] for _, e in events(db, "ledger_task")} == {"T-OPS", "T-P"}
        assert all(e["text"] != "secret progress" for _, e in events(db, "ledger_progress"))
        assert events(db, "mailbox_watermark") == []
        assert not [e for _, e in events(db, "idempotency")]
    check_evidence()

    # -- after a restart the grants still refuse, and the evidence is all there
    proc = hubd_process(tmp_path / "again", db=db).start()
    try:
        ci = await online(proc.url, "PROJ/ci/1", tokens["ci"])
        alice = await online(proc.url, "PROJ/alice", tokens["alice"])
        state, board = await snapshot(ci, "PROJ/ci/1")
        assert [c["task_id"] for c in state["active_claims"]] == ["A-1"]
        assert sorted(board["tasks"]) == ["T-OPS", "T-P"]
        await send(ci, "PROJ/ci/1", "claim", task_id="CI-1", paths=["ci"], idem_key="k1")
        await not_granted(ci, "claim_denied", task_id="CI-1")
        await send(alice, "PROJ/alice", "heartbeat", target="System", mailbox=True,
                   mailbox_for="PROJ/bob", since_seq=100)
        await not_granted(alice, grant="mailbox")
        # an explicit grant given to the running hub applies within a second
        store.add(db, "ci", ["PROJ/ci/*"], {"claim": ["PROJ"], "board": ["OPS"]}, replace=True)
        deadline = time.monotonic() + 3
        while True:
            await send(ci, "PROJ/ci/1", "claim", task_id="CI-2", paths=["ci2"])
            frame = await ci.recv(lambda f: f.get("type") in ("claim_granted", "claim_denied")
                                  and f.get("task_id") == "CI-2")
            if frame["type"] == "claim_granted":
                break
            assert time.monotonic() < deadline, "the widened grant did not apply"
            await asyncio.sleep(0.1)
        for probe in (ci, alice):
            await probe.close()
    finally:
        proc.stop()
    claims = events(db, "claim_denial")
    assert [e["reason_code"] for _, e in claims][:2] == ["NOT_GRANTED", "NOT_GRANTED"]
    assert len(events(db, "acl_denial")) == 8
    assert {e["task_id"] for _, e in events(db, "claim")} == {"A-1", "O-1", "CI-2"}


async def test_no_grants_are_checked_on_a_shared_token_hub(tmp_path):
    """Only the shared --token: its one principal holds every grant, and
    mailbox_for another seat still falls back to the session's own mailbox."""
    db = tmp_path / "hubd.db"
    proc = hubd_process(tmp_path / "hub", "--token", "shared-secret", db=db).start()
    try:
        a = await online(proc.url, "PROJ/a", "shared-secret")
        await a.chat("PROJ/a", "PROJ/b", "for b", receipt_requested=True)
        await a.recv_type("delivery_receipt")
        await send(a, "PROJ/a", "claim", task_id="X-1", paths=["x"])
        await a.recv_type("claim_granted", task_id="X-1")
        await send(a, "PROJ/a", "ledger_task", task_id="T", title="t", project="OPS")
        await a.recv_type("ledger_task_posted")
        await send(a, "PROJ/a", "heartbeat", target="System", mailbox=True,
                   mailbox_for="PROJ/b", since_seq=0)
        await send(a, "PROJ/a", "who_request", target="System")
        await a.recv_type("who_snapshot")  # answered after the heartbeat: nothing came back
        assert not a.seen("error") and not [f for f in a.seen("chat") if f.get("replayed")]
        await a.close()
    finally:
        proc.stop()
    assert events(db, "acl_denial") == [] and events(db, "claim_denial") == []

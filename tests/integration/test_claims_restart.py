"""Leases, fencing epochs, idem_key verdicts, release confirmations, the board
and persistent capability cards survive a SIGKILL of a real hubd process; and
every grant a client saw before the kill is in the journal (commit before
publish)."""

import asyncio
import json
import sqlite3
import time

from tests.support.procs import hubd_process
from tests.support.wsprobe import WsProbe

BURST = 2000
KILL_AFTER = 600
IN_FLIGHT = 64


async def joined(url, name):
    probe = await WsProbe.open(url)
    await probe.recv_type("welcome")
    await probe.register(name)
    await probe.send_json({"sender": name, "type": "who_request", "target": "System"})
    await probe.recv_type("who_snapshot")
    return probe


def frame(name, type_, **fields):
    out = {"sender": name, "target": "System", "type": type_,
           "payload": fields.pop("payload", ""), "timestamp": time.time()}
    out.update(fields)
    return out


async def ask(probe, name, type_, reply, **fields):
    await probe.send_json(frame(name, type_, **fields))
    want = fields.get("task_id")

    def answers(f):
        if f.get("type") not in (reply, "error", "claim_denied") or f.get("target") not in (
                name, "all"):
            return False
        if f.get("type") == "claim_granted" and f.get("owner") != name:
            return False
        if "task_id" in f:
            about = f["task_id"]
        else:
            nested = f.get("task") if isinstance(f.get("task"), dict) else f.get("note")
            about = nested.get("task_id", want) if isinstance(nested, dict) else want
        return want is None or about == want
    return await probe.recv(answers)


def without_presence(claims):
    return [{k: v for k, v in c.items() if not k.startswith("holder_")} for c in claims]


async def test_everything_survives_sigkill(tmp_path):
    work = tmp_path / "hub"
    db = work / "hubd.db"
    hub = hubd_process(work, db=db).start()
    try:
        alice = await joined(hub.url, "p/alice")
        bob = await joined(hub.url, "p/bob")
        keyed = dict(payload="t1", task_id="t1", worktree="/w", paths=["src"], idem_key="k1",
                     note="keyed")
        grant1 = await ask(alice, "p/alice", "claim", "claim_granted", **keyed)
        await ask(alice, "p/alice", "claim", "claim_granted", task_id="t2", worktree="/w",
                  paths=["docs"])
        grant3 = await ask(bob, "p/bob", "claim", "claim_granted", task_id="t3", worktree="/w",
                           paths=["lib"])
        await ask(bob, "p/bob", "checkpoint", "checkpoint_saved", task_id="t3",
                  checkpoint="half", epoch=grant3["epoch"])
        release = frame("p/alice", "release", payload="t2", task_id="t2", idem_key="r1",
                        evidence=["tests pass"], freshness_seconds=3)
        await alice.send_json(release)
        released = await alice.recv_type("release_granted", task_id="t2")
        await ask(alice, "p/alice", "ledger_task", "ledger_task_posted", task_id="B-1",
                  title="Build", project="p", idem_key="d1")
        await ask(bob, "p/bob", "ledger_task_update", "ledger_task_updated", task_id="B-1",
                  status="in_progress", expected_version=1)
        await ask(bob, "p/bob", "ledger_progress", "ledger_progress_posted", task_id="B-1",
                  payload="half way")
        await ask(bob, "p/bob", "advertise", "capability_advertised", persist=True,
                  description="builder")
        await bob.send_json(frame("p/bob", "state_request"))
        before = (await bob.recv_type("state_snapshot"))["snapshot"]["active_claims"]
        await bob.send_json(frame("p/bob", "board_request"))
        board_before = (await bob.recv_type("board_snapshot"))["board"]
        assert [c["task_id"] for c in before] == ["t1", "t3"]
        hub.kill()
        await alice.close()
        await bob.close()

        hub = hubd_process(work, db=db).start()
        alice = await joined(hub.url, "p/alice")
        bob = await joined(hub.url, "p/bob")
        await bob.send_json(frame("p/bob", "state_request"))
        after = (await bob.recv_type("state_snapshot"))["snapshot"]["active_claims"]
        assert without_presence(after) == without_presence(before)
        assert after[1]["checkpoint"] == "half"
        await bob.send_json(frame("p/bob", "board_request"))
        assert (await bob.recv_type("board_snapshot"))["board"] == board_before
        # the keyed claim's verdict, verbatim, privately
        assert await ask(alice, "p/alice", "claim", "claim_granted", **keyed) == grant1
        # the keyed release is still confirmed, exactly
        await alice.send_json(frame("p/alice", "state_request", request_id="q", release_confirmation={
            "task_id": "t2", "operation_id": "r1", "request_digest": released["request_digest"]}))
        rc = (await alice.recv_type("state_snapshot", request_id="q"))["release_confirmation"]
        assert rc["status"] == "confirmed" and rc["receipt"] == released["receipt"]
        # epochs keep counting; the old holder is fenced by them
        fresh = await ask(alice, "p/alice", "claim", "claim_granted", task_id="t4", worktree="/w",
                          paths=["new"])
        assert fresh["epoch"] == max(c["epoch"] for c in before) + 1
        denied = await ask(alice, "p/alice", "claim", "claim_denied", task_id="t5",
                           worktree="/w", paths=["lib/x.py"])
        assert denied["reason_code"] == "SCOPE_CONFLICT" and denied["holder"] == "p/bob"
        await bob.send_json(frame("p/bob", "manifest_request"))
        manifest = (await bob.recv_type("manifest_snapshot"))["manifest"]
        assert [(m["agent"], m["description"], m.get("persistent")) for m in manifest] == [
            ("p/bob", "builder", True)]
        await alice.close()
        await bob.close()
    finally:
        hub.stop()


async def test_every_grant_seen_before_sigkill_is_journaled(tmp_path):
    work = tmp_path / "hub"
    db = work / "hubd.db"
    hub = hubd_process(work, "--max-claims-per-agent", str(BURST), db=db).start()
    seen: list[dict] = []
    try:
        probe = await joined(hub.url, "p/burst")
        window = asyncio.Semaphore(IN_FLIGHT)

        async def send_all():
            for i in range(BURST):
                try:
                    await asyncio.wait_for(window.acquire(), 10)
                    await probe.send_json(frame("p/burst", "claim", task_id=f"b{i}",
                                                worktree="/burst", paths=[f"f{i}"]))
                except Exception:
                    return

        async def read_all():
            while await probe._pull(5.0):
                got = probe.frames[-1]
                if got.get("type") == "claim_granted":
                    seen.append(got)
                    window.release()
                    if len(seen) == KILL_AFTER:
                        hub.kill()
                elif got.get("type") in ("claim_denied", "error"):
                    raise AssertionError(got)

        await asyncio.gather(send_all(), read_all())
        await probe.close()
    finally:
        hub.stop()
    assert len(seen) >= KILL_AFTER
    conn = sqlite3.connect(db)
    rows = [json.loads(p) for (p,) in conn.execute(
        "SELECT payload FROM events WHERE kind = 'claim' ORDER BY seq")]
    conn.close()
    journaled = {(r["task_id"], r["epoch"]) for r in rows}
    assert {(g["task_id"], g["epoch"]) for g in seen} <= journaled
    # each task granted once, epochs strictly increasing in journal order
    epochs = [r["epoch"] for r in rows]
    assert epochs == sorted(set(epochs))
    # and the restarted hub holds every one of them
    hub = hubd_process(work, "--max-claims-per-agent", str(BURST), db=db).start()
    try:
        probe = await joined(hub.url, "p/reader")
        await probe.send_json(frame("p/reader", "state_request"))
        held = {c["task_id"] for c in (await probe.recv_type("state_snapshot", timeout=10))[
            "snapshot"]["active_claims"]}
        assert {g["task_id"] for g in seen} <= held
        await probe.close()
    finally:
        hub.stop()

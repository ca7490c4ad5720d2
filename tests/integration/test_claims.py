"""Claims and leases over real sockets against an in-process hub with a real
journal: grants and denials, scope and path identity, idempotency, lease
lifetime, denial evidence, release receipts and confirmation, task updates,
checkpoints, handoffs, waits."""

import json
import sqlite3
import time

from hubd.core.commands import TICK
from hubd.state.claims import LeaseLimits
from tests.support.inproc import flushed as settled
from tests.support.inproc import running_hub
from tests.support.wsprobe import joined

FAST = LeaseLimits(min_ttl=0.05)


def frame(name, type_, **fields):
    out = {"sender": name, "target": fields.pop("target", "System"), "type": type_,
           "payload": fields.pop("payload", ""), "timestamp": time.time()}
    out.update(fields)
    return out


async def send(probe, name, type_, **fields):
    await probe.send_json(frame(name, type_, **fields))


async def claim(probe, name, task_id, **fields):
    await send(probe, name, "claim", payload=task_id, task_id=task_id, **fields)
    return await probe.recv(lambda f: f.get("type") in ("claim_granted", "claim_denied", "error")
                            and f.get("task_id", task_id) == task_id
                            and f.get("owner", name) == name)


async def same_as_replay(server):
    await settled(server)
    assert await server.hub.load_state() == server.hub.router.state


def journal(server, kind=None):
    conn = sqlite3.connect(server.config.db)
    try:
        rows = conn.execute("SELECT seq, kind, payload FROM events ORDER BY seq").fetchall()
    finally:
        conn.close()
    return [(seq, k, json.loads(p)) for seq, k, p in rows if kind is None or k == kind]


async def state(probe, name):
    await send(probe, name, "state_request", payload="snapshot")
    return (await probe.recv_type("state_snapshot"))["snapshot"]


async def test_grant_is_broadcast_denials_are_private_and_named(tmp_path):
    async with running_hub(tmp_path) as server:
        alice = await joined(server.url, "p/alice")
        bob = await joined(server.url, "p/bob")
        granted = await claim(alice, "p/alice", "t-1", note="work", worktree="/repo",
                              paths=["src/a.py", "src/b/"], ttl_seconds=120)
        assert granted["type"] == "claim_granted" and granted["target"] == "all"
        assert granted["sender"] == "SynapseHub" and granted["owner"] == "p/alice"
        assert granted["paths"] == ["src/a.py", "src/b"] and granted["worktree"] == "/repo"
        assert isinstance(granted["epoch"], int) and granted["version"] == 0
        assert granted["status"] == "claimed"
        assert abs(granted["lease_expires_at"] - (granted["timestamp"] + 120)) < 1e-6
        seen_by_bob = await bob.recv_type("claim_granted", task_id="t-1")
        assert seen_by_bob["epoch"] == granted["epoch"]

        scope = await claim(bob, "p/bob", "t-2", worktree="/repo", paths=["src/b/c.py"])
        assert scope["type"] == "claim_denied" and scope["target"] == "p/bob"
        assert scope["reason_code"] == "SCOPE_CONFLICT"
        assert scope["conflict_task_id"] == "t-1" and scope["holder"] == "p/alice"
        assert scope["payload"] == "Task 't-2' file scope conflicts with 't-1' held by p/alice."
        live = await claim(bob, "p/bob", "t-1", worktree="/elsewhere", paths=["x"])
        assert (live["reason_code"], live["holder"]) == ("LEASE_LIVE", "p/alice")
        await send(bob, "p/bob", "claim", payload="")
        required = await bob.recv_type("claim_denied")
        assert required["reason_code"] == "TASK_ID_REQUIRED"
        # another worktree is another scope; a sibling path is too
        assert (await claim(bob, "p/bob", "t-3", worktree="/other", paths=["src/a.py"]))[
            "type"] == "claim_granted"
        assert (await claim(bob, "p/bob", "t-4", worktree="/repo", paths=["src/c"]))[
            "type"] == "claim_granted"
        # denials went to bob only
        await alice.send_json(frame("p/alice", "who_request"))
        await alice.recv_type("who_snapshot")
        assert alice.seen("claim_denied") == []
        await same_as_replay(server)
        await alice.close()
        await bob.close()


async def test_paths_are_normalised_and_malformed_ones_refused(tmp_path):
    async with running_hub(tmp_path) as server:
        alice = await joined(server.url, "p/alice")
        ok = await claim(alice, "p/alice", "n-1", worktree="/w",
                         paths=["a//b", "./c", "d/./e/", "e\u0301", "c"])
        assert ok["paths"] == ["a/b", "c", "d/e", "\u00e9"]
        # NFC: the decomposed spelling is the same path
        bob = await joined(server.url, "p/bob")
        same = await claim(bob, "p/bob", "n-2", worktree="/w", paths=["\u00e9/x"])
        assert same["reason_code"] == "SCOPE_CONFLICT"
        for bad in (["../x"], ["/abs/x"], ["a/../b"], ["ok", 5], "src"):
            refused = await claim(bob, "p/bob", "n-3", worktree="/w", paths=bad)
            assert refused["type"] == "claim_denied", bad
            assert refused["reason_code"] == "PATH_IDENTITY_INVALID", bad
        # no paths: the whole worktree
        whole = await claim(bob, "p/bob", "n-4", worktree="/w")
        assert whole["reason_code"] == "SCOPE_CONFLICT"
        await alice.close()
        await bob.close()


async def test_renewal_gives_a_new_epoch_and_keeps_the_checkpoint(tmp_path):
    async with running_hub(tmp_path) as server:
        alice = await joined(server.url, "p/alice")
        first = await claim(alice, "p/alice", "r", worktree="/w", paths=["x"])
        await send(alice, "p/alice", "checkpoint", task_id="r", checkpoint="step 2",
                   epoch=first["epoch"])
        saved = await alice.recv_type("checkpoint_saved")
        assert saved["version"] == 1
        renewed = await claim(alice, "p/alice", "r", worktree="/w", paths=["x", "y"], note="more")
        assert renewed["epoch"] > first["epoch"]
        assert (renewed["version"], renewed["checkpoint"], renewed["paths"]) == (
            0, "step 2", ["x", "y"])
        assert renewed["lease_expires_at"] > first["lease_expires_at"]
        # the old epoch is fenced off
        await send(alice, "p/alice", "release", task_id="r", epoch=first["epoch"])
        stale = await alice.recv_type("release_denied")
        assert stale["payload"] == f"Task 'r' epoch is stale (current {renewed['epoch']})."
        await same_as_replay(server)
        await alice.close()


async def test_idem_key_retry_returns_the_original_verdict(tmp_path):
    async with running_hub(tmp_path) as server:
        alice = await joined(server.url, "p/alice")
        bob = await joined(server.url, "p/bob")
        request = dict(payload="k", task_id="k", worktree="/w", paths=["k"], idem_key="key-1")
        await send(alice, "p/alice", "claim", **request)
        original = await alice.recv_type("claim_granted", task_id="k")
        await bob.recv_type("claim_granted", task_id="k")
        events = len(journal(server))

        await send(alice, "p/alice", "claim", **request)  # a retry (new timestamp)
        again = await alice.recv(lambda f: f.get("type") == "claim_granted" and f is not original)
        assert again == original  # same epoch, same expiry, same timestamp
        # a different request under the same key is refused
        await send(alice, "p/alice", "claim", **dict(request, paths=["other"]))
        conflict = await alice.recv_type("error")
        assert conflict["error_code"] == "idempotency_conflict"
        assert conflict["payload"] == "Idempotency key was already used for a different request."
        # another sender may use the same key string
        mine = await claim(bob, "p/bob", "kb", worktree="/w", paths=["kb"], idem_key="key-1")
        assert mine["type"] == "claim_granted"
        await settled(server)
        kinds = [k for _, k, _ in journal(server)[events:]]
        assert kinds == ["claim", "idempotency"]  # bob's; the retry and the conflict wrote nothing
        # the retry went to alice only
        await bob.send_json(frame("p/bob", "who_request"))
        await bob.recv_type("who_snapshot")
        assert len(bob.seen("claim_granted")) == 2  # alice's original and its own

        # after a release, the retry still returns the original grant and
        # does not re-acquire the lease
        await send(alice, "p/alice", "release", task_id="k", epoch=original["epoch"])
        await alice.recv_type("release_granted", task_id="k")
        await send(alice, "p/alice", "claim", **request)
        replay = await alice.recv(lambda f: f.get("type") == "claim_granted" and f.get(
            "task_id") == "k" and f is not original and f is not again)
        assert replay == original
        snapshot = await state(alice, "p/alice")
        assert [c["task_id"] for c in snapshot["active_claims"]] == ["kb"]
        await same_as_replay(server)
        await alice.close()
        await bob.close()

    # ... and after a restart
    async with running_hub(tmp_path) as server:
        alice = await joined(server.url, "p/alice")
        await send(alice, "p/alice", "claim", **request)
        assert (await alice.recv_type("claim_granted", task_id="k")) == original
        await alice.close()


async def test_claims_survive_disconnect_and_report_the_holder_offline(tmp_path):
    async with running_hub(tmp_path) as server:
        alice = await joined(server.url, "p/alice")
        bob = await joined(server.url, "p/bob")
        await claim(alice, "p/alice", "d", worktree="/w", paths=["d"])
        await alice.close()
        await bob.recv_type("presence_update", agent="p/alice", event="left")
        [entry] = (await state(bob, "p/bob"))["active_claims"]
        assert entry["task_id"] == "d" and entry["holder_online"] is False
        assert isinstance(entry["holder_offline_seconds"], float)
        assert entry["holder_offline_seconds"] >= 0
        denied = await claim(bob, "p/bob", "d2", worktree="/w", paths=["d/x"])
        assert denied["reason_code"] == "SCOPE_CONFLICT"
        alice = await joined(server.url, "p/alice")
        [entry] = (await state(alice, "p/alice"))["active_claims"]
        assert entry["holder_online"] is True and entry["holder_offline_seconds"] is None
        await alice.close()
        await bob.close()


async def test_expired_leases_end_themselves_journaled_and_announced(tmp_path):
    async with running_hub(tmp_path, claims=FAST) as server:
        alice = await joined(server.url, "p/alice")
        bob = await joined(server.url, "p/bob")
        short = await claim(alice, "p/alice", "e", worktree="/w", paths=["e"], ttl_seconds=0.2)
        assert abs(short["lease_expires_at"] - short["timestamp"] - 0.2) < 1e-6
        expired = await bob.recv_type("lease_expired", timeout=10)
        assert (expired["task_id"], expired["owner"], expired["epoch"], expired["reason"]) == (
            "e", "p/alice", short["epoch"], "ttl")
        await settled(server)
        [(_, _, row)] = journal(server, "lease_expired")
        assert row["task_id"] == "e" and row["owner"] == "p/alice" and row["epoch"] == short["epoch"]
        assert (await state(bob, "p/bob"))["active_claims"] == []
        assert (await claim(bob, "p/bob", "e2", worktree="/w", paths=["e"]))[
            "type"] == "claim_granted"
        await same_as_replay(server)
        await alice.close()
        await bob.close()


async def test_lease_offline_ttl_ends_a_disconnected_holders_leases(tmp_path):
    limits = LeaseLimits(offline_ttl=0.0)
    async with running_hub(tmp_path, claims=limits) as server:
        alice = await joined(server.url, "p/alice")
        bob = await joined(server.url, "p/bob")
        await claim(alice, "p/alice", "o", worktree="/w", paths=["o"])
        await claim(bob, "p/bob", "kept", worktree="/w", paths=["kept"])
        await alice.close()
        expired = await bob.recv_type("lease_expired", timeout=10)
        assert (expired["task_id"], expired["reason"]) == ("o", "holder_offline")
        assert [c["task_id"] for c in (await state(bob, "p/bob"))["active_claims"]] == ["kept"]
        await same_as_replay(server)
        await bob.close()


async def test_claim_and_path_bounds(tmp_path):
    limits = LeaseLimits(max_claims_per_agent=2, max_paths_per_claim=3)
    async with running_hub(tmp_path, claims=limits) as server:
        alice = await joined(server.url, "p/alice")
        bob = await joined(server.url, "p/bob")
        wide = await claim(alice, "p/alice", "m1", worktree="/w", paths=["a", "b", "c", "d"])
        assert wide["paths"] == [""]  # too many paths: the scope widens to the worktree
        assert (await claim(bob, "p/bob", "q", worktree="/w", paths=["zzz"]))[
            "reason_code"] == "SCOPE_CONFLICT"
        await claim(alice, "p/alice", "m2", worktree="/w2", paths=["a"])
        over = await claim(alice, "p/alice", "m3", worktree="/w3", paths=["a"])
        assert over["reason_code"] == "QUOTA_EXCEEDED"
        assert over["payload"] == "Agent p/alice holds the maximum 2 claims."
        # the quota is per agent: bob still has room
        assert (await claim(bob, "p/bob", "b1", worktree="/w3", paths=["a"]))[
            "type"] == "claim_granted"
        await alice.close()
        await bob.close()


async def test_every_denial_leaves_minimised_evidence_first(tmp_path):
    async with running_hub(tmp_path) as server:
        alice = await joined(server.url, "p/alice")
        bob = await joined(server.url, "p/bob")
        await claim(alice, "p/alice", "secret-task", worktree="/private/repo",
                    paths=["src/secret.py"], note="confidential note")
        denied = await claim(bob, "p/bob", "secret-task", worktree="/private/repo",
                             paths=["src/secret.py"], note="my secret note")
        assert denied["reason_code"] == "LEASE_LIVE"
        # the reply left after the row was committed: it is in the journal now
        rows = journal(server, "claim_denial")
        assert len(rows) == 1
        row = rows[0][2]
        assert row["reason_code"] == "LEASE_LIVE" and row["claimant"] == "p/bob"
        assert row["path_count"] == 1 and row["durable"] is True
        assert set(row) == {"claimant", "claimant_sha256", "claimant_truncated", "decision",
                            "durable", "path_count", "reason_code", "scope_sha256",
                            "task_id_sha256"}
        text = json.dumps(row)
        for secret in ("secret-task", "/private/repo", "src/secret.py", "my secret note"):
            assert secret not in text
        # audit only: replay keeps alice's lease exactly
        await same_as_replay(server)
        await alice.close()
        await bob.close()


async def test_release_receipt_progress_note_and_confirmation(tmp_path):
    async with running_hub(tmp_path) as server:
        alice = await joined(server.url, "p/alice")
        bob = await joined(server.url, "p/bob")
        lease = await claim(alice, "p/alice", "rel", worktree="/w", paths=["r"])
        await send(bob, "p/bob", "release", task_id="rel")
        other = await bob.recv_type("release_denied")
        assert other["payload"] == "Task 'rel' is owned by p/alice, not p/bob."
        assert "reason_code" not in other
        await send(bob, "p/bob", "release", task_id="nope")
        assert (await bob.recv_type("release_denied"))["payload"] == (
            "Task 'nope' is not currently claimed.")

        release = frame("p/alice", "release", payload="rel", task_id="rel", epoch=lease["epoch"],
                        idem_key="op-1", evidence=["pytest: 12 passed"], artifacts=["dist/x.whl"],
                        changed_files=["r/x.py"], confidence="high", freshness_seconds=12)
        await alice.send_json(release)
        granted = await alice.recv_type("release_granted")
        assert granted["target"] == "all" and granted["owner"] == "p/alice"
        receipt = granted["receipt"]
        assert receipt["released"] is True and receipt["task_id"] == "rel"
        assert receipt["evidence"] == ["pytest: 12 passed"] and receipt["known_failures"] == []
        assert receipt["confidence"] == "high" and receipt["freshness_seconds"] == 12.0
        assert granted["release_operation_id"] == "op-1"
        from hubd.state.idem import request_digest
        assert granted["request_digest"] == request_digest(release)
        note = await alice.recv_type("ledger_progress_posted")
        assert note["note"]["kind"] == "assessment" and note["note"]["task_id"] == "rel"
        assert note["note"]["text"].startswith("release receipt: evidence=pytest: 12 passed;")
        await bob.recv_type("release_granted")
        await bob.recv_type("ledger_progress_posted")

        # exact read-only confirmation
        query = {"task_id": "rel", "operation_id": "op-1",
                 "request_digest": granted["request_digest"]}
        await send(alice, "p/alice", "state_request", request_id="rq-1",
                   release_confirmation=query)
        confirmed = await alice.recv_type("state_snapshot")
        assert confirmed["request_id"] == "rq-1" and "snapshot" not in confirmed
        rc = confirmed["release_confirmation"]
        assert rc["status"] == "confirmed" and rc["receipt"] == receipt
        assert rc["owner"] == "p/alice" and rc["release_operation_id"] == "op-1"
        assert rc["first_event_seq"] < rc["commit_seq"]
        for who, probe, q, expected in (
                ("p/bob", bob, query, {"status": "unknown", **query}),  # another sender
                ("p/alice", alice, dict(query, request_digest="1" * 64),
                 {"status": "unknown", **dict(query, request_digest="1" * 64)}),
                ("p/alice", alice, dict(query, request_digest="ABC"), {"status": "unknown"}),
                ("p/alice", alice, "junk", {"status": "unknown"})):
            await send(probe, who, "state_request", request_id="rq-2", release_confirmation=q)
            assert (await probe.recv_type("state_snapshot", request_id="rq-2"))[
                "release_confirmation"] == expected
        await same_as_replay(server)
        await alice.close()
        await bob.close()


async def test_task_update_checkpoint_handoff_and_wait(tmp_path):
    async with running_hub(tmp_path) as server:
        alice = await joined(server.url, "p/alice")
        bob = await joined(server.url, "p/bob")
        lease = await claim(alice, "p/alice", "L", worktree="/w", paths=["L"])
        await send(alice, "p/alice", "task_update", task_id="L", status="working",
                   data_ref="ref://1", note="halfway", epoch=lease["epoch"])
        updated = await bob.recv_type("task_updated")
        assert (updated["status"], updated["data_ref"], updated["version"], updated["owner"]) == (
            "working", "ref://1", 1, "p/alice")
        for who, probe, fields, text in (
                ("p/alice", alice, {"status": "claimed"},
                 "Task 'L' cannot transition working -> claimed."),
                ("p/alice", alice, {"status": "working", "epoch": 999},
                 f"Task 'L' epoch is stale (current {lease['epoch']})."),
                ("p/alice", alice, {"status": "working", "expected_version": 0},
                 "Task 'L' version conflict (current 1)."),
                ("p/bob", bob, {"status": "done"}, "Task 'L' owned by p/alice, not p/bob.")):
            await send(probe, who, "task_update", task_id="L", **fields)
            assert (await probe.recv_type("error"))["payload"] == text

        await send(bob, "p/bob", "checkpoint", task_id="L", checkpoint="mine")
        assert (await bob.recv_type("checkpoint_denied"))["payload"] == (
            "Task 'L' owned by p/alice, not p/bob.")
        await send(alice, "p/alice", "checkpoint", task_id="L", checkpoint="cp-1")
        saved = await alice.recv_type("checkpoint_saved")
        assert saved["target"] == "p/alice" and saved["version"] == 2

        await send(bob, "p/bob", "wait_request", task_id="L")
        wait = await bob.recv_type("wait_granted")
        assert wait["holder"] == "p/alice"
        await send(alice, "p/alice", "wait_request", task_id="L")
        assert (await alice.recv_type("wait_denied"))["payload"] == "You already hold 'L'."
        await claim(bob, "p/bob", "B", worktree="/w", paths=["B"])
        await send(alice, "p/alice", "wait_request", task_id="B")
        deadlock = await alice.recv_type("wait_denied")
        assert deadlock["payload"] == "Waiting for 'B' held by p/bob would deadlock."

        await send(alice, "p/alice", "handoff", task_id="L", target="p/nobody")
        assert (await alice.recv_type("handoff_denied"))["payload"] == (
            "Handoff target 'p/nobody' is not online.")
        await send(alice, "p/alice", "handoff", task_id="L", to_agent="p/bob", note="over to you",
                   epoch=lease["epoch"])
        progress = await bob.recv_type("ledger_progress_posted")
        assert progress["note"]["text"] == "handed off to p/bob: over to you"
        moved = await bob.recv_type("handoff_granted")
        assert (moved["owner"], moved["previous_owner"], moved["status"], moved["checkpoint"],
                moved["version"]) == ("p/bob", "p/alice", "working", "cp-1", 0)
        assert moved["epoch"] > lease["epoch"]
        await send(alice, "p/alice", "release", task_id="L")
        assert (await alice.recv_type("release_denied"))["payload"] == (
            "Task 'L' is owned by p/bob, not p/alice.")
        await send(bob, "p/bob", "release", task_id="L", epoch=moved["epoch"])
        await bob.recv_type("release_granted", task_id="L")
        await same_as_replay(server)
        await alice.close()
        await bob.close()


def identity(rows, *, ns="sha256:host-a", obj="fe00:1", sensitive=True, wt="/repo"):
    return {"version": 1, "worktree_path": wt, "worktree_object_id": obj,
            "filesystem_namespace": ns, "case_sensitive": sensitive,
            "paths": [{"git_path": g, "filesystem_path": g, "object_id": o, "object_scope": s}
                      for g, o, s in rows]}


async def test_path_identity_validated_persisted_and_used_for_aliases(tmp_path):
    async with running_hub(tmp_path) as server:
        alice = await joined(server.url, "p/alice")
        bob = await joined(server.url, "p/bob")
        ident = identity([("a/x.py", "dev:1", ""), ("newdir", "", "")])
        granted = await claim(alice, "p/alice", "P-1", worktree="/repo", paths=["a/x.py", "newdir"],
                              path_identity=ident, git={"branch": "main"})
        assert granted["type"] == "claim_granted"
        assert granted["path_identity"] == ident  # echoed as sent
        assert granted["git"] == {"branch": "main", "auto_release_on": "merge"}
        # a hard link to the same object under another name
        alias = await claim(bob, "p/bob", "P-2", worktree="/repo", paths=["b/alias.py"],
                            path_identity=identity([("b/alias.py", "dev:1", "")]))
        assert alias["reason_code"] == "SCOPE_CONFLICT" and alias["conflict_task_id"] == "P-1"
        # the same object id on another host is another file
        other = await claim(bob, "p/bob", "P-3", worktree="/repo", paths=["b/alias.py"],
                            path_identity=identity([("b/alias.py", "dev:1", "")],
                                                   ns="sha256:host-b"))
        assert other["type"] == "claim_granted"
        # a canonical worktree path joins a differently spelt worktree
        spelt = await claim(bob, "p/bob", "P-4", worktree="/repo/./", paths=["newdir/f"],
                            path_identity=identity([("newdir/f", "", "")]))
        assert spelt["reason_code"] == "SCOPE_CONFLICT"
        # malformed / mismatched identity: refused before anything changes
        bad = await claim(bob, "p/bob", "P-5", worktree="/repo", paths=["c.py"],
                          path_identity=dict(identity([("c.py", "", "")]), version=2))
        assert (bad["reason_code"], bad["payload"]) == (
            "PATH_IDENTITY_INVALID", "Task 'P-5' carries an invalid path identity.")
        mismatch = await claim(bob, "p/bob", "P-5", worktree="/repo", paths=["c.py"],
                               path_identity=identity([("d.py", "", "")]))
        assert mismatch["payload"] == "Task 'P-5' path identity does not match its declared scope."
        # persisted: the snapshot lists it, and it survives a restart
        claims = {c["task_id"]: c for c in (await state(bob, "p/bob"))["active_claims"]}
        assert claims["P-1"]["path_identity"] == ident
        await same_as_replay(server)
        await alice.close()
        await bob.close()
    async with running_hub(tmp_path) as server:
        bob = await joined(server.url, "p/bob")
        alias = await claim(bob, "p/bob", "P-6", worktree="/repo", paths=["z/alias.py"],
                            path_identity=identity([("z/alias.py", "dev:1", "")]))
        assert alias["reason_code"] == "SCOPE_CONFLICT" and alias["conflict_task_id"] == "P-1"
        # two legacy claims keep literal-path behaviour
        assert (await claim(bob, "p/bob", "P-7", worktree="/repo", paths=["z/alias.py"]))[
            "type"] == "claim_granted"
        await bob.close()


async def test_health_and_metrics_show_the_claim_stores(tmp_path):
    import aiohttp

    async with running_hub(tmp_path) as server:
        alice = await joined(server.url, "p/alice")
        await claim(alice, "p/alice", "h", worktree="/w", paths=["h"])
        await server.hub.router.inbox.put(TICK)  # the sweep registers the claim gauges
        await send(alice, "p/alice", "who_request")
        await alice.recv_type("who_snapshot")
        base = server.url.replace("ws://", "http://")
        async with aiohttp.ClientSession() as http:
            async with http.get(base + "health") as resp:
                assert (await resp.json())["active_claims"] == 1
            async with http.get(base + "metrics") as resp:
                text = await resp.text()
        assert "hubd_active_claims 1.0" in text and "hubd_lease_epoch 1.0" in text
        assert "hubd_idempotency_keys" in text and "hubd_board_tasks" in text
        await alice.close()

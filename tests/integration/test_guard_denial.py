"""guard_denial -> guard_denial_recorded against real hubd processes
(docs/guard-evidence-and-spend.md, seed 000 "Authenticated guard-denial
evidence"):

- an open hub answers guard_evidence_unavailable and records nothing;
- a token hub appends one content-minimised audit row (digests only: the
  frame's path and payload never reach it) and answers the sender only;
- an idem_key retry gets the identical frame (same audit_seq), also after a
  restart; the same key with other content is an idempotency_conflict;
- bad fields get error_code guard_evidence in the reference's words;
- the per-credential window refuses evidence over it (a second name on the
  same token shares the bucket) and frees up once the window has passed;
- under --require-acl the evidence permission on evidence:guard-denial is needed;
- a SIGKILL just after or just before the commit neither loses nor doubles a denial.
"""

from __future__ import annotations

import asyncio
import json
import re
import sqlite3
import time

from hubd.timing import Timing
from tests.support.procs import hubd_process
from tests.support.wsprobe import WsProbe

TOKEN = "guard-token-0123456789"
HOOK = "claim-hook/alice-1"
SHA = {name: f"{i:x}" * 64 for i, name in enumerate(("actor_sha256", "call_sha256",
                                                     "scope_sha256"), start=10)}


def denial(**over) -> dict:
    frame = {"sender": HOOK, "target": "SynapseHub", "type": "guard_denial",
             "provider": "claude", "reason_code": "GUARD_NO_CLAIM", "path_count": 1, **SHA}
    frame.update(over)
    return frame


async def seat(url: str, name: str, token: str | None = TOKEN) -> WsProbe:
    probe = await WsProbe.open(url)
    if token is None:
        await probe.recv_type("welcome")
    await probe.register(name, **({"token": token} if token else {}))
    await probe.recv_type("presence_update", agent=name)
    return probe


async def ask(probe: WsProbe, frame: dict) -> dict:
    probe._cursor = len(probe.frames)
    await probe.send_json(frame)
    return await probe.recv(lambda f: f.get("type") in ("guard_denial_recorded", "error"),
                            timeout=10)


def rows(db, kind: str = "guard_denial") -> list[tuple[int, dict]]:
    conn = sqlite3.connect(db)
    try:
        got = conn.execute("SELECT seq, payload FROM events WHERE kind = ? ORDER BY seq",
                           (kind,)).fetchall()
    finally:
        conn.close()
    return [(seq, json.loads(payload)) for seq, payload in got]


def test_open_hub_cannot_record(tmp_path):
    hub = hubd_process(tmp_path, "--open-network")
    hub.start()
    try:
        async def scenario():
            hook = await seat(hub.url, HOOK, token=None)
            got = await ask(hook, denial())
            assert got["type"] == "error", got
            assert got["error_code"] == "guard_evidence_unavailable"
            assert got["payload"] == "guard denial evidence requires an authenticated durable hub"
            await hook.close()
        asyncio.run(scenario())
    finally:
        hub.stop()
    assert rows(tmp_path / "hubd.db") == []


def test_recorded_private_minimised_and_retried_from_the_journal(tmp_path):
    db = tmp_path / "hubd.db"
    hub = hubd_process(tmp_path, "--token", TOKEN)
    hub.start()
    try:
        async def first():
            hook = await seat(hub.url, HOOK)
            other = await seat(hub.url, "p/bystander")
            got = await ask(hook, denial(idem_key="g-1", path="/etc/passwd", payload="text"))
            assert got["type"] == "guard_denial_recorded", got
            assert got["payload"] == "Guard denial evidence recorded."
            assert (got["call_sha256"], got["reason_code"], got["target"]) == \
                (SHA["call_sha256"], "GUARD_NO_CLAIM", HOOK)
            again = await ask(hook, denial(idem_key="g-1", path="/etc/passwd", payload="text"))
            assert again == got  # the identical frame: audit_seq and timestamp included
            conflict = await ask(hook, denial(idem_key="g-1", reason_code="GUARD_NOT_EDITABLE"))
            assert conflict["error_code"] == "idempotency_conflict", conflict
            unkeyed = await ask(hook, denial())
            assert unkeyed["audit_seq"] > got["audit_seq"]
            # bad fields: the reference's texts, nothing recorded
            for over, text in [
                ({"reason_code": "NOPE"}, "guard denial reason_code is not recognised"),
                ({"provider": "vim"}, "guard denial provider is not recognised"),
                ({"path_count": True}, "guard denial path_count must be an integer"),
                ({"path_count": -1}, "guard denial path_count is outside the supported bound"),
                ({"path_count": 10**9}, "guard denial path_count is outside the supported bound"),
                ({"call_sha256": SHA["call_sha256"].upper()},
                 "guard denial call_sha256 must be lowercase SHA-256"),
                ({"scope_sha256": None}, "guard denial scope_sha256 must be lowercase SHA-256"),
            ]:
                bad = await ask(hook, denial(**over))
                assert (bad["type"], bad["error_code"], bad["payload"]) == \
                    ("error", "guard_evidence", text), (over, bad)
            quiet = await other.drain(0.3)
            assert not [f for f in quiet if "guard" in f.get("type", "")], quiet
            await hook.close()
            await other.close()
            return got
        got = asyncio.run(first())
    finally:
        hub.stop()
    recorded = rows(db)
    assert [seq for seq, _ in recorded][0] == got["audit_seq"] and len(recorded) == 2
    row = recorded[0][1]
    assert set(row) == {"actor_sha256", "call_sha256", "credential_principal_sha256",
                        "decision", "path_count", "provider", "reason_code", "recorder_sha256",
                        "scope_sha256"}
    assert "/etc/passwd" not in json.dumps(recorded) and TOKEN not in json.dumps(recorded)
    assert row["decision"] == "deny"
    import hashlib
    assert row["recorder_sha256"] == hashlib.sha256(HOOK.encode()).hexdigest()

    # after a restart the retry is still answered from the journal
    hub.start()
    try:
        async def retry():
            hook = await seat(hub.url, HOOK)
            again = await ask(hook, denial(idem_key="g-1", path="/etc/passwd", payload="text"))
            assert again == got
            await hook.close()
        asyncio.run(retry())
    finally:
        hub.stop()
    assert len(rows(db)) == 2


def test_window_is_per_credential_and_slides(tmp_path):
    db = tmp_path / "hubd.db"
    hub = hubd_process(tmp_path, "--token", TOKEN, "--guard-evidence-window-events", "3",
                       timing=Timing(guard_evidence_window=1.5))
    hub.start()
    try:
        async def scenario():
            hook = await seat(hub.url, HOOK)
            twin = await seat(hub.url, "claim-hook/alice-2")  # same token, another name
            for _ in range(3):
                assert (await ask(hook, denial()))["type"] == "guard_denial_recorded"
            over = await ask(hook, denial())
            assert (over["error_code"], over["limit_reason"], over["payload"]) == \
                ("guard_evidence_rate_limited", "events",
                 "guard denial evidence ingress limit exceeded"), over
            shared = await ask(twin, denial(sender="claim-hook/alice-2"))
            assert shared["error_code"] == "guard_evidence_rate_limited", shared
            # the window slides: once it has passed, evidence is recorded again
            for _ in range(40):
                await asyncio.sleep(0.1)
                got = await ask(hook, denial())
                if got["type"] == "guard_denial_recorded":
                    break
            assert got["type"] == "guard_denial_recorded", got
            await hook.close()
            await twin.close()
        asyncio.run(scenario())
        metrics = hub.get_text("/metrics")
    finally:
        hub.stop()
    assert len(rows(db)) == 4
    refused = re.search(r'hubd_evidence_refused_total\{reason="guard_evidence_rate_limited"\} '
                        r'([0-9.]+)', metrics)
    assert refused and float(refused.group(1)) >= 2, metrics[-2000:]


def test_window_bytes_bound(tmp_path):
    hub = hubd_process(tmp_path, "--token", TOKEN, "--guard-evidence-window-bytes", "700")
    hub.start()
    try:
        async def scenario():
            hook = await seat(hub.url, HOOK)
            assert (await ask(hook, denial()))["type"] == "guard_denial_recorded"
            over = await ask(hook, denial(payload="x" * 400))
            assert (over["error_code"], over["limit_reason"]) == \
                ("guard_evidence_rate_limited", "bytes"), over
            await hook.close()
        asyncio.run(scenario())
    finally:
        hub.stop()
    assert len(rows(tmp_path / "hubd.db")) == 1


def test_acl_needs_the_evidence_permission(tmp_path):
    policy = tmp_path / "acl.json"
    policy.write_text(json.dumps({"rules": [
        {"permission": "evidence", "target_kind": "evidence", "target_pattern": "guard-denial",
         "namespace": "claim-hook"}]}))
    policy.chmod(0o600)
    hub = hubd_process(tmp_path / "h", "--token", TOKEN, "--acl-policy", str(policy),
                       "--require-acl")
    hub.start()
    try:
        async def scenario():
            hook = await seat(hub.url, HOOK)
            stranger = await seat(hub.url, "p/stranger")
            assert (await ask(hook, denial()))["type"] == "guard_denial_recorded"
            refused = await ask(stranger, denial(sender="p/stranger"))
            assert refused["type"] == "error" and refused.get("acl_decision") == "would_deny", \
                refused
            await hook.close()
            await stranger.close()
        asyncio.run(scenario())
    finally:
        hub.stop()
    assert len(rows(tmp_path / "h" / "hubd.db")) == 1


def test_a_crash_around_the_commit_loses_nothing_and_doubles_nothing(tmp_path):
    """SIGKILL right after the denial's commit, before its answer left: the
    reporter's keyed retry after the restart gets the recorded seq and no
    second row. SIGKILL right before the commit: nothing was recorded, and
    the retry records it once."""
    for stage, rows_after_crash in (("kill-after-commit", 1), ("kill-before-commit", 0)):
        folder = tmp_path / stage
        db = folder / "hubd.db"
        hub = hubd_process(folder, "--token", TOKEN,
                           env={"HUBD_FAULT": f"{stage}:guard_denial"})
        hub.start()
        try:
            async def crash():
                hook = await seat(hub.url, HOOK)
                await hook.send_json(denial(idem_key="c-1"))
                closed = await hook.wait_closed(20)
                assert closed is not None
                assert not hook.seen("guard_denial_recorded")  # nothing left before the kill
                await hook.close()
            asyncio.run(crash())
            for _ in range(100):
                if hub.proc.poll() is not None:
                    break
                time.sleep(0.1)
            assert hub.proc.returncode == -9, hub.log()[-2000:]
            assert len(rows(db)) == rows_after_crash, stage
            hub.env = {k: v for k, v in hub.env.items() if k != "HUBD_FAULT"}
            hub.start()

            async def retry():
                hook = await seat(hub.url, HOOK)
                got = await ask(hook, denial(idem_key="c-1"))
                again = await ask(hook, denial(idem_key="c-1"))
                await hook.close()
                return got, again
            got, again = asyncio.run(retry())
        finally:
            hub.stop()
        assert got["type"] == "guard_denial_recorded" and again == got, (stage, got)
        recorded = rows(db)
        assert len(recorded) == 1, (stage, recorded)
        assert got["audit_seq"] == recorded[0][0]

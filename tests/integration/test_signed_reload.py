"""SIGHUP re-reads the reference's identity files: a changed ACL policy takes
effect at once; one that cannot be used is refused and the running one kept
(docs/identity.md, "The reference's identity files")."""

from __future__ import annotations

import asyncio
import json
import signal

from tests.support.signed_site import (CLAIM_ACL, SignedProbe, envelope, mac, owner_only,
                                       start_signed_hub)
from tests.support.waiting import wait_for


def _claim(site, task: str) -> dict:
    async def run():
        conn = await SignedProbe.open(site.proc.url, site.seats["p/alice"])
        frame = mac(envelope("p/alice", "claim", target="all", task_id=task, worktree=task),
                    site.seats["p/alice"].mac_kid)
        await conn.probe.send_json(frame)
        got = await conn.probe.recv(lambda f: f.get("type") in ("claim_granted", "error"))
        await conn.close()
        return got

    return asyncio.run(run())


def test_a_changed_acl_takes_effect_on_sighup_and_a_broken_one_is_refused(tmp_path):
    site = start_signed_hub("hubd", tmp_path, {"p/alice": []}, CLAIM_ACL,
                            reference_files=False)
    try:
        assert _claim(site, "T-1")["type"] == "claim_granted"
        policy = site.root / "acl.json"
        owner_only(policy, "{not json")
        site.proc.signal(signal.SIGHUP)
        wait_for(lambda: "reload refused" in site.proc.log(), what="the reload refused")
        assert _claim(site, "T-2")["type"] == "claim_granted"  # the running policy kept
        owner_only(policy, json.dumps({"rules": []}))
        site.proc.signal(signal.SIGHUP)
        wait_for(lambda: "configuration reloaded" in site.proc.log(), what="the reload")
        denied = _claim(site, "T-3")
        assert denied["payload"] == "access denied: claim on claim:T-3"
    finally:
        site.proc.stop()


def _signed_claim(site, task: str, kid: str, secret: str) -> dict:
    async def run():
        conn = await SignedProbe.open(site.proc.url, site.seats["p/alice"])
        frame = envelope("p/alice", "claim", target="all", task_id=task, worktree=task)
        await conn.probe.send_json(mac(frame, kid, secret))
        got = await conn.probe.recv(lambda f: f.get("type") in ("claim_granted", "error"))
        await conn.close()
        return got

    return asyncio.run(run())


def test_the_key_file_is_reread_on_sighup_and_a_broken_one_keeps_the_running_keys(tmp_path):
    """Rotation without a restart: a key added to --message-auth-key-file
    works after SIGHUP, one taken out stops working; a file that cannot be
    used (open to others, a bad entry) is refused with the reason in the log
    and the running keys are kept."""
    one, two = "rotation-secret-one-0123456789", "rotation-secret-two-0123456789"
    keys = owner_only(tmp_path / "mac-keys.txt", f"# rotation\nrot-1:{one}:p/alice\n")
    site = start_signed_hub("hubd", tmp_path, {"p/alice": []}, CLAIM_ACL,
                            extra=("--message-auth-key-file", str(keys)),
                            reference_files=False)

    def result(task: str, kid: str, secret: str) -> str:
        got = _signed_claim(site, task, kid, secret)
        return got.get("verification_result", got["type"])

    def hup(expect: str, times: int) -> None:
        site.proc.signal(signal.SIGHUP)
        wait_for(lambda: site.proc.log().count(expect) == times, what=expect)

    try:
        assert result("T-1", "rot-1", one) == "claim_granted"
        assert result("T-2", "rot-2", two) == "unknown_key"
        owner_only(keys, f"rot-2:{two}:p/alice\n")
        hup("configuration reloaded", 1)
        assert result("T-3", "rot-2", two) == "claim_granted"
        assert result("T-4", "rot-1", one) == "unknown_key"  # revoked without a restart
        keys.chmod(0o644)
        hup("reload refused", 1)
        assert "mac-keys.txt is accessible by other users" in site.proc.log()
        assert result("T-5", "rot-2", two) == "claim_granted"  # the running keys kept
        owner_only(keys, f"rot-3:{one}:p/alice\nnot-an-entry\n")
        hup("reload refused", 2)
        assert "KEY_ID:SECRET:SENDER" in site.proc.log()
        assert result("T-6", "rot-2", two) == "claim_granted"
        assert result("T-7", "rot-3", one) == "unknown_key"  # nothing of the broken file
        assert one not in site.proc.log() and two not in site.proc.log()
    finally:
        site.proc.stop()

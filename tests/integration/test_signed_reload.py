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

"""Per-message keys bound to hubd principals: a key whose senders name
`@PRINCIPAL` proves every seat a session of that principal speaks for, and
no other session's frame (docs/identity.md, "Keys of a principal")."""

from __future__ import annotations

import json
import os
import signal

from hubd.state.principals import token_digest
from tests.support.procs import hubd_process
from tests.support.seats import online
from tests.support.signed_site import envelope, mac

CI_SECRET, ALICE_SECRET = "ci-fleet-secret-0123456789abcdef", "alice-secret-0123456789abcdef"
TOKENS = {"ci": "ci-principal-token", "alice": "alice-principal-token"}


def _principals(path, ci_seats):
    path.write_text(json.dumps({"principals": [
        {"name": "ci", "seats": ci_seats,
         "tokens": [{"sha256": token_digest(TOKENS["ci"]), "label": "runners"}]},
        {"name": "alice", "seats": ["p/alice"],
         "tokens": [{"sha256": token_digest(TOKENS["alice"]), "label": "laptop"}]}]}))
    os.chmod(path, 0o600)


async def _claim(probe, seat: str, task: str, kid: str, secret: str) -> str:
    # each its own worktree, so no claim conflicts with another's file scope
    await probe.send_json(mac(envelope(seat, "claim", target="all", task_id=task,
                                       worktree=task), kid, secret))
    got = await probe.recv(lambda f: f.get("type") in ("claim_granted", "error")
                           and f.get("task_id", task) == task)
    return got.get("verification_result", got["type"])


async def test_a_principals_key_signs_for_its_seats_only(tmp_path):
    principals = tmp_path / "principals.json"
    _principals(principals, ["p/ci/*"])
    proc = hubd_process(tmp_path / "hub", "--principals", str(principals),
                        "--message-auth-key", f"mac-ci:{CI_SECRET}:@ci",
                        "--message-auth-key", f"mac-a:{ALICE_SECRET}:p/alice",
                        "--require-message-auth").start()
    try:
        runner1 = await online(proc.url, "p/ci/runner-1", TOKENS["ci"])
        runner2 = await online(proc.url, "p/ci/runner-2", TOKENS["ci"])
        alice = await online(proc.url, "p/alice", TOKENS["alice"])
        seen = {
            # one key for the whole fleet of ci's agents, no seat listed
            "runner-1": await _claim(runner1, "p/ci/runner-1", "T-1", "mac-ci", CI_SECRET),
            "runner-2": await _claim(runner2, "p/ci/runner-2", "T-2", "mac-ci", CI_SECRET),
            # alice holding ci's secret: her session is not ci's
            "alice with ci's key": await _claim(alice, "p/alice", "T-3", "mac-ci", CI_SECRET),
            "alice with hers": await _claim(alice, "p/alice", "T-4", "mac-a", ALICE_SECRET),
            # and a ci runner cannot use alice's seat-bound key
            "runner with alice's": await _claim(runner1, "p/ci/runner-1", "T-5", "mac-a",
                                                ALICE_SECRET),
        }
        assert seen == {"runner-1": "claim_granted", "runner-2": "claim_granted",
                        "alice with ci's key": "sender_mismatch",
                        "alice with hers": "claim_granted",
                        "runner with alice's": "sender_mismatch"}
        # the principal's seats decide which sessions are its: a seat taken
        # from ci (SIGHUP) closes that session; the key never widens them
        _principals(principals, ["p/ci/runner-1"])
        proc.signal(signal.SIGHUP)
        assert (await runner2.wait_closed(timeout=5)).code == 4010
        assert await _claim(runner1, "p/ci/runner-1", "T-6", "mac-ci", CI_SECRET) == \
            "claim_granted"
        for probe in (runner1, runner2, alice):
            await probe.close()
        assert CI_SECRET not in proc.log() and ALICE_SECRET not in proc.log()
    finally:
        proc.stop()

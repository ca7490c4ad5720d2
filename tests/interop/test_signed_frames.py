"""Identity binding, the ACL gate and per-message authentication: the same
argument list and the same files (made by the reference's own CLI) start the
reference hub and hubd, and each test passes against both
(docs/reference-observed.md §11, §12; docs/identity.md).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from tests.support.signed_site import (CLAIM_ACL, MAC_SECRET, TOKEN, envelope, mac,
                                       sign_registration, start_signed_hub)
from tests.support.wsprobe import WsProbe

pytestmark = pytest.mark.interop

KINDS = ["reference", "hubd"]


@pytest.fixture(params=KINDS)
def site(request, tmp_path: Path, reference_venv_status):
    if reference_venv_status[0] is None:
        from tests.support.prereq import missing
        missing(reference_venv_status[1])
    site = start_signed_hub(request.param, tmp_path, {"p/alice": [], "p/bob": []}, CLAIM_ACL)
    yield site
    site.ref.stop_all()
    site.proc.stop()


async def _registered(site, name: str, signed: bool = True) -> WsProbe:
    probe = await WsProbe.open(site.proc.url)
    hello = envelope(name, "heartbeat", target="System", payload="online",
                     protocol_version=7, token=TOKEN)
    seat = site.seats[name]
    await probe.send_json(sign_registration(hello, seat.pem, seat.key_id) if signed else hello)
    return probe


def test_the_reference_clients_signed_claim_is_granted(site):
    """Unchanged reference client: signed registration, signed claim and release."""
    seat = site.seats["p/alice"]
    agent = site.ref.agent("p/alice", identity=seat.identity, mac=seat.mac)
    since = agent.mark()
    agent.send("claim", target="all", payload="T-1", task_id="T-1")
    granted = agent.wait_frame(type="claim_granted", task_id="T-1", since=since)
    since = agent.mark()
    agent.send("release", target="all", payload="T-1", task_id="T-1", epoch=granted["epoch"])
    agent.wait_frame(type="release_granted", task_id="T-1", since=since)


def test_an_unsigned_registration_is_refused_4013(site):
    async def run():
        probe = await _registered(site, "p/alice", signed=False)
        refusal = await probe.recv_type("error")
        closed = await probe.wait_closed()
        await probe.close()
        return refusal, closed

    refusal, closed = asyncio.run(run())
    assert refusal["payload"] == "identity binding failed: missing_signature"
    assert refusal["verification_result"] == "missing_signature"
    assert (closed.code, closed.reason) == (4013, "identity binding failed")


def test_a_replayed_registration_is_refused(site):
    seat = site.seats["p/alice"]
    hello = sign_registration(envelope("p/alice", "heartbeat", target="System",
                                       payload="online", protocol_version=7, token=TOKEN),
                              seat.pem, seat.key_id)

    async def register():
        probe = await WsProbe.open(site.proc.url)
        await probe.send_json(hello)
        got = await probe.recv(lambda f: f.get("type") in ("presence_update", "error"))
        await probe.close()
        return got

    async def run():
        return await register(), await register()

    first, again = asyncio.run(run())
    assert first["type"] == "presence_update"
    assert again["verification_result"] == "replayed"


def test_a_registration_signed_by_another_seats_key_is_refused(site):
    async def run():
        probe = await WsProbe.open(site.proc.url)
        bob = site.seats["p/bob"]
        hello = envelope("p/alice", "heartbeat", target="System", payload="online",
                         protocol_version=7, token=TOKEN)
        await probe.send_json(sign_registration(hello, bob.pem, bob.key_id))
        refusal = await probe.recv_type("error")
        closed = await probe.wait_closed()
        await probe.close()
        return refusal, closed

    refusal, closed = asyncio.run(run())
    assert refusal["verification_result"] == "sender_mismatch"
    assert closed.code == 4013


def test_claims_need_a_valid_auth_and_a_nonce_works_once(site):
    async def run():
        probe = await _registered(site, "p/alice")
        await probe.recv_type("welcome")
        answers = {}
        await probe.send_json(envelope("p/alice", "claim", target="all", task_id="T-2"))
        answers["unsigned"] = await probe.recv_type("error")
        bad = mac(envelope("p/alice", "claim", target="all", task_id="T-2"), "mac-0")
        bad["auth"]["value"] = "00" * 32
        await probe.send_json(bad)
        answers["bad"] = await probe.recv_type("error")
        await probe.send_json(mac(envelope("p/alice", "claim", target="all", task_id="T-2"),
                                  "mac-1"))
        answers["bob's key"] = await probe.recv_type("error")
        claim = mac(envelope("p/alice", "claim", target="all", task_id="T-2"), "mac-0")
        await probe.send_json(claim)
        answers["granted"] = await probe.recv_type("claim_granted")
        await probe.send_json(claim)
        answers["replayed"] = await probe.recv_type("error")
        await probe.close()
        return answers

    answers = asyncio.run(run())
    results = {k: v.get("verification_result") for k, v in answers.items()}
    assert results["unsigned"] == "missing"
    assert answers["unsigned"]["payload"] == "per-message authentication failed: missing"
    assert results["bad"] == "bad_authentication"
    assert results["bob's key"] == "sender_mismatch"
    assert answers["granted"]["owner"] == "p/alice"
    assert results["replayed"] == "replayed"
    for answer in answers.values():
        assert MAC_SECRET not in json.dumps(answer)


def test_the_acl_refuses_a_claim_no_rule_grants_before_any_state_changes(site):
    """CLAIM_ACL grants claims on any task and path; a board task needs
    `board`, which no rule grants: the plain error, nothing on the board."""
    async def run():
        probe = await _registered(site, "p/alice")
        await probe.recv_type("welcome")
        await probe.send_json(envelope("p/alice", "ledger_task", target="all", task_id="B-1",
                                       title="t"))
        denied = await probe.recv_type("error")
        await probe.send_json(envelope("p/alice", "board_request", target="SynapseHub"))
        board = await probe.recv(lambda f: f.get("type") in ("board_snapshot", "board"),
                                 timeout=5)
        await probe.close()
        return denied, board

    denied, board = asyncio.run(run())
    assert denied["payload"] == "access denied: board on board:B-1"
    assert denied["acl_decision"] == "would_deny"
    assert "B-1" not in json.dumps(board)


def test_a_nonce_accepted_before_a_restart_is_refused_after_it(site):
    """The replay ledger survives a restart (hubd: the nonces are journaled)."""
    claim = mac(envelope("p/alice", "claim", target="all", task_id="T-3"), "mac-0")

    async def send(expect: str):
        probe = await _registered(site, "p/alice")
        await probe.recv_type("welcome")
        await probe.send_json(claim)
        answer = await probe.recv_type(expect)
        await probe.close()
        return answer

    assert asyncio.run(send("claim_granted"))["owner"] == "p/alice"
    site.proc.stop()
    site.proc.start()
    assert asyncio.run(send("error"))["verification_result"] == "replayed"


@pytest.fixture(params=KINDS)
def strict_site(request, tmp_path: Path, reference_venv_status):
    """The reference's durable-replay flags, the same argument list for both:
    a replay ledger path and the strict sequence floor."""
    if reference_venv_status[0] is None:
        from tests.support.prereq import missing
        missing(reference_venv_status[1])
    ledger = tmp_path / "replay.db"
    site = start_signed_hub(request.param, tmp_path, {"p/alice": [], "p/bob": []}, CLAIM_ACL,
                            extra=("--message-auth-replay-db", str(ledger),
                                   "--message-auth-sequence-floor-mode", "strict"))
    site.kind, site.ledger = request.param, ledger
    yield site
    site.ref.stop_all()
    site.proc.stop()


def test_strict_refuses_a_sequence_at_or_below_its_floor_across_a_restart(strict_site):
    site = strict_site

    def signed(type_: str, kid: str, sequence: int, sender: str = "p/alice") -> dict:
        return mac(envelope(sender, type_, target="all", task_id="T-9", checkpoint="c"),
                   kid, sequence=sequence)

    async def exchange(sends: list[tuple[dict, str]], sender: str = "p/alice") -> list[dict]:
        probe = await _registered(site, sender)
        await probe.recv_type("welcome")
        answers = []
        for frame, expect in sends:
            await probe.send_json(frame)
            answers.append(await probe.recv(
                lambda f, expect=expect: f.get("type") in (expect, "error")))
        await probe.close()
        return answers

    before = asyncio.run(exchange([
        (signed("claim", "mac-0", 200), "claim_granted"),
        (signed("checkpoint", "mac-0", 150), "checkpoint_saved"),  # below the floor
        (signed("checkpoint", "mac-0", 200), "checkpoint_saved"),  # at it
        (signed("checkpoint", "mac-0", 201), "checkpoint_saved")]))
    # another key and sender has a floor of its own
    bob = asyncio.run(exchange([(signed("claim", "mac-1", 5, "p/bob"), "claim_denied")],
                               "p/bob"))
    site.proc.stop()
    site.proc.start()
    after = asyncio.run(exchange([
        (signed("checkpoint", "mac-0", 201), "checkpoint_saved"),  # the floor survived
        (signed("checkpoint", "mac-0", 202), "checkpoint_saved")]))
    results = [a.get("verification_result", a["type"]) for a in before + bob + after]
    assert results == ["claim_granted", "sequence_mismatch", "sequence_mismatch",
                       "checkpoint_saved", "claim_denied", "sequence_mismatch",
                       "checkpoint_saved"]
    # the reference keeps its own ledger file; hubd's ledger is its journal
    # (docs/identity.md, "Replay memory")
    assert site.ledger.exists() == (site.kind == "reference")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("flags, says", [
    (("--message-auth-replay-db", "x.db"),
     "--message-auth-replay-db requires --require-message-auth"),
    (("--message-auth-sequence-floor-mode", "strict"),
     "--message-auth-sequence-floor-mode requires --require-message-auth"),
])
def test_the_replay_flags_without_message_auth_refuse_the_start(kind, flags, says, tmp_path,
                                                                reference_venv_status):
    from tests.support.procs import hubd_process, reference_hub_process

    if reference_venv_status[0] is None:
        from tests.support.prereq import missing
        missing(reference_venv_status[1])
    make = reference_hub_process if kind == "reference" else hubd_process
    proc = make(tmp_path / "hub", *flags)
    with pytest.raises(Exception):
        proc.start(ready_timeout=15)
    proc.proc.wait(15)
    assert proc.proc.returncode == 2
    assert says in proc.log()

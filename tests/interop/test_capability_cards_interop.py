"""Signed capability cards: the reference client, built with a card key,
advertises to the reference hub and to hubd started with the same
--capability-card-trust file; both project the same verification on the
broadcast card and in the manifest (docs/capabilities.md "Signed cards";
docs/reference-observed.md §22)."""

from __future__ import annotations

import subprocess

import pytest

from tests.interop.conftest import KINDS, _need_reference, _wait_healthy
from tests.support.procs import hubd_process, reference_hub_process
from tests.support.refclient import RefClient

pytestmark = pytest.mark.interop


def _keygen(venv, folder, key_id: str, agent: str, trust=None):
    pem = folder / f"{key_id}.pem"
    argv = [str(venv / "bin" / "synapse"), "capability-card", "keygen", "--key-id", key_id,
            "--private-out", str(pem), "--agent", agent, "--project", agent.split("/")[0]]
    if trust is not None:
        argv += ["--trust", str(trust)]
    subprocess.run(argv, check=True, capture_output=True, timeout=60)
    return pem


@pytest.fixture(params=KINDS)
def card_site(request, tmp_path):
    venv = _need_reference(request.getfixturevalue("reference_venv_status"))
    keys = tmp_path / "keys"
    keys.mkdir()
    trust = keys / "card-trust.json"
    pems = {"alice": _keygen(venv, keys, "card-1", "p/alice", trust),
            "dan": _keygen(venv, keys, "card-9", "p/dan")}  # not in the trust file
    flags = ("--capability-card-trust", str(trust))
    if request.param == "reference":
        proc = reference_hub_process(tmp_path / "ref", "--no-durable-ingress-quota", *flags)
    else:
        proc = hubd_process(tmp_path / "hubd", *flags)
    proc.start()
    _wait_healthy(proc)
    proc.kind = request.param
    yield proc, pems, tmp_path
    proc.stop()


def _seen(agent, since, who: str) -> dict:
    got = agent.wait_frame(since=since, type="capability_advertised", agent=who)
    return got["card"]["verification"]


def test_the_reference_clients_signed_cards_get_the_same_verification(card_site):
    proc, pems, tmp_path = card_site
    ref = RefClient(proc.url, tmp_path / "home")
    try:
        alice = ref.agent("p/alice", card_key=(pems["alice"], "card-1", "p"))
        dan = ref.agent("p/dan", card_key=(pems["dan"], "card-9", "p"))
        carol = ref.agent("p/carol")
        card = {"description": "builder", "skills": ["python"], "task_classes": ["code"]}
        results = {}
        for name, agent in (("p/alice", alice), ("p/dan", dan), ("p/carol", carol)):
            since = carol.mark()
            agent.advertise(**card)
            shown = _seen(carol, since, name)
            results[name] = (shown["result"], shown["detail"], shown.get("key_id"))
        assert results == {
            "p/alice": ("valid", "signature, bindings, expiry, and lifecycle checks passed",
                        "card-1"),
            "p/dan": ("unknown_key",
                      "signature key is absent from the capability-card trust bundle", "card-9"),
            "p/carol": ("missing_signature", "card is unsigned and remains advisory discovery",
                        None),
        }, proc.kind
        # a second card from alice: a new sequence, still valid
        since = carol.mark()
        alice.advertise(description="builder", skills=["python", "rust"], task_classes=["code"])
        assert _seen(carol, since, "p/alice")["result"] == "valid", proc.kind
        since = carol.mark()
        carol.send("manifest_request")
        manifest = carol.wait_frame(since=since, type="manifest_snapshot")["manifest"]
        by_agent = {e["agent"]: e["verification"]["result"] for e in manifest}
        assert by_agent == {"p/alice": "valid", "p/dan": "unknown_key",
                            "p/carol": "missing_signature"}, (proc.kind, manifest)
    finally:
        ref.stop_all()

"""Shared-pool reservations (F02, issue 24 item 3): the same spend_request
frames, sent by a peer hub over mTLS with its client certificate, get the
same answers from a reference pool owner (synapse-channel 0.99.38, its ledger
configured with `synapse spend configure`) and from a hubd pool owner (its
owner-only ledger holding the same pool configuration document).

Compared field for field except what is each ledger's own: the reservation
id (opaque) and its expiry (the hub's clock plus wall_seconds), both checked
for shape. docs/reference-observed.md "Issue 24 item 3" has the observed
answers; docs/guard-evidence-and-spend.md says hubd's decisions.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from federation.tls import peer_client_context
from tests.support.federation import make_pki, write_serving_policy
from tests.support.prereq import missing
from tests.support.procs import hubd_process, reference_env, reference_hub_process
from tests.support.spend_docs import (REFUSED, ledger_file, pool_config, query_doc,
                                      reserve_doc, settle_doc)
from tests.support.wsprobe import WsProbe

pytestmark = pytest.mark.interop

CONFLICT = {"reserve": {"admitted": False, "reason": "idempotency_conflict"},
            "settle": {"settled": False, "reason": "idempotency_conflict"}}


def _reference_ledger(folder: Path, venv: Path, config: dict) -> Path:
    """The reference's owner ledger, configured by its own command."""
    folder.mkdir(mode=0o700)
    document = folder / "pool.json"
    document.write_text(json.dumps(config))
    document.chmod(0o600)
    ledger = folder / "spend.sqlite3"
    subprocess.run([str(venv / "bin" / "synapse"), "spend", "configure", "--ledger", str(ledger),
                    "--hub-id", "owner", "--file", str(document)],
                   env=reference_env(folder / "home"), check=True, capture_output=True,
                   timeout=60)
    return ledger


@pytest.fixture(params=["reference", "hubd"])
def owner(request, tmp_path: Path, reference_venv_status):
    venv, why = reference_venv_status
    if venv is None:
        missing(why)
    pki = make_pki(tmp_path / "pki", ["owner", "east", "north"], sans=["127.0.0.1"])
    policy = write_serving_policy(tmp_path / "policy", pki, {"east": ["PROJ"],
                                                             "north": ["PROJ"]})
    config = pool_config(owner="owner", hard_bound="100")
    if request.param == "reference":
        ledger = _reference_ledger(tmp_path / "ledger", venv, config)
        start = reference_hub_process
    else:
        ledger = ledger_file(tmp_path, config)
        start = hubd_process
    proc = start(tmp_path / "hub", "--tls-certfile", pki.file("owner", "server", "cert"),
                 "--tls-keyfile", pki.file("owner", "server", "key"),
                 "--multihub-serving-policy", str(policy), "--spend-ledger", str(ledger),
                 hub_id="owner", scheme="wss").start()
    proc.pki, proc.kind = pki, request.param
    yield proc
    proc.stop()


async def _peer(owner, hub: str) -> WsProbe:
    """A peer hub's connection: its client certificate, registered under its
    hub id (the reference serves a spend_request only from a connection whose
    name is the serving policy grant's `sender`)."""
    context = peer_client_context(owner.pki.file(hub, "client", "cert"),
                                  owner.pki.file(hub, "client", "key"))
    probe = await WsProbe.open(owner.url, ssl=context)
    await probe.register(hub)
    await probe.recv_type("welcome")
    probe.hub = hub
    return probe


async def _ask(probe: WsProbe, action: str, document) -> dict:
    probe._cursor = len(probe.frames)
    await probe.send_json({"sender": probe.hub, "target": "System", "type": "spend_request",
                           "spend_action": action, "spend": document})
    frame = await probe.recv(lambda f: f.get("type") in ("spend_result", "error"), timeout=20)
    if frame["type"] == "error":
        return {"error": frame["payload"]}
    assert frame["spend_action"] == action
    return frame["spend_result"]


def _opaque(answer: dict, asked_at: datetime) -> dict:
    """The answer without the ledger's own values, which are checked for shape."""
    answer = dict(answer)
    reservation_id = answer.pop("reservation_id")
    assert reservation_id.startswith("rsv-") and len(reservation_id) > 8
    if "expires_at" in answer:
        expires = datetime.fromisoformat(answer.pop("expires_at"))
        assert abs(expires - (asked_at + timedelta(seconds=60))) < timedelta(seconds=10)
    return answer


def test_reserve_settle_query_answer_as_the_reference(owner):
    async def scenario():
        east = await _peer(owner, "east")
        now = datetime.now(timezone.utc)
        first = await _ask(east, "reserve", reserve_doc("k1", "40"))
        assert first["admitted"] is True, first
        assert _opaque(first, now) == {"admitted": True, "pool_id": "gpu", "epoch": 1,
                                       "config_revision": 1, "sequence": 2,
                                       "exposure": "40", "unit": "tokens"}
        # a retry answers the stored answer; a query finds it
        assert await _ask(east, "reserve", reserve_doc("k1", "40")) == first
        assert await _ask(east, "query", query_doc("k1")) == {"found": True, "response": first}
        assert await _ask(east, "query", query_doc("k-none")) == REFUSED["query"]
        # another document for the same scope: the reference names the
        # conflict, hubd answers its one refusal (docs/guard-evidence-and-spend.md)
        assert await _ask(east, "reserve", reserve_doc("k1", "41")) == (
            CONFLICT["reserve"] if owner.kind == "reference" else REFUSED["reserve"])
        # every other refusal, whatever its cause, is the one shape
        # (each its own key: the reference stores a refusal too, so another
        # document under a refused key would be its conflict)
        for document in (reserve_doc("k2", "70"),                   # over the pool's bound
                         reserve_doc("k3", "1", unit="dollars"),    # not the pool's unit
                         reserve_doc("k4", "1", depth=9),           # deeper than allowed
                         {**reserve_doc("k5", "1"), "extra": 1},    # not the document
                         {"pool_id": "gpu", "key": "k6", "upper_bound": "1"},  # hubd's old one
                         reserve_doc("k7", "1", pool_id="cpu")):   # no such pool
            assert await _ask(east, "reserve", document) == REFUSED["reserve"], document
        rid = first["reservation_id"]
        settled = await _ask(east, "settle", settle_doc(rid, "u1", "30"))
        assert settled == {"settled": True, "reservation_id": rid, "usage_ref": "u1",
                           "overrun": False}
        assert await _ask(east, "settle", settle_doc(rid, "u1", "30")) == settled
        for document in (settle_doc(rid, "u2", "5"),                # after the final settlement
                         settle_doc("rsv-" + "0" * 32, "u1", "1"),  # no such reservation
                         ):
            assert await _ask(east, "settle", document) == REFUSED["settle"], document
        assert await _ask(east, "settle", settle_doc(rid, "u1", "31")) == (
            CONFLICT["settle"] if owner.kind == "reference" else REFUSED["settle"])
        # what is settled counts against the bound, the released rest does
        # not: 30 settled + 70 is the bound exactly, 71 is over it
        assert await _ask(east, "reserve", reserve_doc("k8", "71")) == REFUSED["reserve"]
        second = await _ask(east, "reserve", reserve_doc("k9", "70"))
        # the pool's sequence moved on (the reference's counts its stored
        # refusals too, hubd's only grants and settlements)
        assert second.pop("sequence") > first["sequence"]
        assert _opaque(second, now) == {"admitted": True, "pool_id": "gpu", "epoch": 1,
                                        "config_revision": 1, "exposure": "70",
                                        "unit": "tokens"}
        assert await _ask(east, "reserve", reserve_doc("k10", "1")) == REFUSED["reserve"]
        # north is served by the policy but not a grantee of the pool, and
        # cannot see or settle east's reservation
        north = await _peer(owner, "north")
        assert await _ask(north, "reserve", reserve_doc("k9", "1")) == REFUSED["reserve"]
        assert await _ask(north, "query", query_doc("k1")) == REFUSED["query"]
        assert await _ask(north, "settle", settle_doc(rid, "u9", "1")) == REFUSED["settle"]
        # an action the verb does not have is a plain error
        assert await _ask(east, "drain", {}) == {"error": "Malformed spend request"}
        await east.close()
        await north.close()

    asyncio.run(scenario())

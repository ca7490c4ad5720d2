"""The published reference client's delivery API, unchanged, against hubd.

The reference (synapse-channel 0.99.38, AGPL) runs only as a separate program
(tests/support/ref_delivery_driver.py under its own venv): SynapseAgent with
delivery_capabilities and DeliveryParticipantBridge as the recipient,
request_who / request_delivery / request_delivery_status / cancel_delivery as
the sender; the bridge reports stages with report_delivery_stage.

The reference client sends delivery verbs only to a hub whose welcome says
wire v3 or later; hubd's does, and so does its /health.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path

from tests.support import ref_forks
from tests.support.delivery_driver import Agent, delivery_rows, operation_key
from tests.support.procs import REPO, hubd_process, reference_env

DRIVER = REPO / "tests" / "support" / "ref_delivery_driver.py"
HUB_ID = "iop-dlv"


def drive(venv, url: str, workdir, scenario: str) -> list[dict]:
    _, out, err = ref_forks.run(
        venv / "bin" / "python", [DRIVER, "--uri", url, "--ns", "iop",
                                  "--ledger", workdir / f"ledger-{scenario}",
                                  "--scenario", scenario],
        reference_env(workdir / "home"), Path.cwd(), timeout=60)
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert any(line["event"] == "done" for line in lines), (out[-3000:], err[-3000:])
    return lines


def test_reference_client_delivery_api_against_hubd(reference_venv_status, tmp_path):
    venv, why = reference_venv_status
    if venv is None:
        from tests.support.prereq import missing
        missing(why)
    hub = hubd_process(tmp_path / "hub", hub_id=HUB_ID)
    hub.start()
    try:
        assert hub.get_json("/health")["protocol_version"] >= 3
        lines = drive(venv, hub.url, tmp_path, "full")
        ops = {line["name"]: line["operation_key"] for line in lines if line["event"] == "op"}
        # the key the reference client computed is the one hubd uses
        assert ops["job-1"] == operation_key(HUB_ID, "iop/alice", "job-1")
        frames = [(line["who"], line["frame"]) for line in lines if line["event"] == "frame"]
        to_alice = [f for who, f in frames if who == "alice"]
        to_bob = [f for who, f in frames if who == "bob"]
        key = ops["job-1"]
        notes = [(f["stage"], f["notification_id"], f["source"]) for f in to_alice
                 if f.get("type") == "delivery_status" and "audience" in f
                 and f["operation_key"] == key]
        assert notes == [("boundary_delivered", f"delivery:{key}:2", "recipient"),
                         ("acknowledged", f"delivery:{key}:3", "recipient"),
                         ("completed", f"delivery:{key}:4", "recipient")]
        final = [f for f in to_alice if f.get("type") == "delivery_status"
                 and "audience" not in f and f["operation_key"] == key][-1]
        assert (final["stage"], final["task_completed"], final["explicitly_acknowledged"]) == \
            ("completed", True, True)
        offers = [f for f in to_bob if f.get("type") == "delivery_offer"]
        assert [o["request_id"] for o in offers] == ["job-1", "job-2"]
        # job-2 was cancelled right after it was requested. A cancel is a
        # request: the bridge either ran the turn anyway (it had the offer
        # first) and completed it, keeping both facts, or confirmed the cancel
        # before starting it, which is terminal too. The driver waited for one.
        turns = [line["prompt"] for line in lines if line["event"] == "turn"]
        assert turns in (["summarise the log"], ["summarise the log", "second"]), turns
        terminal = [line for line in lines if line["event"] in ("terminal", "no_terminal")]
        assert [t["event"] for t in terminal] == ["terminal"], lines[-20:]
        key2 = ops["job-2"]
        last2 = [f for f in to_alice if f.get("type") == "delivery_status"
                 and "audience" not in f and f["operation_key"] == key2][-1]
        # steer is not advertised, the sender's fallback is
        assert (last2["selected_mode"], last2["quality"], last2["cancel_requested"]) == \
            ("follow_up", "emulated", True)
        notes2 = [f for f in to_alice if f.get("type") == "delivery_status" and "audience" in f
                  and f["operation_key"] == key2]
        if len(turns) == 2:  # the completion racing the cancel keeps both facts
            assert terminal[0]["stage"] == "completed"
            assert (last2["stage"], last2["task_completed"],
                    last2["explicitly_acknowledged"]) == ("completed", True, True)
        else:  # the bridge confirmed the cancel: no turn, no completion
            assert terminal[0]["stage"] == "cancelled"
            assert (last2["stage"], last2["task_completed"]) == ("cancelled", False)
            assert notes2[-1]["source"] == "recipient"
            rows2 = [p for _, k, p in delivery_rows(hub.argv[hub.argv.index("--db") + 1])
                     if k == "delivery_stage" and p.get("operation_key") == key2]
            # observed: {"reason_code": "sender_cancelled"}, the bridge's
            # confirmation before the turn; the executor's own shape is allowed too
            assert rows2[-1]["stage"] == "cancelled", rows2
            assert rows2[-1]["evidence"] == {"reason_code": "sender_cancelled"} or \
                set(rows2[-1]["evidence"]) == {"executor_ref", "outcome_code"}, rows2
        assert [n["stage"] for n in notes2][-1] == last2["stage"]
        kinds = [k for _, k, p in delivery_rows(hub.argv[hub.argv.index("--db") + 1])
                 if p.get("operation_key") == key]
        assert kinds[:2] == ["delivery_intent_accepted", "delivery_intent_queued"]
        assert kinds.count("delivery_stage") == 3

        hub.stop()
        hub.start()

        # the reference client pinned iop/alice to its machine key (trust on
        # first use, as on the reference hub): this raw client proves that key
        db = hub.argv[hub.argv.index("--db") + 1]
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        pinned = [json.loads(row[0]) for row in con.execute(
            "SELECT payload FROM events WHERE kind = 'identity_pinned'")]
        con.close()
        pinned = [p for p in pinned if p["name"] == "iop/alice"]
        machine = tmp_path / "home" / "xdg_data_home" / "synapse" / "identity" / "machine.pem"

        async def replayed():
            alice = await Agent.join(hub.url, "iop/alice",
                                     signed_by=(machine, pinned[0]["key_id"]))
            statuses = [await alice.status(key), await alice.status(key2)]
            await alice.close()
            return statuses
        status, status2 = asyncio.run(replayed())
        facts = ("stage", "task_completed", "cancel_requested", "latest_event_seq")
        assert {k: status[k] for k in facts} == {k: final[k] for k in facts}
        assert {k: status2[k] for k in facts} == {k: last2[k] for k in facts}
    finally:
        hub.stop()


def test_an_idempotency_key_reused_under_a_new_request_id_is_refused(hub, reference_venv_status,
                                                                     tmp_path):
    """The reference client's request_delivery, unchanged: job-1, its retry,
    job-2 under job-1's idempotency key, job-3 under a fresh one. Both hubs
    answer alike: the retry is job-1's operation again, job-2 is id_conflict
    with the reference's words, job-3 is admitted (d590ccf admitted job-2)."""
    venv, why = reference_venv_status
    if venv is None:
        from tests.support.prereq import missing
        missing(why)
    lines = drive(venv, hub.url, tmp_path, "reuse")
    answers = [line["frame"] for line in lines if line["event"] == "answer"]
    assert [a.get("request_id") for a in answers] == ["job-1", "job-1", "job-2", "job-3"], answers
    first, retry, reused, fresh = answers
    assert (first["type"], first["stage"]) == ("delivery_status", "queued")
    assert (retry["type"], retry["operation_key"]) == ("delivery_status", first["operation_key"])
    assert {k: reused.get(k) for k in ("type", "reason_code", "payload", "protocol_version")} == {
        "type": "delivery_refused", "reason_code": "id_conflict",
        "payload": "request identity was reused with new content", "protocol_version": 3}
    assert "operation_key" not in reused
    assert (fresh["type"], fresh["stage"]) == ("delivery_status", "queued")
    assert fresh["operation_key"] == operation_key(hub.hub_id, "iop/alice", "job-3")
    if hub.kind == "hubd":
        db = hub.proc.argv[hub.proc.argv.index("--db") + 1]
        accepted = [p["request_id"] for _, k, p in delivery_rows(db)
                    if k == "delivery_intent_accepted"]
        assert accepted == ["job-1", "job-3"]

"""The published reference client's delivery API, unchanged, against hubd.

The reference (synapse-channel 0.99.38, AGPL) runs only as a separate program
(tests/support/ref_delivery_driver.py under its own venv): SynapseAgent with
delivery_capabilities and DeliveryParticipantBridge as the recipient,
request_who / request_delivery / request_delivery_status / cancel_delivery as
the sender; the bridge reports stages with report_delivery_stage.

The reference client sends delivery verbs only to a hub whose welcome says
wire v3 or later. hubd's default welcome still says 2 (the bump is issue 11's
step 6), so the full run uses the pre-release --welcome-wire-v3; against the
default welcome the client refuses locally, which is the seed's "v3 client,
v2 hub" row.
"""

from __future__ import annotations

import asyncio
import json
import subprocess

from tests.support.delivery_driver import Agent, delivery_rows, operation_key
from tests.support.procs import REPO, hubd_process, reference_env

DRIVER = REPO / "tests" / "support" / "ref_delivery_driver.py"
HUB_ID = "iop-dlv"


def drive(venv, url: str, workdir, scenario: str) -> list[dict]:
    result = subprocess.run(
        [str(venv / "bin" / "python"), str(DRIVER), "--uri", url, "--ns", "iop",
         "--ledger", str(workdir / f"ledger-{scenario}"), "--scenario", scenario],
        capture_output=True, text=True, timeout=60, env=reference_env(workdir / "home"))
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert any(line["event"] == "done" for line in lines), (result.stdout[-3000:],
                                                           result.stderr[-3000:])
    return lines


def test_reference_client_delivery_api_against_hubd(reference_venv_status, tmp_path):
    venv, why = reference_venv_status
    if venv is None:
        from tests.support.prereq import missing
        missing(why)
    hub = hubd_process(tmp_path / "hub", "--welcome-wire-v3", hub_id=HUB_ID)
    hub.start()
    try:
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
        # the second turn runs unless the bridge saw the cancel first
        turns = [line["prompt"] for line in lines if line["event"] == "turn"]
        assert turns in (["summarise the log"], ["summarise the log", "second"]), turns
        # job-2: steer is not advertised, the sender's fallback is; its cancel
        # stays a request, and the bridge's completion keeps both facts
        key2 = ops["job-2"]
        last2 = [f for f in to_alice if f.get("type") == "delivery_status"
                 and "audience" not in f and f["operation_key"] == key2][-1]
        assert (last2["selected_mode"], last2["quality"], last2["cancel_requested"]) == \
            ("follow_up", "emulated", True)
        assert last2["stage"] in ("completed", "acknowledged", "boundary_delivered", "queued")
        if len(turns) == 2:  # the completion racing the cancel keeps both facts
            assert last2["stage"] == "completed" and last2["task_completed"] is True
        kinds = [k for _, k, p in delivery_rows(hub.argv[hub.argv.index("--db") + 1])
                 if p.get("operation_key") == key]
        assert kinds[:2] == ["delivery_intent_accepted", "delivery_intent_queued"]
        assert kinds.count("delivery_stage") == 3

        hub.stop()
        hub.start()

        async def replayed():
            alice = await Agent.join(hub.url, "iop/alice")
            status = await alice.status(key)
            await alice.close()
            return status
        status = asyncio.run(replayed())
        assert {k: status[k] for k in ("stage", "task_completed", "latest_event_seq")} == \
            {k: final[k] for k in ("stage", "task_completed", "latest_event_seq")}
    finally:
        hub.stop()


def test_reference_client_refuses_delivery_on_a_hub_that_says_v2(reference_venv_status,
                                                                 tmp_path):
    venv, why = reference_venv_status
    if venv is None:
        from tests.support.prereq import missing
        missing(why)
    hub = hubd_process(tmp_path / "hub", hub_id=HUB_ID)
    hub.start()
    try:
        lines = drive(venv, hub.url, tmp_path, "v2hub")
        refused = [line for line in lines if line["event"] == "refused"]
        assert refused and "v3" in refused[0]["text"], lines
        assert delivery_rows(hub.argv[hub.argv.index("--db") + 1]) == []
        assert hub.get_json("/health")["protocol_version"] == 2
    finally:
        hub.stop()

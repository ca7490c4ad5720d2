"""Forwarded delivery intents (wire v5) with the reference hub as the peer, in
both directions.

The reference hub (synapse-channel 0.99.38, AGPL) runs from its own venv as a
black box; agents on both sides are raw v3 delivery clients
(tests/support/delivery_driver.py), so each hub sees the frames the reference
client sends. The same scenario runs against either pairing: admission across
the link, the offer as from PROJ/alice@east, boundary and ACK reports read
back by the sender's status requests, a cancel routed to the peer and told to
the recipient, the completion, another seat's follow-ups refused, steer
refused as unauthorised_requester."""

from __future__ import annotations

import asyncio

import pytest

from tests.support.delivery_driver import CAPS, Agent, operation_key
from tests.support.federation import make_pki, site_flags, write_serving_policy
from tests.support.prereq import missing
from tests.support.procs import hubd_process, reference_hub_process
from tests.support.waiting import wait_for

pytestmark = pytest.mark.interop

CONTROL_CAPS = {"steer": "native", "interrupt": "native", "next_turn": "native"}
KEY = operation_key("east", "PROJ/alice@east", "r1")  # both hubs compute it so


@pytest.fixture
def pki(tmp_path, reference_venv_status):
    if reference_venv_status[0] is None:
        missing(reference_venv_status[1])
    return make_pki(tmp_path / "pki", ["east", "west"])


async def scenario(east_url: str, west_url: str, sender_version: int,
                   recipient_version: int) -> None:
    bob = await Agent.join(west_url, "PROJ/bob", version=recipient_version, recipient=True)
    dan = await Agent.join(west_url, "PROJ/dan", version=recipient_version, recipient=True,
                           caps=CONTROL_CAPS)
    alice = await Agent.join(east_url, "PROJ/alice", version=sender_version)
    carol = await Agent.join(east_url, "PROJ/carol", version=sender_version)
    # the sender learns bob's incarnation from west's roster
    await alice.send("who_request", hub="west")
    who = await alice.probe.recv_type("who_snapshot", 10)
    assert who["delivery_sessions"]["PROJ/bob@west"] == {
        "incarnation": bob.incarnation, "capabilities": CAPS, "hub_id": "west"}, who

    queued = await alice.request("PROJ/bob@west", bob.incarnation, "r1")
    assert queued["type"] == "delivery_status", queued
    assert (queued["stage"], queued["remote_hub"], queued["operation_key"]) == \
        ("queued", "west", KEY)
    offer = await bob.offer("r1", timeout=10)
    assert (offer["sender"], offer["origin_hub"], offer["operation_key"]) == \
        ("PROJ/alice@east", "east", KEY)

    for refused in (await carol.status(KEY), await carol.cancel(KEY, "c-carol")):
        assert (refused["type"], refused["reason_code"]) == \
            ("delivery_refused", "unauthorised_requester")

    await bob.report(offer, "boundary_delivered")
    await bob.report(offer, "acknowledged")
    status = await alice.status(KEY)
    assert (status["stage"], status["boundary_delivered"], status["explicitly_acknowledged"],
            status["remote_hub"]) == ("acknowledged", True, True, "west")

    cancelled = await alice.cancel(KEY, "cancel-1")
    assert (cancelled["type"], cancelled["stage"], cancelled["cancel_requested"]) == \
        ("delivery_status", "acknowledged", True)
    told = await bob.notification("r1", "acknowledged", timeout=10)
    assert told["source"] == "sender" and told["cancel_requested"] is True

    await bob.report(offer, "completed")
    final = await alice.status(KEY)
    assert (final["stage"], final["task_completed"], final["cancel_requested"],
            final["remote_hub"]) == ("completed", True, True, "west")

    steer = await alice.request("PROJ/dan@west", dan.incarnation, "r2", mode="steer")
    assert (steer["type"], steer["reason_code"], steer["request_id"]) == \
        ("delivery_refused", "unauthorised_requester", "r2")
    assert (await alice.request("PROJ/bob@nowhere", bob.incarnation, "r3"))["reason_code"] == \
        "unknown_hub"
    assert (await alice.request("OTHER/x@west", bob.incarnation, "r4"))["reason_code"] == \
        "namespace_not_granted"
    for agent in (bob, dan, alice, carol):
        await agent.close()


def test_hubd_east_forwards_intents_to_reference_west(tmp_path, pki):
    policy = write_serving_policy(tmp_path / "west-policy", pki, {"east": ["PROJ"]})
    west = reference_hub_process(tmp_path / "west", "--no-durable-ingress-quota",
                                 *site_flags(pki, "west", policy).serve, hub_id="west",
                                 scheme="wss")
    west.start()
    site = site_flags(pki, "east", None)
    east = hubd_process(tmp_path / "east", *site.peer_flags(pki, "west", west.url),
                        *site.connect, hub_id="east")
    try:
        east.start()
        link = lambda: east.get_json("/health")["message_forward"]["west"]  # noqa: E731
        wait_for(lambda: link()["link"] == "up", what="east's link to the reference west")
        # the reference lists no hubd features: its wire version speaks for it
        assert link()["peer_features"] is None and link()["peer_protocol_version"] >= 5
        asyncio.run(scenario(east.url, west.url, sender_version=3, recipient_version=7))

        # after east restarts, the journaled route still sends the status to west
        east.stop()
        east.start()
        wait_for(lambda: link()["link"] == "up", what="the link again after east's restart")

        async def status_after_restart():
            alice = await Agent.join(east.url, "PROJ/alice")
            status = await alice.status(KEY)
            await alice.close()
            return status

        status = asyncio.run(status_after_restart())
        assert (status["type"], status["stage"], status["remote_hub"]) == \
            ("delivery_status", "completed", "west")
    finally:
        east.stop()
        west.stop()


def test_reference_east_forwards_intents_to_hubd_west(tmp_path, pki):
    policy = write_serving_policy(tmp_path / "west-policy", pki, {"east": ["PROJ"]})
    west = hubd_process(tmp_path / "west", *site_flags(pki, "west", policy).serve,
                        hub_id="west", scheme="wss")
    west.start()
    east = reference_hub_process(
        tmp_path / "east", "--no-durable-ingress-quota",
        *site_flags(pki, "east", None).peer_flags(pki, "west", west.url),
        *site_flags(pki, "east", None).connect, hub_id="east")
    try:
        east.start()
        asyncio.run(scenario(east.url, west.url, sender_version=7, recipient_version=3))
    finally:
        east.stop()
        west.stop()


def test_reference_client_delivery_api_across_two_hubd_hubs(tmp_path, pki,
                                                            reference_venv_status):
    """The published client unchanged, alice on east and bob (with the
    DeliveryParticipantBridge) on west: request_who(hub=...) gives bob's
    incarnation, request_delivery across, request_delivery_status until the
    bridge's completion shows. Both hubds welcome v3:
    the client sends no delivery verb to a hub below 3."""
    import json
    from pathlib import Path

    from tests.support import ref_forks
    from tests.support.procs import REPO, reference_env

    venv = reference_venv_status[0]
    policy = write_serving_policy(tmp_path / "west-policy", pki, {"east": ["iop"]})
    west = hubd_process(tmp_path / "west", *site_flags(pki, "west", policy).serve,
                        hub_id="west", scheme="wss").start()
    site = site_flags(pki, "east", None)
    east = hubd_process(tmp_path / "east", *site.peer_flags(pki, "west", west.url),
                        *site.connect, hub_id="east").start()
    try:
        wait_for(lambda: east.get_json("/health")["message_forward"]["west"]["link"] == "up",
                 what="east's link to west")
        _, out, err = ref_forks.run(
            venv / "bin" / "python",
            [REPO / "tests" / "support" / "ref_delivery_driver.py",
             "--uri", east.url, "--bob-uri", west.url, "--peer", "west", "--ns", "iop",
             "--ledger", tmp_path / "ledger", "--scenario", "across"],
            # bob's client trusts west's certificate through the test CA
            {**reference_env(tmp_path / "home"), "SSL_CERT_FILE": str(pki.folder / "ca.pem")},
            Path.cwd(), timeout=90)
        (tmp_path / "driver.out").write_text(out + "\n" + err)
        lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        events = {line["event"]: line for line in lines}
        assert "done" in events, (out[-6000:], err[-3000:])
        answer = events["answer"]["frame"]
        key = operation_key("east", "iop/alice@east", "job-1")
        assert (answer["type"], answer["operation_key"], answer["remote_hub"]) == \
            ("delivery_status", key, "west"), answer
        assert "completed" in events, lines[-10:]
        done = events["completed"]["frame"]
        assert (done["task_completed"], done["explicitly_acknowledged"], done["remote_hub"]) == \
            (True, True, "west")
        # the stage changes were pushed to the unchanged client as local
        # notifications are (docs/delivery.md, "Stage changes across hubs")
        pushed = [line["frame"] for line in lines if line["event"] == "frame"
                  and line["who"] == "alice" and "audience" in line["frame"]]
        assert ("completed", "iop/alice", "west") in [
            (f["stage"], f["audience"], f["remote_hub"]) for f in pushed], pushed
        offers = [line["frame"] for line in lines if line["event"] == "frame"
                  and line["who"] == "bob" and line["frame"].get("type") == "delivery_offer"]
        assert [(o["sender"], o["origin_hub"]) for o in offers] == [("iop/alice@east", "east")]
        # request_delivery returns the key of a local request
        # (sha256([east, iop/alice, job-1])); a forwarded intent's key names
        # the requester as the peer sees it (iop/alice@east), in the reference
        # as in hubd, so the client follows it up by the answer's key
        assert events["op"]["operation_key"] == operation_key("east", "iop/alice", "job-1")
    finally:
        east.stop()
        west.stop()

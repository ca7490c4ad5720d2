"""Property, one per hub-to-hub verb of forwarded delivery stage changes
(issue 24 item 9; federation/delivery_notice_rules.py):

- `multihub_delivery_notices`, at the origin (east): random pushes from the
  peer of notices for the routed operation (stages, ids that repeat), for
  another seat, for an operation never routed, with a bad stage or a missing
  field, or not an object, and restarts of east. East takes a notice exactly
  when the model says (routed, well formed, an id not taken before, across
  restarts); one not taken changes neither the journal nor the projection;
  after every push the Router's projection equals a fresh replay.
- `multihub_delivery_notices_ack`, at the recipient's hub (west): random
  acknowledgements from east's link (ids queued for east's requesters, ids
  never queued, another origin's requester, malformed frames) and restarts
  of west. An acknowledgement settles exactly the queued ids it names for
  east's own requesters; the rest change nothing; live equals replay.

Real in-process hubs (flags parsed by hubd.cli.load), real sockets, mutual
TLS with the test CA's certificates; the other side of each link is a
hand-written peer.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time
from pathlib import Path

import aiohttp
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from federation import delivery_notice_rules as nr
from federation.tls import peer_client_context
from hubd.state import delivery_intents as di
from tests.integration.test_delivery_forward import fake_status
from tests.integration.test_evidence_property import Hub
from tests.support.delivery_driver import Agent
from tests.support.federation import (fake_peer_hub, make_pki, site_flags,
                                      write_serving_policy)

SETTINGS = settings(max_examples=10, deadline=None, derandomize=True,
                    suppress_health_check=list(HealthCheck))
KEY = "b" * 64


async def until(predicate, what: str, timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, f"timed out: {what}"
        await asyncio.sleep(0.01)


# -- multihub_delivery_notices, at the origin

def notice(variant: str, nid: str, stage: str) -> object:
    base = {"audience": "PROJ/alice@east", "cancel_requested": False, "event_seq": 9,
            "notification_id": nid, "operation_key": KEY, "protocol_version": 3,
            "request_id": "r1", "sender": "SynapseHub", "source": "recipient",
            "stage": stage, "target": "PROJ/bob", "target_incarnation": "a" * 64,
            "task_id": "task-r1", "type": "delivery_status"}
    if variant == "other-seat":
        base["audience"] = "PROJ/carol@east"
    elif variant == "unrouted":
        base["operation_key"] = "c" * 64
    elif variant == "bad-stage":
        base["stage"] = "exploded"
    elif variant == "missing-field":
        del base["task_id"]
    elif variant == "not-an-object":
        return ["not", "a", "notice"]
    return base


push_steps = st.lists(st.one_of(
    st.tuples(st.sampled_from(["routed"] * 4 + ["other-seat", "unrouted", "bad-stage",
                                                "missing-field", "not-an-object"]),
              st.sampled_from(["n1", "n2", "n3"]),
              st.sampled_from(["boundary_delivered", "acknowledged", "completed"])),
    st.just("restart")), min_size=1, max_size=12)


@SETTINGS
@given(steps=push_steps)
@example(steps=[("routed", "n1", "completed"), ("routed", "n1", "completed"), "restart",
                ("routed", "n1", "acknowledged"), ("unrouted", "n2", "completed"),
                ("routed", "n2", "acknowledged")])
def test_pushed_notices_are_taken_as_the_model_says_and_live_equals_replay(steps):
    with tempfile.TemporaryDirectory() as folder:
        asyncio.run(push_scenario(Path(folder), steps))


async def push_scenario(root: Path, steps) -> None:
    pki = make_pki(root / "pki", ["east", "west"])
    links: list = []  # east's link sockets, newest last
    acked: list[str] = []

    async def on_frame(ws, frame):
        kind = frame.get("type")
        if kind == "heartbeat":
            links.append(ws)
        elif kind == "multihub_message_forward":
            await ws.send_json({"sender": "SynapseHub", "target": "east",
                                "type": "multihub_message_result",
                                "forward_id": frame["forward_id"], "disposition": "accepted",
                                "answering_hub": "west", "reason_code": "", "detail": "",
                                "result": {"status": fake_status(KEY, "r1")}})
        elif kind == nr.ACK:
            acked.extend(a["notification_id"] for a in frame["acks"])

    async with fake_peer_hub(pki, "west", 6, on_frame, features=["delivery_forward"],
                             mtls=True) as port:
        site = site_flags(pki, "east", None)
        hub = Hub(root, ["--hub-id", "east", "--message-peer",
                         f"west=wss://127.0.0.1:{port}/", "--message-peer-pin",
                         f"west={pki.server_pin('west')}", *site.connect])
        await hub.start()
        try:
            await until(lambda: links, "east's link registered")
            alice = await Agent.join(hub.server.url, "PROJ/alice")
            queued = await alice.request("PROJ/bob@west", "a" * 64, "r1")
            assert queued["operation_key"] == KEY, queued
            await alice.close()
            taken: set[str] = set()
            sentinel = 0
            for step in steps:
                if step == "restart":
                    registered = len(links)
                    await hub.stop()
                    await hub.start()
                    await until(lambda: len(links) > registered, "east's link again")
                    continue
                variant, nid, stage = step
                live, replayed = await hub.snapshot()
                assert live == replayed
                before = live.last_seq
                sentinel += 1
                mark = f"sentinel-{sentinel}"  # unrouted: acknowledged, never taken
                await links[-1].send_json({
                    "sender": "SynapseHub", "target": "east", "payload": "", "type": nr.PUSH,
                    "notices": [notice(variant, nid, stage), notice("unrouted", mark, stage)]})
                await until(lambda: mark in acked, "the push handled")
                live, replayed = await hub.snapshot()
                assert live == replayed
                expected = variant == "routed" and nid not in taken
                if expected:
                    taken.add(nid)
                    assert live.last_seq > before, step
                    assert di.delivery_of(live).outbox["PROJ/alice"]  # queued for her
                else:
                    assert live.last_seq == before, step
            live, replayed = await hub.snapshot()
            assert nr.notices_of(live).received.keys() == taken  # across every restart
        finally:
            await hub.stop()


# -- multihub_delivery_notices_ack, at the recipient's hub

ack_steps = st.lists(st.one_of(
    st.sampled_from(["queued", "queued", "queued-twice", "unknown-id", "other-origin",
                     "malformed", "too-long-id"]),
    st.just("restart")), min_size=1, max_size=10)


@contextlib.asynccontextmanager
async def east_link(hub: Hub, pki, pushed: list):
    """A hand-written east on west's door: its client certificate, a
    registration that takes notices; every notice pushed lands in `pushed`."""
    context = peer_client_context(pki.file("east", "client", "cert"),
                                  pki.file("east", "client", "key"))
    url = hub.server.url.replace("ws://", "wss://")
    async with aiohttp.ClientSession() as http:
        async with http.ws_connect(url, ssl=context) as ws:
            await ws.receive_json(timeout=5)  # the welcome
            await ws.send_json({"sender": "east", "target": "System", "type": "heartbeat",
                                "payload": "online", "protocol_version": 6,
                                "hubd_features": [nr.FEATURE]})
            frames: list = []

            async def read():
                async for msg in ws:
                    frame = msg.json()
                    frames.append(frame)
                    if frame.get("type") == nr.PUSH:
                        pushed.extend(frame["notices"])
            reader = asyncio.create_task(read())
            try:
                yield ws, frames
            finally:
                reader.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await reader


async def forward_request(ws, rid: str, incarnation: str) -> None:
    await ws.send_json({"sender": "east", "target": "System",
                        "type": "multihub_message_forward", "forward_id": f"f-{rid}",
                        "kind": "delivery_request", "sender_seat": "PROJ/alice",
                        "target_seat": "PROJ/bob",
                        "body": {"request_id": rid, "idempotency_key": f"idem-{rid}",
                                 "target_incarnation": incarnation, "mode": "next_turn",
                                 "allowed_fallbacks": [], "task_id": f"task-{rid}",
                                 "body": "do it", "deadline": time.time() + 600,
                                 "protocol_version": 3}})


@SETTINGS
@given(steps=ack_steps)
@example(steps=["malformed", "queued", "queued", "restart", "other-origin", "queued-twice"])
def test_acknowledgements_settle_exactly_what_they_name_and_live_equals_replay(steps):
    with tempfile.TemporaryDirectory() as folder:
        asyncio.run(ack_scenario(Path(folder), steps))


async def ack_scenario(root: Path, steps) -> None:
    pki = make_pki(root / "pki", ["west", "east"])
    policy = write_serving_policy(root / "policy", pki, {"east": ["PROJ"]})
    hub = Hub(root, ["--hub-id", "west", *site_flags(pki, "west", policy).serve])
    await hub.start()
    pushed: list = []
    try:
        # three operations from east's alice to bob, each boundary_delivered:
        # notices queued for PROJ/alice@east and pushed to east's link
        async with east_link(hub, pki, pushed) as (ws, _):
            bob = await Agent.join(hub.server.url, "PROJ/bob", recipient=True)
            for rid in ("r1", "r2", "r3"):
                await forward_request(ws, rid, bob.incarnation)
                offer = await bob.offer(rid)
                await bob.report(offer, "boundary_delivered")
            await bob.close()
            await until(lambda: len(pushed) >= 3, "three notices pushed")
        queued_ids = sorted({n["notification_id"] for n in pushed})
        assert len(queued_ids) == 3
        settled: set[str] = set()
        for i, step in enumerate(steps):
            if step == "restart":
                await hub.stop()
                await hub.start()
                continue
            live, replayed = await hub.snapshot()
            assert live == replayed
            before = live.last_seq
            nid = queued_ids[i % 3]
            acks: object = [{"audience": "PROJ/alice@east", "notification_id": nid}]
            if step == "queued-twice":
                acks = acks * 2
            elif step == "unknown-id":
                acks = [{"audience": "PROJ/alice@east", "notification_id": "never-queued"}]
            elif step == "other-origin":
                acks = [{"audience": "PROJ/alice@north", "notification_id": nid}]
            elif step == "malformed":
                acks = [{"audience": 7}]
            elif step == "too-long-id":
                acks = [{"audience": "PROJ/alice@east", "notification_id": "x" * 300}]
            async with east_link(hub, pki, []) as (ws, frames):
                await ws.send_json({"sender": "east", "target": "System", "payload": "",
                                    "type": nr.ACK, "acks": acks})
                # a round trip: the ack before it was handled
                await ws.send_json({"sender": "east", "target": "all", "payload": "",
                                    "type": "multihub_log_request", "after_seq": 0,
                                    "limit": 1})
                await until(lambda: any(f.get("type") == "multihub_log_snapshot"
                                        for f in frames), "the ack handled")
                errors = [f for f in frames if f.get("type") == "error"]
                assert bool(errors) == (step == "malformed" or step == "too-long-id"), frames
            live, replayed = await hub.snapshot()
            assert live == replayed
            settles = step in ("queued", "queued-twice") and nid not in settled
            outbox = di.delivery_of(live).outbox.get("PROJ/alice@east", {})
            if settles:
                settled.add(nid)
                assert live.last_seq == before + 1, step
            else:
                assert live.last_seq == before, step
            assert set(outbox) == set(queued_ids) - settled
    finally:
        await hub.stop()

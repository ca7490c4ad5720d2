"""A peer's grant bounds its claims and its log pulls, as it bounds its forwards
(docs/federation.md, "What a granted peer still cannot do"), with real hubs
over real mutual TLS.

West owns PROJ and OTHER and grants east PROJ only (north: both). East routes
claims to west, forwards chats and delivery intents to it, and watches west's
log; a hand-driven connection holding east's
(or north's) client certificate plays the peer where the real hub would never
send the request.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time

import pytest

from federation.tls import peer_client_context
from tests.support.delivery_driver import Agent
from tests.support.federation import make_pki, site_flags, write_serving_policy
from tests.support.procs import free_port, hubd_process
from tests.support.wsprobe import WsProbe, joined

OWNERS = ["--namespace-owner", "PROJ=west", "--namespace-owner", "OTHER=west"]


@pytest.fixture(scope="module")
def sites(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("grants")
    pki = make_pki(tmp / "pki", ["east", "west", "north"])
    ports = {"west": free_port(), "east": free_port()}
    url = {hub: f"wss://127.0.0.1:{port}/" for hub, port in ports.items()}
    policy = write_serving_policy(tmp / "west-policy", pki,
                                  {"east": ["PROJ"], "north": ["PROJ", "OTHER"]})
    west = hubd_process(tmp / "west", *site_flags(pki, "west", policy).serve, *OWNERS,
                        hub_id="west", port=ports["west"], scheme="wss").start()
    route = [f"west={url['west']}"]
    pin = [f"west={pki.server_pin('west')}"]
    east = hubd_process(tmp / "east", *site_flags(pki, "east", None).serve,
                        *site_flags(pki, "east", None).connect, *OWNERS,
                        "--claim-peer", *route, "--claim-peer-pin", *pin,
                        "--message-peer", *route, "--message-peer-pin", *pin,
                        "--multihub-watch", *route, "--multihub-watch-pin", *pin,
                        "--multihub-watch-interval", "0.5",
                        hub_id="east", port=ports["east"], scheme="wss").start()
    yield pki, url, tmp / "west" / "hubd.db", tmp / "east" / "hubd.db", west, east
    east.stop()
    west.stop()


def events(db) -> list[tuple]:
    conn = sqlite3.connect(db)
    try:
        return conn.execute("SELECT seq, kind, payload FROM events ORDER BY seq").fetchall()
    finally:
        conn.close()


async def peer(pki, url, hub) -> WsProbe:
    """A connection presenting `hub`'s pinned client certificate."""
    context = peer_client_context(pki.file(hub, "client", "cert"), pki.file(hub, "client", "key"))
    return await WsProbe.open(url, ssl=context)


async def claim(probe, name, task_id, paths):
    await probe.send_json({"sender": name, "target": "System", "type": "claim",
                           "payload": task_id, "task_id": task_id, "worktree": "/repo",
                           "paths": paths, "ttl_seconds": 120})
    return await probe.recv(lambda f: f.get("type") in ("claim_granted", "claim_denied")
                            and f.get("task_id") == task_id, timeout=15)


async def ask(link, claimant, verb, task_id, namespace="PROJ", sender="east", **claim):
    request_id = f"r-{time.monotonic_ns()}"
    body = {"type": verb, "payload": task_id, "task_id": task_id, "id": task_id,
            "worktree": "/repo", "paths": [f"src/{task_id}"], "ttl_seconds": 120, **claim}
    await link.send_json({"sender": sender, "target": "all", "type": "multihub_claim_request",
                          "payload": "", "namespace": namespace, "claimant": claimant,
                          "task_id": task_id, "claim": body, "request_id": request_id})
    return await link.recv(lambda f: f.get("type") == "multihub_claim_result"
                           and f.get("request_id") == request_id, timeout=10)


async def test_forwarded_claims_need_the_namespace_and_a_seat_of_the_peer(sites):
    pki, url, west_db, east_db, west, east = sites
    # through the real claimant hub: east may not claim in OTHER, may in PROJ
    zed = await joined(url["east"], "OTHER/zed")
    before = events(west_db)
    denied = await claim(zed, "OTHER/zed", "o-1", ["docs"])
    assert denied["type"] == "claim_denied", denied
    assert denied["federation_reason"] == "namespace_not_granted", denied
    assert denied["owner_hub_id"] == "west" and denied["target"] == "OTHER/zed"
    assert events(west_db) == before  # nothing applied on the owner, no evidence either
    assert not [k for _, k, _ in events(east_db) if k == "multihub_remote_lease"]
    amy = await joined(url["east"], "PROJ/amy")
    granted = await claim(amy, "PROJ/amy", "p-1", ["src/p"])
    assert granted["type"] == "claim_granted" and granted["owner_hub_id"] == "west", granted

    # a seat of west holds a lease under the same name as east's agent
    local = await joined(url["west"], "PROJ/amy-w")
    held = await claim(local, "PROJ/amy-w", "w-1", ["src/w"])
    assert held["type"] == "claim_granted"
    link = await peer(pki, url["west"], "east")
    before = events(west_db)
    # east may act only for its own seats: PROJ/amy-w here is west's, not amy-w@east
    for verb, extra in (("release", {}), ("claim", {}), ("task_update", {"status": "working"}),
                        ("checkpoint", {"checkpoint": "x"}),
                        ("handoff", {"to_agent": "PROJ/amy"})):
        answer = await ask(link, "PROJ/amy-w", verb, "w-1", target_online=True, **extra)
        assert answer["granted"] is False, (verb, answer)
        assert answer["reason_code"] == "holder_not_at_origin", (verb, answer)
    # a claimant that is not one seat of the namespace
    for claimant, namespace, code in (("PROJ/amy@north", "PROJ", "invalid_claimant"),
                                      ("PROJ/*", "PROJ", "invalid_claimant"),
                                      ("PROJ/a,PROJ/b", "PROJ", "invalid_claimant"),
                                      ("OTHER/x", "PROJ", "invalid_claimant"),
                                      ("OTHER/x", "OTHER", "namespace_not_granted")):
        answer = await ask(link, claimant, "claim", "n-1", namespace=namespace)
        assert (answer["granted"], answer["reason_code"]) == (False, code), (claimant, answer)
    # a peer that is not granted at all (north's certificate under east's name)
    impostor = await peer(pki, url["west"], "north")
    answer = await ask(impostor, "PROJ/eve", "claim", "n-2")
    assert (answer["granted"], answer["reason_code"]) == (False, "peer_not_authorised"), answer
    assert events(west_db) == before  # nothing half-applied
    await local.send_json({"sender": "PROJ/amy-w", "type": "state_request"})
    leases = (await local.recv_type("state_snapshot", timeout=10))["snapshot"]["active_claims"]
    lease = next(c for c in leases if c["task_id"] == "w-1")
    assert (lease["owner"], lease["epoch"]) == ("PROJ/amy-w", held["epoch"])

    # its own seat's lease it may use: claim, renew, update, release
    mine = await ask(link, "PROJ/eve", "claim", "e-1")
    assert mine["granted"] is True and "reason_code" not in mine, mine
    assert (await ask(link, "PROJ/eve", "claim", "e-1"))["granted"] is True  # renewal
    assert (await ask(link, "PROJ/eve", "task_update", "e-1", status="working"))["granted"]
    released = await ask(link, "PROJ/eve", "release", "e-1")
    assert released["granted"] is True, released
    for probe in (zed, amy, local, link, impostor):
        await probe.close()


async def pull(link, sender, after=0):
    await link.send_json({"sender": sender, "target": "all", "type": "multihub_log_request",
                          "payload": "", "after_seq": after, "limit": 1000})
    return await link.recv_type("multihub_log_snapshot", timeout=10)


async def test_log_pulls_show_only_the_granted_namespaces(sites):
    pki, url, west_db, east_db, west, east = sites
    ola = await joined(url["west"], "OTHER/ola")
    await ola.chat("OTHER/ola", "OTHER/bob", "other-secret-1")
    assert (await claim(ola, "OTHER/ola", "o-9", ["x"]))["type"] == "claim_granted"
    pat = await joined(url["west"], "PROJ/pat")
    await pat.chat("PROJ/pat", "OTHER/ola", "cross-secret-2")
    await pat.chat("PROJ/pat", "PROJ/amy", "proj-visible-3")
    await ola.recv_type("chat", payload="cross-secret-2", timeout=10)

    link = await peer(pki, url["west"], "east")
    snapshot = await pull(link, "east")
    assert snapshot["served_namespaces"] == ["PROJ"]
    seqs = [e["seq"] for e in snapshot["events"]]
    assert seqs == list(range(1, len(seqs) + 1)) and seqs[-1] == snapshot["next_cursor"]
    assert snapshot["log_end_seq"] == len(events(west_db)) == seqs[-1]
    text = json.dumps(snapshot)
    assert "other-secret-1" not in text and "cross-secret-2" not in text
    assert "o-9" not in text
    assert "proj-visible-3" in text
    journal = {seq: (kind, json.loads(payload)) for seq, kind, payload in events(west_db)}
    for event in snapshot["events"]:
        kind, payload = journal[event["seq"]]
        if event["kind"] == "withheld":
            assert event["payload"]["reason_code"] in ("namespace_not_granted", "no_namespace")
            if event["payload"]["reason_code"] == "namespace_not_granted":
                assert kind in ("chat", "claim", "claim_denial", "release"), kind
        else:
            assert (event["kind"], event["payload"]) == (kind, payload)
    served = {(e["kind"], e["payload"].get("payload")) for e in snapshot["events"]}
    assert ("chat", "proj-visible-3") in served
    assert ("withheld", None) in served
    # the same pull again is the same bytes: a follower's overlap re-read agrees
    assert (await pull(link, "east"))["events"] == snapshot["events"]

    # north is granted OTHER too: it sees those events
    other = await peer(pki, url["west"], "north")
    wide = json.dumps(await pull(other, "north"))
    assert "other-secret-1" in wide and "cross-secret-2" in wide
    # a connection whose certificate is not the grant's gets the refusal shape
    impostor = await peer(pki, url["west"], "north")
    refused = await pull(impostor, "east")
    assert (refused["events"], refused["log_end_seq"]) == ([], None)
    assert "served_namespaces" not in refused

    # east's standing watch follows the withheld log without a gap or an equivocation
    end = len(events(west_db))
    deadline = time.monotonic() + 15
    while True:
        watch = east.get_json("/health")["multihub"]["watches"]["west"]
        if watch["cursor"] >= end and watch["last_success"]:
            break
        assert time.monotonic() < deadline, watch
        await asyncio.sleep(0.3)
    assert watch["quarantined"] is False and watch["last_error"] is None, watch
    assert not [k for _, k, _ in events(east_db) if k == "multihub_equivocation"]
    for probe in (ola, pat, link, other, impostor):
        await probe.close()



async def test_a_peer_speaks_for_its_own_seats_of_any_namespace_and_addresses_only_its_grant(
        sites):
    """Issue 30.10, decided (docs/federation.md, "Whom a peer speaks for"):
    east is granted PROJ; its seat OPS/mallory may chat and request delivery
    to a PROJ seat on west, and arrives as OPS/mallory@east, never as west's
    own OPS/mallory; it may not address OTHER, nor claim there."""
    pki, url, west_db, east_db, west, east = sites
    bob = await Agent.join(url["west"], "PROJ/bob", recipient=True)
    local_mallory = await joined(url["west"], "OPS/mallory")
    ola = await joined(url["west"], "OTHER/ola")
    mallory = await Agent.join(url["east"], "OPS/mallory")
    await mallory.probe.chat("OPS/mallory", "PROJ/bob@west", "from east's OPS seat",
                             client_msg_id="m-1", receipt_requested=True)
    got = await bob.probe.recv_type("chat", payload="from east's OPS seat", timeout=15)
    assert (got["sender"], got["forwarded_from"]) == ("OPS/mallory@east", "east")
    receipt = await mallory.probe.recv(lambda f: f.get("type") == "delivery_receipt"
                                       and f.get("forward_state") == "accepted", timeout=15)
    # delivered to bob alone: west's own OPS/mallory is another seat
    assert (receipt["delivered"], receipt["recipients"]) == (True, ["PROJ/bob@west"])
    # a delivery intent in its name: admitted at west as OPS/mallory@east
    queued = await mallory.request("PROJ/bob@west", bob.incarnation, "job-1")
    assert (queued["type"], queued["stage"], queued["remote_hub"]) == \
        ("delivery_status", "queued", "west"), queued
    offer = await bob.offer("job-1", timeout=15)
    assert offer["sender"] == "OPS/mallory@east"
    # the grant bounds what east addresses: OTHER is not granted
    await mallory.probe.chat("OPS/mallory", "OTHER/ola@west", "not granted", client_msg_id="m-2",
                             receipt_requested=True)
    refused = await mallory.probe.recv(lambda f: f.get("type") == "delivery_receipt"
                                       and f.get("forward_state") == "refused", timeout=15)
    assert (refused["refusal_code"], refused["client_msg_id"]) == \
        ("namespace_not_granted", "m-2"), refused
    assert not [f for f in await ola.drain(0.5) if f.get("payload") == "not granted"]
    senders = [json.loads(p)["sender"] for _, k, p in events(west_db) if k == "chat"]
    assert "OPS/mallory@east" in senders and "OPS/mallory" not in senders
    for agent in (bob, mallory):
        await agent.close()
    for probe in (local_mallory, ola):
        await probe.close()

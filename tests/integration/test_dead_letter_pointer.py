"""The dead-letter pointer over a relay route, with two real hubs over mutual
TLS (docs/dead-letters.md).

West owns PROJ and forwards chats to east. A chat from PROJ/amy on west to
PROJ/ghost@east reaches nobody on east: east escalates (its agents are
told, the row is journaled) and, PROJ being west's, sends west the
content-free pointer over its --relay-peer route; west journals it and tells
its agents, the origin sender among them. A hand-driven connection holding
east's client certificate then plays the peer for what the real hub never
sends: a repeat within the window is told to nobody, bad pointers get a
typed error and change nothing.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time

import pytest

from federation.tls import peer_client_context
from tests.support.federation import make_pki, site_flags, write_serving_policy
from tests.support.procs import free_port, hubd_process
from tests.support.wsprobe import WsProbe, joined

OWNERS = ["--namespace-owner", "PROJ=west"]
POINTER = "dead_letter_forwarding"


@pytest.fixture(scope="module")
def sites(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pointer")
    pki = make_pki(tmp / "pki", ["east", "west", "north"])
    ports = {"west": free_port(), "east": free_port()}
    url = {hub: f"wss://127.0.0.1:{port}/" for hub, port in ports.items()}
    west_policy = write_serving_policy(tmp / "west-policy", pki, {"east": ["PROJ"]})
    east_policy = write_serving_policy(tmp / "east-policy", pki, {"west": ["PROJ"]})
    west_site, east_site = site_flags(pki, "west", west_policy), site_flags(pki, "east",
                                                                           east_policy)
    west = hubd_process(tmp / "west", *west_site.serve, *west_site.connect, *OWNERS,
                        *west_site.peer_flags(pki, "east", url["east"]),
                        "--dead-letter-escalation-window", "3600",
                        hub_id="west", port=ports["west"], scheme="wss").start()
    east = hubd_process(tmp / "east", *east_site.serve, *east_site.connect, *OWNERS,
                        "--relay-peer", f"west={url['west']}",
                        "--relay-peer-pin", f"west={pki.server_pin('west')}",
                        "--dead-letter-escalation-threshold", "1",
                        "--dead-letter-escalation-window", "3600",
                        hub_id="east", port=ports["east"], scheme="wss").start()
    try:
        deadline = time.monotonic() + 30
        while True:
            relay = east.get_json("/health").get("multihub", {}).get("relay_routes", {})
            forward = west.get_json("/health").get("message_forward", {})
            if relay.get("west", {}).get("link") == "up" and \
                    forward.get("east", {}).get("link") == "up":
                break
            assert time.monotonic() < deadline, (relay, forward)
            time.sleep(0.1)
        yield pki, url, west, east, tmp / "west" / "hubd.db", tmp / "east" / "hubd.db"
    finally:
        east.stop()
        west.stop()


def rows(db, kind: str) -> list[dict]:
    conn = sqlite3.connect(db)
    try:
        found = conn.execute("SELECT payload FROM events WHERE kind = ? ORDER BY seq",
                             (kind,)).fetchall()
    finally:
        conn.close()
    return [json.loads(payload) for (payload,) in found]


def all_rows(db) -> list[tuple]:
    conn = sqlite3.connect(db)
    try:
        return conn.execute("SELECT seq, kind FROM events ORDER BY seq").fetchall()
    finally:
        conn.close()


async def settled(probe: WsProbe, name: str) -> None:
    await probe.send_json({"sender": name, "target": "System", "type": "who_request"})
    await probe.recv_type("who_snapshot", timeout=10)


async def test_a_forwarded_chat_that_reaches_nobody_points_the_owner_at_the_gap(sites):
    pki, url, west, east, west_db, east_db = sites
    amy = await joined(url["west"], "PROJ/amy")  # the origin sender, on the owning hub
    bob = await joined(url["east"], "PROJ/bob")  # a bystander on the hub where it dead-letters
    await amy.chat("PROJ/amy", "PROJ/ghost@east", "secret body", client_msg_id="c1")

    escalation = await bob.recv_type("dead_letter_escalation", timeout=15)
    assert escalation["escalation_target"] == "PROJ/ghost"
    assert escalation["escalation_count"] == 1
    assert escalation["last_sender"] == "PROJ/amy@west"

    told = await amy.recv_type(POINTER, timeout=15)
    assert told["target"] == "all" and told["sender"] == "SynapseHub"
    assert (told["forwarding_target"], told["forwarding_count"], told["origin_hub_id"]) == (
        "PROJ/ghost", 1, "east")
    assert "secret body" not in json.dumps(told)
    assert told["payload"].startswith("dead-letter forwarding: peer hub 'east' reports 1 "
                                      "directed messages to 'PROJ/ghost'")

    # both sides journaled their half; neither holds the body
    out = rows(east_db, POINTER)
    assert out == [{"target": "PROJ/ghost", "count": 1, "origin_hub_id": "east",
                    "owner_hub_id": "west", "direction": "out"}]
    inbound = rows(west_db, POINTER)
    assert inbound == [{"target": "PROJ/ghost", "count": 1, "origin_hub_id": "east",
                        "owner_hub_id": "west", "direction": "in", "peer": "east"}]
    assert [r["target"] for r in rows(east_db, "dead_letter_escalation")] == ["PROJ/ghost"]
    assert east.metric('hubd_dead_letter_pointers_total{outcome="sent"}') == 1
    assert west.metric('hubd_dead_letter_pointers_total{outcome="received"}') == 1

    # a second dead letter within east's window escalates nothing, points nothing
    await amy.chat("PROJ/amy", "PROJ/ghost@east", "again", client_msg_id="c2")
    deadline = time.monotonic() + 15
    while east.metric("hubd_dead_letters_total") < 2:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    await settled(bob, "PROJ/bob")
    await settled(amy, "PROJ/amy")
    assert len(bob.seen("dead_letter_escalation")) == 1
    assert len(rows(east_db, POINTER)) == 1
    assert east.metric('hubd_dead_letter_pointers_total{outcome="sent"}') == 1
    assert east.metric("hubd_dead_letter_escalations_suppressed_total") == 1
    assert len(amy.seen(POINTER)) == 1
    await amy.close()
    await bob.close()


async def peer_link(pki, url: str, hub: str) -> WsProbe:
    """A connection presenting `hub`'s pinned client certificate, registered
    as that peer (its first frame)."""
    context = peer_client_context(pki.file(hub, "client", "cert"), pki.file(hub, "client", "key"))
    link = await WsProbe.open(url, ssl=context)
    await link.send_json({"sender": hub, "target": "System", "type": "heartbeat",
                          "payload": "online", "protocol_version": 6})
    return link


def pointer_frame(sender: str, **fields) -> dict:
    body = {"target": "PROJ/zed", "count": 7, "origin_hub_id": sender, "owner_hub_id": "west"}
    body.update(fields)
    return {"sender": sender, "target": "all", "type": POINTER, "payload": "", "forwarding": body}


@pytest.mark.parametrize("frame,code", [
    (pointer_frame("east", target="OTHER/zed"), "namespace_not_owned_here"),
    (pointer_frame("east", owner_hub_id="north"), "namespace_not_owned_here"),
    (pointer_frame("east", origin_hub_id="north"), "origin_mismatch"),
    (pointer_frame("east", count=-1), "malformed"),
    (pointer_frame("east", count=True), "malformed"),
    (pointer_frame("east", target=""), "malformed"),
    (pointer_frame("east", target="x" * 300), "malformed"),
    (pointer_frame("east", target="PROJ/\u0001"), "malformed"),
    ({"sender": "east", "target": "all", "type": POINTER, "forwarding": "PROJ/zed"},
     "malformed"),
])
async def test_a_bad_pointer_gets_a_typed_error_and_changes_nothing(sites, frame, code):
    pki, url, west, east, west_db, east_db = sites
    watcher = await joined(url["west"], "PROJ/watcher")
    link = await peer_link(pki, url["west"], "east")
    before = all_rows(west_db)
    await link.send_json(frame)
    error = await link.recv_type("error", timeout=10)
    assert error["error_code"] == "dead_letter_forwarding_refused"
    assert error["reason_code"] == code, error
    await settled(watcher, "PROJ/watcher")
    assert watcher.seen(POINTER) == []
    assert all_rows(west_db) == before
    await link.close()
    await watcher.close()


async def test_a_peer_outside_the_policy_is_not_a_peer(sites):
    pki, url, west, east, west_db, east_db = sites
    # north holds a certificate of the same CA but no grant on west: its
    # first frame makes it an ordinary (open-hub) agent, never a peer link
    context = peer_client_context(pki.file("north", "client", "cert"),
                                  pki.file("north", "client", "key"))
    before = all_rows(west_db)
    link = await WsProbe.open(url["west"], ssl=context)
    await link.recv_type("welcome")
    await link.register("north")
    await link.send_json(pointer_frame("north"))
    error = await link.recv_type("error", timeout=10)
    assert error.get("reason_code") == "not_a_peer", error
    assert [k for _, k in all_rows(west_db)[len(before):] if k == POINTER] == []
    await link.close()


async def test_the_same_peers_pointer_is_told_once_per_window(sites):
    pki, url, west, east, west_db, east_db = sites
    watcher = await joined(url["west"], "PROJ/watcher2")
    link = await peer_link(pki, url["west"], "east")
    await link.send_json(pointer_frame("east", target="PROJ/once"))
    told = await watcher.recv_type(POINTER, timeout=10, forwarding_target="PROJ/once")
    assert told["forwarding_count"] == 7
    repeated = west.metric('hubd_dead_letter_pointers_total{outcome="repeated"}')
    await link.send_json(pointer_frame("east", target="PROJ/once", count=8))
    deadline = time.monotonic() + 10
    while west.metric('hubd_dead_letter_pointers_total{outcome="repeated"}') == repeated:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    await settled(watcher, "PROJ/watcher2")
    # the repeat gets no answer (fire-and-forget) and tells nobody
    assert [f["forwarding_count"] for f in watcher.seen(POINTER)
            if f["forwarding_target"] == "PROJ/once"] == [7]
    assert [r["count"] for r in rows(west_db, POINTER) if r["target"] == "PROJ/once"] == [7]
    await link.close()
    await watcher.close()


async def test_a_pointer_the_relay_link_could_not_take_is_sent_when_it_comes_up(tmp_path):
    pki = make_pki(tmp_path / "pki", ["east", "west"])
    ports = {"west": free_port(), "east": free_port()}
    url = {hub: f"wss://127.0.0.1:{port}/" for hub, port in ports.items()}
    west_policy = write_serving_policy(tmp_path / "west-policy", pki, {"east": ["PROJ"]})
    east_site = site_flags(pki, "east", None)
    east = hubd_process(tmp_path / "east", *east_site.serve, *east_site.connect, *OWNERS,
                        "--relay-peer", f"west={url['west']}",
                        "--relay-peer-pin", f"west={pki.server_pin('west')}",
                        "--dead-letter-escalation-threshold", "1",
                        hub_id="east", port=ports["east"], scheme="wss").start()
    west = None
    try:
        sender = await joined(url["east"], "PROJ/s")
        await sender.chat("PROJ/s", "PROJ/ghost", "nobody home")
        await sender.recv_type("dead_letter_escalation", timeout=10)
        deadline = time.monotonic() + 15
        while east.metric('hubd_dead_letter_pointers_total{outcome="unsent"}') < 1:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        assert rows(tmp_path / "east" / "hubd.db", POINTER)[0]["direction"] == "out"
        # west (the owner) starts: east's link comes up and the pointer follows
        west_site = site_flags(pki, "west", west_policy)
        west = hubd_process(tmp_path / "west", *west_site.serve, *OWNERS, hub_id="west",
                            port=ports["west"], scheme="wss").start()
        deadline = time.monotonic() + 60  # the link's reconnect backoff
        while not rows(tmp_path / "west" / "hubd.db", POINTER):
            assert time.monotonic() < deadline, east.get_json("/health")
            await asyncio.sleep(0.1)
        assert rows(tmp_path / "west" / "hubd.db", POINTER) == [
            {"target": "PROJ/ghost", "count": 1, "origin_hub_id": "east",
             "owner_hub_id": "west", "direction": "in", "peer": "east"}]
        assert east.metric('hubd_dead_letter_pointers_total{outcome="resent"}') == 1
        await sender.close()
    finally:
        if west is not None:
            west.stop()
        east.stop()

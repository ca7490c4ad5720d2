"""The dead-letter pointer between the reference hub and hubd.

The same frames, sent by a connection holding east's pinned client
certificate (what east's relay connector sends: one `dead_letter_forwarding`
frame, its first, with the pointer under `forwarding`), go to a reference
owning hub and to hubd as the owner; an agent connected to the owner sees
the same `dead_letter_forwarding` frame from both, and both journal the
inbound row. Where they differ (docs/dead-letters.md): hubd answers a bad
pointer with a typed error, the reference drops it with a log line only;
hubd tells the same peer's pointer for the same target once per window.
Then hubd as the origin: its relay link's pointer is accepted by a reference
owner, which tells and journals it as it does its own connector's.
"""

import asyncio
import json
import sqlite3
import time

import pytest

from federation.tls import peer_client_context
from tests.support.federation import make_pki, site_flags, write_serving_policy
from tests.support.prereq import missing
from tests.support.procs import hubd_process, reference_hub_process
from tests.support.wsprobe import WsProbe

pytestmark = pytest.mark.interop

POINTER = "dead_letter_forwarding"


@pytest.fixture
def pki(tmp_path, reference_venv_status):
    if reference_venv_status[0] is None:
        missing(reference_venv_status[1])
    return make_pki(tmp_path / "pki", ["east", "west"])


async def joined(url, name):
    probe = await WsProbe.open(url)
    await probe.register(name)
    await probe.recv_type("presence_update", agent=name, timeout=10)
    return probe


def frame(**fields) -> dict:
    pointer = {"target": "PROJ/ghost", "count": 3, "origin_hub_id": "east",
               "owner_hub_id": "west"}
    pointer.update(fields)
    return {"sender": "east", "target": "all", "type": POINTER, "payload": "",
            "forwarding": pointer}


async def send_as_east(pki, url, sent: dict) -> WsProbe:
    context = peer_client_context(pki.file("east", "client", "cert"),
                                  pki.file("east", "client", "key"))
    link = await WsProbe.open(url, ssl=context)
    await link.send_json(sent)
    return link


def journaled(db, kind: str) -> list[dict]:
    conn = sqlite3.connect(db)
    try:
        rows = conn.execute("SELECT payload FROM events WHERE kind = ? ORDER BY seq",
                            (kind,)).fetchall()
    finally:
        conn.close()
    return [json.loads(p) for (p,) in rows]


async def observe(hub, pki, db) -> dict:
    watcher = await joined(hub.url, "PROJ/watcher")
    seen = {}
    # a bad pointer first: what does the sender hear, does anyone else?
    bad = await send_as_east(pki, hub.url, frame(count=-1))
    seen["bad_answer"] = [f for f in await bad.drain(1.0) if f.get("type") == "error"]
    await bad.close()
    await watcher.send_json({"sender": "PROJ/watcher", "target": "System", "type": "who_request"})
    await watcher.recv_type("who_snapshot", timeout=10)
    seen["bad_told"] = [f for f in watcher.frames if f.get("type") == POINTER]
    good = await send_as_east(pki, hub.url, frame())
    told = await watcher.recv_type(POINTER, timeout=10)
    seen["told"] = {k: told[k] for k in ("sender", "target", "type", "payload",
                                         "forwarding_target", "forwarding_count",
                                         "origin_hub_id")}
    seen["good_answer"] = [f for f in await good.drain(0.5) if f.get("type") == "error"]
    await good.close()
    await watcher.close()
    seen["rows"] = [{k: v for k, v in row.items() if k != "peer"}
                    for row in journaled(db, POINTER)]
    return seen


async def test_the_owner_tells_its_agents_what_the_reference_tells(tmp_path, pki):
    owners = ("--namespace-owner", "PROJ=west")
    policy = write_serving_policy(tmp_path / "policy", pki, {"east": ["PROJ"]})
    ref = reference_hub_process(tmp_path / "ref", *site_flags(pki, "west", policy).serve,
                                *owners, hub_id="west", scheme="wss").start()
    try:
        theirs = await observe(ref, pki, tmp_path / "ref" / "ref.db")
    finally:
        ref.stop()
    ours_hub = hubd_process(tmp_path / "hubd", *site_flags(pki, "west", policy).serve, *owners,
                            hub_id="west", scheme="wss").start()
    try:
        ours = await observe(ours_hub, pki, tmp_path / "hubd" / "hubd.db")
    finally:
        ours_hub.stop()

    assert {**ours["told"], "sender": None} == {**theirs["told"], "sender": None}, (ours,
                                                                                    theirs)
    assert ours["rows"] == theirs["rows"] == [
        {"target": "PROJ/ghost", "count": 3, "origin_hub_id": "east", "owner_hub_id": "west",
         "direction": "in"}]
    assert theirs["bad_answer"] == [] and theirs["good_answer"] == []
    assert [f["reason_code"] for f in ours["bad_answer"]] == ["malformed"]
    assert ours["good_answer"] == []
    assert ours["bad_told"] == theirs["bad_told"] == []


async def test_hubd_as_the_origin_points_a_reference_owner_at_the_gap(tmp_path, pki):
    """hubd's relay link (registered once, then the pointer as a later frame)
    is accepted by the reference owner like its own connector's frame."""
    owners = ("--namespace-owner", "PROJ=west")
    policy = write_serving_policy(tmp_path / "policy", pki, {"east": ["PROJ"]})
    west = reference_hub_process(tmp_path / "ref", *site_flags(pki, "west", policy).serve,
                                 *owners, hub_id="west", scheme="wss").start()
    east_site = site_flags(pki, "east", None)
    east = hubd_process(tmp_path / "east", *east_site.serve, *east_site.connect, *owners,
                        "--relay-peer", f"west=wss://127.0.0.1:{west.port}/",
                        "--relay-peer-pin", f"west={pki.server_pin('west')}",
                        "--dead-letter-escalation-threshold", "1", hub_id="east",
                        scheme="wss").start()
    try:
        deadline = time.monotonic() + 30
        while east.get_json("/health")["multihub"]["relay_routes"]["west"]["link"] != "up":
            assert time.monotonic() < deadline, east.get_json("/health")["multihub"]
            await asyncio.sleep(0.1)
        watcher = await joined(west.url, "PROJ/watcher")
        sender = await joined(east.url, "PROJ/s")
        await sender.chat("PROJ/s", "PROJ/ghost", "nobody home")
        told = await watcher.recv_type(POINTER, timeout=15)
        assert (told["forwarding_target"], told["forwarding_count"], told["origin_hub_id"]) == (
            "PROJ/ghost", 1, "east")
        assert [{k: v for k, v in row.items() if k != "peer"}
                for row in journaled(tmp_path / "ref" / "ref.db", POINTER)] == [
            {"target": "PROJ/ghost", "count": 1, "origin_hub_id": "east",
             "owner_hub_id": "west", "direction": "in"}]
        await watcher.close()
        await sender.close()
    finally:
        east.stop()
        west.stop()

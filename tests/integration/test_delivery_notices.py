"""Stage changes of a forwarded delivery operation reach the origin sender
(issue 24 item 9; docs/delivery.md, "Stage changes across hubs"): two real
hubd processes over a pinned mutual-TLS link. PROJ/alice on east asks
PROJ/bob on west; every stage bob reports is pushed back to east, journaled
there once, and delivered to alice as a local notification is: at once if she
is online, on her next registration if not, and after east was down when the
stage changed. Polling (delivery_status_request) keeps answering."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import time

import pytest

from tests.support.delivery_driver import Agent, operation_key
from tests.support.federation import make_pki, site_flags, write_serving_policy
from tests.support.procs import hubd_process
from tests.support.waiting import wait_for


@pytest.fixture
def pki(tmp_path):
    return make_pki(tmp_path / "pki", ["east", "west"])


def start_west(tmp_path, pki):
    policy = write_serving_policy(tmp_path / "west-policy", pki, {"east": ["PROJ"]})
    return hubd_process(tmp_path / "west", *site_flags(pki, "west", policy).serve,
                        hub_id="west", scheme="wss").start()


def east_process(tmp_path, pki, west):
    site = site_flags(pki, "east", None)
    return hubd_process(tmp_path / "east", *site.peer_flags(pki, "west", west.url),
                        *site.connect, hub_id="east")


def link_up(east) -> bool:
    return east.get_json("/health")["message_forward"]["west"]["link"] == "up"


def relayed_rows(db) -> list[dict]:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        rows = con.execute("SELECT payload FROM events WHERE kind = 'multihub_delivery_notice'"
                           " ORDER BY seq").fetchall()
    finally:
        con.close()
    return [json.loads(p) for (p,) in rows]


def seen_notes(agent, stage: str) -> list[dict]:
    """Every notification of `stage` this connection got (registration
    included: a pending one arrives before the presence update)."""
    return [f for f in agent.probe.frames if f.get("type") == "delivery_status"
            and "audience" in f and f.get("stage") == stage]


async def told(agent, stage: str, timeout: float = 10.0) -> dict:
    deadline = time.monotonic() + timeout
    while not seen_notes(agent, stage):
        assert time.monotonic() < deadline, f"no {stage} notification: {agent.probe.frames}"
        await agent.probe.drain(0.1)
    return seen_notes(agent, stage)[0]


async def admitted(west, east):
    """alice on east asks bob on west (r1); bob, online, has its offer."""
    bob = await Agent.join(west.url, "PROJ/bob", recipient=True)
    alice = await Agent.join(east.url, "PROJ/alice")
    await alice.request("PROJ/bob@west", bob.incarnation, "r1")
    offer = await bob.offer("r1")
    await alice.close()
    return bob, offer


# a frame west answers with one page: the round trip that says everything before it was handled
LOG_ROUND_TRIP = {"sender": "east", "target": "all", "payload": "",
                  "type": "multihub_log_request", "after_seq": 0, "limit": 1}


@contextlib.asynccontextmanager
async def east_link(west, pki):
    """A hand-written east's link to west: its client certificate (mutual
    TLS), welcomed, registered as a peer that takes delivery notices."""
    import aiohttp

    from federation.tls import peer_client_context

    context = peer_client_context(pki.file("east", "client", "cert"),
                                  pki.file("east", "client", "key"))
    async with aiohttp.ClientSession() as http:
        async with http.ws_connect(west.url, ssl=context) as ws:
            await ws.receive_json(timeout=5)  # the welcome
            await ws.send_json({"sender": "east", "target": "System", "type": "heartbeat",
                                "payload": "online", "protocol_version": 6,
                                "hubd_features": ["delivery_notices"]})
            yield ws


def west_outbox(west) -> int:
    """Notices west holds for east's requesters, not yet acknowledged."""
    return west.get_json("/health")["delivery_notices"]["waiting"].get("east", 0)


def test_stage_changes_reach_the_origin_sender_online_and_after_reconnecting(tmp_path, pki):
    west = start_west(tmp_path, pki)
    east = east_process(tmp_path, pki, west).start()
    key = operation_key("east", "PROJ/alice@east", "r1")
    try:
        wait_for(lambda: link_up(east), what="east's link to west")

        async def scenario():
            bob = await Agent.join(west.url, "PROJ/bob", recipient=True)
            alice = await Agent.join(east.url, "PROJ/alice")
            queued = await alice.request("PROJ/bob@west", bob.incarnation, "r1")
            assert (queued["stage"], queued["operation_key"]) == ("queued", key), queued
            offer = await bob.offer("r1")

            await bob.report(offer, "boundary_delivered")
            boundary = await alice.notification("r1", "boundary_delivered", 10)
            await bob.report(offer, "acknowledged")
            acked = await alice.notification("r1", "acknowledged", 10)
            # polling still answers, from west
            polled = await alice.status(key)
            assert (polled["stage"], polled["remote_hub"]) == ("acknowledged", "west")

            # alice away when the operation completes: told on her next registration
            await alice.close()
            await bob.report(offer, "completed")
            await asyncio.to_thread(wait_for, lambda: len(relayed_rows(
                tmp_path / "east" / "hubd.db")) == 3, 10.0, "east journaled the completion")
            alice = await Agent.join(east.url, "PROJ/alice")
            completed = await told(alice, "completed")
            # a registration later: already delivered, not again
            await alice.close()
            alice = await Agent.join(east.url, "PROJ/alice")
            await alice.probe.drain(1.0)
            assert seen_notes(alice, "completed") == []
            final = await alice.status(key)
            await alice.close()
            await bob.close()
            return boundary, acked, completed, final

        boundary, acked, completed, final = asyncio.run(scenario())
        for note, stage in ((boundary, "boundary_delivered"), (acked, "acknowledged"),
                            (completed, "completed")):
            assert (note["type"], note["audience"], note["operation_key"], note["stage"],
                    note["source"], note["remote_hub"], note["target"], note["sender"]) == \
                ("delivery_status", "PROJ/alice", key, stage, "recipient", "west",
                 "PROJ/bob@west", "SynapseHub"), note
        assert final["stage"] == "completed" and final["task_completed"] is True
        rows = relayed_rows(tmp_path / "east" / "hubd.db")
        ids = [r["notification"]["notification_id"] for r in rows]
        assert len(ids) == len(set(ids)) == 3
        assert {(r["peer"], r["audience"]) for r in rows} == {("west", "PROJ/alice")}
        # west's outbox drained: east acknowledged every notice
        wait_for(lambda: west_outbox(west) == 0, what="west's outbox drained")
        health = west.get_json("/health")["delivery_notices"]
        assert health["takers"] == ["east"] and health["settled"] == 3, health
        assert east.get_json("/health")["delivery_notices"]["relayed"] == 3
        # a restart of east replays the same dedup memory from its journal
        east.stop()
        east.start()
        assert east.get_json("/health")["delivery_notices"]["remembered"] == 3
    finally:
        east.stop()
        west.stop()


def test_stages_while_the_origin_is_down_are_kept_and_delivered_after(tmp_path, pki):
    west = start_west(tmp_path, pki)
    east = east_process(tmp_path, pki, west).start()
    key = operation_key("east", "PROJ/alice@east", "r1")
    try:
        wait_for(lambda: link_up(east), what="east's link to west")

        async def report_while_east_is_down():
            bob, offer = await admitted(west, east)
            await asyncio.to_thread(east.stop)
            await bob.report(offer, "boundary_delivered")
            await bob.report(offer, "acknowledged")
            await bob.report(offer, "completed")
            await bob.close()

        asyncio.run(report_while_east_is_down())
        # durable on west, for east's requester, until east acknowledges
        assert west_outbox(west) == 3
        west.stop()
        west.start()  # and across a restart of west
        assert west_outbox(west) == 3
        east.start()
        wait_for(lambda: link_up(east), what="east's link after both restarts")
        wait_for(lambda: west_outbox(west) == 0, what="west's outbox drained")

        async def read():
            alice = await Agent.join(east.url, "PROJ/alice")
            notes = [await told(alice, stage) for stage in ("boundary_delivered",
                                                            "acknowledged", "completed")]
            await alice.close()
            return notes

        notes = asyncio.run(read())
        assert [n["operation_key"] for n in notes] == [key] * 3
        assert len(relayed_rows(tmp_path / "east" / "hubd.db")) == 3
    finally:
        east.stop()
        west.stop()


def test_stages_after_the_recipients_hub_restarted_before_the_origin_is_back(tmp_path, pki):
    """West restarts after admitting east's operation and before any stage
    changed: it learns that east takes notices from the admission's row,
    not from east's link (which is down), so every stage made in the gap is
    queued for east and pushed once east's link registers again (not left
    to polling); alice gets each once."""
    west = start_west(tmp_path, pki)
    east = east_process(tmp_path, pki, west).start()
    key = operation_key("east", "PROJ/alice@east", "r1")
    try:
        wait_for(lambda: link_up(east), what="east's link to west")

        async def admit():
            bob, _ = await admitted(west, east)
            await bob.close()
            return bob.token

        token = asyncio.run(admit())
        east.stop()
        west.stop()
        west.start()

        async def report_in_the_gap():
            # the same process token: the same incarnation, its offer sent again
            bob = await Agent.join(west.url, "PROJ/bob", token=token)
            offer = await bob.offer("r1")
            for stage in ("boundary_delivered", "acknowledged", "completed"):
                await bob.report(offer, stage)
            await bob.close()

        asyncio.run(report_in_the_gap())
        assert west_outbox(west) == 3  # queued for east, durable, before its link is back
        east.start()
        wait_for(lambda: link_up(east), what="east's link after the restarts")
        wait_for(lambda: west_outbox(west) == 0, what="west's outbox drained")

        async def read():
            alice = await Agent.join(east.url, "PROJ/alice")
            notes = [await told(alice, stage) for stage in ("boundary_delivered",
                                                            "acknowledged", "completed")]
            await alice.probe.drain(0.5)
            counts = [len(seen_notes(alice, s)) for s in ("boundary_delivered",
                                                          "acknowledged", "completed")]
            await alice.close()
            return notes, counts

        notes, counts = asyncio.run(read())
        assert [n["operation_key"] for n in notes] == [key] * 3
        assert counts == [1, 1, 1]
        ids = [r["notification"]["notification_id"]
               for r in relayed_rows(tmp_path / "east" / "hubd.db")]
        assert len(ids) == len(set(ids)) == 3
    finally:
        east.stop()
        west.stop()


def test_the_origin_takes_only_routed_notices_once_and_acknowledges_all(tmp_path, pki):
    """A hand-written west (mutual TLS) answers alice's request, then pushes
    notices: one for her routed operation (twice: the second is a duplicate),
    one for another seat, one for an operation never routed, one malformed.
    East journals and delivers the one, once; acknowledges every notice that
    names itself; the refused ones change nothing."""
    from tests.integration.test_delivery_forward import fake_status
    from tests.support.federation import fake_peer_hub

    key = "b" * 64
    acks: list[dict] = []
    sockets = []

    def note(**over) -> dict:
        base = {"audience": "PROJ/alice@east", "cancel_requested": False, "event_seq": 9,
                "notification_id": f"delivery:{key}:2", "operation_key": key,
                "protocol_version": 3, "request_id": "r1", "sender": "SynapseHub",
                "source": "recipient", "stage": "boundary_delivered", "target": "PROJ/bob",
                "target_incarnation": "a" * 64, "task_id": "task-r1", "type": "delivery_status"}
        return {**base, **over}

    async def on_frame(ws, frame):
        if frame.get("type") == "heartbeat":
            sockets.append(ws)
        elif frame.get("type") == "multihub_message_forward":
            await ws.send_json({"sender": "SynapseHub", "target": "east",
                                "type": "multihub_message_result",
                                "forward_id": frame["forward_id"], "disposition": "accepted",
                                "answering_hub": "west", "reason_code": "", "detail": "",
                                "result": {"status": fake_status(key, "r1")}})
        elif frame.get("type") == "multihub_delivery_notices_ack":
            acks.extend(frame["acks"])

    async def push(notices):
        await sockets[-1].send_json({"sender": "SynapseHub", "target": "east", "payload": "",
                                     "type": "multihub_delivery_notices", "notices": notices})

    async def scenario():
        async with fake_peer_hub(pki, "west", 6, on_frame, features=["delivery_forward"],
                                 mtls=True) as port:
            site = site_flags(pki, "east", None)
            east = hubd_process(tmp_path / "east", "--message-peer",
                                f"west=wss://127.0.0.1:{port}/", "--message-peer-pin",
                                f"west={pki.server_pin('west')}", *site.connect, hub_id="east")
            await asyncio.to_thread(east.start)
            try:
                await asyncio.to_thread(wait_for, lambda: link_up(east), 20.0, "east's link")
                alice = await Agent.join(east.url, "PROJ/alice")
                queued = await alice.request("PROJ/bob@west", "a" * 64, "r1")
                assert queued["operation_key"] == key, queued
                await push([note(), note(audience="PROJ/carol@east",
                                         notification_id="n-carol"),
                            note(operation_key="c" * 64, notification_id="n-unrouted"),
                            note(stage="exploded", notification_id="n-bad"), "not a notice"])
                first = await told(alice, "boundary_delivered")
                await push([note()])  # pushed again: the ack was "lost"
                deadline = time.monotonic() + 10
                while len(acks) < 5 and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
                await alice.probe.drain(0.5)
                health = east.get_json("/health")["delivery_notices"]
                await alice.close()
                return first, seen_notes(alice, "boundary_delivered"), health
            finally:
                east.stop()

    first, all_seen, health = asyncio.run(scenario())
    assert (first["audience"], first["remote_hub"], first["operation_key"]) == \
        ("PROJ/alice", "west", key)
    assert len(all_seen) == 1  # the duplicate was not delivered again
    rows = relayed_rows(tmp_path / "east" / "hubd.db")
    assert [r["notification"]["notification_id"] for r in rows] == [f"delivery:{key}:2"]
    # every notice that named itself was acknowledged (the duplicate too), once per push
    assert [a["notification_id"] for a in acks] == [
        f"delivery:{key}:2", "n-carol", "n-unrouted", "n-bad", f"delivery:{key}:2"]
    assert (health["relayed"], health["duplicates"], health["refused"]) == (1, 1, 4)


def test_a_bad_acknowledgement_changes_nothing(tmp_path, pki):
    """On west: a hand-written east (its client certificate, mutual TLS)
    sends a malformed ack and an ack naming another origin's requester; a
    local agent sends the hub-to-hub verb. Each is refused or ignored and the
    journal does not change."""
    from tests.support.wsprobe import WsProbe

    west = start_west(tmp_path, pki)
    db = tmp_path / "west" / "hubd.db"

    def journal() -> list:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            return con.execute("SELECT seq, kind FROM events ORDER BY seq").fetchall()
        finally:
            con.close()

    async def scenario():
        answers = []
        async with east_link(west, pki) as ws:
            for acks in ("x", [{"audience": 1}],
                         [{"audience": "PROJ/alice@north", "notification_id": "n1"}]):
                await ws.send_json({"sender": "east", "target": "System", "payload": "",
                                    "type": "multihub_delivery_notices_ack", "acks": acks})
            await ws.send_json(LOG_ROUND_TRIP)
            while True:
                frame = await ws.receive_json(timeout=5)
                if frame.get("type") == "multihub_log_snapshot":
                    break
                answers.append(frame)
        local = await WsProbe.open(west.url)
        await local.recv_type("welcome")
        await local.register("PROJ/mallory")
        await local.send_json({"sender": "PROJ/mallory", "target": "System", "payload": "",
                               "type": "multihub_delivery_notices_ack",
                               "acks": [{"audience": "PROJ/x@east", "notification_id": "n"}]})
        refused = await local.recv_type("error", 5)
        await local.close()
        return answers, refused

    try:
        before = journal()
        answers, refused = asyncio.run(scenario())
        assert [a["type"] for a in answers] == ["error", "error"], answers
        assert all("Malformed multihub_delivery_notices_ack" in a["payload"] for a in answers)
        assert refused["type"] == "error", refused
        assert "hub-to-hub verb" in refused["payload"]
        assert journal() == before  # nothing journaled, nothing settled
    finally:
        west.stop()


def test_a_log_page_comes_after_the_answers_to_the_links_earlier_frames(tmp_path, pki):
    """A peer's link sends a malformed ack, then a log pull; a local agent keeps
    west's writer committing meanwhile. The error (released after the writer's
    commit of its round) must reach the link before the page (read from the
    journal on another thread): a link's answers come in the order it asked."""
    from tests.support.wsprobe import WsProbe

    west = start_west(tmp_path, pki)

    async def scenario() -> list[list[str]]:
        chatter = await WsProbe.open(west.url)
        await chatter.recv_type("welcome")
        await chatter.register("PROJ/chatter")
        busy = True

        async def chat_on():
            # to itself, paced: commits all along, within the chat quota, and
            # nothing for east's link to queue before it registers
            n = 0
            while busy:
                n += 1
                await chatter.chat("PROJ/chatter", "PROJ/chatter", f"note {n}")
                await asyncio.sleep(0.002)

        chatting = asyncio.create_task(chat_on())
        rounds = []
        try:
            async with east_link(west, pki) as ws:
                for _ in range(40):
                    await ws.send_json({"sender": "east", "target": "System", "payload": "",
                                        "type": "multihub_delivery_notices_ack", "acks": "x"})
                    await ws.send_json(LOG_ROUND_TRIP)
                    seen = []
                    while "multihub_log_snapshot" not in seen:
                        type_ = (await ws.receive_json(timeout=5))["type"]
                        if type_ in ("error", "multihub_log_snapshot"):
                            seen.append(type_)
                    rounds.append(seen)
        finally:
            busy = False
            await chatting
            await chatter.close()
        return rounds

    try:
        rounds = asyncio.run(scenario())
        assert rounds == [["error", "multihub_log_snapshot"]] * 40, rounds
    finally:
        west.stop()

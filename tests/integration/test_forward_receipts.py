"""Receipts of forwarded chats follow the completed-write rule on the
receiving hub (docs/receipts.md, "Forwarded chats"): two real hubd processes
over pinned mutual TLS; west decides `delivered` with the consume-live
partition and the write tracking of its local receipts, and east's receipt
reports west's facts with hub-qualified names."""

import asyncio
import json

import pytest

from federation.tls import peer_client_context
from hubd.cli import build_parser, config_from_args
from hubd.timing import Timing
from tests.support.inproc import running_hub, settled
from tests.support.rawws import RawWs, text
from tests.support.federation import make_pki, site_flags, write_serving_policy
from tests.support.procs import hubd_process
from tests.support.wsprobe import WsProbe, joined

# west's reaction window: short, so "idle" is reached in a test's time, and
# long enough that a reaction followed by a forwarded chat stays inside it
WINDOW = "2"


@pytest.fixture
def pki(tmp_path):
    return make_pki(tmp_path / "pki", ["east", "west"])


def start_pair(tmp_path, pki):
    policy = write_serving_policy(tmp_path / "west-policy", pki, {"east": ["PROJ"]})
    west = hubd_process(tmp_path / "west", *site_flags(pki, "west", policy).serve,
                        "--recipient-liveness-window", WINDOW, hub_id="west", scheme="wss")
    west.start()
    east = hubd_process(tmp_path / "east", "--message-peer", f"west=wss://127.0.0.1:{west.port}/",
                        "--message-peer-pin", f"west={pki.server_pin('west')}",
                        *site_flags(pki, "east", None).connect, hub_id="east")
    east.start()
    return east, west


async def bob_liveness(watcher: WsProbe) -> dict:
    await watcher.send_json({"sender": "PROJ/watch", "target": "System", "type": "who_request"})
    return (await watcher.recv_type("who_snapshot"))["agent_liveness"]["PROJ/bob"]


def test_a_forwarded_chat_is_delivered_only_to_a_consume_live_recipient(tmp_path, pki):
    east, west = start_pair(tmp_path, pki)
    try:
        async def scenario():
            bob = await joined(west.url, "PROJ/bob")
            watcher = await joined(west.url, "PROJ/watch")
            alice = await joined(east.url, "PROJ/alice")
            # bob registered just now: consume-live; the write to him completes
            await alice.chat("PROJ/alice", "PROJ/bob@west", "live", client_msg_id="l1",
                             receipt_requested=True)
            assert (await bob.recv_type("chat", client_msg_id="l1", timeout=10))["payload"] == \
                "live"
            live = await alice.recv_type("delivery_receipt", client_msg_id="l1", timeout=15)
            assert live["forward_state"] == "accepted" and live["delivered"] is True
            assert live["reason"] == "" and live["dead_lettered"] is False
            assert live["recipients"] == ["PROJ/bob@west"]
            assert live["matched_recipients"] == ["PROJ/bob@west"]
            assert live["stale_recipients"] == []
            assert live["recipient_wake_capabilities"] == {}

            # bob reacts to nothing: once west no longer counts him live, a
            # forwarded chat reaches his socket but is not reported delivered
            while (await bob_liveness(watcher))["proven_live"]:
                await asyncio.sleep(0.2)
            await alice.chat("PROJ/alice", "PROJ/bob@west", "stale", client_msg_id="s1",
                             receipt_requested=True)
            stale = await alice.recv_type("delivery_receipt", client_msg_id="s1", timeout=15)
            assert stale["forward_state"] == "accepted" and stale["delivered"] is False
            assert stale["reason"] == "no_live_recipient" and stale["dead_lettered"] is True
            assert stale["recipients"] == []
            assert stale["matched_recipients"] == ["PROJ/bob@west"]
            assert stale["stale_recipients"] == ["PROJ/bob@west"]
            assert "no live recipient" in stale["payload"]
            # the chat itself still went to bob (best effort) and is journaled on west
            assert (await bob.recv_type("chat", client_msg_id="s1", timeout=10))["seq"] > 0

            # a reaction makes him live again: delivered once more
            await bob.send_json({"sender": "PROJ/bob", "target": "System",
                                 "type": "who_request"})
            await bob.recv_type("who_snapshot")
            await alice.chat("PROJ/alice", "PROJ/bob@west", "again", client_msg_id="a1",
                             receipt_requested=True)
            again = await alice.recv_type("delivery_receipt", client_msg_id="a1", timeout=15)
            assert again["delivered"] is True and again["recipients"] == ["PROJ/bob@west"]
            assert again["stale_recipients"] == []

            # nobody matched at all: accepted, no_online_recipient, nothing matched
            await alice.chat("PROJ/alice", "PROJ/carol@west", "nobody", client_msg_id="o1",
                             receipt_requested=True)
            offline = await alice.recv_type("delivery_receipt", client_msg_id="o1", timeout=15)
            assert offline["delivered"] is False and offline["reason"] == "no_online_recipient"
            assert offline["matched_recipients"] == [] and offline["stale_recipients"] == []
            for probe in (alice, bob, watcher):
                await probe.close()

        asyncio.run(scenario())
    finally:
        east.stop()
        west.stop()


def test_a_duplicate_after_the_receiver_restarted_claims_no_delivery(tmp_path, pki):
    """The verdict is live state on the receiving hub: before a restart a
    duplicate gets the first answer's verdict, after it `delivery_unconfirmed`
    (docs/receipts.md, decisions)."""
    policy = write_serving_policy(tmp_path / "west-policy", pki, {"east": ["PROJ"]})
    west = hubd_process(tmp_path / "west", *site_flags(pki, "west", policy).serve,
                        hub_id="west", scheme="wss")
    west.start()
    context = peer_client_context(pki.file("east", "client", "cert"),
                                  pki.file("east", "client", "key"))
    forward = {"sender": "east", "target": "System", "type": "multihub_message_forward",
               "forward_id": "f-restart", "kind": "chat", "sender_seat": "PROJ/alice",
               "target_seat": "PROJ/bob", "body": {"payload": "once"}}
    try:
        async def first():
            bob = await joined(west.url, "PROJ/bob")
            peer = await WsProbe.open(west.url, ssl=context)
            await peer.send_json(forward)
            answer = await peer.recv_type("multihub_message_result", timeout=15)
            assert answer["disposition"] == "accepted"
            assert answer["result"]["delivered"] is True
            assert answer["result"]["recipients"] == ["PROJ/bob"]
            await peer.send_json(forward)
            again = await peer.recv_type("multihub_message_result", timeout=15)
            assert again["disposition"] == "duplicate" and again["result"] == answer["result"]
            for probe in (bob, peer):
                await probe.close()
            return answer["result"]

        async def after_restart(before):
            peer = await WsProbe.open(west.url, ssl=context)
            await peer.send_json(forward)
            again = await peer.recv_type("multihub_message_result", timeout=15)
            assert again["disposition"] == "duplicate"
            result = again["result"]
            assert result["seq"] == before["seq"] and result["delivered"] is False
            assert result["reason"] == "delivery_unconfirmed" and result["dead_lettered"] is True
            assert result["matched_recipients"] == ["PROJ/bob"] and result["recipients"] == []
            await peer.close()

        before = asyncio.run(first())
        west.stop()
        west.start()
        asyncio.run(after_restart(before))
    finally:
        west.stop()


async def test_a_forward_to_a_stalled_recipient_is_answered_transport_unavailable(tmp_path, pki):
    """West in-process (so the test can see bob's write stall), serving pinned
    mTLS; bob registers and never reads; a forward to him is answered once
    the drain deadline failed the write, inside the origin's answer bound,
    and counted in west's dead-letter ledger."""
    policy = write_serving_policy(tmp_path / "west-policy", pki, {"east": ["PROJ"]})
    parser = build_parser()
    args = parser.parse_args(["--hub-id", "west", *site_flags(pki, "west", policy).serve])
    federation = config_from_args(args, parser).federation
    # a one-second drain deadline (production's is five), swept ten times a second
    async with running_hub(tmp_path, hub_id="west", redsyn=False, private_directed=True,
                           federation=federation,
                           timing=Timing(sweep=0.1, send_stall=1.0)) as west:
        alice = await joined(west.url, "PROJ/alice")
        bob = await RawWs.connect(west.port, rcvbuf=4096, tls=peer_client_context())
        await bob.send(text(json.dumps({"sender": "PROJ/bob", "target": "System",
                                        "type": "heartbeat", "payload": "online"})))
        await alice.recv_type("presence_update", agent="PROJ/bob")
        session = west.hub.router.presence.session_of("PROJ/bob")
        conn = west.hub.endpoints.get(session.endpoint)
        loop = asyncio.get_running_loop()
        big = "x" * 60_000
        while conn.write_stalled_for(loop.time()) == 0:
            await alice.chat("PROJ/alice", "PROJ/bob", big)
            await asyncio.sleep(0.01)
        peer = await WsProbe.open(west.url, ssl=peer_client_context(
            pki.file("east", "client", "cert"), pki.file("east", "client", "key")))
        try:
            await peer.send_json({"sender": "east", "target": "System",
                                  "type": "multihub_message_forward", "forward_id": "f-stuck",
                                  "kind": "chat", "sender_seat": "PROJ/carol",
                                  "target_seat": "PROJ/bob", "body": {"payload": "stuck"}})
            answer = await peer.recv_type("multihub_message_result", timeout=15)
            assert answer["disposition"] == "accepted"
            result = answer["result"]
            assert result["delivered"] is False and result["dead_lettered"] is True
            assert result["reason"] == "recipient_transport_unavailable"
            assert result["matched_recipients"] == ["PROJ/bob"]
            assert result["stale_recipients"] == [] and result["recipients"] == []
            assert west.hub.metrics.send_timeouts >= 1
            # a dead letter in west's ledger too, journaled as such (docs/dead-letters.md)
            await settled(west)
            entry = west.hub.router.state.chat.dead_letters.by_target["PROJ/bob"]
            assert (entry["count"], entry["last_sender"]) == (1, "PROJ/carol@east")
        finally:
            bob.close()
            await peer.close()
            await alice.close()

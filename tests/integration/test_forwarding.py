"""Cross-site forwarding between real hubd processes over pinned mTLS links,
with certificates made by `hubd certs`."""

import asyncio
import json
import time

import pytest

from federation.actors.outbox import RESIDENT
from federation.tls import peer_client_context
from hubd.state.mailbox import MAX_REPLAY
from tests.support.federation import fake_peer_hub, make_pki, site_flags, write_serving_policy
from tests.support.procs import hubd_process
from tests.support.wsprobe import WsProbe, joined
from tests.support.waiting import wait_for


@pytest.fixture
def pki(tmp_path):
    return make_pki(tmp_path / "pki", ["east", "west", "north"])


def start_pair(tmp_path, pki, *, grants=None, east_extra=(), pin=None, client_cert=True,
               west_port=None):
    policy = write_serving_policy(tmp_path / "west-policy", pki, grants or {"east": ["PROJ"]})
    west_site = site_flags(pki, "west", policy)
    west = hubd_process(tmp_path / "west", *west_site.serve, hub_id="west", scheme="wss",
                        port=west_port)
    west.start()
    east_site = site_flags(pki, "east", None)
    flags = ["--message-peer", f"west=wss://127.0.0.1:{west.port}/", "--message-peer-pin",
             f"west={pin or pki.server_pin('west')}"]
    if client_cert:
        flags += east_site.connect
    east = hubd_process(tmp_path / "east", *flags, *east_extra, hub_id="east")
    east.start()
    return east, west


def test_chat_east_to_west_with_receipt(tmp_path, pki):
    east, west = start_pair(tmp_path, pki)
    try:
        async def scenario():
            bob = await joined(west.url, "PROJ/bob")
            alice = await joined(east.url, "PROJ/alice")
            await alice.chat("PROJ/alice", "PROJ/bob@west", "hello bob", client_msg_id="x1",
                             receipt_requested=True)
            got = await bob.recv_type("chat", timeout=10)
            assert got["sender"] == "PROJ/alice@east" and got["forwarded_from"] == "east"
            assert got["target"] == "PROJ/bob" and got["payload"] == "hello bob"
            assert got["client_msg_id"] == "x1" and got["hub_id"] == "west"
            receipt = await alice.recv_type("delivery_receipt", timeout=10)
            assert receipt["forward_state"] == "accepted" and receipt["delivered"] is True
            assert receipt["forwarded_to"] == "west" and receipt["forward_id"] == got["forward_id"]
            assert receipt["recipients"] == ["PROJ/bob@west"]
            assert receipt["client_msg_id"] == "x1" and receipt["message_target"] == "PROJ/bob@west"
            # offline seat: accepted, waits in west's mailbox
            await alice.chat("PROJ/alice", "PROJ/carol@west", "for carol", receipt_requested=True)
            offline = await alice.recv_type("delivery_receipt", message_target="PROJ/carol@west",
                                            timeout=10)
            assert offline["forward_state"] == "accepted" and offline["delivered"] is False
            assert offline["reason"] == "no_online_recipient"
            # local refusals: unknown hub, comma list, glob
            for target, words in [("PROJ/bob@nowhere", "not a configured message peer"),
                                  ("PROJ/a@west,PROJ/b@west", "exactly one seat"),
                                  ("PROJ/*@west", "not an audience or a glob")]:
                await alice.chat("PROJ/alice", target, "no")
                assert words in (await alice.recv_type("error"))["payload"]
            # roster of the peer, limited to granted namespaces
            other = await joined(west.url, "OTHER/zed")
            await alice.send_json({"sender": "PROJ/alice", "type": "who_request", "hub": "west"})
            roster = await alice.recv_type("who_snapshot", timeout=10)
            assert roster["remote_hub"] == "west" and roster["online_agents"] == ["PROJ/bob@west"]
            for p in (alice, bob, other):
                await p.close()
        asyncio.run(scenario())
        health = east.get_json("/health")["message_forward"]["west"]
        assert health["link"] == "up" and health["pending"] == 0
        # the chat to a hub east has no route to was counted and logged
        assert east.metric("hubd_chats_no_route_total") == 1
        assert "chat to a hub with no route" in east.log() and "hub=nowhere" in east.log()
    finally:
        east.stop()
        west.stop()


@pytest.mark.parametrize("problem", ["wrong_pin", "no_client_cert", "ungranted_namespace"])
def test_refusals_deliver_nothing(tmp_path, pki, problem):
    kwargs = {}
    if problem == "wrong_pin":
        kwargs["pin"] = pki.server_pin("north")
    elif problem == "no_client_cert":
        kwargs["client_cert"] = False
    else:
        kwargs["grants"] = {"east": ["OTHER"]}
    east, west = start_pair(tmp_path, pki, **kwargs)
    try:
        async def scenario():
            bob = await joined(west.url, "PROJ/bob")
            alice = await joined(east.url, "PROJ/alice")
            await alice.chat("PROJ/alice", "PROJ/bob@west", "must not arrive",
                             receipt_requested=True)
            receipt = await alice.recv_type("delivery_receipt", timeout=10)
            # a sentinel from a seat on west: had west taken the forward, its
            # chat would have reached bob before west answered, so before this
            carol = await joined(west.url, "PROJ/carol")
            await carol.chat("PROJ/carol", "PROJ/bob", "sentinel")
            await bob.recv_type("chat", payload="sentinel", timeout=10)
            assert [c["payload"] for c in bob.seen("chat")] == ["sentinel"]
            await carol.close()
            await alice.close()
            await bob.close()
            return receipt
        receipt = asyncio.run(scenario())
        assert receipt["delivered"] is False
        health = east.get_json("/health")["message_forward"]["west"]
        if problem == "wrong_pin":
            assert receipt["forward_state"] == "pending"
            assert health["link"] == "down" and health["last_error"]["cause"] == "pin_mismatch"
        elif problem == "no_client_cert":
            assert receipt["forward_state"] == "refused"
            assert "no client certificate" in receipt["payload"]
        else:
            assert receipt["forward_state"] == "refused"
            assert receipt["refusal_code"] == "namespace_not_granted"
    finally:
        east.stop()
        west.stop()


def scrape(hub, name, peer="west"):
    import urllib.request
    text = urllib.request.urlopen(hub.http_url + "/metrics", timeout=5).read().decode()
    for line in text.splitlines():
        if line.startswith(f'{name}{{peer="{peer}"}}'):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_peer_down_then_back_delivers_the_backlog_once(tmp_path, pki):
    """How fast the backlog drains is measured, not asserted: scenario (c) of
    tests/bench/bench_forward.py (N = 20 pending, west restarted)."""
    east, west = start_pair(tmp_path, pki)
    try:
        async def send_while_down():
            alice = await joined(east.url, "PROJ/alice")
            for i in range(20):
                await alice.chat("PROJ/alice", "PROJ/bob@west", f"m{i}", client_msg_id=f"d{i}",
                                 receipt_requested=True)
            pending = await alice.recv_type("delivery_receipt", timeout=10)
            await alice.send_json({"sender": "PROJ/alice", "type": "who_request", "hub": "west"})
            roster = await alice.recv_type("error", timeout=10)
            assert "did not answer the roster request" in roster["payload"]
            await alice.close()
            return pending
        west.stop()
        # let the link notice and back off for a while
        wait_for(lambda: east.get_json("/health")["message_forward"]["west"]["link"] == "down")
        pending = asyncio.run(send_while_down())
        assert pending["forward_state"] == "pending" and pending["reason"] == "forward_pending"
        assert scrape(east, "synapse_message_forward_pending") == 20
        # the oldest forward's age, in the gauge, passes two seconds
        wait_for(lambda: scrape(east, "synapse_message_forward_oldest_pending_seconds") >= 2,
                 timeout=10)

        west.start()  # same port, same journal

        async def collect():
            bob = await WsProbe.open(west.url)
            await bob.recv_type("welcome")
            await bob.register("PROJ/bob", mailbox=True, since_seq=0)
            got = {}  # client_msg_id -> seqs (replay and live may both carry one entry)
            while len(got) < 20:
                chat = await bob.recv_type("chat", timeout=10)
                got.setdefault(chat["client_msg_id"], set()).add(chat["seq"])
            await bob.close()
            return got
        got = asyncio.run(collect())
        wait_for(lambda: scrape(east, "synapse_message_forward_pending") == 0, timeout=30)
        assert sorted(got) == sorted(f"d{i}" for i in range(20))
        assert all(len(s) == 1 for s in got.values()), got
        assert scrape(east, "hubd_peer_link_up") == 1

        async def settled_receipts():
            # alice left while they were pending: the settled receipts wait for her
            alice = await WsProbe.open(east.url)
            await alice.recv_type("welcome")
            await alice.register("PROJ/alice")
            await alice.recv_type("presence_update", agent="PROJ/alice")
            await alice.close()
            return alice.seen("delivery_receipt")  # they come before presence_update
        receipts = asyncio.run(settled_receipts())
        assert sorted(r["client_msg_id"] for r in receipts) == sorted(f"d{i}" for i in range(20))
        # accepted (or duplicate, for one resent across the outage); bob may have
        # registered after some landed, so `delivered` may be either
        assert all(r["forward_state"] in ("accepted", "duplicate") and r["deferred"] is True
                   for r in receipts), receipts
        assert "handler failed" not in east.log() and "Traceback" not in east.log()
    finally:
        east.stop()
        west.stop()


def test_a_backlog_larger_than_the_outbox_holds_waits_in_the_journal_and_drains_once(
        tmp_path, pki):
    """The outbox holds RESIDENT forwards; the rest of a long outage's backlog
    stays in the journal and is read back as room frees up, across a restart
    of the origin too."""
    count = RESIDENT + 904
    east, west = start_pair(tmp_path, pki)
    try:
        def forward_health():
            return east.get_json("/health")["message_forward"]["west"]

        async def send_while_down():
            alice = await joined(east.url, "PROJ/alice")
            for i in range(count):
                await alice.chat("PROJ/alice", "PROJ/bob@west", f"m{i}", client_msg_id=f"b{i}")
            await alice.close()
        west.stop()
        wait_for(lambda: forward_health()["link"] == "down")
        asyncio.run(send_while_down())
        wait_for(lambda: forward_health()["pending"] == count, timeout=60)
        wait_for(lambda: forward_health()["held_in_memory"] == RESIDENT)
        assert forward_health()["pending"] == count
        east.stop()
        east.start()  # the backlog is read back from the journal, RESIDENT of it
        wait_for(lambda: forward_health()["held_in_memory"] == RESIDENT)
        assert forward_health()["pending"] == count

        west.start()
        wait_for(lambda: forward_health()["pending"] == 0, timeout=60)

        async def collect():
            # every chat is in bob's mailbox on west now; a replay sends at most
            # MAX_REPLAY of them, so bob pages with since_seq
            bob = await WsProbe.open(west.url)
            await bob.recv_type("welcome")
            await bob.register("PROJ/bob", mailbox=True, since_seq=0)
            got = {}  # client_msg_id -> seqs
            since = 0
            while True:
                for _ in range(min(MAX_REPLAY, count - len(got))):
                    chat = await bob.recv_type("chat", timeout=30)
                    got.setdefault(chat["client_msg_id"], set()).add(chat["seq"])
                    since = max(since, chat["seq"])
                if len(got) >= count:
                    break
                await bob.send_json({"sender": "PROJ/bob", "type": "heartbeat",
                                     "mailbox": True, "since_seq": since})
            await bob.close()
            return got
        got = asyncio.run(collect())
        assert sorted(got) == sorted(f"b{i}" for i in range(count))
        assert all(len(seqs) == 1 for seqs in got.values())
        assert forward_health()["held_in_memory"] == 0
        assert "handler failed" not in east.log() and "Traceback" not in east.log()
    finally:
        east.stop()
        west.stop()


def test_sigkill_origin_with_pending_forwards(tmp_path, pki):
    east, west = start_pair(tmp_path, pki)
    try:
        west.stop()
        wait_for(lambda: east.get_json("/health")["message_forward"]["west"]["link"] == "down")

        async def send():
            alice = await joined(east.url, "PROJ/alice")
            for i in range(30):
                await alice.chat("PROJ/alice", "PROJ/bob@west", f"k{i}", client_msg_id=f"k{i}")
            await alice.send_json({"sender": "PROJ/alice", "type": "who_request"})
            await alice.recv_type("who_snapshot")  # all 30 handled and committed
            await alice.close()
        asyncio.run(send())
        east.kill()
        west.start()
        east.start()

        async def collect():
            bob = await WsProbe.open(west.url)
            await bob.recv_type("welcome")
            await bob.register("PROJ/bob", mailbox=True, since_seq=0)
            seqs: dict[str, set] = {}
            deadline = time.monotonic() + 15
            while len(seqs) < 30 and time.monotonic() < deadline:
                chat = await bob.recv_type("chat", timeout=15)
                seqs.setdefault(chat["client_msg_id"], set()).add(chat["seq"])
            # a sentinel from a seat on west, then a round trip: whatever west
            # routed to bob, live or replayed, was on his socket before it
            carol = await joined(west.url, "PROJ/carol")
            await carol.chat("PROJ/carol", "PROJ/bob", "sentinel")
            await bob.recv_type("chat", payload="sentinel", timeout=15)
            await bob.send_json({"sender": "PROJ/bob", "type": "who_request", "target": "System"})
            await bob.recv_type("who_snapshot")
            await carol.close()
            for chat in bob.seen("chat"):
                if chat["payload"] == "sentinel":
                    continue
                seqs.setdefault(chat["client_msg_id"], set()).add(chat["seq"])
            await bob.close()
            return seqs
        seqs = asyncio.run(collect())
        # A chat can reach bob twice as the same journal entry (replayed, and live
        # while he registers): clients dedup on seq. Exactly once means one seq
        # per chat: west accepted each forward once, whatever east resent.
        assert sorted(seqs) == sorted(f"k{i}" for i in range(30))
        assert all(len(s) == 1 for s in seqs.values()), seqs
        wait_for(lambda: scrape(east, "synapse_message_forward_pending") == 0)
    finally:
        east.stop()
        west.stop()


def test_duplicate_and_conflicting_forward_ids(tmp_path, pki):
    policy = write_serving_policy(tmp_path / "west-policy", pki, {"east": ["PROJ"]})
    west = hubd_process(tmp_path / "west", *site_flags(pki, "west", policy).serve, hub_id="west",
                        scheme="wss")
    west.start()
    try:
        async def scenario():
            bob = await joined(west.url, "PROJ/bob")
            context = peer_client_context(pki.file("east", "client", "cert"),
                                          pki.file("east", "client", "key"))
            peer = await WsProbe.open(west.url, ssl=context)
            forward = {"sender": "east", "target": "System", "type": "multihub_message_forward",
                       "forward_id": "f-1", "kind": "chat", "sender_seat": "PROJ/alice",
                       "target_seat": "PROJ/bob",
                       "body": {"payload": "once", "origin_msg_id": 1, "origin_timestamp": 1.5}}
            await peer.send_json(forward)
            first = await peer.recv_type("multihub_message_result")
            assert first["disposition"] == "accepted" and first["answering_hub"] == "west"
            assert first["result"]["delivered"] is True
            await peer.send_json(forward)
            again = await peer.recv_type("multihub_message_result")
            assert again["disposition"] == "duplicate" and again["result"] == first["result"]
            changed = json.loads(json.dumps(forward))
            changed["body"]["origin_timestamp"] = 2.5
            await peer.send_json(changed)
            conflict = await peer.recv_type("multihub_message_result")
            assert conflict["disposition"] == "refused"
            assert conflict["reason_code"] == "forward_id_conflict"
            glob = dict(forward, forward_id="f-2", target_seat="PROJ/*")
            await peer.send_json(glob)
            assert (await peer.recv_type("multihub_message_result"))["reason_code"] == \
                "invalid_target"
            # a sentinel: any chat a resent forward made reached bob before its answer
            await bob.send_json({"sender": "PROJ/bob", "type": "who_request", "target": "System"})
            await bob.recv_type("who_snapshot")
            assert [c["payload"] for c in bob.seen("chat")] == ["once"]
            # a local client claiming to be east, without the certificate, is refused
            squatter = await WsProbe.open(west.url)
            await squatter.send_json(dict(forward, forward_id="f-3"))
            refused = await squatter.recv_type("multihub_message_result")
            assert refused["disposition"] == "refused"
            assert refused["reason_code"] == "peer_not_authorised"
            assert "no client certificate" in refused["detail"]
            for p in (bob, peer, squatter):
                await p.close()
        asyncio.run(scenario())
    finally:
        west.stop()


def test_log_pull_is_served_only_to_a_pinned_granted_peer(tmp_path, pki):
    policy = write_serving_policy(tmp_path / "west-policy", pki, {"east": ["PROJ"]})
    west = hubd_process(tmp_path / "west", *site_flags(pki, "west", policy).serve, hub_id="west",
                        scheme="wss")
    west.start()
    try:
        async def scenario():
            bob = await joined(west.url, "PROJ/bob")
            for i in range(5):
                await bob.chat("PROJ/bob", "all", f"n{i}")
            await bob.send_json({"sender": "PROJ/bob", "type": "who_request"})
            await bob.recv_type("who_snapshot")
            east_ctx = peer_client_context(pki.file("east", "client", "cert"),
                                           pki.file("east", "client", "key"))
            peer = await WsProbe.open(west.url, ssl=east_ctx)
            request = {"sender": "east", "target": "all", "type": "multihub_log_request",
                       "payload": "", "after_seq": 0, "limit": None}
            await peer.send_json(request)
            snap = await peer.recv_type("multihub_log_snapshot")
            chats = [e for e in snap["events"] if e["kind"] == "chat"]
            assert [e["payload"]["payload"] for e in chats] == [f"n{i}" for i in range(5)]
            assert snap["next_cursor"] == snap["events"][-1]["seq"] == snap["log_end_seq"]
            assert all(set(e) == {"seq", "ts", "kind", "payload"} for e in snap["events"])
            await peer.send_json(dict(request, after_seq=snap["next_cursor"]))
            caught_up = await peer.recv_type("multihub_log_snapshot")
            assert caught_up["events"] == [] and caught_up["log_end_seq"] == snap["log_end_seq"]
            await peer.send_json(dict(request, after_seq=0, limit=2))
            paged = await peer.recv_type("multihub_log_snapshot")
            assert [e["seq"] for e in paged["events"]] == [1, 2] and paged["next_cursor"] == 2
            # pipelined pulls: each answered once; past IN_FLIGHT reads at once, the
            # rest are told "nothing now" (and the hub says so in its log)
            for _ in range(24):
                await peer.send_json(dict(request, after_seq=0, limit=2))
            answers = [await peer.recv_type("multihub_log_snapshot") for _ in range(24)]
            served = [a for a in answers if a["events"]]
            assert served and all([e["seq"] for e in a["events"]] == [1, 2] for a in served)
            not_now = [a for a in answers if not a["events"]]
            assert all(a["log_end_seq"] is None and a["next_cursor"] == 0 for a in not_now)
            assert west.log().count("too many being read") == len(not_now)
            # no certificate, or a certificate that is not east's: an empty answer
            for ssl in (None, peer_client_context(pki.file("north", "client", "cert"),
                                                  pki.file("north", "client", "key"))):
                other = await WsProbe.open(west.url, ssl=ssl)
                await other.send_json(dict(request, after_seq=3))
                refused = await other.recv_type("multihub_log_snapshot")
                assert refused["events"] == [] and refused["log_end_seq"] is None
                assert refused["next_cursor"] == 3
                await other.close()
            for p in (bob, peer):
                await p.close()
        asyncio.run(scenario())
    finally:
        west.stop()


def test_a_peer_older_than_v5_refuses_once_and_is_not_retried(tmp_path, pki):
    """No pre-v5 hub can be installed here, so this peer is a small server that
    answers as one does: the forward verb is an unknown type."""
    seen = []

    async def old_hub(ws, frame):
        if frame.get("type") == "multihub_message_forward":
            seen.append(frame["forward_id"])
            await ws.send_json({"sender": "SynapseHub", "target": "east",
                                "type": "error", "hub_id": "west",
                                "payload": "Unknown message type "
                                           "'multihub_message_forward'."})

    async def scenario():
        async with fake_peer_hub(pki, "west", 4, old_hub) as port:
            east = hubd_process(tmp_path / "east",
                                "--message-peer", f"west=wss://127.0.0.1:{port}/",
                                "--message-peer-pin", f"west={pki.server_pin('west')}",
                                *site_flags(pki, "east", None).connect, hub_id="east")
            await asyncio.to_thread(east.start)
            try:
                alice = await joined(east.url, "PROJ/alice")
                await alice.chat("PROJ/alice", "PROJ/bob@west", "hello old hub",
                                 receipt_requested=True)
                receipt = await alice.recv_type("delivery_receipt", timeout=10)
                # the refusal settled the row: nothing is left that could be retried
                health = await asyncio.to_thread(east.get_json, "/health")
                assert health["message_forward"]["west"]["pending"] == 0
                await alice.close()
                return receipt
            finally:
                east.stop()

    receipt = asyncio.run(scenario())
    assert receipt["forward_state"] == "refused" and receipt["refusal_code"] == "peer_rejected"
    assert len(seen) == 1, f"the forward was retried: {seen}"


def test_forward_expires_after_its_ttl_and_the_sender_is_told(tmp_path, pki):
    east, west = start_pair(tmp_path, pki, east_extra=("--message-forward-ttl", "2"))
    try:
        west.stop()
        wait_for(lambda: east.get_json("/health")["message_forward"]["west"]["link"] == "down")

        async def scenario():
            alice = await joined(east.url, "PROJ/alice")
            await alice.chat("PROJ/alice", "PROJ/bob@west", "too late", client_msg_id="ttl-1",
                             receipt_requested=True)
            pending = await alice.recv_type("delivery_receipt", forward_state="pending",
                                            timeout=10)
            expired = await alice.recv_type("delivery_receipt", forward_state="expired",
                                            timeout=15)
            await alice.close()
            return pending, expired
        pending, expired = asyncio.run(scenario())
        assert expired["reason"] == "forward_expired" and expired["deferred"] is True
        assert expired["client_msg_id"] == "ttl-1" and expired["delivered"] is False
        assert expired["forward_id"] == pending["forward_id"]
        assert scrape(east, "synapse_message_forward_pending") == 0
        assert "handler failed" not in east.log()
    finally:
        east.stop()
        west.stop()

"""The single-site hub over real sockets and a real journal (in-process hub)."""

import asyncio

from hubd.state.hub import HubState
from hubd.timing import Timing
from tests.support.inproc import running_hub
from tests.support.wsprobe import WsProbe


async def joined(url, name, **extra):
    probe = await WsProbe.open(url)
    await probe.recv_type("welcome")
    await probe.register(name, **extra)
    await probe.recv_type("presence_update", agent=name, event="joined")
    return probe


async def test_welcome_registration_and_presence(tmp_path):
    async with running_hub(tmp_path) as server:
        a = await WsProbe.open(server.url)
        welcome = await a.recv_type("welcome")
        assert welcome["sender"] == "SynapseHub" and welcome["hub_id"] == "test-hub"
        assert type(welcome["protocol_version"]) is int and welcome["protocol_version"] >= 2
        assert welcome["connected_clients"] == 1 and welcome["online_agents"] == []
        await a.register("p/alice")
        update = await a.recv_type("presence_update")
        assert update["event"] == "joined" and update["online_agents"] == ["p/alice"]
        b = await joined(server.url, "p/bob")
        await a.recv_type("presence_update", agent="p/bob", event="joined")
        await b.close()
        left = await a.recv_type("presence_update", agent="p/bob", event="left")
        assert left["online_agents"] == ["p/alice"]
        await a.close()


async def test_name_rules(tmp_path):
    async with running_hub(tmp_path) as server:
        a = await joined(server.url, "p/alice")
        dup = await WsProbe.open(server.url)
        await dup.recv_type("welcome")
        await dup.register("p/alice")
        conflict = await dup.recv_type("name_conflict")
        assert "already online" in conflict["payload"]
        assert (await dup.wait_closed()).code == 4009
        # the original keeps its name and works
        await a.send_json({"sender": "p/alice", "type": "who_request", "target": "System"})
        assert (await a.recv_type("who_snapshot"))["online_agents"] == ["p/alice"]
        # name switch on a bound socket
        await a.send_json({"sender": "p/mallory", "type": "chat", "target": "all", "payload": "x"})
        assert "switch" in (await a.recv_type("name_conflict"))["payload"]
        assert (await a.wait_closed()).code == 4009
        for reserved in ("SynapseHub", "p/bob@west"):
            r = await WsProbe.open(server.url)
            await r.recv_type("welcome")
            await r.register(reserved)
            await r.recv_type("name_conflict")
            closed = await r.wait_closed()
            assert closed.code == 4009 and closed.reason == "reserved identity"
        # the name is free again as soon as its socket is gone
        again = await joined(server.url, "p/alice")
        await again.close()


async def test_takeover_supersedes_the_old_socket(tmp_path):
    async with running_hub(tmp_path) as server:
        old = await joined(server.url, "p/alice")
        new = await WsProbe.open(server.url)
        await new.recv_type("welcome")
        await new.register("p/alice", takeover=True)
        await new.recv_type("presence_update", agent="p/alice")
        closed = await old.wait_closed()
        assert closed.code == 4010 and closed.reason == "superseded"
        await new.close()


async def test_chat_is_stamped_and_receipted(tmp_path):
    async with running_hub(tmp_path) as server:
        alice = await joined(server.url, "p/alice")
        bob = await joined(server.url, "p/bob")
        await alice.chat("p/alice", "p/bob", "hello", client_msg_id="c1", receipt_requested=True,
                         timestamp=12.5, token="leak", metadata={"k": 1})
        got = await bob.recv_type("chat")
        assert got["sender"] == "p/alice" and got["payload"] == "hello"
        assert got["client_timestamp"] == 12.5 and got["timestamp"] > 1e9
        assert got["hub_id"] == "test-hub" and got["msg_id"] == 1 and got["seq"] >= 1
        assert "token" not in got and got["metadata"] == {"k": 1}
        echo = await alice.recv_type("chat")
        assert echo["seq"] == got["seq"]
        receipt = await alice.recv_type("delivery_receipt")
        assert receipt["sender"] == "SynapseHub" and receipt["target"] == "p/alice"
        assert receipt["client_msg_id"] == "c1" and receipt["message_target"] == "p/bob"
        assert receipt["delivered"] is True and receipt["recipients"] == ["p/bob"]
        assert receipt["message_seq"] == got["seq"]
        assert receipt["receipt_notification_id"] == f"delivery-receipt:{got['seq']}:immediate_delivered"
        # a non-finite or non-numeric client timestamp is dropped
        await alice.chat("p/alice", "p/bob", "x2", timestamp="yesterday")
        assert "client_timestamp" not in await bob.recv_type("chat", payload="x2")
        await alice.close()
        await bob.close()


async def test_offline_recipient_dead_letter_and_deferred_receipt(tmp_path):
    async with running_hub(tmp_path) as server:
        alice = await joined(server.url, "p/alice")
        await alice.chat("p/alice", "p/carol", "while you were out", client_msg_id="m1",
                         receipt_requested=True)
        receipt = await alice.recv_type("delivery_receipt")
        assert receipt["delivered"] is False and receipt["dead_lettered"] is True
        assert receipt["reason"] == "no_online_recipient" and receipt["recipients"] == []
        seq = receipt["message_seq"]
        await alice.send_json({"sender": "p/alice", "type": "state_request", "target": "System"})
        letters = (await alice.recv_type("state_snapshot"))["snapshot"]["dead_letters"]
        assert letters[0]["target"] == "p/carol" and letters[0]["count"] == 1
        await alice.send_json({"sender": "p/alice", "type": "who_request", "target": "System"})
        assert (await alice.recv_type("who_snapshot"))["mailbox_pending"]["p/carol"] == 1

        carol = await WsProbe.open(server.url)
        await carol.recv_type("welcome")
        await carol.register("p/carol", mailbox=True, since_seq=0)
        replayed = await carol.recv_type("chat")
        assert replayed["replayed"] is True and replayed["seq"] == seq
        assert "receipt_requested" not in replayed
        # a spoofed ack from someone else neither advances nor fabricates
        await alice.send_json({"sender": "p/alice", "type": "ack", "seq": seq,
                               "mailbox_for": "p/carol", "target": "all"})
        await carol.send_json({"sender": "p/carol", "type": "ack", "seq": seq,
                               "mailbox_for": "p/carol", "target": "all"})
        deferred = await alice.recv_type("delivery_receipt", deferred=True)
        assert deferred["delivered"] is True and deferred["client_msg_id"] == "m1"
        assert deferred["recipients"] == ["p/carol"] and deferred["message_seq"] == seq
        await alice.send_json({"sender": "p/alice", "type": "who_request", "target": "System"})
        assert (await alice.recv_type("who_snapshot"))["mailbox_pending"]["p/carol"] == 0
        await alice.close()
        await carol.close()


async def test_retry_identity(tmp_path):
    async with running_hub(tmp_path) as server:
        alice = await joined(server.url, "p/alice")
        bob = await joined(server.url, "p/bob")
        await alice.chat("p/alice", "p/bob", "once", client_msg_id="dup-1")
        first = await bob.recv_type("chat", payload="once")
        await alice.chat("p/alice", "p/bob", "once", client_msg_id="dup-1")
        dup = await alice.recv_type("system")
        assert dup["duplicate"] is True and dup["msg_id"] == first["msg_id"]
        assert dup["seq"] == first["seq"]
        await alice.chat("p/alice", "p/bob", "changed", client_msg_id="dup-1")
        err = await alice.recv_type("error")
        assert "already used for a different message" in err["payload"]
        await alice.chat("p/alice", "p/bob", "after", client_msg_id="dup-2")
        await bob.recv_type("chat", payload="after")
        assert [f["payload"] for f in bob.seen("chat")] == ["once", "after"]
        await alice.close()
        await bob.close()


async def test_routing_targets_and_private_mode(tmp_path):
    async with running_hub(tmp_path, private_directed=True) as server:
        a = await joined(server.url, "p/a")
        b = await joined(server.url, "p/b", roles=["reviewer"])
        c = await joined(server.url, "q/c")
        for target, expect in [("p/b", {"p/b"}), ("p/b,q/c", {"p/b", "q/c"}), ("p/*", {"p/b"}),
                               ("q", {"q/c"}), ("reviewer", {"p/b"})]:
            await a.chat("p/a", target, f"to {target}", receipt_requested=True)
            receipt = await a.recv_type("delivery_receipt", message_target=target)
            assert set(receipt["recipients"]) == expect
        await a.chat("p/a", "all", "everyone")
        await b.recv_type("chat", payload="everyone")
        await c.recv_type("chat", payload="everyone")
        # a sentinel, not a pause: once it is on c's socket, everything routed
        # before it is too (frames leave in seq order)
        await a.chat("p/a", "q/c", "sentinel")
        await c.recv_type("chat", payload="sentinel")
        got_c = [f["payload"] for f in c.seen("chat")]
        assert got_c == ["to p/b,q/c", "to q", "everyone", "sentinel"]  # private: nothing else
        for p in (a, b, c):
            await p.close()


async def test_bad_input_gets_typed_errors_and_socket_stays(tmp_path):
    async with running_hub(tmp_path) as server:
        a = await joined(server.url, "p/a")
        await a.send_text("{not json")
        assert (await a.recv_type("error"))["payload"] == "Malformed JSON."
        await a.send_text("[1,2,3]")
        assert (await a.recv_type("error"))["payload"] == \
            "Malformed frame: expected a JSON object."
        await a.send_json({"sender": "p/a", "target": ["x"], "type": "chat"})
        assert (await a.recv_type("error"))["payload"] == \
            "Malformed frame: 'target' must be a string."
        await a.send_json({"sender": "p/a", "type": "frobnicate"})
        assert (await a.recv_type("error"))["payload"] == "Unknown message type 'frobnicate'."
        await a.send_bytes(b"\xff\xfe")
        assert (await a.recv_type("error"))["payload"] == "Malformed JSON."
        await a.send_json({"sender": "p/a", "type": "ack", "seq": "abc"})
        await a.send_json({"sender": "p/a", "type": "who_request"})
        assert (await a.recv_type("who_snapshot"))["online_agents"] == ["p/a"]
        assert a.closed is None
        await a.close()


async def test_oversized_frame_closes_with_1009(tmp_path):
    async with running_hub(tmp_path, max_msg_bytes=4096) as server:
        a = await joined(server.url, "p/a")
        await a.chat("p/a", "all", "x" * 5000)
        assert (await a.wait_closed()).code == 1009


async def test_history_and_resume(tmp_path):
    async with running_hub(tmp_path) as server:
        a = await joined(server.url, "p/a")
        for i in range(5):
            await a.chat("p/a", "p/b" if i % 2 else "all", f"m{i}", client_msg_id=f"id{i}")
        await a.send_json({"sender": "p/a", "type": "history_request", "limit": 2})
        snap = await a.recv_type("history_snapshot")
        assert [m["payload"] for m in snap["history"]] == ["m3", "m4"]
        assert snap["requested_limit"] == 2
        await a.send_json({"sender": "p/a", "type": "history_request",
                           "history_client_msg_id": "id1", "limit": 1})
        assert [m["payload"] for m in (await a.recv_type("history_snapshot"))["history"]] == ["m1"]
        await a.send_json({"sender": "p/a", "type": "history_request", "history_target": "p/b"})
        assert [m["payload"] for m in (await a.recv_type("history_snapshot"))["history"]] == \
            ["m1", "m3"]
        await a.send_json({"sender": "p/a", "type": "history_request", "history_target": ""})
        assert (await a.recv_type("history_snapshot"))["history"] == []
        await a.send_json({"sender": "p/a", "type": "resume_request", "since": 3})
        resumed = await a.recv_type("resume_snapshot")
        assert [m["msg_id"] for m in resumed["messages"]] == [4, 5]
        await a.close()


async def test_quota_refuses_before_the_journal_grows(tmp_path):
    from hubd.state.quota import QuotaLimits

    async with running_hub(tmp_path, quota=QuotaLimits(3, 1 << 20, 60)) as server:
        a = await joined(server.url, "p/a")
        for i in range(5):
            await a.chat("p/a", "all", f"q{i}")
        err = await a.recv_type("error")
        assert err["payload"] == "Durable ingress quota exceeded (events)."
        await a.send_json({"sender": "p/a", "type": "who_request", "target": "System"})
        await a.recv_type("who_snapshot")  # everything the five chats caused came before it
        assert [f["payload"] for f in a.seen("chat")] == ["q0", "q1", "q2"]
        assert server.hub.router.state.chat.last_msg_id == 3
        await a.close()


async def test_secured_hub(tmp_path):
    async with running_hub(tmp_path, token="s3cret") as server:
        none = await WsProbe.open(server.url)
        await none.register("p/a")
        denied = await none.recv_type("auth_denied")
        assert denied["payload"] == "Authentication token required."
        assert (await none.wait_closed()).code == 4010
        assert none.seen("welcome") == []
        wrong = await WsProbe.open(server.url)
        await wrong.register("p/a", token="nope")
        assert (await wrong.recv_type("auth_denied"))["payload"] == "Invalid authentication token."
        assert (await wrong.wait_closed()).code == 4010
        ok = await WsProbe.open(server.url)
        await ok.register("p/a", token="s3cret")
        await ok.recv_type("welcome")
        await ok.recv_type("presence_update", agent="p/a")
        await ok.close()


async def test_registration_deadline(tmp_path):
    async with running_hub(tmp_path, timing=Timing(auth_timeout=0.3)) as server:
        idle = await WsProbe.open(server.url)
        await idle.recv_type("welcome")
        closed = await idle.wait_closed(timeout=5)
        assert closed.code == 4012 and closed.reason == "registration timeout"


async def test_restart_keeps_msg_ids_history_mailbox_and_receipts(tmp_path):
    async with running_hub(tmp_path) as server:
        alice = await joined(server.url, "p/alice")
        for i in range(3):
            await alice.chat("p/alice", "p/carol", f"m{i}", client_msg_id=f"k{i}",
                             receipt_requested=True)
        seqs = [(await alice.recv_type("delivery_receipt"))["message_seq"] for _ in range(3)]
        await alice.close()
        before: HubState = server.hub.router.state
    async with running_hub(tmp_path) as server:
        after = server.hub.router.state
        assert after == before
        carol = await WsProbe.open(server.url)
        await carol.recv_type("welcome")
        await carol.register("p/carol", mailbox=True, since_seq=0)
        got = [await carol.recv_type("chat") for _ in range(3)]
        assert [g["seq"] for g in got] == seqs and all(g["replayed"] for g in got)
        await carol.send_json({"sender": "p/carol", "type": "ack", "seq": seqs[0]})
        await carol.send_json({"sender": "p/carol", "type": "who_request"})
        assert (await carol.recv_type("who_snapshot"))["mailbox_pending"]["p/carol"] == 2
        await carol.close()
        # the deferred receipt waits for alice in the durable outbox
        alice = await WsProbe.open(server.url)
        await alice.recv_type("welcome")
        await alice.register("p/alice")
        deferred = await alice.recv_type("delivery_receipt", deferred=True)
        assert deferred["client_msg_id"] == "k0" and deferred["message_seq"] == seqs[0]
        new = await alice.recv_type("presence_update")  # receipts come before presence
        assert new["agent"] == "p/alice"
        await alice.chat("p/alice", "all", "next")
        assert (await alice.recv_type("chat", payload="next"))["msg_id"] == 4
        await alice.close()
    async with running_hub(tmp_path) as server:
        # delivered once: settled in the journal, not sent again
        alice = await WsProbe.open(server.url)
        await alice.recv_type("welcome")
        await alice.register("p/alice")
        await alice.recv_type("presence_update")
        await alice.send_json({"sender": "p/alice", "type": "who_request", "target": "System"})
        await alice.recv_type("who_snapshot")  # anything owed to her was queued before it
        assert alice.seen("delivery_receipt") == []
        await alice.close()


async def test_health_readyz_metrics(tmp_path):
    import aiohttp

    async with running_hub(tmp_path, metrics_token="mt") as server:
        a = await joined(server.url, "p/a")
        await a.chat("p/a", "p/nobody", "x")
        await a.recv_type("chat")
        base = f"http://127.0.0.1:{server.port}"
        async with aiohttp.ClientSession() as http:
            async with http.get(base + "/health") as resp:
                assert resp.status == 401
            auth = {"Authorization": "Bearer mt"}
            async with http.get(base + "/health", headers=auth) as resp:
                health = await resp.json()
            assert health["hub_id"] == "test-hub" and health["status"] == "ok"
            assert health["connections"] == 1 and health["journal_seq"] >= 1
            async with http.get(base + "/readyz") as resp:
                assert resp.status == 200
            async with http.get(base + "/metrics", headers=auth) as resp:
                text = await resp.text()
            for name in ("hubd_frames_received_total", "hubd_chats_routed_total",
                         "hubd_dead_letters_total", "hubd_journal_commit_seconds_bucket",
                         "hubd_journal_commit_batch_events_bucket", "hubd_connections"):
                assert name in text, name
            assert 'hubd_frames_received_total{type="chat"} 1.0' in text
            async with http.get(base + "/health", headers={**auth, "Host": "evil.example"}) as resp:
                assert resp.status == 403
            async with http.get(base + "/health", headers={**auth, "Origin": "http://x"}) as resp:
                assert resp.status == 403
        await a.close()


async def test_slow_consumer_is_cut_off_and_others_carry_on(tmp_path):
    import base64
    import os
    import socket

    # a one-second drain deadline (production's is five), swept ten times a second
    async with running_hub(tmp_path, timing=Timing(sweep=0.1, send_stall=1.0)) as server:
        # A client that completes the handshake, registers, then never reads.
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", server.port))
        reader, writer = await asyncio.open_connection(sock=sock)
        key = base64.b64encode(os.urandom(16)).decode()
        writer.write((f"GET / HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nUpgrade: websocket\r\n"
                      f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                      "Sec-WebSocket-Version: 13\r\n\r\n").encode())
        await writer.drain()
        assert b"101" in await reader.readuntil(b"\r\n\r\n")
        payload = b'{"sender":"p/sleepy","type":"heartbeat","payload":"online"}'
        mask = os.urandom(4)
        writer.write(bytes([0x81, 0x80 | len(payload)]) + mask +
                     bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))
        await writer.drain()

        talker = await joined(server.url, "p/talker")
        assert "p/sleepy" in talker.seen("presence_update")[-1]["online_agents"]
        big = "x" * 60_000
        left = None
        for i in range(400):
            await talker.chat("p/talker", "all", big)
            frames = await talker.drain(0.01)
            left = next((f for f in frames if f.get("type") == "presence_update"
                         and f.get("agent") == "p/sleepy" and f.get("event") == "left"), None)
            if left:
                break
        if left is None:
            left = await talker.recv_type("presence_update", agent="p/sleepy", event="left",
                                          timeout=15)
        metrics = server.hub.metrics
        assert metrics.send_timeouts + metrics.send_queue_overflows >= 1
        # the talker was never held up by the sleeper
        await talker.chat("p/talker", "all", "still here")
        await talker.recv_type("chat", payload="still here")
        await talker.close()
        writer.close()


async def test_wal_is_checkpointed_beside_the_writer(tmp_path):
    async with running_hub(tmp_path) as server:
        a = await joined(server.url, "p/a")
        big = "y" * 20_000
        for i in range(400):  # ~8 MB of journal
            await a.chat("p/a", "p/b", big, client_msg_id=f"w{i}")
        await a.send_json({"sender": "p/a", "type": "who_request"})
        await a.recv_type("who_snapshot", timeout=10)
        deadline = asyncio.get_running_loop().time() + 10
        while server.hub.metrics.checkpoints == 0:
            assert asyncio.get_running_loop().time() < deadline, "no checkpoint ran"
            await asyncio.sleep(0.1)
        await a.close()
        state = server.hub.router.state
    async with running_hub(tmp_path) as server:
        assert server.hub.router.state == state

"""Hostile frames against a real hubd process: each is refused at the wire
layer with a typed error and its socket stays open; no handler fails, no
connection is closed 1011 and the state is never rebuilt from the journal
(issue 22 items 2 and 8, issue 30 item 1, WebSocket door).

The last test is the fuzz run the issue asks for: 20,000 seeded hostile
frames (tests/support/hostile.py) over 8 connections, then valid frames that
must still be answered as before.
"""

from __future__ import annotations

import asyncio
import json
import re
import time

import aiohttp
import pytest

from tests.support.hostile import HostileFrames
from tests.support.procs import hubd_process
from tests.support.rawws import RawWs, client_frame, text
from tests.support.wsprobe import WsProbe, joined


def metric(hub, name: str) -> float:
    """One sample of the hub's /metrics (0 when it has none yet)."""
    for line in hub.get_text("/metrics").splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def refused_total(hub, code: str) -> float:
    return metric(hub, f'hubd_frames_refused_total{{code="{code}"}}')


def assert_nothing_failed(hub) -> None:
    assert metric(hub, "hubd_handler_crashes_total") == 0
    assert metric(hub, "hubd_state_rebuilds_total") == 0
    assert "handler failed" not in hub.log() and "Traceback" not in hub.log(), hub.log()[-3000:]


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    proc = hubd_process(tmp_path_factory.mktemp("hostile"), "--no-durable-ingress-quota")
    proc.start()
    yield proc
    proc.stop()


def run(coro):
    return asyncio.run(coro)


# -- issue 22 item 2: the crash it reports


def test_a_receipt_chat_with_a_list_client_msg_id_is_refused_and_nothing_rebuilds(hub):
    async def case():
        alice = await joined(hub.url, "h1/alice")
        bob = await joined(hub.url, "h1/bob")
        # to a seat nobody holds: the negative receipt's applier forgets the
        # retry identity, which hashes client_msg_id (d590ccf: 1011, rebuild)
        await alice.send_json({"sender": "h1/alice", "target": "h1/nobody", "type": "chat",
                               "payload": "refused", "receipt_requested": True,
                               "client_msg_id": ["x"]})
        error = await alice.recv_type("error")
        assert (error["error_code"], error["field"], error["payload"]) == (
            "invalid_field", "client_msg_id",
            "Malformed frame: 'client_msg_id' must be a string of at most 256 bytes.")
        # the same socket goes on: the same chat with a valid id gets its
        # negative receipt, and one to bob is delivered and receipted
        await alice.chat("h1/alice", "h1/nobody", "to nobody", receipt_requested=True,
                         client_msg_id="c-nobody")
        receipt = await alice.recv_type("delivery_receipt")
        assert (receipt["client_msg_id"], receipt["delivered"]) == ("c-nobody", False)
        await alice.chat("h1/alice", "h1/bob", "after", receipt_requested=True,
                         client_msg_id="c-after")
        receipt = await alice.recv_type("delivery_receipt")
        assert (receipt["client_msg_id"], receipt["delivered"]) == ("c-after", True)
        await bob.recv_type("chat", payload="after")
        # every socket sees directed chats (the reference's compatibility
        # routing): the refused one was never routed
        assert [f["payload"] for f in bob.seen("chat")] == ["to nobody", "after"]
        assert alice.closed is None and bob.closed is None
        assert refused_total(hub, "invalid_field") >= 1
        for probe in (alice, bob):
            await probe.close()
    run(case())
    assert_nothing_failed(hub)


def test_fields_no_handler_can_use_are_refused_with_the_socket_kept(hub):
    async def case():
        carol = await joined(hub.url, "h2/carol", protocol_version=3)
        frames = [
            ({"type": "claim", "task_id": ["t"], "idem_key": "k"}, "task_id"),
            ({"type": "release", "task_id": "t", "epoch": True}, "epoch"),
            ({"type": "heartbeat", "roles": [{"r": 1}]}, "roles"),
            ({"type": "multihub_message_forward", "forward_id": "f", "kind": ["chat"]}, "kind"),
            ({"type": {"k": "v"}}, "type"),
            ({"type": "who_request", "hub": {"h": 1}}, "hub"),
        ]
        for fields, name in frames:
            await carol.send_json({"sender": "h2/carol", "target": "System", **fields})
            error = await carol.recv_type("error")
            assert (error["error_code"], error["field"], error["target"]) == (
                "invalid_field", name, "all"), error
        await carol.send_json({"sender": "h2/carol", "type": "claim", "task_id": "h2-t"})
        assert (await carol.recv_type("claim_granted"))["owner"] == "h2/carol"
        assert carol.closed is None
        await carol.close()
    run(case())
    assert_nothing_failed(hub)


# -- issue 22 item 8: duplicate keys


def test_a_frame_with_a_duplicate_key_is_refused_at_any_depth(hub):
    async def case():
        dave = await joined(hub.url, "h3/dave")
        erin = await joined(hub.url, "h3/erin")
        texts = [
            '{"sender":"h3/dave","target":"h3/erin","type":"chat","payload":"a","payload":"b"}',
            '{"sender":"h3/dave","sender":"h3/mallory","target":"h3/erin","type":"chat"}',
            '{"sender":"h3/dave","target":"h3/erin","type":"chat","type":"claim",'
            '"task_id":"t"}',
            '{"sender":"h3/dave","target":"h3/erin","type":"chat","payload":"c",'
            '"metadata":{"tags":[{"k":1,"k":2}]}}',
            '{"sender":"h3/dave","target":"h3/erin","type":"chat","payload":"d",'
            '"a":"x:y","a":"z","b":"\\u003a"}',
        ]
        for frame in texts:
            await dave.send_text(frame)
            error = await dave.recv_type("error")
            assert error["error_code"] == "duplicate_key" and \
                "appears twice in one object" in error["payload"], error
        await dave.chat("h3/dave", "h3/erin", "sentinel")
        chats = [f["payload"] for f in await erin.drain(0.5) if f.get("type") == "chat"]
        assert chats == ["sentinel"], "a frame with a duplicate key was routed"
        assert dave.closed is None and refused_total(hub, "duplicate_key") >= len(texts)
        for probe in (dave, erin):
            await probe.close()
    run(case())
    assert_nothing_failed(hub)


def test_two_tokens_in_one_frame_authenticate_nobody(tmp_path):
    """Last-wins parsing would admit `{"token":"wrong","token":"right"}`; the
    refusal is the malformed first frame's: an error, then close 4010 (no
    welcome: a secured hub says nothing else before the token)."""
    secured = hubd_process(tmp_path, "--token", "s3cret").start()
    try:
        async def case():
            for tokens in ('"token":"wrong","token":"s3cret"', '"token":"s3cret","token":"wrong"'):
                probe = await WsProbe.open(secured.url)
                await probe.send_text('{"sender":"h4/x","type":"heartbeat","payload":"online",'
                                      + tokens + "}")
                closed = await probe.wait_closed()
                assert (closed.code, closed.reason) == (4010, "auth required")
                assert [f["type"] for f in probe.frames] == ["error"]
                assert probe.frames[0]["error_code"] == "duplicate_key"
                await probe.close()
            # so is one whose field breaks its rule, right token or not
            probe = await WsProbe.open(secured.url)
            await probe.send_text('{"sender":"h4/x","type":"heartbeat","token":"s3cret",'
                                  '"roles":"reviewer"}')
            assert (await probe.wait_closed()).code == 4010
            assert [(f["type"], f["field"]) for f in probe.frames] == [("error", "roles")]
            await probe.close()
            honest = await WsProbe.open(secured.url)
            await honest.register("h4/x", token="s3cret")
            await honest.recv_type("welcome")
            await honest.close()
        run(case())
    finally:
        secured.stop()


# -- issue 30 item 1, the WebSocket door: text UTF-8 cannot carry


def test_lone_surrogates_are_refused_typed_while_others_write(hub):
    async def case():
        frank = await joined(hub.url, "h5/frank", protocol_version=3)
        grace = await joined(hub.url, "h5/grace")
        # the surrogate and another person's write at the same moment
        await asyncio.gather(
            frank.send_text('{"sender":"h5/frank","target":"h5/grace","type":"chat",'
                            '"payload":"\\ud800"}'),
            grace.chat("h5/grace", "h5/frank", "same moment", client_msg_id="g1",
                       receipt_requested=True))
        assert (await grace.recv_type("delivery_receipt"))["delivered"] is True
        assert (await frank.recv_type("chat"))["payload"] == "same moment"
        error = next(f for f in frank.frames if f.get("type") == "error")  # before or after
        assert (error["error_code"], error["target"]) == ("invalid_utf8", "all")
        # in a key, nested, in a frame whose type is not even hashable
        for frame in ('{"sender":"h5/frank","type":"chat","\\udc00":1}',
                      '{"sender":"h5/frank","type":"chat","metadata":{"a":["x\\udfff"]}}',
                      '{"sender":"h5/frank","type":{"k":"\\ud800"}}'):
            await frank.send_text(frame)
            assert (await frank.recv_type("error"))["error_code"] == "invalid_utf8"
        # a delivery verb is refused as the verb refuses (the reference client
        # matches it by request_id)
        await frank.send_text('{"sender":"h5/frank","target":"h5/grace","type":'
                              '"delivery_request","protocol_version":3,"request_id":"r-5",'
                              '"body":"\\ud800"}')
        answer = await frank.recv_type("delivery_refused")
        assert (answer["reason_code"], answer["request_id"], answer["error_code"]) == (
            "invalid_shape", "r-5", "invalid_utf8")
        # surrogates written as bytes in a binary frame: the reference's sentence, typed
        await frank.send_bytes(b'{"sender":"h5/frank","type":"chat","payload":"\xed\xa0\x80"}')
        error = await frank.recv_type("error")
        assert (error["payload"], error["error_code"]) == ("Malformed JSON.", "invalid_utf8")
        await frank.chat("h5/frank", "h5/grace", "still here")
        await grace.drain(0.5)
        chats = [f["payload"] for f in grace.seen("chat")]
        assert chats == ["same moment", "still here"]  # nothing refused was routed
        assert frank.closed is None
        for probe in (frank, grace):
            await probe.close()
    run(case())
    assert_nothing_failed(hub)


def test_a_surrogate_cannot_register_through_a_delivery_frame(hub):
    """A first frame registers whatever its type: a surrogate in its roles
    would sit in presence and break every who_snapshot after it."""
    async def case():
        eve = await WsProbe.open(hub.url)
        await eve.recv_type("welcome")
        await eve.send_text('{"sender":"h6/eve","type":"delivery_request","protocol_version":3,'
                            '"request_id":"r-6","roles":["\\ud800"]}')
        answer = await eve.recv_type("delivery_refused")
        assert (answer["reason_code"], answer["request_id"]) == ("invalid_shape", "r-6")
        henry = await joined(hub.url, "h6/henry")
        await henry.send_json({"sender": "h6/henry", "type": "who_request"})
        who = await henry.recv_type("who_snapshot")
        assert "h6/eve" not in who["online_agents"] and henry.closed is None
        for probe in (eve, henry):
            await probe.close()
    run(case())
    assert_nothing_failed(hub)


def test_invalid_utf8_in_a_text_frame_fails_the_connection_1007(hub):
    """RFC 6455 section 8.1: an endpoint MUST fail the connection on a text
    frame that is not UTF-8 (the reference closes 1007 too)."""
    async def case():
        ws = await RawWs.connect(hub.port)
        await ws.send(text('{"sender":"h7/ivan","type":"heartbeat","payload":"online"}'))
        await ws.send(client_frame(0x1, b'{"type":"chat","payload":"\xed\xa0\x80"}'))
        received = await ws.read_all(5)
        assert received.close is not None and received.close[0] == 1007
        ws.close()
    run(case())
    assert_nothing_failed(hub)


# -- the fuzz run


CONNECTIONS = 8
FRAMES = 20_000
SEED = 22


class FuzzClient:
    """One connection: sends its share of hostile frames without waiting, and
    reads everything that comes back (so its send queue never fills)."""

    def __init__(self, session: aiohttp.ClientSession, name: str):
        self.session, self.name = session, name
        self.frames: list[dict] = []
        self.close_code: int | None = None
        self.arrived = asyncio.Event()

    async def open(self, url: str, index: int) -> None:
        self.ws = await self.session.ws_connect(url, max_msg_size=0)
        self.reader = asyncio.create_task(self._read())
        await self.ws.send_str(json.dumps({
            "sender": self.name, "target": "System", "type": "heartbeat", "payload": "online",
            "protocol_version": 3, "mailbox": True, "since_seq": 0,
            "delivery_session_token": f"{index:064x}",
            "delivery_capabilities": {"next_turn": "native"}}))

    async def _read(self) -> None:
        async for msg in self.ws:
            if msg.type == aiohttp.WSMsgType.TEXT:
                self.frames.append(json.loads(msg.data))
                self.arrived.set()
        self.close_code = self.ws.close_code

    async def wait_for(self, pred, timeout: float = 60.0) -> dict:
        deadline = time.monotonic() + timeout
        seen = 0
        while True:
            for frame in self.frames[seen:]:
                if pred(frame):
                    return frame
            seen = len(self.frames)
            if self.close_code is not None:
                raise AssertionError(f"{self.name} closed {self.close_code}")
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"{self.name}: nothing matched; last {self.frames[-5:]}")
            self.arrived.clear()
            try:
                await asyncio.wait_for(self.arrived.wait(), left)
            except asyncio.TimeoutError:
                pass

    async def send(self, frame: dict) -> None:
        await self.ws.send_str(json.dumps({"sender": self.name, "target": "System", **frame}))


def test_20000_hostile_frames_over_8_connections_close_nothing_and_rebuild_nothing(tmp_path):
    fuzzed = hubd_process(tmp_path, "--no-durable-ingress-quota").start()
    try:
        run(_fuzz(fuzzed))
        assert refused_total(fuzzed, "invalid_field") > 0
        assert refused_total(fuzzed, "duplicate_key") > 0
        assert refused_total(fuzzed, "invalid_utf8") > 0
        assert_nothing_failed(fuzzed)
    finally:
        fuzzed.stop()


async def _fuzz(hub) -> None:
    names = [f"fz/c{i}" for i in range(CONNECTIONS)]
    async with aiohttp.ClientSession() as session:
        clients = [FuzzClient(session, name) for name in names]
        for index, client in enumerate(clients):
            await client.open(hub.url, index)
        for client in clients:
            await client.wait_for(lambda f: f.get("type") == "delivery_session")

        async def hostile(index: int, client: FuzzClient) -> None:
            frames = HostileFrames(SEED * 1000 + index, client.name,
                                   [n for n in names if n != client.name])
            for sent in range(FRAMES // CONNECTIONS):
                await client.ws.send_str(frames.next())
                if sent % 64 == 0:
                    await asyncio.sleep(0)  # let the readers read
            # everything sent before it has been handled once this is answered
            await client.send({"type": "state_request", "request_id": f"done-{index}"})
            await client.wait_for(lambda f: f.get("request_id") == f"done-{index}", 300)
        await asyncio.gather(*(hostile(i, c) for i, c in enumerate(clients)))
        assert [c.close_code for c in clients] == [None] * CONNECTIONS

        # valid frames are answered as before, on the same connections
        first, second = clients[0], clients[1]
        await first.send({"type": "chat", "target": second.name, "payload": "valid after",
                          "receipt_requested": True, "client_msg_id": "after-fuzz"})
        chat = await second.wait_for(lambda f: f.get("payload") == "valid after")
        assert chat["sender"] == first.name and isinstance(chat["seq"], int)
        receipt = await first.wait_for(lambda f: f.get("type") == "delivery_receipt"
                                       and f.get("client_msg_id") == "after-fuzz")
        assert receipt["delivered"] is True and receipt["recipients"] == [second.name]
        await second.send({"type": "who_request"})
        who = await second.wait_for(lambda f: f.get("type") == "who_snapshot")
        assert set(names) <= set(who["online_agents"])
        # a newcomer (the fuzzed seats hold claims up to their cap) claims and chats
        late = await joined(hub.url, "fz/late")
        await late.send_json({"sender": "fz/late", "type": "claim", "task_id": "after-fuzz",
                              "worktree": "/after-fuzz", "idem_key": "af-1"})
        assert (await late.recv_type("claim_granted", task_id="after-fuzz"))["owner"] == \
            "fz/late"
        await first.wait_for(lambda f: f.get("type") == "claim_granted"
                             and f.get("task_id") == "after-fuzz")
        await late.chat("fz/late", "all", "late hello")
        await first.wait_for(lambda f: f.get("payload") == "late hello")
        await late.close()
        assert [c.close_code for c in clients] == [None] * CONNECTIONS
        for client in clients:
            await client.ws.close()
            await client.reader
    health = hub.get_json("/health")
    assert health["status"] == "ok", health
    assert re.search(r"hubd_frames_received_total\{type=\"invalid\"\} \d", hub.get_text(
        "/metrics"))

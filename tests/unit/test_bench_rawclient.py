"""The benchmark's raw WebSocket client (tests/bench/rawclient.py): handshake, framing, parsing.

Correctness only: nothing here measures or asserts on time.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import random
import secrets
import struct

import aiohttp
import pytest
from aiohttp import web

from tests.bench import loadgen, nullhub, rawclient
from tests.bench.rawclient import HandshakeError, Masker, WSClientProtocol, accept_for, key_value_is, unmask


def server_frame(payload: bytes, opcode: int = 0x1, fin: bool = True) -> bytes:
    """An unmasked (server-to-client) frame."""
    b0 = (0x80 if fin else 0) | opcode
    n = len(payload)
    if n < 126:
        head = struct.pack("!BB", b0, n)
    elif n < 65536:
        head = struct.pack("!BBH", b0, 126, n)
    else:
        head = struct.pack("!BBQ", b0, 127, n)
    return head + payload


def parse_client_frames(data: bytes) -> list[tuple[int, bytes]]:
    """What a server reads: (b0, unmasked payload) per frame; every frame must be masked."""
    out = []
    pos = 0
    while pos < len(data):
        b0, b1 = data[pos], data[pos + 1]
        assert b1 & 0x80, "client frames must be masked"
        n = b1 & 0x7F
        pos += 2
        if n == 126:
            n = struct.unpack_from("!H", data, pos)[0]
            pos += 2
        elif n == 127:
            n = struct.unpack_from("!Q", data, pos)[0]
            pos += 8
        key = data[pos:pos + 4]
        pos += 4
        out.append((b0, unmask(data[pos:pos + n], key)))
        pos += n
    assert pos == len(data)
    return out


class FakeTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.closing = False
        self.aborted = False

    def write(self, data) -> None:
        self.written += data

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def abort(self) -> None:
        self.closing = True
        self.aborted = True


def upgraded_protocol() -> tuple[WSClientProtocol, FakeTransport, list[bytes]]:
    """A protocol past a (fake) 101 response, collecting every message it is handed."""
    proto = WSClientProtocol("127.0.0.1", 1234, "/")
    tr = FakeTransport()
    proto.connection_made(tr)
    accept = accept_for(proto.ws_key)
    proto.data_received(("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                         f"Sec-WebSocket-Accept: {accept}\r\n\r\n").encode())
    assert proto.opened.done() and proto.opened.result() is True
    tr.written.clear()
    got: list[bytes] = []
    proto.handler = lambda buf, s, e, t: got.append(bytes(buf[s:e]))
    return proto, tr, got


def feed_in_pieces(proto: WSClientProtocol, data: bytes, cuts: list[int]) -> None:
    prev = 0
    for c in sorted(set(cuts)) + [len(data)]:
        if c > prev:
            proto.data_received(data[prev:c])
            prev = c


# ----------------------------------------------------------------------------- handshake and masking

def test_accept_matches_rfc6455_example():
    assert accept_for("dGhlIHNhbXBsZSBub25jZQ==") == "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="


@pytest.mark.parametrize("n", [0, 1, 3, 4, 5, 125, 126, 127, 65535, 65536, 70001])
def test_masked_frames_round_trip_with_every_length_form(n):
    m = Masker(b"\x12\x34\x56\x78")
    payload = os.urandom(n)
    frame = m.frame(payload)
    [(b0, got)] = parse_client_frames(frame)
    assert b0 == 0x81
    assert got == payload
    if n:
        assert frame[-n:] != payload  # the mask is applied
    # the per-length caches give the same bytes again
    assert m.frame(payload) == frame


def test_each_connection_gets_its_own_mask_and_key():
    async def make():
        return WSClientProtocol("h", 1), WSClientProtocol("h", 1)
    a, b = asyncio.run(make())
    assert a.masker.key != b.masker.key or a.ws_key != b.ws_key
    assert len(base64.b64decode(a.ws_key)) == 16


async def test_request_is_a_plain_upgrade_without_extensions():
    proto = WSClientProtocol("127.0.0.1", 8765, "/x?y=1")
    tr = FakeTransport()
    proto.connection_made(tr)
    req = bytes(tr.written).decode()
    lines = req.split("\r\n")
    assert lines[0] == "GET /x?y=1 HTTP/1.1"
    hdrs = {k.lower(): v.strip() for k, _, v in (l.partition(":") for l in lines[1:] if l)}
    assert hdrs["host"] == "127.0.0.1:8765"
    assert hdrs["upgrade"] == "websocket"
    assert hdrs["connection"] == "Upgrade"
    assert hdrs["sec-websocket-version"] == "13"
    assert "sec-websocket-extensions" not in hdrs
    assert req.endswith("\r\n\r\n")


@pytest.mark.parametrize("response, why", [
    ("HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n", "refused"),
    ("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
     "Sec-WebSocket-Accept: AAAAAAAAAAAAAAAAAAAAAAAAAAA=\r\n\r\n", "Accept"),
    ("HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n"
     "Sec-WebSocket-Accept: {accept}\r\n\r\n", "Upgrade"),
    ("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
     "Sec-WebSocket-Accept: {accept}\r\nSec-WebSocket-Extensions: permessage-deflate\r\n\r\n", "extension"),
])
async def test_bad_handshake_responses_fail_the_connection(response, why):
    proto = WSClientProtocol("127.0.0.1", 1)
    tr = FakeTransport()
    proto.connection_made(tr)
    proto.data_received(response.replace("{accept}", accept_for(proto.ws_key)).encode())
    with pytest.raises(HandshakeError, match=why):
        proto.opened.result()
    assert tr.closing


async def test_frames_in_the_same_segment_as_the_101_are_delivered():
    proto = WSClientProtocol("127.0.0.1", 1)
    tr = FakeTransport()
    proto.connection_made(tr)
    got = []
    proto.handler = lambda buf, s, e, t: got.append(bytes(buf[s:e]))
    resp = ("HTTP/1.1 101 Switching Protocols\r\nupgrade: WebSocket\r\nconnection: keep-alive, upgrade\r\n"
            f"sec-websocket-accept: {accept_for(proto.ws_key)}\r\n\r\n").encode()
    data = resp + server_frame(b'{"type":"welcome"}') + server_frame(b"x" * 300)
    feed_in_pieces(proto, data, [5, len(resp) - 2, len(resp) + 1])
    assert got == [b'{"type":"welcome"}', b"x" * 300]


# ----------------------------------------------------------------------------- parsing

async def test_parser_handles_every_length_form_at_every_split():
    msgs = [b"", b"a", b"b" * 125, b"c" * 126, b"d" * 300, b"e" * 65535, b"f" * 65536, b"g" * 70000]
    stream = b"".join(server_frame(m, 0x1 if i % 2 else 0x2) for i, m in enumerate(msgs))
    rnd = random.Random(7)
    for trial in range(60):
        proto, tr, got = upgraded_protocol()
        if trial == 0:
            cuts = list(range(1, len(stream)))[:400]  # byte by byte through the first frames
        else:
            cuts = [rnd.randrange(1, len(stream)) for _ in range(rnd.randrange(1, 40))]
        feed_in_pieces(proto, stream, cuts)
        assert got == msgs
        assert proto.frames == len(msgs)
        assert not tr.written and not tr.closing


async def test_fragmented_message_with_a_ping_in_between():
    proto, tr, got = upgraded_protocol()
    stream = (server_frame(b'{"a":', 0x1, fin=False) + server_frame(b"ping!", 0x9)
              + server_frame(b'"b"', 0x0, fin=False) + server_frame(b"}", 0x0, fin=True)
              + server_frame(b"next"))
    for cut in range(0, len(stream) + 1):
        proto, tr, got = upgraded_protocol()
        feed_in_pieces(proto, stream, [cut])
        assert got == [b'{"a":"b"}', b"next"]
        assert parse_client_frames(bytes(tr.written)) == [(0x8A, b"ping!")]


async def test_ping_is_answered_with_a_masked_pong():
    proto, tr, got = upgraded_protocol()
    proto.data_received(server_frame(b"", 0x9) + server_frame(b"hi") + server_frame(b"abc", 0x9))
    assert got == [b"hi"]
    assert parse_client_frames(bytes(tr.written)) == [(0x8A, b""), (0x8A, b"abc")]


async def test_server_close_is_echoed_and_reading_stops():
    proto, tr, got = upgraded_protocol()
    proto.data_received(server_frame(b"one") + server_frame(struct.pack("!H", 1001) + b"bye", 0x8)
                        + server_frame(b"after close"))
    assert got == [b"one"]
    assert proto.close_code == 1001
    assert parse_client_frames(bytes(tr.written)) == [(0x88, struct.pack("!H", 1001))]
    assert tr.closing


@pytest.mark.parametrize("bad, code", [
    (bytes([0x81, 0x83]) + b"\x00\x00\x00\x00abc", 1002),     # masked frame from the server
    (bytes([0xC1, 0x01]) + b"x", 1002),                       # RSV1 without an extension
    (server_frame(b"x", 0x0), 1002),                          # continuation without a start
    (bytes([0x09, 0x00]), 1002),                              # fragmented control frame
    (server_frame(b"x", 0x3), 1002),                          # reserved opcode
    (bytes([0x81, 0x7F]) + struct.pack("!Q", 1 << 40), 1009),  # absurd length
])
async def test_protocol_errors_close_with_a_code(bad, code):
    proto, tr, got = upgraded_protocol()
    proto.data_received(bad)
    assert got == []
    assert proto.close_code == code
    assert tr.closing
    assert parse_client_frames(bytes(tr.written)) == [(0x88, struct.pack("!H", code))]


async def test_filter_drops_other_chats_and_routes_own_ones():
    proto, tr, got = upgraded_protocol()
    own = []
    proto.mark = b"BMK"
    proto.own = b"BMKrun.1."
    proto.own_handler = lambda buf, s, e, t, i: own.append((bytes(buf[s:e]), buf[i:i + 12]))
    frames = [b'{"payload":"BMKrun.0.5.x"}', b'{"payload":"BMKrun.1.6.x"}', b'{"type":"presence"}',
              b'{"payload":"BMKrun.10.7.x"}', b'{"payload":"BMKother.1.8.x"}']
    proto.data_received(b"".join(server_frame(f) for f in frames))
    assert got == [b'{"type":"presence"}']
    assert own == [(frames[1], b"BMKrun.1.6.x")]


# ----------------------------------------------------------------------------- byte-level JSON checks

@pytest.mark.parametrize("frame, expect", [
    (b'{"sender":"a","target":"bench/x-r1","type":"chat"}', True),
    (b'{"sender": "a", "target": "bench/x-r1", "type": "chat"}', True),          # json.dumps separators
    (b'{"type":"chat","sender":"a","target":"bench/x-r1"}', True),               # any key order
    (b'{"target":"bench/x-r10","type":"chat"}', False),
    (b'{"target":"bench/x-r","type":"chat"}', False),
    (b'{"message_target":"bench/x-r1","type":"delivery_receipt"}', False),
    (b'{"target":"bench/x-r2","x":{"target":"bench/x-r1"}}', None),              # twice: undecided
    (b'{"target" : "bench/x-r1"}', None),                                        # other spacing
    (b'{"target":"bench\\/x-r1"}', None),                                        # escapes
    (b'{"target":null}', None),
])
def test_key_value_is(frame, expect):
    buf = b"\x81\x00" + frame + b"tail"
    assert key_value_is(buf, 2, 2 + len(frame), b'"target"', b'"bench/x-r1"') is expect
    if expect is not None:
        assert (json.loads(frame).get("target") == "bench/x-r1") is expect


# ----------------------------------------------------------------------------- real sockets

async def test_round_trip_against_an_aiohttp_server():
    seen = []

    async def ws_handler(request):
        ws = web.WebSocketResponse(autoping=False)
        await ws.prepare(request)
        await ws.send_str("hello")
        await ws.ping(b"p1")
        async for msg in ws:
            seen.append((msg.type, msg.data))
            if msg.type == aiohttp.WSMsgType.TEXT:
                await ws.send_str(msg.data.upper())
                await ws.send_bytes(b"B" * 70000)
        seen.append(("closed", ws.close_code))  # the loop ends on the client's close frame
        return ws

    app = web.Application()
    app.router.add_get("/", ws_handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    try:
        got: list[bytes] = []
        arrived = asyncio.Event()

        def setup(p):
            def h(buf, s, e, t):
                got.append(bytes(buf[s:e]))
                if len(got) == 3:
                    arrived.set()
            p.handler = h

        proto = await rawclient.connect(f"ws://127.0.0.1:{port}/", 5, setup=setup)
        proto.send_text(b"shout " + b"z" * 200)
        await asyncio.wait_for(arrived.wait(), 10)
        assert got == [b"hello", b"SHOUT " + b"Z" * 200, b"B" * 70000]
        await proto.close()
        assert proto.closed
        assert (aiohttp.WSMsgType.PONG, b"p1") in seen
        assert ("closed", 1000) in seen
    finally:
        await runner.cleanup()


async def test_connect_refuses_other_schemes():
    with pytest.raises(ValueError):
        await rawclient.connect("http://127.0.0.1:1/")


async def _nullhub(private: bool):
    loop = asyncio.get_running_loop()
    hub = nullhub.Hub(private)
    server = await loop.create_server(lambda: nullhub.Conn(hub), "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


@pytest.mark.parametrize("private, receipts", [(False, False), (True, False), (False, True)])
async def test_full_load_against_nullhub(private, receipts):
    server, port = await _nullhub(private)
    try:
        cfg = loadgen.LoadConfig(url=f"ws://127.0.0.1:{port}/", senders=3, window=5, count=900,
                                 warmup=30, receipts=receipts, client="raw")
        res = await rawclient.client_main(cfg, secrets.token_hex(3), [0, 1, 2], [300, 300, 300], [10, 10, 10])
    finally:
        server.close()
    c = res["counters"]
    assert c["sent"] == 900 and c["delivered"] == 900
    assert len(res["lat"]) == 900 and all(x >= 0 for x in res["lat"])
    for k in ("missing", "duplicates", "late", "unexpected", "malformed", "errors", "closed_sockets",
              "json_fallbacks"):
        assert c[k] == 0, (k, res["samples"])
    if receipts:
        assert c["receipts_ok"] == 900 and len(res["rlat"]) == 900
    # broadcast: every socket sees every chat; private: the target and the sender
    assert res["frames"] == 900 * (2 if private else 6) + (900 if receipts else 0)
    assert not res["aborted"]

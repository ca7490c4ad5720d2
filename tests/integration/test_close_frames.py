"""Every connection the hub ends gets a close frame with its documented code
and reason (docs/operations.md, "Close codes"), over real sockets with a raw
client that sees exactly what arrived before the connection ended."""

import asyncio
import json

import pytest

from hubd.http.closing import CLOSE_REASONS
from hubd.timing import Timing
from tests.support.inproc import running_hub
from tests.support.rawws import RawWs, client_frame, text
from tests.support.wsprobe import WsProbe

MAX = 4096


def register(name: str) -> bytes:
    return text(json.dumps({"sender": name, "target": "System", "type": "heartbeat",
                            "payload": "online"}))


def chat(name: str, payload: str = "hi") -> bytes:
    return text(json.dumps({"sender": name, "target": "all", "type": "chat",
                            "payload": payload}))


# frames that each call for a close, and the code they are refused with
BAD = {
    "over_cap": (lambda: text(b"x" * (MAX + 1)), 1009),
    "over_cap_declared": (lambda: client_frame(0x1, b"", length=1 << 40), 1009),
    "bad_utf8": (lambda: text(b"\xff\xfe"), 1007),
    "bad_utf8_close_reason": (lambda: client_frame(0x8, b"\x03\xe8\xff"), 1007),
    "reserved_opcode": (lambda: client_frame(0x5, b"x"), 1002),
    "reserved_bits": (lambda: client_frame(0x1, b"{}", rsv=0x40), 1002),
    "fragmented_ping": (lambda: client_frame(0x9, b"x", fin=False), 1002),
    "continuation_first": (lambda: client_frame(0x0, b"x"), 1002),
}
PAIRS = [("over_cap", "bad_utf8"), ("bad_utf8", "over_cap"), ("over_cap_declared", "bad_utf8"),
         ("reserved_opcode", "over_cap"), ("bad_utf8_close_reason", "reserved_bits"),
         ("fragmented_ping", "bad_utf8"), ("continuation_first", "over_cap"),
         ("reserved_bits", "fragmented_ping")]


async def pipelined(port: int, index: int, first: str, second: str) -> tuple:
    """One write: registration, chats, two bad frames, 1,500 more chats; then
    0.3 s more of chats, without reading (a client still sending when the hub
    decides to close), then read everything."""
    name = f"p/hostile{index}"
    ws = await RawWs.connect(port)
    burst = register(name) + chat(name) * 20 + BAD[first][0]() + BAD[second][0]() + \
        chat(name) * 1500
    await ws.send(burst)
    loop = asyncio.get_running_loop()
    end = loop.time() + 0.3
    while loop.time() < end and await ws.send(chat(name) * 50):
        await asyncio.sleep(0.01)
    received = await ws.read_all()
    ws.close()
    return first, received


async def test_pipelined_bad_frames_each_get_a_close_frame(tmp_path):
    async with running_hub(tmp_path, max_msg_bytes=MAX) as server:
        results = await asyncio.gather(*(pipelined(server.port, i, a, b)
                                         for i, (a, b) in enumerate(PAIRS)))
        for first, received in results:
            code = BAD[first][1]
            assert received.close == (code, CLOSE_REASONS[code]), (first, received.close,
                                                                   received.error)
        # the hub serves on
        async with WsProbe.connect(server.url) as probe:
            await probe.recv_type("welcome")
            await probe.send_json({"sender": "p/after", "type": "who_request"})
            await probe.recv_type("who_snapshot")


@pytest.mark.parametrize("setup, code, reason", [
    ({"timing": Timing(auth_timeout=0.2)}, 4012, "registration timeout"),
    ({"token": "s3cret"}, 4010, "auth denied"),
])
async def test_hub_closes_carry_their_reason_to_a_client_still_sending(tmp_path, setup, code,
                                                                        reason):
    async with running_hub(tmp_path, **setup) as server:
        ws = await RawWs.connect(server.port)
        if "token" in setup:
            await ws.send(register("p/a"))  # no token: auth_denied, then the close
        else:
            await asyncio.sleep(0.3)  # past the registration deadline, sending nothing
        received = await ws.read_all()
        ws.close()
        assert received.close == (code, reason), received


async def test_name_conflict_closes_4009_with_its_reason(tmp_path):
    async with running_hub(tmp_path) as server:
        holder = await WsProbe.open(server.url)
        await holder.recv_type("welcome")
        await holder.register("p/a")
        await holder.recv_type("presence_update", agent="p/a")
        ws = await RawWs.connect(server.port)
        await ws.send(register("p/a") + chat("p/a") * 200)
        received = await ws.read_all()
        ws.close()
        assert received.close == (4009, "name conflict"), received
        await holder.close()


async def stall(server, name: str):
    """A socket that registers, then reads nothing (a tiny receive buffer)."""
    ws = await RawWs.connect(server.port, rcvbuf=4096)
    await ws.send(register(name))
    return ws


def conn_of(server, name):
    session = server.hub.router.presence.session_of(name)
    return server.hub.endpoints.get(session.endpoint) if session is not None else None


async def test_stalled_consumer_gets_a_graceful_1013_before_the_abort(tmp_path):
    # a one-second drain deadline (production's is five), swept ten times a second;
    # the waking client, in this test's own event loop, has three seconds to read
    # what the hub had buffered before its close (one was not enough on a busy machine)
    async with running_hub(tmp_path, timing=Timing(sweep=0.1, send_stall=1.0,
                                                   graceful_close=3.0)) as server:
        waking = await stall(server, "p/waking")
        sleeping = await stall(server, "p/sleeping")
        talker = await WsProbe.open(server.url)
        await talker.recv_type("welcome")
        await talker.register("p/talker")
        loop = asyncio.get_running_loop()
        for name in ("p/waking", "p/sleeping"):
            while conn_of(server, name) is None:
                await asyncio.sleep(0.01)
        conns = {name: conn_of(server, name) for name in ("p/waking", "p/sleeping")}
        big = "x" * 60_000
        # Broadcast until both sleepers' writes stop draining, then no more.
        while not all(c.write_stalled_for(loop.time()) > 0 for c in conns.values()):
            await talker.chat("p/talker", "all", big)
            await talker.drain(0.01)
        # The sweeper declares the stall (after the drain deadline) and tries a
        # graceful close; the waking client reads from that moment on.
        while not conns["p/waking"].stall_closing:
            await asyncio.sleep(0.01)
        woke = await waking.read_all()
        assert woke.close == (1013, "outbound delivery timeout"), woke.error
        assert woke.frames[-2][0] == 0x1  # everything buffered came before it
        # The other one never reads: aborted once the graceful attempt is over.
        while server.hub.metrics.send_aborts < 1:
            await asyncio.sleep(0.05)
        assert server.hub.metrics.send_aborts == 1
        assert server.hub.metrics.send_timeouts == 2
        slept = await sleeping.read_all()
        assert slept.close is None  # aborted: its close frame never left the hub
        await talker.chat("p/talker", "all", "still here")
        await talker.recv_type("chat", payload="still here")
        await talker.close()
        waking.close()
        sleeping.close()


# The closing handshake (RFC 6455 7.1.1): once both close frames have
# crossed, the hub ends the TCP connection itself, at once. A client that
# waits for the server to close first (the `websockets` library, the
# reference hub's per-forward peer links) must not wait out the linger, over
# TLS (no half-close to tell it anything) as over plain TCP. The linger is
# lengthened so that waiting it out could not pass for a prompt close.
LONG_LINGER = 30.0
PROMPT = 5.0


@pytest.fixture(params=["ws", "wss"])
def scheme_overrides(request, tmp_path):
    if request.param == "ws":
        return {}, None
    from federation.tls import peer_client_context
    from hubd.cli import build_parser, config_from_args
    from tests.support.federation import make_pki, site_flags

    pki = make_pki(tmp_path / "pki", ["hub"])
    parser = build_parser()
    args = parser.parse_args(["--hub-id", "test-hub", *site_flags(pki, "hub", None).serve])
    return {"federation": config_from_args(args, parser).federation}, peer_client_context()


def close_from_client(code: int = 1000, reason: bytes = b"bye") -> bytes:
    return client_frame(0x8, code.to_bytes(2, "big") + reason)


async def test_a_client_close_is_answered_and_the_connection_ended_at_once(
        tmp_path, scheme_overrides):
    overrides, tls = scheme_overrides
    async with running_hub(tmp_path, timing=Timing(close_linger=LONG_LINGER),
                           **overrides) as server:
        ws = await RawWs.connect(server.port, tls=tls)
        await ws.send(register("p/leaving"))
        loop = asyncio.get_running_loop()
        started = loop.time()
        await ws.send(close_from_client())
        received = await ws.read_all(timeout=LONG_LINGER + 5)
        ended = loop.time() - started
        ws.close()
        assert received.close == (1000, "normal closure") and received.error is None, received
        assert ended < PROMPT, f"the hub kept the connection {ended:.1f} s after the handshake"


async def test_a_hub_close_answered_by_the_client_ends_the_connection_at_once(
        tmp_path, scheme_overrides):
    overrides, tls = scheme_overrides
    async with running_hub(tmp_path, timing=Timing(close_linger=LONG_LINGER),
                           **overrides) as server:
        holder = await WsProbe.open(server.url)
        await holder.recv_type("welcome")
        await holder.register("p/a")
        await holder.recv_type("presence_update", agent="p/a")
        ws = await RawWs.connect(server.port, tls=tls)
        await ws.send(register("p/a"))
        refused = await ws.read_until_close()
        assert refused.close == (4009, "name conflict"), refused
        loop = asyncio.get_running_loop()
        started = loop.time()
        await ws.send(close_from_client(4009, b""))
        rest = await ws.read_all(timeout=LONG_LINGER + 5)
        ended = loop.time() - started
        ws.close()
        assert rest.error is None and rest.frames == [], rest
        assert ended < PROMPT, f"the hub kept the connection {ended:.1f} s after the handshake"
        await holder.close()



def test_a_stopping_hub_closes_every_socket_with_1001_and_exits_at_once(tmp_path):
    """SIGTERM: every open socket gets 1001 "hub shutting down", an agent's
    and a peer hub's inbound link alike, and the hub exits at once instead of
    waiting out its listener's two-second shutdown timeout for the link."""
    import signal
    import time

    from federation.tls import peer_client_context
    from tests.support.federation import make_pki, site_flags, write_serving_policy
    from tests.support.procs import hubd_process

    pki = make_pki(tmp_path / "pki", ["east", "west"])
    policy = write_serving_policy(tmp_path / "west-policy", pki, {"east": ["PROJ"]})
    west = hubd_process(tmp_path / "west", *site_flags(pki, "west", policy).serve,
                        hub_id="west", scheme="wss").start()
    try:
        async def scenario():
            link = await RawWs.connect(west.port, tls=peer_client_context(
                pki.file("east", "client", "cert"), pki.file("east", "client", "key")))
            await link.send(text(json.dumps({"sender": "east", "target": "System",
                                             "type": "heartbeat", "payload": "online",
                                             "protocol_version": 3})))
            agent = await RawWs.connect(west.port, tls=peer_client_context())
            await agent.send(register("PROJ/agent"))
            for ws in (link, agent):  # registered: the welcome arrived
                assert (await ws.read_until_close(timeout=0.5)).frames
            started = time.monotonic()
            west.signal(signal.SIGTERM)
            got = await asyncio.gather(link.read_all(timeout=5), agent.read_all(timeout=5))
            for ws in (link, agent):
                ws.close()
            return got, started

        (link, agent), started = asyncio.run(scenario())
        assert link.close == (1001, "hub shutting down"), link
        assert agent.close == (1001, "hub shutting down"), agent
        west.proc.wait(5)
        exited = time.monotonic() - started
        assert west.proc.returncode == 0
        assert exited < 2.0, f"the hub took {exited:.1f} s to exit"
    finally:
        west.stop()

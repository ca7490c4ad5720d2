"""Interop: the published reference client (synapse-channel 0.99.38) against a hub.

Every test runs twice, against the reference hub and against hubd (fixture
``hub``/``secured_hub`` in conftest.py). Passing against the reference hub is
what validates the test itself; passing against hubd is what proves hubd works
unchanged with the real client.

Three instruments (tests/support):
* ``ref`` (RefClient): the real ``synapse`` CLI and the real ``SynapseAgent``
  (driven by ref_agent_driver.py), each a separate program from the reference
  venv — never imported here;
* ``WsProbe``: a raw aiohttp WebSocket for hardening checks (no reference code,
  so those tests run against hubd even without the reference venv).

Facts are from /work/shared/reference/wire-facts.md ("wf §N" below). Where the
reference does something hubd need not copy, the comment says so and the test
asserts only the shared contract.
"""

from __future__ import annotations

import math
import re
import time

import pytest

from tests.support.refclient import RefClient, wait_until
from tests.support.wsprobe import WsProbe

pytestmark = pytest.mark.interop

HUB_ID = "iop-east"  # as started by conftest.py
TOKEN = "s3cret-token"


def is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def mailbox_pending(who_stdout: str) -> dict[str, int]:
    """Parse `synapse who`'s "N undelivered message(s) pending for NAME" lines."""
    return {m.group(2): int(m.group(1))
            for m in re.finditer(r"(\d+) undelivered messages? pending for (\S+)", who_stdout)}


def who_ok(ref: RefClient, name: str = "iop/who") -> str:
    res = ref.who(name)
    assert res.returncode == 0, str(res)
    return res.stdout


async def registered_probe(url: str, name: str, **extra) -> WsProbe:
    """A raw socket that has its welcome and a bound name (confirmed by a who reply)."""
    p = await WsProbe.open(url)
    await p.recv_type("welcome")
    await p.register(name, **extra)
    await p.send_json({"sender": name, "target": "System", "type": "who_request", "payload": "who"})
    await p.recv(lambda f: f.get("type") == "who_snapshot" and name in f.get("online_agents", []))
    return p


# --------------------------------------------------------------------------------------
# Session: welcome, health, who
# --------------------------------------------------------------------------------------

async def test_welcome_frame_raw(hub):
    """wf §0.1/§4: first frame on an open hub is the welcome, with an int protocol_version >= 2."""
    async with WsProbe.connect(hub.url) as p:
        first = await p.recv(timeout=5)
        assert first.get("type") == "welcome", first
        assert first.get("sender") == "SynapseHub", first
        assert first.get("hub_id") == HUB_ID, first
        # The client reads it with a strict int check and emits ack only for >= 2.
        assert is_int(first.get("protocol_version")) and first["protocol_version"] >= 2, first


def test_cli_health_and_http_health(hub, ref):
    """`synapse health` waits for a welcome (exit 0); GET /health is JSON with hub_id and int version."""
    res = ref.health()
    assert res.returncode == 0, str(res)
    health = hub.get_json("/health")
    assert health.get("hub_id") == HUB_ID, health
    assert is_int(health.get("protocol_version")), health
    # The real agent reads the same version from the welcome.
    agent = ref.agent("iop/probe")
    ready = agent.wait_ready()
    assert ready["hub_id"] == HUB_ID
    assert ready["protocol_version"] == health["protocol_version"] and ready["protocol_version"] >= 2


def test_who_lists_connected_agent(hub, ref):
    """`synapse who` shows an agent connected through the real client library."""
    ref.agent("iop/alice")
    out = who_ok(ref)
    assert "iop/alice" in out, out
    # The one-shot reader itself registered and is listed too (wf §12).
    assert "iop/who" in out, out


# --------------------------------------------------------------------------------------
# Chat
# --------------------------------------------------------------------------------------

def test_directed_chat_delivered_live_with_hub_stamps(hub, ref):
    """A directed chat reaches the live recipient stamped with msg_id/seq/hub_id/client_timestamp."""
    bob = ref.agent("iop/bob")
    alice = ref.agent("iop/alice")
    since = bob.mark()
    t_before = time.time()
    alice.chat("iop/bob", "hello bob", client_msg_id="iop-c1", metadata={"k": [1, 2]})
    f = bob.wait_frame(type="chat", client_msg_id="iop-c1", since=since)
    t_after = time.time()
    assert f["sender"] == "iop/alice" and f["target"] == "iop/bob" and f["payload"] == "hello bob", f
    assert f["hub_id"] == HUB_ID, f
    assert is_int(f.get("msg_id")), f
    assert is_int(f.get("seq")) and f["seq"] > 0, f  # durable hub (--db)
    ct = f.get("client_timestamp")
    assert isinstance(ct, float) and math.isfinite(ct) and t_before - 1 <= ct <= t_after + 1, f
    assert isinstance(f.get("timestamp"), (int, float)) and t_before - 1 <= f["timestamp"] <= t_after + 1, f
    assert f.get("metadata") == {"k": [1, 2]}, f  # other client fields are kept
    assert "token" not in f, f
    # The hub keeps counting: a second chat gets larger msg_id and seq.
    alice.chat("iop/bob", "again", client_msg_id="iop-c2")
    g = bob.wait_frame(type="chat", client_msg_id="iop-c2", since=since)
    assert g["msg_id"] > f["msg_id"] and g["seq"] > f["seq"], (f, g)
    # Not asserted: whether bystanders also see directed chats (the reference
    # broadcasts them unless --private-directed-messages, wf §5).


async def test_chat_stamping_and_echo_raw(hub):
    """wf §0.3: hub time in timestamp, finite client value kept, token stripped, sender gets an echo."""
    a = await registered_probe(hub.url, "iop/a")
    b = await registered_probe(hub.url, "iop/b")
    try:
        await a.chat("iop/a", "iop/b", "stamp me", timestamp=123.5, client_msg_id="s1",
                     priority=True, metadata={"x": 1}, token="not-for-relay")
        got = await b.recv_type("chat", client_msg_id="s1")
        echo = await a.recv_type("chat", client_msg_id="s1")
        for f in (got, echo):
            assert f["client_timestamp"] == 123.5, f
            assert abs(f["timestamp"] - time.time()) < 30, f
            assert f["hub_id"] == HUB_ID and is_int(f["msg_id"]) and is_int(f["seq"]), f
            assert f["priority"] is True and f["metadata"] == {"x": 1}, f
            assert "token" not in f, f
        assert echo["msg_id"] == got["msg_id"] and echo["seq"] == got["seq"]
        # A non-numeric client timestamp is dropped (no client_timestamp).
        await a.chat("iop/a", "iop/b", "bad clock", timestamp="yesterday", client_msg_id="s2")
        g2 = await b.recv_type("chat", client_msg_id="s2")
        assert "client_timestamp" not in g2 and isinstance(g2["timestamp"], (int, float)), g2
    finally:
        await a.close()
        await b.close()


def test_broadcast_reaches_everyone(hub, ref):
    """`synapse send` without a target reaches every connected client (CLI listener and agent)."""
    listener = ref.listen("iop/listener")
    agent = ref.agent("iop/agent")
    wait_until(lambda: "iop/listener" in ref.who().stdout, 15, what="listener registered")
    since = agent.mark()
    res = ref.send("all", "hello everyone")
    assert res.returncode == 0, str(res)
    f = agent.wait_frame(type="chat", payload="hello everyone", since=since)
    assert f.get("target", "all") == "all" and f["hub_id"] == HUB_ID and is_int(f["msg_id"]), f
    listener.wait_line(r"send-\d+: hello everyone")


# --------------------------------------------------------------------------------------
# Delivery receipts, dead letters
# --------------------------------------------------------------------------------------

def test_send_to_live_recipient_positive_receipt(hub, ref):
    """`synapse send --require-recipient` to a live agent exits 0 (matching delivered:true receipt)."""
    bob = ref.agent("iop/bob")
    since = bob.mark()
    res = ref.send("iop/bob", "are you there", "--require-recipient")
    # Exit 0 requires a delivery_receipt matching sender/target/client_msg_id/
    # message_target and delivered:true (exit 3 = no matching receipt, 1 = negative).
    assert res.returncode == 0, str(res)
    assert res.stdout.strip(), str(res)  # the CLI prints the positive receipt's text
    f = bob.wait_frame(type="chat", payload="are you there", since=since)
    assert f["target"] == "iop/bob" and str(f.get("client_msg_id", "")).startswith("cli-"), f


def test_send_to_offline_recipient_negative_receipt_and_dead_letter(hub, ref):
    """Directed send to nobody: negative receipt (exit 1), dead-lettered, listed by `dead-letters`."""
    res = ref.send("iop/nobody", "anyone?")
    assert res.returncode == 1, str(res)  # 1 = explicit negative receipt (3 would be "unknown")
    # The receipt itself, as the client library sees it.
    alice = ref.agent("iop/alice")
    since = alice.mark()
    alice.send("chat", target="iop/nobody", payload="second try", receipt_requested=True,
               client_msg_id="neg-1")
    r = alice.wait_frame(type="delivery_receipt", client_msg_id="neg-1", since=since)
    assert r["sender"] == "SynapseHub" and r["target"] == "iop/alice", r
    assert r["message_target"] == "iop/nobody", r
    assert r["delivered"] is False and r["dead_lettered"] is True, r
    assert r.get("reason") == "no_online_recipient" and r.get("recipients") == [], r
    dl = ref.dead_letters()
    assert dl.returncode == 0, str(dl)
    assert "iop/nobody" in dl.stdout and "count=2" in dl.stdout, str(dl)


def test_deferred_receipt_after_recipient_acks(hub, ref):
    """Receipt-requested chat to an offline mailbox: delivered:false now, delivered+deferred on ack."""
    carol = ref.agent("iop/carol", mailbox=True)  # the hub has seen carol as a mailbox identity
    carol.close()
    alice = ref.agent("iop/alice")
    since = alice.mark()
    alice.send("chat", target="iop/carol", payload="for later", receipt_requested=True,
               client_msg_id="def-1")
    first = alice.wait_frame(type="delivery_receipt", client_msg_id="def-1", since=since)
    assert first["delivered"] is False and first["message_target"] == "iop/carol", first
    # carol comes back with mailbox on; the real client acks the replayed chat itself.
    ref.agent("iop/carol", mailbox=True)
    second = alice.wait_frame(type="delivery_receipt", client_msg_id="def-1", delivered=True,
                              since=since, timeout=15)
    assert second["deferred"] is True, second
    assert second["sender"] == "SynapseHub" and second["target"] == "iop/alice", second
    assert second["message_target"] == "iop/carol", second
    assert second.get("recipients") == ["iop/carol"], second


# --------------------------------------------------------------------------------------
# Mailbox
# --------------------------------------------------------------------------------------

def test_mailbox_replay_after_reconnect(hub, ref):
    """Directed chats sent while offline are replayed (replayed:true, int seq) on a mailbox reconnect."""
    carol = ref.agent("iop/carol", mailbox=True)
    carol.close()
    alice = ref.agent("iop/alice")
    alice.chat("iop/carol", "missed one", client_msg_id="mb-1")
    alice.chat("all", "broadcast while away", client_msg_id="mb-b")
    alice.chat("iop/carol", "missed two", client_msg_id="mb-2")
    carol = ref.agent("iop/carol", mailbox=True)
    one = carol.wait_frame(type="chat", client_msg_id="mb-1")
    two = carol.wait_frame(type="chat", client_msg_id="mb-2")
    for f in (one, two):
        assert f.get("replayed") is True and is_int(f.get("seq")), f
        assert f["sender"] == "iop/alice" and f["target"] == "iop/carol", f
    assert one["seq"] < two["seq"], (one, two)
    # A live marker after the replay proves the replay is over; broadcasts are not replayed.
    alice.chat("iop/carol", "live marker", client_msg_id="mb-live")
    live = carol.wait_frame(type="chat", client_msg_id="mb-live")
    assert not live.get("replayed"), live
    assert not [f for f in carol.frames("chat") if f.get("client_msg_id") == "mb-b" and f.get("replayed")]
    cursor = wait_until(lambda: [e["cursor"] for e in carol.events() if e.get("event") == "frame"
                                 and e["frame"].get("client_msg_id") == "mb-live"], 5)[0]
    assert cursor == live["seq"], (cursor, live)
    # Reconnecting from that cursor replays nothing old.
    carol.close()
    carol = ref.agent("iop/carol", mailbox=True, since_seq=cursor)
    alice.chat("iop/carol", "after resume", client_msg_id="mb-3")
    carol.wait_frame(type="chat", client_msg_id="mb-3")
    assert [f.get("client_msg_id") for f in carol.frames("chat")] == ["mb-3"], carol.frames("chat")
    # Not asserted: reconnecting with since_seq=0 replays acked messages again on
    # the reference (wf §13.5, it ignores its own watermark); hubd need not copy that.


def test_mailbox_ack_lowers_pending(hub, ref):
    """`synapse who` mailbox_pending counts directed chats after the ack watermark: 2 -> 1 -> 0."""
    carol = ref.agent("iop/carol", mailbox=True)
    carol.close()
    assert ref.send("iop/carol", "one").returncode == 1
    assert ref.send("iop/carol", "two").returncode == 1
    assert mailbox_pending(who_ok(ref)).get("iop/carol") == 2
    # Reconnect with the mailbox gate closed: frames are shown but not acked yet.
    carol = ref.agent("iop/carol", mailbox=True, manual_ack=True)
    one = carol.wait_frame(type="chat", payload="one")
    two = carol.wait_frame(type="chat", payload="two")
    assert one.get("replayed") is True and two.get("replayed") is True, (one, two)
    assert mailbox_pending(who_ok(ref)).get("iop/carol") == 2
    carol.ack(one["seq"])
    wait_until(lambda: mailbox_pending(who_ok(ref)).get("iop/carol") == 1, 10,
               what="pending 1 after first ack")
    carol.ack(two["seq"])
    wait_until(lambda: mailbox_pending(who_ok(ref)).get("iop/carol", 0) == 0, 10,
               what="pending 0 after second ack")


# --------------------------------------------------------------------------------------
# History
# --------------------------------------------------------------------------------------

def test_history_request_limit_and_selectors(hub, ref):
    """history_request: limit (newest N, oldest first), history_client_msg_id and history_target."""
    bob = ref.agent("iop/bob")
    alice = ref.agent("iop/alice")
    alice.chat("iop/bob", "h one", client_msg_id="h1")
    alice.chat("all", "h two", client_msg_id="h2")
    alice.chat("iop/bob", "h three", client_msg_id="h3")
    bob.wait_frame(type="chat", client_msg_id="h3")

    def ask(**fields):
        since = alice.mark()
        alice.send("history_request", target="System", payload="history", **fields)
        snap = alice.wait_frame(type="history_snapshot", since=since)
        assert snap["target"] == "iop/alice" and isinstance(snap.get("history"), list), snap
        return snap

    snap = ask(limit=2)
    assert [m.get("client_msg_id") for m in snap["history"]] == ["h2", "h3"], snap
    assert all(is_int(m.get("msg_id")) for m in snap["history"]), snap
    assert snap.get("requested_limit") == 2, snap

    snap = ask(limit=50)
    assert [m.get("client_msg_id") for m in snap["history"]] == ["h1", "h2", "h3"], snap

    snap = ask(history_client_msg_id="h1")
    assert [(m.get("client_msg_id"), m.get("payload")) for m in snap["history"]] == [("h1", "h one")], snap

    snap = ask(history_target="iop/bob")
    assert [m.get("client_msg_id") for m in snap["history"]] == ["h1", "h3"], snap

    snap = ask(history_target="iop/bob", limit=1)  # selectors apply before the limit
    assert [m.get("client_msg_id") for m in snap["history"]] == ["h3"], snap

    snap = ask(history_client_msg_id="no-such-id")
    assert snap["history"] == [], snap
    snap = ask(history_client_msg_id="")  # empty selector: no matches, never everything
    assert snap["history"] == [], snap


# --------------------------------------------------------------------------------------
# Errors never kill the socket (raw probes)
# --------------------------------------------------------------------------------------

BAD_INPUTS = {
    "malformed_json": ("text", "{not json"),
    "bad_utf8_binary": ("bytes", b"\xff\xfe{"),
    "non_object_json": ("text", "[1, 2, 3]"),
    "target_not_string": ("json", {"sender": "iop/err", "target": ["x"], "type": "chat", "payload": "x"}),
    "unknown_type": ("json", {"sender": "iop/err", "target": "System", "type": "frobnicate", "payload": ""}),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
async def test_bad_input_gets_one_error_and_socket_stays_usable(hub, case):
    kind, data = BAD_INPUTS[case]
    p = await registered_probe(hub.url, "iop/err")
    try:
        before = len(p.seen("error"))
        if kind == "text":
            await p.send_text(data)
        elif kind == "bytes":
            await p.send_bytes(data)
        else:
            await p.send_json(data)
        err = await p.recv_type("error")
        assert err.get("sender") == "SynapseHub" and isinstance(err.get("payload"), str) and err["payload"], err
        # Not asserted: err["target"] (the reference addresses decode errors to "all"
        # although it sends them only to this socket, wf §10 — don't route on it).
        # Still usable: a request gets its private answer, a chat its echo.
        await p.send_json({"sender": "iop/err", "target": "System", "type": "who_request", "payload": "who"})
        snap = await p.recv_type("who_snapshot")
        assert "iop/err" in snap.get("online_agents", []), snap
        await p.chat("iop/err", "all", "still here", client_msg_id="after-err")
        await p.recv_type("chat", client_msg_id="after-err")
        assert p.closed is None
        assert len(p.seen("error")) - before == 1, p.seen("error")
    finally:
        await p.close()


# --------------------------------------------------------------------------------------
# Names
# --------------------------------------------------------------------------------------

async def test_name_conflict_second_live_socket_raw(hub):
    """wf §4: a second live socket under the same name gets name_conflict + 4009; the first keeps it."""
    first = await registered_probe(hub.url, "iop/dup")
    try:
        async with WsProbe.connect(hub.url) as second:
            await second.recv_type("welcome")  # open hub: welcome comes before registration
            await second.register("iop/dup")
            nc = await second.recv_type("name_conflict")
            assert nc.get("target") == "iop/dup" and nc.get("sender") == "SynapseHub", nc
            closed = await second.wait_closed()
            assert closed.code == 4009 and closed.reason == "name conflict", closed
        await first.send_json({"sender": "iop/dup", "target": "System", "type": "who_request",
                               "payload": "who"})
        snap = await first.recv_type("who_snapshot")
        assert "iop/dup" in snap["online_agents"] and first.closed is None, snap
    finally:
        await first.close()


def test_name_conflict_between_real_clients(hub, ref):
    """A second real client under a live name is refused (4009) and the holder keeps working."""
    holder = ref.agent("iop/dup")
    second = ref.agent("iop/dup", registered=False)  # welcome first, then the refusal
    closed = second.wait_closed()
    assert closed["code"] == 4009, closed
    assert second.frames("name_conflict"), second.events()
    res = ref.send("all", "still works?", name="iop/dup")
    assert res.returncode == 1 and "4009" in res.stdout, str(res)
    holder.wait_registered()


async def test_name_switch_refused_raw(hub):
    """wf §4: a different sender on a bound socket -> name_conflict + close 4009 "name switch"."""
    p = await registered_probe(hub.url, "iop/first")
    try:
        await p.chat("iop/second", "all", "who am i")
        nc = await p.recv_type("name_conflict")
        assert nc.get("sender") == "SynapseHub", nc
        closed = await p.wait_closed()
        assert closed.code == 4009 and closed.reason == "name switch", closed
        assert not [f for f in p.seen("chat") if f.get("sender") == "iop/second"], p.frames
    finally:
        await p.close()


@pytest.mark.parametrize("name", ["SynapseHub", "iop/seat@peer-hub"])
async def test_reserved_name_refused_raw(hub, name):
    """wf §4: SynapseHub and any name with '@' -> name_conflict + close 4009 "reserved identity"."""
    async with WsProbe.connect(hub.url) as p:
        await p.recv_type("welcome")
        await p.register(name)
        nc = await p.recv_type("name_conflict")
        assert nc.get("target") == name and nc.get("sender") == "SynapseHub", nc
        closed = await p.wait_closed()
        assert closed.code == 4009 and closed.reason == "reserved identity", closed
    watcher = await registered_probe(hub.url, "iop/watch")
    try:
        await watcher.send_json({"sender": "iop/watch", "target": "System", "type": "who_request",
                                 "payload": "who"})
        snap = await watcher.recv_type("who_snapshot")
        assert name not in snap["online_agents"], snap
    finally:
        await watcher.close()


# --------------------------------------------------------------------------------------
# Secured hub (--token)
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("token,label", [(None, "missing"), ("wrong-token", "wrong")])
async def test_secured_hub_refuses_bad_token_and_sends_nothing_first(secured_hub, token, label):
    async with WsProbe.connect(secured_hub.url) as p:
        extra = {"token": token} if token else {}
        await p.register("iop/intruder", **extra)
        denied = await p.recv(timeout=5)
        # the answer to the first frame is the first frame the hub sends
        assert p.frames[0] is denied, "a secured hub must send nothing before authentication"
        assert denied.get("type") == "auth_denied", p.frames
        assert denied.get("target") == "iop/intruder" and denied.get("sender") == "SynapseHub", denied
        closed = await p.wait_closed()
        assert closed.code == 4010, closed
        assert not p.seen("welcome"), p.frames


async def test_secured_hub_right_token_gets_welcome(secured_hub):
    async with WsProbe.connect(secured_hub.url) as p:
        await p.register("iop/member", token=TOKEN)
        first = await p.recv(timeout=5)
        assert p.frames[0] is first, "a secured hub must send nothing before authentication"
        assert first.get("type") == "welcome" and first.get("hub_id") == HUB_ID, p.frames
        assert is_int(first.get("protocol_version")), first
        # Only the first frame needs the token; the bound socket works normally.
        await p.chat("iop/member", "all", "inside", client_msg_id="sec-1", token=TOKEN)
        echo = await p.recv_type("chat", client_msg_id="sec-1")
        assert "token" not in echo, echo
        assert p.closed is None


def test_secured_hub_with_real_cli(secured_hub, make_ref):
    ref = make_ref(secured_hub)
    # (short ready timeouts: the CLI waits them out even after a 4010 close)
    assert ref.health(ready_timeout=1).returncode == 1  # no token: no welcome, exit 1
    bad = ref.who("iop/who", "--ready-timeout", "1", token="wrong-token")
    assert bad.returncode != 0 and "4010" in bad.stdout, str(bad)
    good = ref.health(token=TOKEN)
    assert good.returncode == 0, str(good)
    ref.agent("iop/member", token=TOKEN)
    out = ref.who("iop/who", token=TOKEN)
    assert out.returncode == 0 and "iop/member" in out.stdout, str(out)

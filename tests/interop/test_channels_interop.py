"""Private channels driven by the reference client's own channel helpers
(agent.channel_create / channel_invite / channel_join / channel_leave /
request_channels / request_channel_history, agent.chat(channel=...)) against
the reference hub and hubd: the same answers from both (docs/channels.md;
docs/reference-observed.md §20 and "Private channels: membership, routing,
observe")."""

from __future__ import annotations

import json

import pytest

from tests.interop.conftest import KINDS, _need_reference
from tests.support.procs import hubd_process, reference_hub_process
from tests.support.wsprobe import WsProbe

# what both hubs answer, as observed on the reference hub (synapse-channel 0.99.38)
EXPECTED_RESULTS = [
    ("alice", "create ops", ("ops", True, ["p/alice"], "created channel 'ops'")),
    ("alice", "create ops again", ("ops", False, [], "channel 'ops' already exists")),
    ("alice", "invite bob", ("ops", True, ["p/alice"], "invited 'p/bob' to 'ops'")),
    ("alice", "invite dan", ("ops", True, ["p/alice"], "invited 'p/dan' to 'ops'")),
    ("bob", "bob invites carol",
     ("ops", False, [], "cannot invite to 'ops': no such channel or you are not its owner")),
    ("carol", "carol joins",
     ("ops", False, [], "cannot join 'ops': no such channel or you were not invited")),
    ("bob", "bob joins", ("ops", True, ["p/alice", "p/bob"], "joined 'ops'")),
]


def _result(agent, since: int) -> tuple:
    f = agent.wait_frame(since=since, type="channel_result")
    return f["channel"], f["ok"], f["members"], f["payload"]


def test_reference_client_channels(hub, ref):
    agents = {n: ref.agent(f"p/{n}") for n in ("alice", "bob", "carol", "dan")}
    alice, bob, carol, dan = (agents[n] for n in ("alice", "bob", "carol", "dan"))
    calls = {
        "create ops": ("channel_create", ("ops",), {"label": "Ops"}),
        "create ops again": ("channel_create", ("ops",), {}),
        "invite bob": ("channel_invite", ("ops", "p/bob"), {}),
        "invite dan": ("channel_invite", ("ops", "p/dan"), {}),
        "bob invites carol": ("channel_invite", ("ops", "p/carol"), {}),
        "carol joins": ("channel_join", ("ops",), {}),
        "bob joins": ("channel_join", ("ops",), {}),
    }
    for who, step, expected in EXPECTED_RESULTS:
        agent = agents[who]
        since = agent.mark()
        method, args, kwargs = calls[step]
        agent.channel(method, *args, **kwargs)
        assert _result(agent, since) == expected, (hub.kind, step)

    # a member's chat: the joined member's copy keeps `channel`
    since_bob = bob.mark()
    alice.chat("all", "secret", channel="ops")
    got = bob.wait_frame(since=since_bob, type="chat", payload="secret")
    assert (got["channel"], got["sender"]) == ("ops", "p/alice"), hub.kind

    # the receipt: recipients are the online members but the sender
    since = alice.mark()
    alice.send("chat", target="all", payload="with receipt", channel="ops",
               receipt_requested=True, client_msg_id="ch-1")
    receipt = alice.wait_frame(since=since, type="delivery_receipt")
    assert (receipt["delivered"], receipt["recipients"], receipt["matched_recipients"],
            receipt["message_target"], receipt["client_msg_id"]) == \
        (True, ["p/bob"], ["p/bob"], "ops", "ch-1"), (hub.kind, receipt)
    assert (receipt["reason"], receipt["dead_lettered"], receipt["deferred"],
            receipt["stale_recipients"]) == ("", False, False, []), (hub.kind, receipt)
    # Not compared: the payload text ("delivered to p/bob (direct agent)" on the
    # reference, hubd's directed-receipt text "delivered to p/bob"), message_seq and
    # receipt_notification_id (None on the reference, whose channel receipts are
    # not journaled; hubd's are durable outbox rows like every receipt)

    # a non-member's channel chat is an error naming the channel
    since = carol.mark()
    carol.chat("all", "let me in", channel="ops")
    err = carol.wait_frame(since=since, type="error")
    assert (err["payload"], err["channel"]) == ("not a member of channel 'ops'", "ops"), hub.kind

    # lists and history: members only
    since = bob.mark()
    bob.channel("request_channels")
    assert bob.wait_frame(since=since, type="channel_list")["channels"] == ["ops"], hub.kind
    since = carol.mark()
    carol.channel("request_channels")
    assert carol.wait_frame(since=since, type="channel_list")["channels"] == [], hub.kind
    since = bob.mark()
    bob.channel("request_channel_history", "ops", limit=10)
    hist = bob.wait_frame(since=since, type="channel_history")
    assert hist["channel"] == "ops", hub.kind
    assert [m["payload"] for m in hist["messages"]] == ["secret", "with receipt"], hub.kind
    assert all(m["channel"] == "ops" for m in hist["messages"]), hub.kind
    since = carol.mark()
    carol.channel("request_channel_history", "ops")
    assert _result(carol, since) == ("ops", False, [], "not a member of channel 'ops'")

    # leave: twice
    since = bob.mark()
    bob.channel("channel_leave", "ops")
    assert _result(bob, since) == ("ops", True, [], "left 'ops'"), hub.kind
    since = bob.mark()
    bob.channel("channel_leave", "ops")
    assert _result(bob, since) == ("ops", False, [], "not a member of 'ops'"), hub.kind

    # with bob gone, alice's channel chat reaches nobody
    since = alice.mark()
    alice.send("chat", target="all", payload="anyone?", channel="ops",
               receipt_requested=True, client_msg_id="ch-2")
    alone = alice.wait_frame(since=since, type="delivery_receipt")
    assert (alone["delivered"], alone["recipients"], alone["matched_recipients"],
            alone["message_target"], alone["reason"], alone["dead_lettered"],
            alone["deferred"], alone["payload"]) == \
        (False, [], [], "ops", "no_online_recipient", False, False,
         "delivery failed: no online recipient matched ops"), (hub.kind, alone)

    # sentinels: carol and dan (invited, never joined) saw no channel chat
    for agent in (carol, dan):
        since = agent.mark()
        alice.chat(agent.name, f"sentinel {agent.name}")
        agent.wait_frame(since=since, type="chat", payload=f"sentinel {agent.name}")
        assert not [f for f in agent.frames("chat") if f.get("channel")], (hub.kind, agent.name)


# -- private directed messages and the ACL observe grant, raw frames

OBSERVE_RULES = {"rules": [
    {"permission": "observe", "target_kind": "agent", "target_pattern": "p/*",
     "namespace": "mon"},
    {"permission": "message", "target_kind": "agent", "target_pattern": "*"}]}


@pytest.fixture(params=KINDS)
def private_hub(request, tmp_path):
    """Both hubs with the same flags: --private-directed-messages and an ACL
    policy granting `observe` on agent:p/* to project mon (no --require-acl;
    the reference counts private routing as multi-seat, hence
    --insecure-unbound-identity, which hubd accepts too)."""
    policy = tmp_path / "acl.json"
    policy.write_text(json.dumps(OBSERVE_RULES))
    args = ["--private-directed-messages", "--insecure-unbound-identity",
            "--acl-policy", str(policy)]
    if request.param == "reference":
        _need_reference(request.getfixturevalue("reference_venv_status"))
        proc = reference_hub_process(tmp_path / "ref", "--no-durable-ingress-quota", *args)
    else:
        proc = hubd_process(tmp_path / "hubd", *args)
    proc.start()
    proc.kind = request.param
    yield proc
    proc.stop()


async def _joined(url: str, name: str) -> WsProbe:
    probe = await WsProbe.open(url)
    await probe.recv_type("welcome")
    await probe.register(name)
    await probe.recv_type("presence_update", agent=name)
    return probe


async def test_observe_grant_and_channel_privacy_under_private_routing(private_hub):
    url, kind = private_hub.url, private_hub.kind
    alice, bob = await _joined(url, "p/alice"), await _joined(url, "p/bob")
    carol, watch = await _joined(url, "p/carol"), await _joined(url, "mon/watch")
    outsider = await _joined(url, "q/watch")  # same rule, other namespace: no grant

    await alice.chat("p/alice", "p/bob", "for bob", receipt_requested=True)
    await bob.recv_type("chat", payload="for bob")
    echo = await alice.recv_type("chat", payload="for bob")  # the sender's echo
    assert echo["sender"] == "p/alice", kind
    await watch.recv_type("chat", payload="for bob")  # mon holds observe on agent:p/*
    receipt = await alice.recv_type("delivery_receipt")
    assert (receipt["recipients"], receipt["delivered"]) == (["p/bob"], True), (kind, receipt)

    # a channel chat reaches members only: no observer, no echo
    await alice.send_json({"sender": "p/alice", "target": "System", "type": "channel_create",
                           "channel": "ops", "payload": ""})
    await alice.recv_type("channel_result", ok=True)
    await alice.send_json({"sender": "p/alice", "target": "System", "type": "channel_invite",
                           "channel": "ops", "invitee": "p/bob", "payload": ""})
    await alice.recv_type("channel_result", ok=True)
    await bob.send_json({"sender": "p/bob", "target": "System", "type": "channel_join",
                         "channel": "ops", "payload": ""})
    await bob.recv_type("channel_result", ok=True)
    await alice.chat("p/alice", "all", "members only", channel="ops")
    await bob.recv_type("chat", payload="members only")

    # sentinels: directed chats, in seq order after everything above
    for probe, name in ((carol, "p/carol"), (watch, "mon/watch"), (outsider, "q/watch"),
                        (alice, "p/alice")):
        await bob.chat("p/bob", name, f"sentinel {name}")
        await probe.recv_type("chat", payload=f"sentinel {name}")
    seen = {name: [f["payload"] for f in probe.seen("chat")]
            for probe, name in ((carol, "p/carol"), (watch, "mon/watch"),
                                (outsider, "q/watch"), (alice, "p/alice"))}
    assert seen["p/carol"] == ["sentinel p/carol"], (kind, seen)
    assert seen["q/watch"] == ["sentinel q/watch"], (kind, seen)
    # the observer saw the chat to p/bob and bob's chat to p/carol (a p/* target)
    assert seen["mon/watch"] == ["for bob", "sentinel p/carol", "sentinel mon/watch"], \
        (kind, seen)
    assert seen["p/alice"] == ["for bob", "sentinel p/alice"], (kind, seen)
    for p in (alice, bob, carol, watch, outsider):
        await p.close()


async def _ask(probe: WsProbe, sender: str, type_: str, **fields) -> tuple:
    await probe.send_json({"sender": sender, "target": "System", "type": type_, "payload": "",
                           **fields})
    f = await probe.recv(lambda f: f.get("type") in ("channel_result", "error"))
    return f["type"], f.get("channel"), f.get("ok"), f.get("members"), f["payload"]


async def test_owner_leaves_and_comes_back_and_ids_are_trimmed(hub):
    alice, bob = await _joined(hub.url, "p/alice"), await _joined(hub.url, "p/bob")
    ok = ("channel_result", "ops", True)
    assert (await _ask(alice, "p/alice", "channel_create", channel="  ops  "))[:3] == ok
    assert (await _ask(alice, "p/alice", "channel_invite", channel="ops",
                       invitee=" p/bob "))[4] == "invited 'p/bob' to 'ops'"
    assert (await _ask(bob, "p/bob", "channel_join", channel="ops"))[3] == ["p/alice", "p/bob"]
    # the owner leaves; the channel stays with bob, and the owner may join
    # back without an invite (it still owns the channel)
    assert await _ask(alice, "p/alice", "channel_leave", channel="ops") == \
        ("channel_result", "ops", True, [], "left 'ops'")
    assert await _ask(alice, "p/alice", "channel_join", channel="ops") == \
        ("channel_result", "ops", True, ["p/alice", "p/bob"], "joined 'ops'")
    assert (await _ask(alice, "p/alice", "channel_join", channel="ops"))[4] == \
        "already a member of 'ops'"
    # the last member out removes the channel
    await _ask(alice, "p/alice", "channel_leave", channel="ops")
    await _ask(bob, "p/bob", "channel_leave", channel="ops")
    assert await _ask(bob, "p/bob", "channel_leave", channel="ops") == \
        ("channel_result", "ops", False, [], "channel 'ops' does not exist")
    assert await _ask(bob, "p/bob", "channel_create", channel="ops") == \
        ("channel_result", "ops", True, ["p/bob"], "created channel 'ops'")
    # a retried channel chat is answered as a duplicate
    await bob.chat("p/bob", "all", "once", channel="ops", client_msg_id="d-1")
    await bob.chat("p/bob", "all", "once", channel="ops", client_msg_id="d-1")
    await bob.chat("p/bob", "p/bob", "sentinel")
    frames = [f for f in await bob.drain(0.5) if f.get("type") in ("system", "error")]
    assert frames == [], (hub.kind, frames)  # bob alone: it reached nobody, so no memory
    # with a member online the first copy is remembered: the retry is a duplicate
    await _ask(bob, "p/bob", "channel_invite", channel="ops", invitee="p/alice")
    await _ask(alice, "p/alice", "channel_join", channel="ops")
    await bob.chat("p/bob", "all", "twice", channel="ops", client_msg_id="d-2")
    first = await alice.recv_type("chat", payload="twice")
    await bob.chat("p/bob", "all", "twice", channel="ops", client_msg_id="d-2")
    dup = await bob.recv_type("system", client_msg_id="d-2")
    # (the reference stamps no seq on a channel chat, so both are absent there)
    assert (dup["duplicate"], dup["msg_id"], dup.get("seq"), dup["channel"]) == \
        (True, first["msg_id"], first.get("seq"), "ops"), (hub.kind, dup)
    await bob.chat("p/bob", "all", "changed", channel="ops", client_msg_id="d-2")
    err = await bob.recv_type("error")  # (the reference's error has no client_msg_id)
    assert "already used for a different message" in err["payload"], (hub.kind, err)
    await alice.close()
    await bob.close()


@pytest.mark.parametrize("kind", KINDS)
async def test_team_secure_profile(kind, tmp_path, request):
    """--team-secure on both hubs with the same files: the same startup
    refusals, an unsigned registration closed 4013, a directed chat reaching
    only its recipient and the sender's echo."""
    import subprocess
    import sys

    from tests.support.procs import reference_env
    from tests.support.signed_site import TOKEN, SignedSite, envelope, sign_registration

    site = SignedSite.make(tmp_path / "files", None,
                           {"p/alice": [], "p/bob": [], "p/carol": []}, [])
    trust = str(tmp_path / "files" / "identity-trust.json")
    grants = str(tmp_path / "files" / "role-grants.json")
    if kind == "reference":
        venv = _need_reference(request.getfixturevalue("reference_venv_status"))
        argv0, env = [str(venv / "bin" / "synapse"), "hub"], reference_env(tmp_path / "home")
    else:
        argv0, env = [sys.executable, "-m", "hubd"], None
    for args, text in [
        ((), "team-secure mode requires --token or --token-file (identity and role grants "
             "are only as strong as the connect gate)"),
        (("--token", TOKEN), "team-secure mode requires --identity-trust"),
        (("--token", TOKEN, "--identity-trust", trust),
         "team-secure mode requires --role-grants")]:
        done = subprocess.run([*argv0, "--port", "0", "--db", str(tmp_path / "x.db"),
                               "--team-secure", *args], capture_output=True, text=True,
                              timeout=60, env=env)
        assert done.returncode == 2 and text in done.stderr, (kind, done.stderr)

    flags = ["--team-secure", "--token", TOKEN, "--identity-trust", trust,
             "--role-grants", grants]
    proc = (reference_hub_process(tmp_path / "ref", *flags) if kind == "reference"
            else hubd_process(tmp_path / "hubd", *flags)).start()
    try:
        unsigned = await WsProbe.open(proc.url)
        await unsigned.register("p/alice", token=TOKEN)
        assert (await unsigned.wait_closed()).code == 4013, kind
        assert unsigned.seen("error")[0]["payload"] == \
            "identity binding failed: missing_signature", kind
        seats = {}
        for name in ("p/alice", "p/bob", "p/carol"):
            seat = site.seats[name]
            probe = await WsProbe.open(proc.url)
            hello = envelope(name, "heartbeat", target="System", payload="online", token=TOKEN)
            await probe.send_json(sign_registration(hello, seat.pem, seat.key_id))
            await probe.recv_type("welcome")
            seats[name] = probe
        alice, bob, carol = seats["p/alice"], seats["p/bob"], seats["p/carol"]
        await alice.chat("p/alice", "p/bob", "just bob")
        await bob.recv_type("chat", payload="just bob")
        await alice.chat("p/alice", "p/carol", "sentinel")
        await carol.recv_type("chat", payload="sentinel")
        await alice.recv_type("chat", payload="sentinel")
        assert [f["payload"] for f in carol.seen("chat")] == ["sentinel"], kind
        assert [f["payload"] for f in alice.seen("chat")] == ["just bob", "sentinel"], kind
        for probe in seats.values():
            await probe.close()
    finally:
        proc.stop()


@pytest.mark.parametrize("kind", KINDS)
async def test_acl_gates_the_channel_verbs(kind, tmp_path, request):
    """Under --require-acl the mutating channel verbs need `message` on
    channel:<id>: refused with the reference's access-denied error when no
    rule grants it, answered when one does. The same files on both hubs."""
    from tests.support.signed_site import SignedProbe, envelope, start_signed_hub

    if kind == "reference":
        _need_reference(request.getfixturevalue("reference_venv_status"))
    acl = [{"permission": "message", "target_kind": "channel", "target_pattern": "ops"}]
    site = start_signed_hub(kind, tmp_path, {"p/alice": []}, acl, reference_files=False)
    try:
        conn = await SignedProbe.open(site.proc.url, site.seats["p/alice"])
        probe = conn.probe
        for cid, expect in (("ops", "created channel 'ops'"),
                            ("dev", "access denied: message on channel:dev")):
            await probe.send_json(envelope("p/alice", "channel_create", channel=cid))
            answer = await probe.recv(lambda f: f.get("type") in ("channel_result", "error"))
            assert answer["payload"] == expect, (kind, answer)
        await conn.close()
    finally:
        site.proc.stop()

"""Private channels, --private-directed-messages with the ACL observe grant, and
--team-secure, on real hubd processes over real sockets and SQLite journals
(docs/channels.md). The stalled-member test runs the hub in process (it reads
the endpoint's write state to know the socket is stalled)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest

from hubd.timing import Timing
from tests.support.inproc import running_hub
from tests.support.procs import hubd_process
from tests.support.rawws import RawWs, text
from tests.support.signed_site import TOKEN, SignedSite, envelope, sign_registration
from tests.support.wsprobe import WsProbe


async def joined(url: str, name: str, **extra) -> WsProbe:
    probe = await WsProbe.open(url)
    await probe.recv_type("welcome")
    await probe.register(name, **extra)
    await probe.recv_type("presence_update", agent=name, event="joined")
    return probe


async def ask(probe: WsProbe, sender: str, type_: str, answer: str = "channel_result",
              **fields) -> dict:
    await probe.send_json({"sender": sender, "target": "System", "type": type_,
                           "payload": "", **fields})
    return await probe.recv(lambda f: f.get("type") in (answer, "error"))


async def sentinel(sender: WsProbe, name: str, *to: tuple[WsProbe, str]) -> None:
    """Frames leave in seq order: once a later chat is on each socket, every
    earlier one routed there is too."""
    for probe, who in to:
        await sender.chat(name, who, f"sentinel {who}")
        await probe.recv_type("chat", payload=f"sentinel {who}")


@pytest.fixture
def hub(tmp_path):
    proc = hubd_process(tmp_path / "hub").start()
    yield proc
    proc.stop()


async def test_membership_routing_receipts_and_refusals(hub):
    alice, bob = await joined(hub.url, "p/alice"), await joined(hub.url, "p/bob")
    carol, dan = await joined(hub.url, "p/carol"), await joined(hub.url, "p/dan")

    made = await ask(alice, "p/alice", "channel_create", channel="ops", label="Ops")
    assert (made["ok"], made["members"], made["channel"], made["payload"]) == \
        (True, ["p/alice"], "ops", "created channel 'ops'")
    again = await ask(alice, "p/alice", "channel_create", channel="ops")
    assert (again["ok"], again["members"], again["payload"]) == \
        (False, [], "channel 'ops' already exists")
    for invitee in ("p/bob", "p/dan"):
        inv = await ask(alice, "p/alice", "channel_invite", channel="ops", invitee=invitee)
        assert (inv["ok"], inv["members"], inv["payload"]) == \
            (True, ["p/alice"], f"invited '{invitee}' to 'ops'")
    not_owner = await ask(bob, "p/bob", "channel_invite", channel="ops", invitee="p/carol")
    assert (not_owner["ok"], not_owner["members"], not_owner["payload"]) == \
        (False, [], "cannot invite to 'ops': no such channel or you are not its owner")
    uninvited = await ask(carol, "p/carol", "channel_join", channel="ops")
    assert uninvited["payload"] == "cannot join 'ops': no such channel or you were not invited"
    join = await ask(bob, "p/bob", "channel_join", channel="ops")
    assert (join["ok"], join["members"], join["payload"]) == \
        (True, ["p/alice", "p/bob"], "joined 'ops'")

    # a member's chat reaches the joined members online, not the invited-not-
    # joined dan, not carol, not the sender; the copy keeps `channel`
    await alice.chat("p/alice", "all", "secret", channel="ops", receipt_requested=True,
                     client_msg_id="c-1")
    got = await bob.recv_type("chat", payload="secret")
    assert got["channel"] == "ops" and got["sender"] == "p/alice"
    receipt = await alice.recv_type("delivery_receipt", client_msg_id="c-1")
    assert (receipt["delivered"], receipt["recipients"], receipt["matched_recipients"],
            receipt["message_target"], receipt["dead_lettered"]) == \
        (True, ["p/bob"], ["p/bob"], "ops", False)
    # a non-member's channel chat, and one to a channel that does not exist
    for cid in ("ops", "nope"):
        await carol.chat("p/carol", "all", "let me in", channel=cid)
        err = await carol.recv_type("error")
        assert (err["payload"], err["channel"]) == (f"not a member of channel '{cid}'", cid)
    await sentinel(alice, "p/alice", (carol, "p/carol"), (dan, "p/dan"), (bob, "p/bob"))
    # (directed chats go to every socket on this compatibility-mode hub)
    for probe in (carol, dan, alice):  # alice: no echo of its own channel chat
        assert not [f for f in probe.seen("chat") if f.get("channel")], probe.seen("chat")
    assert not [f for f in bob.seen("chat") if f["payload"] == "let me in"]

    # history and list: members only
    hist = await ask(bob, "p/bob", "channel_history_request", answer="channel_history",
                     channel="ops", limit=5)
    assert [m["payload"] for m in hist["messages"]] == ["secret"]
    assert hist["retention"]["max_messages"] >= 1
    refused = await ask(carol, "p/carol", "channel_history_request", channel="ops")
    assert (refused["type"], refused["ok"], refused["payload"]) == \
        ("channel_result", False, "not a member of channel 'ops'")
    listed = await ask(bob, "p/bob", "channel_list_request", answer="channel_list")
    assert listed["channels"] == ["ops"]
    assert (await ask(carol, "p/carol", "channel_list_request",
                      answer="channel_list"))["channels"] == []

    # bob leaves: alice's next channel chat reaches nobody; the negative
    # receipt is final (not dead-lettered) and a retry is routed again
    left = await ask(bob, "p/bob", "channel_leave", channel="ops")
    assert (left["ok"], left["members"], left["payload"]) == (True, [], "left 'ops'")
    assert (await ask(bob, "p/bob", "channel_leave", channel="ops"))["payload"] == \
        "not a member of 'ops'"
    await alice.chat("p/alice", "all", "anyone?", channel="ops", receipt_requested=True,
                     client_msg_id="c-2")
    alone = await alice.recv_type("delivery_receipt", client_msg_id="c-2")
    assert (alone["delivered"], alone["recipients"], alone["reason"],
            alone["dead_lettered"]) == (False, [], "no_online_recipient", False)
    # bob comes back only with a fresh invite
    assert not (await ask(bob, "p/bob", "channel_join", channel="ops"))["ok"]
    await ask(alice, "p/alice", "channel_invite", channel="ops", invitee="p/bob")
    assert (await ask(bob, "p/bob", "channel_join", channel="ops"))["ok"]
    await alice.chat("p/alice", "all", "anyone?", channel="ops", receipt_requested=True,
                     client_msg_id="c-2")
    await bob.recv_type("chat", payload="anyone?")
    assert (await alice.recv_type("delivery_receipt", client_msg_id="c-2"))["delivered"]

    # typed errors at the wire layer: the socket stays, nothing changes
    await alice.send_json({"sender": "p/alice", "type": "channel_create", "channel": 5})
    bad = await alice.recv_type("error")
    assert "'channel' must be" in bad["payload"]
    await alice.send_json({"sender": "p/alice", "type": "channel_invite", "channel": "ops",
                           "invitee": ["p/carol"]})
    assert "'invitee' must be" in (await alice.recv_type("error"))["payload"]
    long_id = await ask(alice, "p/alice", "channel_create", channel="x" * 201)
    assert (long_id["ok"], long_id["payload"]) == (False, "invalid channel id")
    assert (await ask(alice, "p/alice", "channel_create", channel="y" * 200))["ok"]
    metrics = hub.get_text("/metrics")
    # refused: a create, an invite, 2 joins, 2 chats, a history, a leave, a 201-char id
    assert "hubd_channel_refusals_total 9.0" in metrics
    assert "hubd_channel_chats_total 3.0" in metrics
    for p in (alice, bob, carol, dan):
        await p.close()


async def test_membership_and_history_survive_a_restart(tmp_path):
    folder = tmp_path / "hub"
    proc = hubd_process(folder).start()
    alice, bob = await joined(proc.url, "p/alice"), await joined(proc.url, "p/bob")
    await ask(alice, "p/alice", "channel_create", channel="ops")
    await ask(alice, "p/alice", "channel_invite", channel="ops", invitee="p/bob")
    await ask(alice, "p/alice", "channel_invite", channel="ops", invitee="p/dan")
    await ask(bob, "p/bob", "channel_join", channel="ops")
    await alice.chat("p/alice", "all", "before restart", channel="ops")
    await bob.recv_type("chat", payload="before restart")
    await alice.close()
    await bob.close()
    port = proc.port
    proc.stop()

    again = hubd_process(folder, port=port).start()
    try:
        alice, bob = await joined(again.url, "p/alice"), await joined(again.url, "p/bob")
        dan = await joined(again.url, "p/dan")
        assert (await ask(bob, "p/bob", "channel_list_request",
                          answer="channel_list"))["channels"] == ["ops"]
        hist = await ask(bob, "p/bob", "channel_history_request", answer="channel_history",
                         channel="ops")
        assert [m["payload"] for m in hist["messages"]] == ["before restart"]
        # dan's invite outlived the restart; the owner still owns
        joined_dan = await ask(dan, "p/dan", "channel_join", channel="ops")
        assert joined_dan["members"] == ["p/alice", "p/bob", "p/dan"]
        await alice.chat("p/alice", "all", "after", channel="ops", receipt_requested=True)
        receipt = await alice.recv_type("delivery_receipt")
        assert receipt["recipients"] == ["p/bob", "p/dan"] and receipt["delivered"]
        for p in (alice, bob, dan):
            await p.close()
    finally:
        again.stop()


async def test_private_directed_with_the_observe_grant(tmp_path):
    policy = tmp_path / "acl.json"
    policy.write_text(json.dumps({"rules": [
        {"permission": "observe", "target_kind": "agent", "target_pattern": "p/*",
         "namespace": "mon"}]}))
    proc = hubd_process(tmp_path / "hub", "--private-directed-messages",
                        "--acl-policy", str(policy)).start()
    try:
        alice, bob = await joined(proc.url, "p/alice"), await joined(proc.url, "p/bob")
        carol, watch = await joined(proc.url, "p/carol"), await joined(proc.url, "mon/watch")
        await alice.chat("p/alice", "p/bob", "for bob", receipt_requested=True)
        await bob.recv_type("chat", payload="for bob")
        await alice.recv_type("chat", payload="for bob")  # the sender's echo
        await watch.recv_type("chat", payload="for bob")  # observe on agent:p/*, mon's rule
        receipt = await alice.recv_type("delivery_receipt")
        assert receipt["recipients"] == ["p/bob"]  # an observer is not a recipient
        assert "hubd_observer_copies_total 1.0" in proc.get_text("/metrics")
        # a target outside the grant's pattern reaches no observer
        await alice.chat("p/alice", "q/zed", "nobody")
        await sentinel(alice, "p/alice", (carol, "p/carol"), (watch, "mon/watch"))
        assert [f["payload"] for f in carol.seen("chat")] == ["sentinel p/carol"]
        assert [f["payload"] for f in watch.seen("chat")] == \
            ["for bob", "sentinel p/carol", "sentinel mon/watch"]
        # channel chats are never copied to observers
        await ask(alice, "p/alice", "channel_create", channel="ops")
        await alice.chat("p/alice", "all", "members only", channel="ops")
        await sentinel(alice, "p/alice", (watch, "mon/watch"))
        assert "members only" not in [f["payload"] for f in watch.seen("chat")]
        for p in (alice, bob, carol, watch):
            await p.close()
    finally:
        proc.stop()


def _hubd_exit(tmp_path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hubd", "--db", str(tmp_path / "x.db"),
                           "--port", "0", *args], capture_output=True, text=True, timeout=30)


async def test_team_secure_needs_its_files_and_forces_binding_and_privacy(tmp_path):
    site = SignedSite.make(tmp_path / "files", None, {"p/alice": [], "p/bob": [],
                                                      "p/carol": []}, [])
    trust = str(tmp_path / "files" / "identity-trust.json")
    grants = str(tmp_path / "files" / "role-grants.json")
    for args, text in [
        ((), "team-secure mode requires --token or --token-file"),
        (("--token", TOKEN), "team-secure mode requires --identity-trust"),
        (("--token", TOKEN, "--identity-trust", trust),
         "team-secure mode requires --role-grants")]:
        done = _hubd_exit(tmp_path, "--team-secure", *args)
        assert done.returncode == 2 and text in done.stderr, done

    proc = hubd_process(tmp_path / "hub", "--team-secure", "--token", TOKEN,
                        "--identity-trust", trust, "--role-grants", grants).start()
    try:
        # binding is forced: an unsigned registration is refused
        probe = await WsProbe.open(proc.url)
        await probe.register("p/alice", token=TOKEN)
        assert (await probe.wait_closed()).code == 4013
        assert "identity binding failed" in probe.seen("error")[0]["payload"]
        seats = {}
        for name in ("p/alice", "p/bob", "p/carol"):
            seat = site.seats[name]
            probe = await WsProbe.open(proc.url)
            hello = envelope(name, "heartbeat", target="System", payload="online", token=TOKEN)
            await probe.send_json(sign_registration(hello, seat.pem, seat.key_id))
            await probe.recv_type("welcome")
            seats[name] = probe
        alice, bob, carol = seats["p/alice"], seats["p/bob"], seats["p/carol"]
        await alice.send_json(envelope("p/alice", "who_request", target="System"))
        await alice.recv_type("who_snapshot")
        # private directed messages are forced: carol does not see alice -> bob
        await alice.chat("p/alice", "p/bob", "just bob")
        await bob.recv_type("chat", payload="just bob")
        await alice.chat("p/alice", "p/carol", "sentinel")
        await carol.recv_type("chat", payload="sentinel")
        assert [f["payload"] for f in carol.seen("chat")] == ["sentinel"]
        for p in seats.values():
            await p.close()
    finally:
        proc.stop()


async def test_a_stalled_member_is_left_out_of_the_receipt(tmp_path):
    """Fan-out to members is concurrent and the receipt lists only members
    whose write completed: a member whose socket stalls past the drain
    deadline (one second here) is not among them; when it is the only one the
    receipt is negative, not dead-lettered, and a retry is routed again."""
    async with running_hub(tmp_path, timing=Timing(sweep=0.1, send_stall=1.0)) as server:
        alice, carol = await joined(server.url, "p/alice"), await joined(server.url, "p/carol")
        bob = await RawWs.connect(server.port, rcvbuf=4096)  # registers, then never reads
        await bob.send(text(json.dumps({"sender": "p/bob", "target": "System",
                                        "type": "heartbeat", "payload": "online"})))
        await alice.recv_type("presence_update", agent="p/bob")
        await ask(alice, "p/alice", "channel_create", channel="ops")
        await ask(alice, "p/alice", "channel_invite", channel="ops", invitee="p/carol")
        await ask(carol, "p/carol", "channel_join", channel="ops")
        # bob's join comes over his raw socket (he reads nothing back)
        await ask(alice, "p/alice", "channel_invite", channel="ops", invitee="p/bob")
        await bob.send(text(json.dumps({"sender": "p/bob", "target": "System",
                                        "type": "channel_join", "channel": "ops"})))
        book = server.hub.router.state.extensions["channels"]
        while not book.is_member("ops", "p/bob"):
            await asyncio.sleep(0.01)
        conn = server.hub.endpoints.get(server.hub.router.presence.session_of("p/bob").endpoint)
        loop = asyncio.get_running_loop()
        big = "x" * 60_000
        while conn.write_stalled_for(loop.time()) == 0:
            await alice.chat("p/alice", "all", big, channel="ops")
            await asyncio.sleep(0.01)
        await alice.chat("p/alice", "all", "both?", channel="ops", client_msg_id="s1",
                         receipt_requested=True)
        receipt = await alice.recv_type("delivery_receipt", client_msg_id="s1", timeout=15)
        assert (receipt["delivered"], receipt["recipients"], receipt["matched_recipients"]) == \
            (True, ["p/carol"], ["p/bob", "p/carol"])
        # carol leaves: bob, stalled, is the only member left
        await ask(carol, "p/carol", "channel_leave", channel="ops")
        await alice.chat("p/alice", "all", "bob?", channel="ops", client_msg_id="s2",
                         receipt_requested=True)
        alone = await alice.recv_type("delivery_receipt", client_msg_id="s2", timeout=15)
        assert (alone["delivered"], alone["reason"], alone["recipients"],
                alone["matched_recipients"], alone["dead_lettered"]) == \
            (False, "recipient_transport_unavailable", [], ["p/bob"], False)
        await alice.chat("p/alice", "all", "bob?", channel="ops", client_msg_id="s2",
                         receipt_requested=True)
        again = await alice.recv(lambda f: f.get("type") in ("delivery_receipt", "system")
                                 and f.get("client_msg_id") == "s2", timeout=15)
        assert again["type"] == "delivery_receipt"  # routed again, not a duplicate
        assert again["message_seq"] > alone["message_seq"]
        bob.close()
        await alice.close()
        await carol.close()

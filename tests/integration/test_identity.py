"""Principals on the WebSocket and REDSYN doors, with real hub processes
(docs/identity.md):
a token speaks only for its principal's seats, a takeover stays within the
principal, directed chats reach only their recipients, the journal records
who caused each event, and a change made with `hubd principal` (or a SIGHUP'd
--principals file) applies to a running hub within a second."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

from federation.tls import peer_client_context
from hubd.journal import principals as store
from hubd.state.principals import token_digest
from tests.support.federation import make_pki, site_flags, write_serving_policy
from tests.support.procs import hubd_process
from tests.support.redsyn_client import Client, login
from tests.support.seats import connect, online, refused
from tests.support.wsprobe import WsProbe


def principal(db, *args) -> str:
    out = subprocess.run([sys.executable, "-m", "hubd", "principal", *args, "--db", str(db)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.fixture
def hub(tmp_path):
    # made in this process (the CLI is driven by the running-hub test below)
    db = tmp_path / "hubd.db"
    tokens = {}
    for name, seat in (("alice", "PROJ/alice"), ("bob", "PROJ/bob"),
                       ("mallory", "PROJ/mallory"), ("team", "PROJ/*")):
        store.add(db, name, [seat])
        tokens[name] = store.new_token(db, name, "laptop")
    proc = hubd_process(tmp_path / "hub", db=db).start()
    yield proc, db, tokens
    proc.stop()


async def test_a_token_speaks_only_for_its_principals_seats(hub):
    proc, db, tokens = hub
    # alice's token cannot register bob's seat: refused before anything is registered
    probe = await connect(proc.url, "PROJ/bob", tokens["alice"])
    denied = await refused(probe)
    assert "alice" in denied["payload"] and "PROJ/bob" in denied["payload"]
    assert tokens["alice"] not in json.dumps(denied)
    await probe.close()
    # nor can a wrong token or none at all
    for token in ("hubd_not-a-token", None):
        probe = await WsProbe.open(proc.url)
        await probe.send_json({"sender": "PROJ/alice", "type": "heartbeat", "target": "System",
                               "payload": "online", **({"token": token} if token else {})})
        await refused(probe)
        await probe.close()

    assert proc.get_json("/health")["identity"] == {
        "mode": "principals", "tokenless": "loopback", "source": "journal", "principals": 4,
        "tokens": 4}
    alice = await online(proc.url, "PROJ/alice", tokens["alice"])
    bob = await online(proc.url, "PROJ/bob", tokens["bob"])
    who = await _who(bob)
    assert who == ["PROJ/alice", "PROJ/bob"]
    # nobody else takes over alice's socket: not mallory, who may not speak for
    # her seat, nor the team principal, which may (PROJ/*) but is not alice's
    thief = await connect(proc.url, "PROJ/alice", tokens["mallory"], takeover=True)
    assert "may not speak for 'PROJ/alice'" in (await refused(thief))["payload"]
    await thief.close()
    thief = await connect(proc.url, "PROJ/alice", tokens["team"], takeover=True)
    assert "another principal" in (await refused(thief))["payload"]
    await thief.close()
    assert await _who(bob) == ["PROJ/alice", "PROJ/bob"]
    # alice's own second session may take over (same principal), and her -rx sidecar is hers
    again = await connect(proc.url, "PROJ/alice", tokens["alice"], takeover=True)
    assert (await alice.wait_closed()).code == 4010
    sidecar = await online(proc.url, "PROJ/alice-rx", tokens["alice"])
    for probe in (again, sidecar, bob):
        await probe.close()
    await alice.close()


async def _who(probe: WsProbe) -> list[str]:
    await probe.send_json({"type": "who_request", "sender": probe_name(probe),
                           "target": "System", "payload": ""})
    return (await probe.recv_type("who_snapshot"))["online_agents"]


def probe_name(probe: WsProbe) -> str:
    for frame in probe.frames:
        if frame.get("type") == "presence_update" and frame.get("event") == "joined":
            return frame["agent"]
    raise AssertionError("probe never joined")


async def test_directed_chats_reach_only_their_recipients_and_the_journal_names_who(hub):
    proc, db, tokens = hub
    alice = await online(proc.url, "PROJ/alice", tokens["alice"])
    bob = await online(proc.url, "PROJ/bob", tokens["bob"])
    mallory = await online(proc.url, "PROJ/mallory", tokens["mallory"])
    await alice.chat("PROJ/alice", "PROJ/bob", "for bob only")
    await alice.chat("PROJ/alice", "all", "for everyone")
    got = await bob.recv_type("chat", payload="for bob only")
    assert got["sender"] == "PROJ/alice"
    await mallory.recv_type("chat", payload="for everyone")
    # the directed chat was journaled before the broadcast, so mallory has seen all
    # she will of both: never the directed one, live or in history or a resume
    assert not [f for f in mallory.seen("chat") if f["payload"] == "for bob only"]
    for request in ({"type": "history_request"}, {"type": "resume_request", "since": 0}):
        await mallory.send_json({**request, "sender": "PROJ/mallory", "target": "System"})
        reply = await mallory.recv_type(request["type"].replace("_request", "_snapshot"))
        texts = [m["payload"] for m in reply.get("history", reply.get("messages", []))]
        assert "for everyone" in texts and "for bob only" not in texts
    await bob.send_json({"type": "history_request", "sender": "PROJ/bob", "target": "System"})
    texts = [m["payload"] for m in (await bob.recv_type("history_snapshot"))["history"]]
    assert "for bob only" in texts
    for probe in (alice, bob, mallory):
        await probe.close()
    proc.stop()
    conn = sqlite3.connect(db)
    rows = conn.execute("SELECT principal, payload FROM events WHERE kind = 'chat'").fetchall()
    assert sorted((p, json.loads(t)["payload"]) for p, t in rows) == [
        ("alice", "for bob only"), ("alice", "for everyone")]
    conn.close()
    # no token, only digests, anywhere in the journal or the log
    files = [db, db.with_name(db.name + "-wal")]
    blob = b"".join(f.read_bytes() for f in files if f.exists()) + proc.log().encode()
    for token in tokens.values():
        assert token.encode() not in blob
    assert token_digest(tokens["alice"]).encode() in blob  # the digest is what is kept


async def test_changes_apply_to_a_running_hub_within_a_second(hub):
    proc, db, tokens = hub
    principal(db, "add", "carol", "--seat", "PROJ/carol")
    token = principal(db, "token", "carol")
    started = time.monotonic()  # the change is committed once the command has printed
    while True:  # the new token works once the hub has looked (every 0.5 s)
        probe = await connect(proc.url, "PROJ/carol", token)
        frame = await probe.recv(lambda f: f.get("type") in ("presence_update", "auth_denied"))
        if frame["type"] == "presence_update":
            break
        await probe.close()
        assert time.monotonic() - started < 1.0, "a new token did not work within 1 s"
        await asyncio.sleep(0.05)
    added_after = time.monotonic() - started
    # revoking the token closes its live connection within a second
    principal(db, "revoke-token", "carol", "--label", "default")
    started = time.monotonic()
    closed = await probe.wait_closed(timeout=5)
    revoked_after = time.monotonic() - started
    assert closed.code == 4010 and revoked_after < 1.0, revoked_after
    assert (await probe.recv_type("auth_denied"))["payload"] == "Token revoked."
    await probe.close()
    print(f"token usable after {added_after:.2f} s, revoked connection closed after "
          f"{revoked_after:.2f} s")
    # removing a principal cuts it off the same way
    bob = await online(proc.url, "PROJ/bob", tokens["bob"])
    principal(db, "remove", "bob")
    assert (await bob.wait_closed(timeout=5)).code == 4010
    await bob.close()


async def test_a_principals_file_and_sighup(tmp_path):
    path = tmp_path / "principals.json"

    def write(doc, mode=0o600):
        path.write_text(json.dumps(doc))
        os.chmod(path, mode)

    alice_token, bob_token = "alice-secret-token", "bob-secret-token"
    doc = {"principals": [{"name": "alice", "seats": ["PROJ/alice"],
                           "tokens": [{"sha256": token_digest(alice_token), "label": "l"}]}]}
    # refused at start: readable by others, malformed
    write(doc, 0o644)
    proc = hubd_process(tmp_path / "bad", "--principals", str(path))
    with pytest.raises(Exception):
        proc.start(ready_timeout=10)
    assert "accessible by other users" in proc.log()
    proc.stop()
    write({"principals": [{"name": "alice", "seats": ["PROJ/a*"]}]})
    proc = hubd_process(tmp_path / "bad2", "--principals", str(path))
    with pytest.raises(Exception):
        proc.start(ready_timeout=10)
    assert "seat pattern" in proc.log()
    proc.stop()

    write(doc)
    proc = hubd_process(tmp_path / "hub", "--principals", str(path)).start()
    try:
        alice = await online(proc.url, "PROJ/alice", alice_token)
        # a malformed file on SIGHUP is refused and the old table kept
        path.write_text("{not json")
        proc.signal(signal.SIGHUP)
        await _until(lambda: "reload refused" in proc.log())
        probe = await online(proc.url, "PROJ/alice-rx", alice_token)
        await probe.close()
        # a good one replaces it: bob comes in, alice's token is gone and she is cut off
        write({"principals": [{"name": "bob", "seats": ["PROJ/bob"],
                               "tokens": [{"sha256": token_digest(bob_token)}]}]})
        proc.signal(signal.SIGHUP)
        assert (await alice.wait_closed(timeout=5)).code == 4010
        bob = await online(proc.url, "PROJ/bob", bob_token)
        await bob.close()
        await alice.close()
    finally:
        proc.stop()


async def _until(check, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)


async def test_the_shared_token_speaks_for_every_seat_beside_principals(tmp_path):
    db = tmp_path / "hubd.db"
    store.add(db, "alice", ["PROJ/alice"])
    alice_token = store.new_token(db, "alice")
    proc = hubd_process(tmp_path / "hub", "--token", "shared-secret", db=db).start()
    try:
        ops = await online(proc.url, "OPS/anyone", "shared-secret")
        alice = await online(proc.url, "PROJ/alice", alice_token)
        # the shared token is one principal: it may not take over alice's seat
        thief = await connect(proc.url, "PROJ/alice", "shared-secret", takeover=True)
        assert "another principal" in (await refused(thief))["payload"]
        for probe in (ops, alice, thief):
            await probe.close()
    finally:
        proc.stop()


async def test_a_redsyn_person_is_one_principal_on_both_doors(tmp_path):
    db = tmp_path / "hubd.db"
    joel = login(db, "acme/general/joel", "laptop")  # `hubd redsyn login`
    ana = login(db, "acme/general/ana", "laptop")
    store.add(db, "ops", ["OPS/*"])
    ops = store.new_token(db, "ops")
    proc = hubd_process(tmp_path / "hub", db=db).start()
    try:
        # REDSYN: a node speaks for its person's agents only; a principal that
        # is not a person has no REDSYN node
        assert Client(proc.http_url, joel).call("GET", "/inbox/acme/general/joel/x").status == 200
        assert Client(proc.http_url, joel).call("GET", "/inbox/acme/general/ana/x").status == 403
        answer = Client(proc.http_url, ops).call("GET", "/inbox/acme/general/joel/x")
        assert answer.status == 403 and "not a REDSYN person" in answer.json["error"]
        # the WebSocket door: the same token speaks for the person's seats only
        probe = await online(proc.url, "acme/general/joel/cli", joel)
        await probe.close()
        denied = await refused(await connect(proc.url, "acme/general/ana/cli", joel))
        assert "acme/general/joel" in denied["payload"]
        probe = await online(proc.url, "acme/general/ana/cli", ana)
        await probe.close()
    finally:
        proc.stop()


async def test_a_client_certificate_alone_admits_a_peer_hub_never_an_agent(tmp_path):
    """On a hub with principals, a peer hub may prove itself by its pinned
    TLS client certificate without a token (its forward is served); the same
    certificate without a token cannot register a principal's seat (it is no
    token: it admits no more than no token does)."""
    pki = make_pki(tmp_path / "pki", ["east", "west"])
    policy = write_serving_policy(tmp_path / "west-policy", pki, {"east": ["PROJ"]})
    db = tmp_path / "west.db"
    store.add(db, "bob", ["PROJ/bob"])
    bob_token = store.new_token(db, "bob")
    west = hubd_process(tmp_path / "west", *site_flags(pki, "west", policy).serve,
                        hub_id="west", scheme="wss", db=db).start()
    try:
        context = peer_client_context(pki.file("east", "client", "cert"),
                                      pki.file("east", "client", "key"))
        agent = await WsProbe.open(west.url, ssl=context)
        await agent.register("PROJ/bob")
        assert "needs that principal's token" in (await refused(agent))["payload"]
        await agent.close()

        bob = await WsProbe.open(west.url)
        await bob.register("PROJ/bob", token=bob_token)
        await bob.recv_type("presence_update", agent="PROJ/bob")
        peer = await WsProbe.open(west.url, ssl=context)
        await peer.send_json({"type": "multihub_message_forward", "sender": "east",
                              "target": "west", "forward_id": "f-cert-only", "kind": "chat",
                              "sender_seat": "PROJ/alice", "target_seat": "PROJ/bob",
                              "body": {"payload": "hello from east"}, "payload": ""})
        result = await peer.recv_type("multihub_message_result")
        assert result["disposition"] == "accepted", result
        chat = await bob.recv_type("chat", payload="hello from east")
        assert chat["sender"] == "PROJ/alice@east"
        for probe in (bob, peer):
            await probe.close()
    finally:
        west.stop()


async def test_the_ingress_quota_charges_the_principal(tmp_path):
    """Every session of one principal draws on one bucket; another principal's
    is its own."""
    db = tmp_path / "hubd.db"
    for name, seats in (("alice", ["PROJ/alice", "PROJ/alice-laptop"]), ("bob", ["PROJ/bob"])):
        store.add(db, name, seats)
    tokens = {name: store.new_token(db, name) for name in ("alice", "bob")}
    proc = hubd_process(tmp_path / "hub", "--durable-ingress-events", "3", db=db).start()
    try:
        one = await online(proc.url, "PROJ/alice", tokens["alice"])
        two = await online(proc.url, "PROJ/alice-laptop", tokens["alice"])
        bob = await online(proc.url, "PROJ/bob", tokens["bob"])
        for i, probe in enumerate((one, two, one)):
            await probe.chat(probe_name(probe), "PROJ/bob", f"chat {i}")
            await bob.recv_type("chat", payload=f"chat {i}")
        await two.chat("PROJ/alice-laptop", "PROJ/bob", "one too many")
        assert "quota exceeded" in (await two.recv_type("error"))["payload"]
        await bob.chat("PROJ/bob", "PROJ/alice", "bob's own bucket")
        await one.recv_type("chat", payload="bob's own bucket")
        for probe in (one, two, bob):
            await probe.close()
    finally:
        proc.stop()


async def test_a_redsyn_login_on_an_open_hub_binds_that_persons_seats_only(tmp_path):
    """Issue 22 item 6: `hubd redsyn login` on a running open hub (no --token,
    no principals, loopback) makes the person a principal. Its seats need its
    token from then on (a tokenless session on one is closed, a new one
    refused); every other seat stays as open as before: tokenless agents stay
    connected, talk, and new ones join. The hub logs the change once."""
    db = tmp_path / "hubd.db"
    proc = hubd_process(tmp_path / "hub", db=db).start()
    try:
        assert proc.get_json("/health")["identity"]["mode"] == "open-loopback"
        alice = await online(proc.url, "PROJ/alice", None)
        bob = await online(proc.url, "PROJ/bob", None)
        squatter = await online(proc.url, "acme/dev/joel/cli", None)

        token = login(db, "acme/dev/joel", "laptop")  # the CLI, while the hub runs
        # the squatter's seat is the person's now: its tokenless session goes
        assert "now belongs to a principal" in (await refused(squatter))["payload"]
        identity = proc.get_json("/health")["identity"]
        assert (identity["mode"], identity["tokenless"]) == ("principals", "loopback")

        # every other seat is as open as before: alice and bob stay, and talk
        await alice.chat("PROJ/alice", "PROJ/bob", "still here")
        assert (await bob.recv_type("chat", payload="still here"))["sender"] == "PROJ/alice"
        carol = await online(proc.url, "PROJ/carol", None)
        assert carol.seen("welcome")  # welcomed at connect, as on an open hub
        await carol.chat("PROJ/carol", "PROJ/alice", "new here")
        await alice.recv_type("chat", payload="new here")
        # ... and the grants no more than before: a tokenless claim is served
        await carol.send_json({"type": "claim", "sender": "PROJ/carol", "target": "System",
                               "payload": "t-22-6", "task_id": "t-22-6", "paths": ["src/"],
                               "ttl_seconds": 30, "timestamp": time.time()})
        assert (await carol.recv_type("claim_granted"))["owner"] == "PROJ/carol"

        # the person's seats need its token
        for seat in ("acme/dev/joel/cli", "acme/dev/joel/other"):
            denied = await refused(await connect(proc.url, seat, None))
            assert "needs that principal's token" in denied["payload"], denied
        assert "Invalid" in (await refused(await connect(
            proc.url, "acme/dev/joel/cli", "rsn_not-a-token")))["payload"]
        joel = await online(proc.url, "acme/dev/joel/cli", token)
        assert Client(proc.http_url, token).call("GET", "/inbox/acme/dev/joel/x").status == 200
        await joel.chat("acme/dev/joel/cli", "PROJ/bob", "from a principal")
        await bob.recv_type("chat", payload="from a principal")
        for probe in (alice, bob, carol, joel):
            assert probe.closed is None
            await probe.close()
    finally:
        proc.stop()
    changes = [line for line in proc.log().splitlines() if "identity changed" in line]
    assert len(changes) == 1, changes
    assert "agents without a token keep every other seat" in changes[0]

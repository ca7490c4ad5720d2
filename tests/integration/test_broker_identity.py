"""The broker door's principal (docs/identity.md, "The other doors"), with a real
hub process and its real Unix socket: the door's token maps to one principal
(`--broker-principal`, default `broker`) whose seats are `<namespace>/*`; every
event a broker request causes records that principal's name; a broker session
speaks only for its namespace, and when the hub's table holds a principal of
that name, that principal's seats decide (refused `forbidden`, before anything
is journaled)."""

from __future__ import annotations

import asyncio
import sqlite3
import time

import pytest

from hubd.journal import principals as store
from tests.support.broker_client import BrokerClient, BrokerError
from tests.support.procs import connect_broker, hubd_process
from tests.support.wsprobe import WsProbe


def events(db) -> list[tuple]:
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT seq, kind, principal, payload FROM events "
                            "ORDER BY seq").fetchall()


async def broker(tmp_path) -> BrokerClient:
    return await connect_broker(tmp_path / "hubd.db")


async def refused(call, code: str) -> BrokerError:
    with pytest.raises(BrokerError) as caught:
        await call
    assert caught.value.code == code, caught.value.error
    return caught.value


async def test_broker_principal_records_its_name_and_speaks_only_for_its_namespace(tmp_path):
    db = tmp_path / "hubd.db"
    store.add(db, "alice", ["PROJ/alice"])
    alice_token = store.new_token(db, "alice", "laptop")
    proc = hubd_process(tmp_path, "--broker-principal", "cli-bus", db=db).start()
    try:
        alice = await WsProbe.open(proc.url)
        await alice.send_json({"sender": "PROJ/alice", "target": "System", "type": "heartbeat",
                               "payload": "online", "timestamp": time.time(),
                               "token": alice_token})
        await alice.recv_type("presence_update", agent="PROJ/alice", event="joined")

        c = await broker(tmp_path)
        # the broker cannot even name a seat outside its namespace: a handle is
        # ^[a-z0-9][a-z0-9-]{1,47}$, so <ns>/<handle> is the only seat it makes
        before = len(events(db))
        for handle in ("proj/bob", "PROJ", "bob@west", "local/bob", "*"):
            await refused(c.call("register", clientKind="cli", handle=handle), "bad_request")
            await refused(c.call("session", event="session-start", client="claude",
                                 cliSessionId="s-x", host={"hostPid": 1, "hostStart": 1},
                                 handle=handle), "bad_request")
        assert len(events(db)) == before

        # the door's own principal: every seat local/*; its events record its name
        assert (await c.call("register", clientKind="cli", handle="renn"))["handle"] == "renn"
        other = await broker(tmp_path)
        await other.call("register", clientKind="cli", handle="bob")
        sent = await c.call("send", threadId=None, to=["bob", "PROJ/alice"], body="hello")
        chat = await alice.recv_type("chat")
        assert chat["sender"] == "local/renn" and chat["target"] == "PROJ/alice"
        rows = events(db)[before:]
        assert rows and {principal for _, _, principal, _ in rows} == {"cli-bus"}, rows
        assert "chat" in {kind for _, kind, _, _ in rows}

        # a principal of that name in the hub's table wins: its seats decide
        store.add(db, "cli-bus", ["local/renn", "OPS/*"])
        deadline = time.monotonic() + 5
        while True:
            try:
                await other.call("send", threadId=sent["threadId"], to="renn",
                                 body=f"still? {time.monotonic()}")
            except BrokerError as error:
                assert error.code == "forbidden", error.error
                assert "local/bob" in error.message and "cli-bus" in error.message
                break
            assert time.monotonic() < deadline, "the table change did not apply"
            await asyncio.sleep(0.2)
        before = len(events(db))
        # refused before anything is journaled, for every verb naming the handle
        await refused(other.call("reply", messageId=sent["messageId"], body="no"), "forbidden")
        await refused(other.call("ack", ids=[sent["messageId"]]), "forbidden")
        await refused(other.call("inbox", unreadOnly=False), "forbidden")
        await refused(c.call("hook", event="prompt", handle="bob"), "forbidden")
        await refused(c.call("fetch-push", handle="bob", limit=5), "forbidden")
        newcomer = await broker(tmp_path)
        await refused(newcomer.call("register", clientKind="cli", handle="zed"), "forbidden")
        await refused(newcomer.call("register", clientKind="cli", client="codex"), "forbidden")
        await refused(newcomer.call("session", event="session-start", client="claude",
                                    cliSessionId="s-1", host={"hostPid": 7, "hostStart": 1}),
                      "forbidden")
        assert len(events(db)) == before
        # what it may speak for still works, and still records the principal
        await c.call("send", threadId=sent["threadId"], to="PROJ/alice", body="again")
        assert (await alice.recv_type("chat"))["sender"] == "local/renn"
        rows = events(db)[before:]
        assert rows and {principal for _, _, principal, _ in rows} == {"cli-bus"}
        metrics = proc.get_text("/metrics")
        assert 'hubd_broker_errors_total{code="forbidden"}' in metrics
        for client in (c, other, newcomer):
            await client.close()
        await alice.close()
    finally:
        proc.stop()


async def test_a_seat_a_principal_holds_is_not_the_brokers_to_speak_for(tmp_path):
    """`lalice` (seat local/alice) is online on the WebSocket door: a broker
    client cannot register handle `alice` and speak to PROJ/carol as
    local/alice; a chat to local/alice reaches lalice only; a handle whose
    seat a principal comes to hold is refused from then on, on every verb."""
    db = tmp_path / "hubd.db"
    store.add(db, "lalice", ["local/alice"])
    store.add(db, "carol", ["PROJ/carol"])
    tokens = {name: store.new_token(db, name, "laptop") for name in ("lalice", "carol")}
    proc = hubd_process(tmp_path, db=db).start()
    try:
        seats = {}
        for name, seat in (("lalice", "local/alice"), ("carol", "PROJ/carol")):
            seats[name] = await WsProbe.open(proc.url)
            await seats[name].register(seat, token=tokens[name])
            await seats[name].recv_type("presence_update", agent=seat, event="joined")
        lalice, carol = seats["lalice"], seats["carol"]

        c = await broker(tmp_path)
        before = len(events(db))
        taken = await refused(c.call("register", clientKind="cli", handle="alice"), "forbidden")
        assert "held by principal 'lalice'" in taken.message
        await refused(c.call("session", event="session-start", client="claude",
                             cliSessionId="s-a", host={"hostPid": 41, "hostStart": 1},
                             handle="alice"), "forbidden")
        await refused(c.call("session", event="session-start", client="claude",
                             cliSessionId="s-b", host={"hostPid": 42, "hostStart": 1},
                             title="Alice"), "forbidden")  # the title's slug is alice
        assert len(events(db)) == before  # refused before anything is journaled

        # every other handle of the namespace stays the broker's
        await c.call("register", clientKind="cli", handle="bob")
        await c.call("send", threadId=None, to="PROJ/carol", body="from the broker")
        chat = await carol.recv_type("chat")
        assert chat["sender"] == "local/bob"
        # a chat to local/alice is lalice's, not a broker handle's
        await carol.chat("PROJ/carol", "local/alice", "for alice")
        got = await lalice.recv_type("chat", sender="PROJ/carol")
        assert got["payload"] == "for alice"
        await carol.recv_type("chat", payload="for alice")  # her echo (private routing)
        assert [p["handle"] for p in (await c.call("status"))["peers"]] == ["bob"]

        # a handle registered before a principal held its seat: refused once it does
        dave = await broker(tmp_path)
        await dave.call("register", clientKind="cli", handle="dave")
        await dave.call("send", threadId=None, to="bob", body="while dave is the broker's")
        store.add(db, "ldave", ["local/dave"])
        deadline = time.monotonic() + 5
        while True:
            try:
                await dave.call("send", threadId=None, to="PROJ/carol",
                                body=f"as dave {time.monotonic()}")
                assert (await carol.recv_type("chat"))["sender"] == "local/dave"
            except BrokerError as error:
                assert error.code == "forbidden" and "'ldave'" in error.message, error.error
                break
            assert time.monotonic() < deadline, "the table change did not apply"
            await asyncio.sleep(0.2)
        await refused(dave.call("inbox", unreadOnly=False), "forbidden")
        await refused(c.call("hook", event="prompt", handle="dave"), "forbidden")
        # and a chat to local/dave no longer lands in the broker handle's inbox
        await carol.chat("PROJ/carol", "local/dave", "for the seat, not the handle")
        await carol.chat("PROJ/carol", "local/bob", "after it")
        deadline = time.monotonic() + 5
        while (await c.call("inbox", unreadOnly=True))["unreadTotal"] < 2:  # dave's, carol's
            assert time.monotonic() < deadline, "carol's chat to local/bob did not arrive"
            await asyncio.sleep(0.05)
        # carol's chats are handled in order: the one to local/dave came first
        peers = {p["handle"]: p for p in (await c.call("status"))["peers"]}
        assert peers["dave"]["unread"] == 0
        for client in (c, dave):
            await client.close()
        for probe in (lalice, carol):
            await probe.close()
    finally:
        proc.stop()


def test_broker_principal_and_namespace_flags_are_checked(tmp_path, capsys):
    from hubd.cli import build_parser, config_from_args

    parser = build_parser()
    db = ["--db", str(tmp_path / "x.db")]
    config = config_from_args(parser.parse_args(db), parser)
    assert config.broker.principal == "broker" and config.broker.namespace == "local"
    # the socket and token are named after the journal; naming one leaves the other there
    journal = (tmp_path / "x.db").resolve()
    assert (config.broker.socket_path, config.broker.token_file) == (
        journal.with_name("x.db-bus.sock"), journal.with_name("x.db-bus.token"))
    named = config_from_args(parser.parse_args([*db, "--broker-socket", "/run/b.sock"]), parser)
    assert (str(named.broker.socket_path), named.broker.token_file) == (
        "/run/b.sock", journal.with_name("x.db-bus.token"))
    config = config_from_args(parser.parse_args([*db, "--broker-principal", "cli-bus"]), parser)
    assert config.broker.principal == "cli-bus"
    for flags in (["--broker-principal", "shared-token"], ["--broker-principal", "a b"],
                  ["--broker-namespace", "x@y"], ["--broker-namespace", "*"],
                  ["--broker-namespace", "a/b"]):
        with pytest.raises(SystemExit) as exited:
            config_from_args(parser.parse_args([*db, *flags]), parser)
        assert exited.value.code == 2 and flags[0] in capsys.readouterr().err, flags

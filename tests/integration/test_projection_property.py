"""Property: random frame sequences from several sockets never crash the hub,
and the Router's state always equals a fresh replay of the journal (also across
restarts). Real hub, real sockets, real SQLite."""

import asyncio
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hubd.actors.journal_writer import Flush
from tests.support.inproc import running_hub
from tests.support.wsprobe import WsProbe

NAMES = ["p/a", "p/b", "q/d", "p/a-rx"]
TARGETS = NAMES + ["p", "q", "p/*", "all", "", "p/a,q/d", "p/nobody", "reviewer", "x@y", "p/b@west"]
GARBAGE = ["{not json", "[1]", '{"type": 7}', '{"target": ["x"]}', '{"type": "frobnicate"}',
           '{"type": "ack", "seq": "abc"}', "\"str\"", '{"a": NaN}']

who = st.integers(0, len(NAMES) - 1)
connect = st.tuples(st.just("connect"), who, st.booleans(), st.integers(0, 40))
actions = st.one_of(
    connect, connect,
    st.tuples(st.just("disconnect"), who),
    *[st.tuples(st.just("chat"), who, st.sampled_from(TARGETS), st.booleans(),
                st.sampled_from([None, "c1", "c2", "c3"]), st.sampled_from(["x", "y"]))] * 3,
    st.tuples(st.just("ack"), who, st.integers(-1, 30), st.sampled_from([None, "p/a", "p/b"])),
    st.tuples(st.just("garbage"), who, st.sampled_from(GARBAGE)),
    st.tuples(st.just("query"), who, st.sampled_from(["who_request", "state_request",
                                                      "history_request"])),
)
# Restarts are costly; a few per run are enough to cover replay.
actions = st.one_of(*[actions] * 12, st.tuples(st.just("restart")))


async def settle(server, sockets):
    """Every frame sent so far is handled, and everything it set off is
    committed. One round trip per socket is not enough: a completed write can
    make the Router journal more after the round trip's answer left (a
    receipt's verdict once the recipient's write completed, receipt_notified
    once the sender's did, each a commit later), so the rounds (a who round
    trip on every socket, then a flush of the journal writer) repeat until
    two in a row commit nothing."""
    writer = server.hub.writer
    quiet = 0
    for _ in range(50):
        before = writer.committed_seq
        for name, probe in list(sockets.items()):
            # nothing in these scenarios closes a socket (garbage gets a typed
            # error, names are never taken twice): every socket must answer
            assert probe.closed is None, f"the hub closed {name}'s socket: {probe.closed}"
            await probe.send_json({"sender": name, "type": "who_request", "target": "System"})
            await probe.recv_type("who_snapshot", timeout=10)
        done = asyncio.get_running_loop().create_future()
        await writer.inbox.put(Flush(done))
        await done
        quiet = quiet + 1 if writer.committed_seq == before else 0
        if quiet == 2:
            return
    raise AssertionError("the hub kept committing after 50 rounds of round trips")


async def check(server):
    live = server.hub.router.state
    replayed = await server.hub.load_state()
    assert replayed == live
    assert server.hub.ready


async def scenario(folder: Path, steps, hooks: dict | None = None, check=check):
    """Run `steps`; an action of a kind in `hooks` is `await hook(server, sockets, step)`."""
    hooks = hooks or {}
    sockets: dict[str, WsProbe] = {}
    server_cm = running_hub(folder)
    server = await server_cm.__aenter__()
    try:
        for step in steps:
            kind = step[0]
            if kind in hooks:
                await hooks[kind](server, sockets, step)
            elif kind == "connect":
                name = NAMES[step[1]]
                if name in sockets:
                    continue
                probe = await WsProbe.open(server.url)
                extra = {"roles": ["reviewer"]} if step[2] else {}
                await probe.register(name, mailbox=step[2], since_seq=step[3], **extra)
                sockets[name] = probe
            elif kind == "disconnect":
                probe = sockets.pop(NAMES[step[1]], None)
                if probe is not None:
                    await probe.close()
            elif kind == "restart":
                await settle(server, sockets)
                await check(server)
                for probe in sockets.values():
                    await probe.close()
                sockets.clear()
                await server_cm.__aexit__(None, None, None)
                server_cm = running_hub(folder)
                server = await server_cm.__aenter__()
                await check(server)
            else:
                name = NAMES[step[1]]
                probe = sockets.get(name)
                if probe is None:
                    continue
                if kind == "chat":
                    extra = {"receipt_requested": step[3]}
                    if step[4]:
                        extra["client_msg_id"] = step[4]
                    await probe.chat(name, step[2], step[5], **extra)
                elif kind == "ack":
                    frame = {"sender": name, "type": "ack", "target": "all", "seq": step[2]}
                    if step[3]:
                        frame["mailbox_for"] = step[3]
                    await probe.send_json(frame)
                elif kind == "garbage":
                    await probe.send_text(step[2])
                else:
                    await probe.send_json({"sender": name, "type": step[2], "target": "System"})
        await settle(server, sockets)
        await check(server)
    finally:
        for probe in sockets.values():
            await probe.close()
        await server_cm.__aexit__(None, None, None)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(actions, min_size=8, max_size=60))
def test_projection_equals_replay(steps):
    with tempfile.TemporaryDirectory() as folder:
        asyncio.run(scenario(Path(folder), steps))


async def test_a_journal_from_before_the_routing_service_replays_to_the_same_state(tmp_path):
    """hubd 66f4a31's journal (tests/integration/data/journal_66f4a31): chats
    whose routes name seats only, a REDSYN box filled from such a chat, a
    broker handle's inbox from broker_message events after the chat. Today's
    hubd replays it to the state that hubd did, projection by projection."""
    import json
    import os
    import sqlite3

    from hubd.composition import build_hub
    from tests.support.inproc import test_config
    from tests.support.old_journal import as_of, plain_state

    data = Path(__file__).parent / "data" / "journal_66f4a31"
    db = tmp_path / "hub.db"
    os.close(os.open(db, os.O_CREAT | os.O_WRONLY, 0o600))  # owner-only, as a journal is
    connection = sqlite3.connect(db)
    connection.executescript((data / "journal.sql").read_text())
    connection.close()
    hub = build_hub(test_config(tmp_path, db=db))
    state = await hub.load_state()
    then = json.loads((data / "state.json").read_text())
    assert as_of(plain_state(state), then) == then
    # what the old routes meant: the seat's chat was the REDSYN agent's request
    # (and its reply closed it); the seat's chat back closed ana's request; a
    # thread of three broker messages from separate broker_message events
    redsyn = state.extensions["redsyn"]
    assert redsyn.messages["chat.2"].closed and redsyn.messages["to-ws-1"].closed
    assert redsyn.messages["chat.8"].envelope["reply_to"] == "to-ws-1"
    assert state.extensions["broker"].threads[1].messages == [1, 2, 3]

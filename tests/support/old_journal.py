"""A journal written by an earlier hubd, and the state that hubd replays it to.

Before the routing service (issue 26), a chat's route named its seat
recipients only: a chat to a REDSYN agent landed in its box because the
REDSYN projection derived it from the chat, and a chat to a broker handle was
followed by broker_message events of its own. A hubd after it must replay
such a journal to the same state. `write` drives those ways through an
in-process hub of whatever hubd is imported (run it against the older tree
with PYTHONPATH, as tests/integration/data/README.md says) and returns the
journal as SQL text and its replayed state as plain data (`plain_state`), so
the test can replay the same SQL with today's hubd and compare.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sqlite3
from collections import deque
from pathlib import Path

from hubd.config import BrokerConfig, broker_files_beside
from tests.support.broker_client import BrokerClient
from tests.support.inproc import running_hub
from tests.support.redsyn_client import Client, login
from tests.support.wsprobe import WsProbe


# the WebSocket agent: a seat no principal holds, named as a REDSYN address is
SEAT = "acme/general/sam/desk"


def plain(value):
    """Any projection as JSON-able data, order kept where the state keeps one."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)
                if f.name not in ("appliers", "woken")}
    if isinstance(value, dict):
        return [[plain(k), plain(v)] for k, v in value.items()]
    if isinstance(value, (list, tuple, deque)):
        return [plain(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((plain(v) for v in value), key=repr)
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if hasattr(value, "__dict__"):
        return {k: plain(v) for k, v in vars(value).items()}
    if hasattr(value, "__slots__"):
        return {k: plain(getattr(value, k)) for k in value.__slots__ if hasattr(value, k)}
    return repr(value)


def plain_state(state) -> dict:
    return plain(state)


def as_of(today, then):
    """Today's plain state in the shape of an older one: a dataclass field
    added since (a key `then` lacks) is left out, and only if it is empty
    (None, or an empty container) there: a journal from before it cannot have
    filled it. Everything the older state has is compared as it was."""
    if isinstance(today, dict) and isinstance(then, dict):
        added = {k: v for k, v in today.items() if k not in then}
        assert all(_empty(v) for v in added.values()), added
        return {k: as_of(v, then[k]) for k, v in today.items() if k in then}
    if _named_pairs(today) and _named_pairs(then):  # a projection's dict of parts
        named = dict(then)
        added = {k: v for k, v in today if k not in named}
        assert all(_empty(v) for v in added.values()), added
        return [[k, as_of(v, named[k])] for k, v in today if k in named]
    if isinstance(today, list) and isinstance(then, list) and len(today) == len(then):
        return [as_of(a, b) for a, b in zip(today, then)]
    return today


def _named_pairs(value) -> bool:
    return isinstance(value, list) and bool(value) and all(
        isinstance(v, list) and len(v) == 2 and isinstance(v[0], str) for v in value)


def _empty(value) -> bool:
    """None, an empty container, or a dataclass whose fields are all empty."""
    if isinstance(value, dict):
        return all(_empty(v) for v in value.values())
    return value in (None, [], {}, 0)


async def write(folder: Path) -> tuple[str, dict]:
    """Drive a hub through chats between seats, REDSYN agents and a broker
    handle; the journal as SQL, and the state its hubd replays it to."""
    db = folder / "hub.db"
    ana = await asyncio.to_thread(login, db, "acme/general/ana", "laptop")
    joel = await asyncio.to_thread(login, db, "acme/general/joel", "laptop")
    sock, token = broker_files_beside(db)
    async with running_hub(folder, broker=BrokerConfig(sock, token)) as server:
        http = server.url.replace("ws://", "http://")
        ana_node, joel_node = Client(http, ana), Client(http, joel)
        ws = await WsProbe.open(server.url)
        await ws.recv_type("welcome")
        await ws.register(SEAT)
        await ws.recv_type("presence_update", agent=SEAT, event="joined")
        # a seat to a REDSYN agent: a request in its box, then its reply as a chat
        echo = "acme/general/joel/echo"
        assert (await asyncio.to_thread(joel_node.announce, echo)).status == 200
        await ws.chat(SEAT, echo, "ping")
        [request] = await asyncio.to_thread(joel_node.take_until, echo, 1)
        sent = await asyncio.to_thread(joel_node.send, {
            "id": "echo-1", "kind": "reply", "from": "echo", "reply_to": request["id"],
            "body": {"type": "text/plain", "text": "PONG"}})
        assert sent.status == 201, sent.body
        await ws.recv_type("chat", sender=echo)
        # a REDSYN agent to the seat: a request as a chat, the seat's chat back is its reply
        asked = await asyncio.to_thread(ana_node.send, {
            "id": "to-ws-1", "kind": "request", "from": "cli", "to": SEAT,
            "body": {"type": "text/plain", "text": "hello seat"}})
        assert asked.status == 201, asked.body
        await ws.recv_type("chat", sender="acme/general/ana/cli")
        await ws.chat(SEAT, "acme/general/ana/cli", "hello agent")
        [answer] = await asyncio.to_thread(ana_node.take_until, "acme/general/ana/cli", 1)
        assert answer["kind"] == "reply"
        # a seat to a broker handle: a new thread; the handle's reply; the seat's reply
        broker = await BrokerClient.connect(str(sock), token.read_text().strip())
        session = await broker.call("session", event="session-start", client="claude",
                                    cliSessionId="old-1", host={"hostPid": 7, "hostStart": 1},
                                    listen=True)
        handle = session["handle"]
        await ws.chat(SEAT, f"local/{handle}", "to the handle")
        push = (await broker.event("push"))["payload"]
        await broker.call("reply", messageId=push["message"]["messageId"], body="from the handle")
        reply = await ws.recv_type("chat", sender=f"local/{handle}")
        await ws.chat(SEAT, f"local/{handle}",
                      f"m{reply['metadata']['broker']['messageId']} agree: and back")
        await broker.event("push")
        # and a dead letter; the who answer comes after its commit
        await ws.chat(SEAT, "p/nobody", "anyone?")
        await ws.send_json({"sender": SEAT, "type": "who_request"})
        await ws.recv_type("who_snapshot")
        await broker.close()
        await ws.close()
        replayed = await server.hub.load_state()
    connection = sqlite3.connect(db)
    try:
        sql = "\n".join(connection.iterdump())
    finally:
        connection.close()
    return sql, plain_state(replayed)


if __name__ == "__main__":  # python -m tests.support.old_journal OUT_FOLDER
    import json
    import sys
    import tempfile

    out = Path(sys.argv[1])
    with tempfile.TemporaryDirectory() as scratch:
        sql, state = asyncio.run(write(Path(scratch)))
    (out / "journal.sql").write_text(sql + "\n")
    (out / "state.json").write_text(json.dumps(state, indent=1, sort_keys=False) + "\n")

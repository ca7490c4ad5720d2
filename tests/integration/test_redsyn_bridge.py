"""REDSYN agents and WebSocket agents (the published reference client) talk
to each other by name through one hub: a REDSYN address is the hub seat of
the same name. A person is one principal on both doors: wsbob's WebSocket
agents connect with a token of the person acme/general/wsbob."""

from __future__ import annotations

import pytest

from tests.support.procs import hubd_process
from tests.support.redsyn_client import Client, login
from tests.support.refclient import RefClient

pytestmark = pytest.mark.interop


@pytest.fixture
def hub(tmp_path):
    db = tmp_path / "hubd.db"
    tokens = {"ana": login(db, "acme/general/ana", "laptop"),
              "joel": login(db, "acme/general/joel", "laptop"),
              "wsbob": login(db, "acme/general/wsbob", "desktop")}
    proc = hubd_process(tmp_path / "hub", db=db).start()
    ref = RefClient(proc.url, tmp_path / "client-home", token=tokens["wsbob"])
    yield proc, ref, Client(proc.http_url, tokens["ana"]), Client(proc.http_url, tokens["joel"])
    ref.stop_all()
    proc.stop()


def test_a_redsyn_request_to_a_websocket_seat_and_its_reply(hub):
    proc, ref, ana, _ = hub
    helper = ref.agent("acme/general/wsbob/helper")
    since = helper.mark()
    sent = ana.send({"id": "to-ws-1", "kind": "request", "from": "cli",
                     "to": "acme/general/wsbob/helper",
                     "body": {"type": "text/plain", "text": "hello over there"}})
    assert sent.status == 201, sent.body
    assert sent.json["to"] == "acme/general/wsbob/helper"
    chat = helper.wait_frame(since=since, type="chat", sender="acme/general/ana/cli")
    assert chat["payload"] == "hello over there"
    assert chat["redsyn"]["id"] == "to-ws-1" and chat["redsyn"]["kind"] == "request"
    assert chat["redsyn"]["from"] == sent.json["from"]

    helper.chat("acme/general/ana/cli", "HELLO OVER THERE")
    [reply] = ana.take_until("acme/general/ana/cli", 1)
    assert reply["kind"] == "reply" and reply["reply_to"] == "to-ws-1"
    assert reply["from"] == "acme/general/wsbob/helper"
    assert reply["to"] == sent.json["from"] and reply["thread"] == sent.json["thread"]
    assert reply["body"] == {"type": "text/plain", "text": "HELLO OVER THERE"}
    assert ana.ack("acme/general/ana/cli", [reply["id"]]).json["acked"] == [reply["id"]]
    # the reply closed the request: a second chat is a new request of its own
    helper.chat("acme/general/ana/cli", "anything else?")
    [again] = ana.take_until("acme/general/ana/cli", 1)
    assert again["kind"] == "request" and again["reply_to"] is None


def test_a_websocket_chat_to_a_redsyn_agent_and_its_reply(hub):
    proc, ref, _, joel = hub
    assert joel.announce("acme/general/joel/echo", description="shouts back").status == 200
    caller = ref.agent("acme/general/wsbob/caller")
    since = caller.mark()
    caller.chat("acme/general/joel/echo", "ping")
    [request] = joel.take_until("acme/general/joel/echo", 1)
    assert request["kind"] == "request" and request["from"] == "acme/general/wsbob/caller"
    assert request["body"] == {"type": "text/plain", "text": "ping"}
    assert request["to"].startswith("acme/general/joel/echo#s")
    answer = joel.send({"id": "echo-1", "kind": "reply", "from": "echo",
                        "reply_to": request["id"], "body": {"type": "text/plain",
                                                            "text": "PING"}})
    assert answer.status == 201, answer.body
    chat = caller.wait_frame(since=since, type="chat", sender="acme/general/joel/echo")
    assert chat["payload"] == "PING" and chat["redsyn"]["reply_to"] == request["id"]
    # the reply closed the request in the REDSYN agent's inbox
    status = joel.call("GET", "/agents/acme/general/joel/echo").json
    assert status["waiting"] == 0


def test_the_bridge_survives_a_restart(hub, tmp_path):
    proc, ref, ana, joel = hub
    assert joel.announce("acme/general/joel/echo").status == 200
    caller = ref.agent("acme/general/wsbob/caller")
    caller.chat("acme/general/joel/echo", "before restart")
    [first] = joel.take_until("acme/general/joel/echo", 1, lease=1)  # and not confirmed
    ref.stop_all()
    proc.stop()
    proc.start()
    [again] = joel.take_until("acme/general/joel/echo", 1)
    assert again["id"] == first["id"] and again["attempts"] == 2
    assert again["from"] == "acme/general/wsbob/caller"

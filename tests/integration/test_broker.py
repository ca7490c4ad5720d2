"""The local broker door (seed 004) against a real hubd process over its real
Unix socket, driven by a client written from the seed alone."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import stat
from pathlib import Path

import pytest

from tests.support.broker_client import BrokerClient, BrokerError
from tests.support.procs import hubd_process

HOST = {"hostPid": 4242, "hostStart": 17}


@pytest.fixture
def hub(tmp_path):
    proc = hubd_process(tmp_path).start()
    yield proc
    proc.stop()


@pytest.fixture
def unlimited_hub(tmp_path):
    proc = hubd_process(tmp_path, "--broker-no-rate-limit").start()
    yield proc
    proc.stop()


def broker_of(proc, tmp_path) -> tuple[str, str]:
    path = tmp_path / "bus.sock"
    return str(path), (tmp_path / "bus.token").read_text().strip()


async def client(tmp_path) -> BrokerClient:
    path, token = broker_of(None, tmp_path)
    return await BrokerClient.connect(path, token)


async def session(tmp_path, cli_id: str, pid: int, listen=True, **extra) -> tuple[BrokerClient,
                                                                                   str]:
    c = await client(tmp_path)
    result = await c.call("session", event="session-start", client="claude",
                          cliSessionId=cli_id, host={"hostPid": pid, "hostStart": 1},
                          listen=listen, **extra)
    return c, result["handle"]


def assert_keys(obj: dict, *keys: str) -> None:
    assert set(keys) <= set(obj), (keys, obj)


async def test_every_verb_and_its_result_shape(hub, tmp_path):
    owner = await client(tmp_path)
    reg = await owner.call("register", clientKind="cli", handle="renn", owner=True,
                           display="Renn", ancestors=[999999])
    assert reg == {"handle": "renn", "owner": True, "via": None}
    a, a_handle = await session(tmp_path, "sess-a", 5001, cwd="/src/a")
    assert a_handle == "claude-1"
    b, b_handle = await session(tmp_path, "sess-b", 5002, listen=False)
    assert b_handle == "claude-2"

    sent = await owner.call("send", threadId=None, to=[a_handle, b_handle], body="Ship it?\nok")
    assert_keys(sent, "messageId", "threadId", "seq", "via", "deliveries")
    assert sent["deliveries"] == [{"to": "claude-1", "state": "sent"},
                                  {"to": "claude-2", "state": "queued"}]
    push = await a.event("push")
    assert_keys(push["payload"], "message", "mode", "footer", "text")
    assert push["payload"]["text"].startswith(f"[murmur m{sent['messageId']} from renn")

    assert await a.call("delivered", ids=[sent["messageId"]]) == {"delivered": [sent["messageId"]]}
    rep = await a.call("reply", messageId=sent["messageId"], body="yes", verdict="agree")
    assert_keys(rep, "messageId", "threadId", "seq")
    assert rep["seq"] == 2
    assert await b.call("ack", ids=[sent["messageId"]]) == {"acknowledged": [sent["messageId"]]}
    read = await b.call("read", ids=[rep["messageId"]])
    assert read["messages"][0]["body"] == "yes" and read["messages"][0]["verdict"] == "agree"
    inbox = await b.call("inbox", unreadOnly=False)
    assert_keys(inbox, "handle", "unreadTotal", "threads")
    thread = await owner.call("thread", threadId=sent["threadId"], sinceSeq=None, full=True)
    assert_keys(thread, "threadId", "latestSeq", "messages")
    collect = await owner.call("collect", threadId=sent["threadId"])
    assert_keys(collect, "threadId", "askMessageId", "recipients", "verdictTally")
    wait = await owner.call("wait", threadId=sent["threadId"], until="any_replied",
                            timeoutMs=1000)
    assert wait["conditionMet"] is True and wait["timedOut"] is False
    assert_keys(wait, "threadId", "conditionMet", "timedOut", "matrix")
    group = await owner.call("groups", action="create", name="pair",
                             members=[a_handle, b_handle])
    assert group == {"group": {"name": "pair", "members": [a_handle, b_handle]}}
    assert (await owner.call("groups", action="list"))["groups"] == [group["group"]]
    status = await owner.call("status")
    assert_keys(status, "now", "peers")
    assert {p["handle"] for p in status["peers"]} == {"renn", a_handle, b_handle}
    loner = await client(tmp_path)
    await loner.call("register", clientKind="hook", handle="loner")
    await loner.close()
    assert await owner.call("prune") == {"removed": ["loner"]}
    to_b = await owner.call("send", threadId=None, to=b_handle, body="for the hook")
    hook = await b.call("hook", event="prompt", sessionHint="sess-b")
    assert_keys(hook, "handle", "event", "count", "messages", "text")
    assert hook["handle"] == b_handle and hook["count"] >= 1
    assert f"[murmur m{to_b['messageId']}" in hook["text"]
    await owner.call("send", threadId=None, to=b_handle, body="for fetch")
    fetched = await b.call("fetch-push", handle=b_handle, limit=10)
    assert_keys(fetched, "messages", "texts")
    assert len(fetched["texts"]) == 1 and "for fetch" in fetched["texts"][0]
    with pytest.raises(BrokerError) as failed:
        await b.call("native-register", handle=b_handle, socketPath=str(tmp_path / "nope.sock"),
                     token="t")
    assert failed.value.code == "native_failed"
    again = await owner.request("auth", token="x")
    assert again["ok"] is False and again["error"]["code"] == "bad_request"
    for c in (owner, a, b):
        await c.close()

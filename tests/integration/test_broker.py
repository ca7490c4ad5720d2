"""The local broker door (seed 004) against a real hubd process over its real
Unix socket, driven by a client written from the seed alone."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import stat
import time

import pytest

from tests.support.broker_client import BrokerClient, BrokerError
from tests.support.procs import broker_files, connect_broker, hubd_process



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


def broker_of(tmp_path) -> tuple[str, str]:
    path, token = broker_files(tmp_path / "hubd.db")
    return str(path), token.read_text().strip()


async def client(tmp_path) -> BrokerClient:
    return await connect_broker(tmp_path / "hubd.db")


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


async def test_two_sessions_hold_a_thread_with_verdicts_collect_and_wait(hub, tmp_path):
    owner = await client(tmp_path)
    await owner.call("register", clientKind="cli", handle="renn", owner=True,
                     ancestors=[7001])
    a, a_handle = await session(tmp_path, "s-a", 7001, title="Parser Work")
    b, b_handle = await session(tmp_path, "s-b", 7002, title="Reviewer")
    assert (a_handle, b_handle) == ("parser-work", "reviewer")
    # the owner's connection resolves its via from its ancestors: the session on pid 7001
    await owner.close()
    owner = await client(tmp_path)
    reg = await owner.call("register", clientKind="cli", handle="renn", owner=True,
                           ancestors=[1, 7001])
    assert reg["via"] == "parser-work"
    sent = await owner.call("send", threadId=None, to=["parser-work", "reviewer"],
                            body="Merge the parser change?")
    thread_id, ask = sent["threadId"], sent["messageId"]
    assert sent["via"] == "parser-work"
    # parser-work is both a recipient and the via: one delivery
    assert [d["to"] for d in sent["deliveries"]] == ["parser-work", "reviewer"]
    push_b = (await b.event("push"))["payload"]
    assert push_b["text"] == (
        f"[murmur m{ask} from renn via parser-work | thread {thread_id} #1]\n"
        "Merge the parser change?\n"
        f"(reply with messageId {ask}, verdict agree, disagree or info; "
        f"the reply goes to everyone in thread {thread_id})")
    assert push_b["message"]["via"] == "parser-work" and push_b["mode"] == "push"
    await a.event("push")

    # a wait that is met before its timeout
    waiter = await client(tmp_path)
    await waiter.call("register", clientKind="cli", handle="watcher")
    wait_id = waiter.take_id()
    await waiter.send_line({"v": 2, "id": wait_id, "type": "wait", "threadId": thread_id,
                            "until": "all_replied", "timeoutMs": 300000})
    r1 = await a.call("reply", messageId=ask, body="Yes, tests pass.", verdict="agree")
    # the reply goes to every sender, recipient and via minus the replier
    push = (await b.event("push"))["payload"]
    assert push["message"]["from"] == "parser-work" and push["message"]["verdict"] == "agree"
    assert push["text"].startswith(f"[murmur m{r1['messageId']} from parser-work | thread "
                                   f"{thread_id} #2 | reply to m{ask} | agree]")
    assert waiter.answers.empty()  # not all replied yet
    await b.call("reply", messageId=ask, body="One nit.", verdict="disagree")
    done = await waiter.answer(timeout=10)
    assert done["id"] == wait_id and done["ok"]
    assert done["result"]["conditionMet"] is True and done["result"]["timedOut"] is False
    assert [(row["handle"], row["state"], row["verdict"]) for row in done["result"]["matrix"]] \
        == [("parser-work", "replied", "agree"), ("reviewer", "replied", "disagree")]

    collect = await owner.call("collect", threadId=thread_id)
    assert collect["askMessageId"] == ask
    assert collect["verdictTally"] == {"agree": 1, "disagree": 1, "info": 0, "none": 0}

    # a wait that times out: a new thread nobody answers
    quiet = await owner.call("send", threadId=None, to="reviewer", body="Anyone?")
    timed = await owner.call("wait", threadId=quiet["threadId"], until="any_replied",
                             timeoutMs=300)
    assert timed == {"threadId": quiet["threadId"], "conditionMet": False, "timedOut": True,
                     "matrix": [{"handle": "reviewer", "state": "sent", "verdict": None,
                                 "replyId": None}]}

    # thread views: sinceSeq, full, messageId
    view = await owner.call("thread", threadId=thread_id, sinceSeq=None, full=False)
    assert view["latestSeq"] == 3 and [m["seq"] for m in view["messages"]] == [1, 2, 3]
    assert "body" not in view["messages"][0]
    since = await owner.call("thread", threadId=thread_id, sinceSeq=2, full=True)
    assert [m["body"] for m in since["messages"]] == ["One nit."]
    r3 = await owner.call("reply", messageId=r1["messageId"], body="Thanks")
    only = await owner.call("thread", threadId=thread_id, sinceSeq=None, full=False,
                            messageId=r1["messageId"])
    assert [m["messageId"] for m in only["messages"]] == [r1["messageId"], r3["messageId"]]
    assert only["messages"][1]["body"] == "Thanks"
    bad = await owner.request("thread", threadId=thread_id, sinceSeq=None, full=False,
                              messageId=quiet["messageId"])
    assert bad["error"]["code"] == "bad_request"

    # unread counts: reviewer's reply answered the ask and r1 (replied); r3 and
    # "Anyone?" are unread
    inbox = await b.call("inbox", unreadOnly=True)
    assert inbox["handle"] == "reviewer" and inbox["unreadTotal"] == 2
    assert sorted(m["messageId"] for t in inbox["threads"] for m in t["messages"]) == sorted([
        r3["messageId"], quiet["messageId"]])
    await b.call("ack", ids=[r3["messageId"]])
    assert (await b.call("inbox", unreadOnly=True))["unreadTotal"] == 1
    for c in (owner, a, b, waiter):
        await c.close()


async def test_unread_and_thread_caps_are_answered(unlimited_hub, tmp_path):
    sender = await client(tmp_path)
    await sender.call("register", clientKind="cli", handle="flood")
    target = await client(tmp_path)
    await target.call("register", clientKind="cli", handle="inbox-owner")
    first = await sender.call("send", threadId=None, to="inbox-owner", body="m0")
    for i in range(1, 200):
        await sender.call("send", threadId=None, to="inbox-owner", body=f"m{i}")
    assert (await target.call("inbox", unreadOnly=True))["unreadTotal"] == 200
    full = await sender.request("send", threadId=None, to="inbox-owner", body="one more")
    assert full["error"]["code"] == "cap_inbox"
    assert (await target.call("inbox", unreadOnly=True))["unreadTotal"] == 200
    await target.call("ack", ids=[first["messageId"]])
    await sender.call("send", threadId=None, to="inbox-owner", body="fits again")
    # the thread cap: 500 messages (the other side acks as it goes)
    third = await client(tmp_path)
    await third.call("register", clientKind="cli", handle="third")
    ask = await sender.call("send", threadId=None, to="third", body="long thread")
    ids = [ask["messageId"]]
    for i in range(499):
        r = await sender.call("send", threadId=ask["threadId"], to="third", body=f"n{i}")
        ids.append(r["messageId"])
        if len(ids) >= 150:
            await third.call("ack", ids=ids)
            ids = []
    capped = await third.request("reply", messageId=ask["messageId"], body="too late")
    assert capped["error"]["code"] == "cap_thread"
    view = await sender.call("thread", threadId=ask["threadId"], sinceSeq=495, full=False)
    assert view["latestSeq"] == 500
    for c in (sender, target, third):
        await c.close()


async def test_socket_token_limits_and_bad_lines(hub, tmp_path):
    sock, token_file = broker_files(tmp_path / "hubd.db")
    assert stat.S_ISSOCK(sock.stat().st_mode)
    assert stat.S_IMODE(sock.stat().st_mode) == 0o600
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    token = token_file.read_text().strip()
    assert len(token) >= 32

    # the first line must be auth; a wrong token is refused and the connection closed
    c = await BrokerClient.connect(str(sock))
    first = await c.request("status")
    assert first["error"]["code"] == "auth_required"
    wrong = await c.request("auth", token="not-the-token")
    assert wrong["error"]["code"] == "bad_token"
    await asyncio.wait_for(c.closed.wait(), 5)

    c = await BrokerClient.connect(str(sock), token)
    await c.call("register", clientKind="cli", handle="alice")
    other = await client(tmp_path)
    await other.call("register", clientKind="cli", handle="bob")
    # duplicate window
    await c.call("send", threadId=None, to="bob", body="same words")
    dup = await c.request("send", threadId=None, to="bob", body="same words")
    assert dup["error"]["code"] == "duplicate" and dup["error"]["messageId"] >= 1
    # rate: 20 sends per 60 s per handle (the first send counted)
    for i in range(19):
        await c.call("send", threadId=None, to="bob", body=f"n{i}")
    limited = await c.request("send", threadId=None, to="bob", body="twenty-first")
    assert limited["error"]["code"] == "rate_limited"
    assert (await other.call("inbox", unreadOnly=True))["unreadTotal"] == 20

    # malformed lines, unknown verbs and bad fields: typed errors, connection usable
    await c.send_raw(b"{not json\n")
    assert (await c.answer())["error"]["code"] == "bad_request"
    await c.send_line({"v": 2, "id": 900, "type": "frobnicate"})
    bad = await c.answer()
    assert bad["id"] == 900 and bad["error"]["code"] == "bad_request"
    await c.send_line({"v": 2, "id": 5, "type": "status"})
    stale = await c.answer()
    assert stale["id"] == 5 and "does not follow" in stale["error"]["message"]
    c.next_id = 1000
    unknown = await c.request("send", threadId=None, to="nobody-here", body="x")
    assert unknown["error"]["code"] == "unknown_handle"
    # a line over 1 MiB is refused, and the next line is served
    await c.send_raw(b'{"v":2,"id":2000,"type":"send","body":"' + b"x" * (1024 * 1024) +
                     b'"}\n')
    too_long = await c.answer(timeout=20)
    assert too_long["ok"] is False and too_long["error"]["code"] == "bad_request"
    assert too_long["id"] is None and "exceeds" in too_long["error"]["message"]
    c.next_id = 2001
    assert (await c.call("status"))["peers"]
    for x in (c, other):
        await x.close()


async def test_text_that_is_not_utf8_is_refused_while_another_client_sends(hub, tmp_path):
    """Raw bytes that do not decode, and escapes of lone surrogates, in any
    string of a line: the line is answered bad_request naming the fault, nothing
    of it is stored, its connection stays usable, and another client's send at
    the same moment is served."""
    mallory, alice, bob = [await client(tmp_path) for _ in range(3)]
    for c, handle in ((mallory, "mallory"), (alice, "alice"), (bob, "bob")):
        await c.call("register", clientKind="cli", handle=handle)
    forms = [
        ('"body":"\xed\xa0\x80"', "byte 0xED"),  # a surrogate, encoded
        ('"body":"ok \xff"', "byte 0xFF"),
        ('"body":"\\ud800"', "escape \\ud800"),
        ('"body":"pair \\ud83d\\ude00 then \\udc00"', "escape \\udc00"),
        ('"body":"x","references":[],"mode":"push","extra":"\\udbff"', "escape \\udbff"),
    ]
    for n, (body, fault) in enumerate(forms):
        id_ = mallory.take_id()
        raw = (f'{{"v":2,"id":{id_},"type":"send","threadId":null,"to":"bob",{body}}}\n'
               .encode("latin-1"))
        _, answered, served = await asyncio.gather(
            mallory.send_raw(raw), mallory.answer(),
            alice.call("send", threadId=None, to="bob", body=f"fine {n}"))
        assert answered["id"] == id_ and answered["error"]["code"] == "bad_request", answered
        assert "not valid UTF-8" in answered["error"]["message"], answered
        assert fault in answered["error"]["message"], answered
        assert served["deliveries"] == [{"to": "bob", "state": "queued"}]
    # the refusing connection is still usable, and a bad register changed nothing
    id_ = mallory.take_id()
    await mallory.send_raw(f'{{"v":2,"id":{id_},"type":"register","clientKind":"cli",'
                           f'"handle":"mallory","display":"\\ud800"}}\n'.encode())
    assert (await mallory.answer())["error"]["code"] == "bad_request"
    await mallory.call("send", threadId=None, to="bob", body="now valid")
    inbox = await bob.call("inbox", unreadOnly=True)
    bodies = sorted(m["firstLine"] for t in inbox["threads"] for m in t["messages"])
    assert bodies == sorted([f"fine {n}" for n in range(len(forms))] + ["now valid"])
    peers = {p["handle"]: p for p in (await bob.call("status"))["peers"]}
    assert peers["mallory"]["display"] is None
    assert "hubd_broker_refused_lines_total 6.0" in hub.get_text("/metrics")
    for c in (mallory, alice, bob):
        await c.close()


async def test_sigkill_mid_thread_loses_no_answered_message(tmp_path):
    proc = hubd_process(tmp_path, "--broker-no-rate-limit").start()
    answered: list[tuple[int, int, str]] = []
    try:
        asker = await client(tmp_path)
        await asker.call("register", clientKind="cli", handle="asker")
        peers = []
        for n in range(3):
            p = await client(tmp_path)
            await p.call("register", clientKind="cli", handle=f"peer-{n}")
            peers.append(p)
        ask = await asker.call("send", threadId=None, to=["peer-0", "peer-1", "peer-2"],
                               body="count with me")
        thread_id = ask["threadId"]
        answered.append((ask["messageId"], ask["seq"], "count with me"))

        async def replier(p, n):
            i = 0
            while True:
                body = f"peer-{n} says {i}"
                r = await p.call("reply", messageId=ask["messageId"], body=body)
                answered.append((r["messageId"], r["seq"], body))
                i += 1

        tasks = [asyncio.ensure_future(replier(p, n)) for n, p in enumerate(peers)]
        while len(answered) < 60:
            await asyncio.sleep(0.01)
        os.kill(proc.pid, signal.SIGKILL)
        proc.proc.wait()
        await asyncio.gather(*tasks, return_exceptions=True)
        for x in [asker, *peers]:
            x.writer.transport.abort()
    finally:
        proc.stop()
    restarted = hubd_process(tmp_path, "--broker-no-rate-limit").start()
    try:
        reader = await client(tmp_path)
        view = await reader.call("thread", threadId=thread_id, sinceSeq=None, full=True)
        by_id = {}
        for m in view["messages"]:
            assert m["messageId"] not in by_id, "a message is in its thread twice"
            by_id[m["messageId"]] = (m["seq"], m["body"])
        for message_id, seq, body in answered:
            assert by_id.get(message_id) == (seq, body), message_id
        assert [m["seq"] for m in view["messages"]] == list(range(1, len(view["messages"]) + 1))
        await reader.close()
    finally:
        restarted.stop()


async def test_pipelined_lines_are_answered_strictly_in_order(hub, tmp_path):
    c = await client(tmp_path)
    other = await client(tmp_path)
    await other.call("register", clientKind="cli", handle="bob")
    lines = [
        {"v": 2, "id": 10, "type": "register", "clientKind": "cli", "handle": "alice"},
        {"v": 2, "id": 11, "type": "send", "threadId": None, "to": "bob", "body": "one"},
        {"v": 2, "id": 12, "type": "send", "threadId": None, "to": "ghost", "body": "x"},
        "garbage",
        {"v": 2, "id": 13, "type": "send", "threadId": 1, "to": "bob", "body": "two"},
        {"v": 2, "id": 14, "type": "thread", "threadId": 1, "sinceSeq": None, "full": True},
        {"v": 2, "id": 15, "type": "wait", "threadId": 1, "until": "any_replied",
         "timeoutMs": 200},
        {"v": 2, "id": 16, "type": "status"},
    ]
    data = b"".join((line.encode() if isinstance(line, str) else json.dumps(line).encode())
                    + b"\n" for line in lines)
    await c.send_raw(data)
    answers = [await c.answer() for _ in lines]
    assert [a["id"] for a in answers] == [10, 11, 12, None, 13, 14, 15, 16]
    assert [a["ok"] for a in answers] == [True, True, False, False, True, True, True, True]
    assert answers[2]["error"]["code"] == "unknown_handle"
    # the thread view saw both sends: lines were handled in order
    assert [m["body"] for m in answers[5]["result"]["messages"]] == ["one", "two"]
    assert answers[6]["result"]["timedOut"] is True
    await c.close()
    await other.close()


async def test_queued_messages_are_pushed_on_listen_and_senders_notified(hub, tmp_path):
    sender, sender_handle = await session(tmp_path, "s-send", 8001, handle="sender")
    late = await client(tmp_path)
    await late.call("register", clientKind="adapter", handle="late")
    sent = await sender.call("send", threadId=None, to="late", body="while you were away")
    assert sent["deliveries"] == [{"to": "late", "state": "queued"}]
    offline = (await sender.event("notification"))["payload"]
    assert offline == [{"kind": "peer_offline", "handle": "late", "threadId": sent["threadId"],
                        "messageId": sent["messageId"],
                        "text": f"late is not listening; m{sent['messageId']} (thread "
                                f"{sent['threadId']}) is queued for it"}]
    silent = await sender.call("send", threadId=None, to="late", body="no push", mode="silent")
    # late starts listening: the queued push-mode message arrives, the silent one does not
    await late.close()
    late, _ = await session(tmp_path, "s-late", 8002, handle="late")
    push = (await late.event("push"))["payload"]
    assert push["message"]["messageId"] == sent["messageId"]
    assert late.pending_events() == []
    inbox = await late.call("inbox", unreadOnly=True)
    assert sorted(m["state"] for t in inbox["threads"] for m in t["messages"]) == [
        "queued", "sent"]
    # the sender's next notification is held by the 60 s batch window: a queued
    # delivery becoming sent is still visible in the thread and collect
    collect = await sender.call("collect", threadId=sent["threadId"])
    assert collect["recipients"][0]["state"] == "sent"
    assert silent["deliveries"] == [{"to": "late", "state": "queued"}]
    # a renamed session's connection follows its handle
    renamed = await late.call("session", event="prompt", client="claude", cliSessionId="s-late",
                              host={"hostPid": 8002, "hostStart": 1}, title="Late Arrival")
    assert renamed == {"handle": "late"}  # pinned by the explicit handle: no rename
    auto, auto_handle = await session(tmp_path, "s-auto", 8003)
    renamed = await auto.call("session", event="prompt", client="claude", cliSessionId="s-auto",
                              host={"hostPid": 8003, "hostStart": 1}, title="Late Arrival")
    assert renamed == {"handle": "late-arrival"}
    await sender.call("send", threadId=None, to="late-arrival", body="after the rename")
    push = (await auto.event("push"))["payload"]["message"]
    assert push["to"] == ["late-arrival"] and push["body"] == "after the rename"
    status = await sender.call("status")
    peer = {p["handle"]: p for p in status["peers"]}
    assert auto_handle not in peer and peer["late-arrival"]["listening"] is True
    assert peer["late-arrival"]["presence"] == "busy"
    for c in (sender, late, auto):
        await c.close()


def test_broker_flags(tmp_path):
    # --no-broker: no socket, no token file
    off = hubd_process(tmp_path / "off", "--no-broker").start()
    try:
        assert [p.name for p in (tmp_path / "off").iterdir() if "-bus." in p.name] == []
    finally:
        off.stop()
    # a token file others can read is refused at start
    loose = tmp_path / "loose"
    loose.mkdir()
    _, loose_token = broker_files(loose / "hubd.db")
    loose_token.write_text("secret\n")
    os.chmod(loose_token, 0o644)
    refused = hubd_process(loose)
    with pytest.raises(RuntimeError):
        refused.start()
    assert "accessible by other users" in refused.log()
    refused.stop()


async def test_a_second_hub_on_a_live_socket_refuses_and_leaves_it_serving(tmp_path):
    first = hubd_process(tmp_path / "first", hub_id="first").start()
    try:
        sock, token_file = broker_files(tmp_path / "first" / "hubd.db")
        second = hubd_process(tmp_path / "second", "--broker-socket", str(sock),
                              "--broker-token-file", str(token_file),
                              hub_id="second")
        with pytest.raises(RuntimeError):
            second.start()
        assert "another process serves the broker socket" in second.log()
        second.stop()
        # the refused hub closed what it opened, not the first hub's socket
        assert sock.exists()
        c = await client(tmp_path / "first")
        assert (await c.call("status"))["peers"] == []
        await c.close()
    finally:
        first.stop()


async def test_two_hubs_whose_journals_share_a_folder_each_serve_their_own_broker(tmp_path):
    """`--db hubs/east.db` and `--db hubs/west.db`, no broker flag: each hub's
    socket and token are named after its journal, so both start."""
    folder = tmp_path / "hubs"
    east = hubd_process(folder, db=folder / "east.db", hub_id="east").start()
    try:
        west = hubd_process(folder, db=folder / "west.db", hub_id="west").start()
        try:
            names = {p.name for p in folder.iterdir() if "-bus." in p.name}
            assert names == {"east.db-bus.sock", "east.db-bus.token", "west.db-bus.sock",
                             "west.db-bus.token"}
            tokens = {(folder / f"{hub}.db-bus.token").read_text() for hub in ("east", "west")}
            assert len(tokens) == 2  # a token per hub, not one shared
            on_east = await connect_broker(folder / "east.db")
            on_west = await connect_broker(folder / "west.db")
            await on_east.call("register", clientKind="cli", handle="renn")
            assert [p["handle"] for p in (await on_east.call("status"))["peers"]] == ["renn"]
            assert (await on_west.call("status"))["peers"] == []  # another hub's broker
            await on_east.close()
            await on_west.close()
        finally:
            west.stop()
    finally:
        east.stop()
    assert not (folder / "east.db-bus.sock").exists()  # each removed its own on a clean stop


async def test_custom_socket_token_and_namespace(tmp_path):
    sock = tmp_path / "elsewhere" / "b.sock"
    sock.parent.mkdir()
    token_file = tmp_path / "tok"
    token_file.write_text("given-token\n")
    os.chmod(token_file, 0o600)
    proc = hubd_process(tmp_path / "hub", "--broker-socket", str(sock), "--broker-token-file",
                        str(token_file), "--broker-namespace", "team").start()
    try:
        assert stat.S_IMODE(sock.stat().st_mode) == 0o600
        c = await BrokerClient.connect(str(sock), "given-token")
        await c.call("register", clientKind="cli", handle="alice")
        other = await BrokerClient.connect(str(sock), "given-token")
        await other.call("register", clientKind="cli", handle="bob")
        sent = await c.call("send", threadId=None, to="team/bob", body="namespaced")
        assert sent["deliveries"] == [{"to": "bob", "state": "queued"}]
        await c.close()
        await other.close()
    finally:
        proc.stop()
    assert not sock.exists()  # removed on a clean stop


async def test_delivery_proof_from_the_transcript(hub, tmp_path):
    transcript = tmp_path / "transcript.jsonl"
    transcript.write_text('{"role":"user","content":"hello"}\n')
    s, handle = await session(tmp_path, "s-proof", 9001, transcriptPath=str(transcript))
    sender = await client(tmp_path)
    await sender.call("register", clientKind="cli", handle="asker")
    first = await sender.call("send", threadId=None, to=handle, body="prove it")
    second = await sender.call("send", threadId=None, to=handle, body="and this")
    await s.event("push")
    await s.event("push")
    # the CLI shows the first message in its session: its tag lands in the transcript
    with transcript.open("a") as out:
        out.write(json.dumps({"role": "user", "content": f"[murmur m{first['messageId']} from "
                                                         "asker | thread 1 #1]\nprove it"}) + "\n")
    for _ in range(200):
        inbox = await s.call("inbox", unreadOnly=False)
        states = {m["messageId"]: m["state"] for t in inbox["threads"] for m in t["messages"]}
        if states[first["messageId"]] == "delivered":
            break
        await asyncio.sleep(0.05)
    assert states[first["messageId"]] == "delivered"
    assert states[second["messageId"]] == "sent"  # its tag never appeared
    await s.close()
    await sender.close()


def by_label(hub, metric: str) -> dict[str, float]:
    """One labelled metric of the hub's /metrics: label value -> sample."""
    found = re.findall(metric + r'\{\w+="(\w+)"\} (\S+)', hub.get_text("/metrics"))
    return {label: float(n) for label, n in found}


def refused_connections(hub) -> dict[str, float]:
    return by_label(hub, "hubd_broker_refused_connections_total")


def broker_connections(hub) -> dict[str, float]:
    return by_label(hub, "hubd_broker_connections")


async def test_connections_that_never_authenticate_never_lock_clients_out(hub, tmp_path):
    """300 connections that never send auth: only 64 of them are held (each
    newcomer past that displaces the one that waited longest, told why), and
    a client that authenticates as it connects is served at once."""
    path, token = broker_of(tmp_path)
    started = time.monotonic()
    idle = []
    for _ in range(300):  # a blocking connect returns once the hub's listen queue took it
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(path)  # in blocking mode: with a timeout, a full queue is EAGAIN
        s.settimeout(5)
        idle.append(s)
    # queued behind the 300 (the hub's listen queue holds 1024), accepted last
    c = await BrokerClient.connect(path, token)
    assert (await c.call("status"))["peers"] == []
    # the first 237 (300 - 64, and one more for c) were displaced, oldest first
    for s in idle[:237]:
        told = json.loads(s.makefile("rb").readline())
        assert told["id"] is None and told["error"]["code"] == "broker_closed"
        assert "have not authenticated" in told["error"]["message"]
        assert s.recv(1) == b""
    assert refused_connections(hub) == {"unauthenticated_displaced": 237}
    assert broker_connections(hub) == {"authenticated": 1, "unauthenticated": 63}
    # the newest 63 still wait for their auth line, and may still send it
    idle[-1].sendall(json.dumps({"v": 2, "id": 1, "type": "auth", "token": token}).encode()
                     + b"\n")
    assert json.loads(idle[-1].makefile("rb").readline())["ok"] is True
    assert broker_connections(hub) == {"authenticated": 2, "unauthenticated": 62}
    # the refusals are logged, at most one line per reason every 10 s
    lines = hub.log().count("broker connections refused")
    assert 1 <= lines <= 1 + (time.monotonic() - started) // 10
    for s in idle:
        s.close()
    await c.close()


async def test_connections_and_listening_sessions_are_bounded(hub, tmp_path):
    path, token = broker_of(tmp_path)
    early = await BrokerClient.connect(path)  # not authenticated: holds no place of the 256
    held = []
    for i in range(256):
        held.append(await BrokerClient.connect(path, token))
    extra = await BrokerClient.connect(path)
    refused = await extra.answer()
    assert refused["id"] is None and refused["error"]["code"] == "broker_closed"
    assert "256 authenticated" in refused["error"]["message"]
    await asyncio.wait_for(extra.closed.wait(), 5)
    # an auth that finds the 256 places taken is refused with its id
    late = await early.request("auth", token=token)
    assert late["error"]["code"] == "broker_closed" and late["id"] == 1
    await asyncio.wait_for(early.closed.wait(), 5)
    assert refused_connections(hub) == {"authenticated_full": 2}
    # at most 128 of them may listen
    results = []
    for i, c in enumerate(held[:129]):
        results.append(await c.request("session", event="session-start", client="other",
                                       cliSessionId=f"l{i}",
                                       host={"hostPid": 20000 + i, "hostStart": 1},
                                       listen=True))
    assert all(r["ok"] for r in results[:128])
    assert results[128]["error"]["code"] == "bad_request"
    assert "128 listening" in results[128]["error"]["message"]
    # without listen the same request is served
    alone = await held[128].call("session", event="session-start", client="other",
                                 cliSessionId="l128", host={"hostPid": 20128, "hostStart": 1})
    assert alone["handle"]
    for c in held:
        await c.close()

"""A broker session (seed 004, Unix socket) and a WebSocket agent (the published
reference client, driven as a black box) exchange a message and a reply through
one real hubd process."""

from __future__ import annotations

import pytest

from tests.support.procs import connect_broker, hubd_process
from tests.support.refclient import RefClient


@pytest.fixture
def broker_hub(tmp_path):
    proc = hubd_process(tmp_path / "hub", hub_id="iop-east").start()
    yield proc
    proc.stop()


async def test_broker_session_and_reference_agent_exchange_a_message_and_a_reply(
        broker_hub, tmp_path, reference_venv_status):
    if reference_venv_status[0] is None:
        pytest.skip(reference_venv_status[1])
    asker = await connect_broker(tmp_path / "hub" / "hubd.db")
    result = await asker.call("session", event="session-start", client="codex",
                              cliSessionId="iop-1", host={"hostPid": 3100, "hostStart": 9},
                              handle="asker", listen=True)
    assert result == {"handle": "asker"}

    ref = RefClient(broker_hub.url, tmp_path / "client-home")
    try:
        bob = ref.agent("iop/bob")
        bob.wait_ready()
        bob.wait_registered()
        since = bob.mark()
        sent = await asker.call("send", threadId=None, to="iop/bob",
                                body="Is the migration safe?")
        assert sent["deliveries"] == [{"to": "iop/bob", "state": "sent"}]
        chat = bob.wait_frame(since=since, type="chat", sender="local/asker")
        assert chat["target"] == "iop/bob"
        assert chat["payload"].startswith(
            f"[murmur m{sent['messageId']} from asker | thread {sent['threadId']} #1]\n"
            "Is the migration safe?\n")
        assert chat["metadata"]["broker"]["messageId"] == sent["messageId"]

        # the WebSocket seat answers with the message id: the reply joins the thread
        bob.chat("local/asker", f"m{sent['messageId']} agree: yes, it is reversible")
        push = (await asker.event("push", timeout=15))["payload"]
        assert push["message"]["from"] == "iop/bob"
        assert push["message"]["threadId"] == sent["threadId"]
        assert push["message"]["replyTo"] == sent["messageId"]
        assert push["message"]["verdict"] == "agree"
        assert push["message"]["body"] == "yes, it is reversible"
        assert push["text"].startswith(f"[murmur m{push['message']['messageId']} from iop/bob | "
                                       f"thread {sent['threadId']} #2 | reply to "
                                       f"m{sent['messageId']} | agree]")
        waited = await asker.call("wait", threadId=sent["threadId"], until="all_replied",
                                  timeoutMs=5000)
        assert waited["conditionMet"] and not waited["timedOut"]
        collect = await asker.call("collect", threadId=sent["threadId"])
        assert collect["recipients"] == [{"handle": "iop/bob", "state": "replied",
                                          "verdict": "agree",
                                          "replyId": push["message"]["messageId"]}]

        # a chat from the hub side that names no message starts a thread; the
        # broker's reply to it reaches the seat
        bob.chat("local/asker", "separate question: lunch?")
        fresh = (await asker.event("push", timeout=15))["payload"]["message"]
        assert fresh["from"] == "iop/bob" and fresh["seq"] == 1 and fresh["replyTo"] is None
        since = bob.mark()
        await asker.call("reply", messageId=fresh["messageId"], body="after the deploy")
        answer = bob.wait_frame(since=since, type="chat", sender="local/asker")
        assert "after the deploy" in answer["payload"]
        assert answer["metadata"]["broker"]["threadId"] == fresh["threadId"]
    finally:
        ref.stop_all()
        await asker.close()

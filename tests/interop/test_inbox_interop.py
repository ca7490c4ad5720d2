"""The durable inbox query (history_request's inbox_query, version 1) against
the reference hub and hubd: the same pages, cursors and refusals from both
(docs/inbox.md). hubd's page after a restart is in the last test."""

from __future__ import annotations

import time

from tests.interop.conftest import HUB_ID
from tests.support.wsprobe import WsProbe

CHATS = [  # (target, payload, extra): in this order, from PROJ/writer
    ("PROJ/reader", "direct", {"receipt_requested": True, "client_msg_id": "c-1"}),
    ("PROJ/reader,PROJ/other", "comma", {}),
    ("PROJ/other", "foreign", {}),
    ("PROJ/*", "wildcard", {}),
    ("PROJ", "project", {}),
    ("all", "broadcast", {}),
]
ADDRESSED = ["direct", "comma", "wildcard", "project", "broadcast"]


async def join(url: str, name: str) -> WsProbe:
    probe = await WsProbe.open(url)
    await probe.recv_type("welcome")
    await probe.register(name)
    await probe.recv_type("presence_update", agent=name)
    return probe


async def ask(probe: WsProbe, sender: str, request_id="r-1", **query) -> tuple[dict, dict]:
    body = {"version": 1, "identity": "PROJ/reader", "hub_id": "", "since_seq": 0, "limit": 50}
    body.update(query)
    frame = {"type": "history_request", "sender": sender, "target": "System",
             "inbox_query": {k: v for k, v in body.items() if v is not None},
             "timestamp": time.time()}
    if request_id is not None:
        frame["request_id"] = request_id
    await probe.send_json(frame)
    answer = await probe.recv_type("history_snapshot")
    return answer, answer["inbox_page"]


async def fill(url: str) -> tuple[WsProbe, WsProbe]:
    reader = await join(url, "PROJ/reader")
    writer = await join(url, "PROJ/writer")
    await reader.chat("PROJ/reader", "PROJ/writer", "own")
    await reader.recv_type("chat", payload="own")
    for target, payload, extra in CHATS:
        await writer.chat("PROJ/writer", target, payload, **extra)
        if payload in ADDRESSED:
            await reader.recv_type("chat", payload=payload)
    return reader, writer


async def test_pages_cursors_and_the_sidecar(hub):
    reader, writer = await fill(hub.url)
    answer, page = await ask(reader, "PROJ/reader")
    assert "history" not in answer and answer["request_id"] == "r-1"
    assert answer["payload"] == "Durable inbox page"
    assert (page["version"], page["available"], page["identity"], page["hub_id"],
            page["has_more"]) == (1, True, "PROJ/reader", HUB_ID, False)
    messages = page["messages"]
    assert [m["payload"] for m in messages] == ADDRESSED
    seqs = [m["seq"] for m in messages]
    assert seqs == sorted(seqs) and all(type(s) is int for s in seqs)
    assert messages[0]["receipt_requested"] is True and messages[0]["client_msg_id"] == "c-1"
    assert messages[0]["sender"] == "PROJ/writer" and messages[0]["type"] == "chat"
    assert page["cursor"] >= seqs[-1]

    # the next page from that cursor is empty, and says so
    _, after = await ask(reader, "PROJ/reader", hub_id=HUB_ID, since_seq=page["cursor"])
    assert (after["available"], after["messages"], after["has_more"]) == (True, [], False)

    # pages of two: the cursor stops at the last message returned, so the
    # next page starts with the message after it
    _, first = await ask(reader, "PROJ/reader", limit=2)
    assert [m["payload"] for m in first["messages"]] == ["direct", "comma"]
    assert first["has_more"] is True and first["cursor"] == first["messages"][-1]["seq"]
    _, second = await ask(reader, "PROJ/reader", limit=2, hub_id=HUB_ID,
                          since_seq=first["cursor"])
    assert [m["payload"] for m in second["messages"]] == ["wildcard", "project"]

    # the seat's -rx wake sidecar reads the seat's inbox; its own holds what
    # was addressed to every seat of the project, not the seat's own chats
    sidecar = await join(hub.url, "PROJ/reader-rx")
    _, for_seat = await ask(sidecar, "PROJ/reader-rx")
    assert [m["payload"] for m in for_seat["messages"]] == ADDRESSED
    _, own = await ask(sidecar, "PROJ/reader-rx", identity="PROJ/reader-rx")
    assert (own["available"], own["identity"]) == (True, "PROJ/reader-rx")
    assert [m["payload"] for m in own["messages"]] == ["wildcard", "project", "broadcast"]
    # an invalid request id is not echoed; an absent one neither
    answer, _ = await ask(reader, "PROJ/reader", request_id="r" * 129)
    assert "request_id" not in answer
    answer, _ = await ask(reader, "PROJ/reader", request_id=None)
    assert "request_id" not in answer
    for probe in (reader, writer, sidecar):
        await probe.close()


async def test_refusals_are_explicit_pages(hub):
    reader, writer = await fill(hub.url)
    _, page = await ask(reader, "PROJ/reader")
    last = page["cursor"]
    cases = [
        (dict(version=2), "invalid inbox query", "PROJ/reader", 0),
        (dict(limit=0), "invalid inbox query", "PROJ/reader", 0),
        (dict(limit=101), "invalid inbox query", "PROJ/reader", 0),
        (dict(since_seq=True, hub_id=HUB_ID), "invalid inbox query", "PROJ/reader", 0),
        (dict(since_seq=1.0, hub_id=HUB_ID), "invalid inbox query", "PROJ/reader", 0),
        (dict(since_seq=-1), "invalid inbox query", "PROJ/reader", 0),
        (dict(since_seq=2**63, hub_id=HUB_ID), "invalid inbox query", "PROJ/reader", 0),
        # a later page must name the hub its cursor came from
        (dict(since_seq=1), "invalid inbox query", "PROJ/reader", 0),
        (dict(identity=None), "invalid inbox query", "PROJ/reader", 0),
        (dict(hub_id=None), "invalid inbox query", "PROJ/reader", 0),
        (dict(identity="PROJ/other"), "inbox identity is not owned by this connection",
         "PROJ/other", 0),
        (dict(identity="PROJ/reader-rx"), "inbox identity is not owned by this connection",
         "PROJ/reader-rx", 0),
        (dict(hub_id="elsewhere", since_seq=1), "inbox cursor belongs to a different hub",
         "PROJ/reader", 1),
        (dict(hub_id=HUB_ID, since_seq=last + 1000), "inbox cursor exceeds the retained journal",
         "PROJ/reader", last + 1000),
    ]
    for query, error, identity, cursor in cases:
        answer, refused = await ask(reader, "PROJ/reader", **query)
        assert answer["request_id"] == "r-1"
        assert refused == {"version": 1, "available": False, "identity": identity,
                           "hub_id": HUB_ID, "cursor": cursor, "messages": [],
                           "has_more": False, "error": error}, (query, refused)
    # a query that is not an object at all
    await reader.send_json({"type": "history_request", "sender": "PROJ/reader",
                            "target": "System", "inbox_query": "all", "timestamp": time.time()})
    answer = await reader.recv_type("history_snapshot")
    assert answer["inbox_page"]["error"] == "invalid inbox query"
    # the connection is still usable, and an ordinary history request unchanged
    await reader.send_json({"type": "history_request", "sender": "PROJ/reader",
                            "target": "System", "limit": 2, "timestamp": time.time()})
    answer = await reader.recv_type("history_snapshot")
    assert "history" in answer and "inbox_page" not in answer
    for probe in (reader, writer):
        await probe.close()


async def test_hubd_serves_the_same_page_after_a_restart(tmp_path):
    from tests.support.procs import hubd_process

    proc = hubd_process(tmp_path, hub_id=HUB_ID).start()
    try:
        reader, writer = await fill(proc.url)
        _, before = await ask(reader, "PROJ/reader")
        for probe in (reader, writer):
            await probe.close()
        proc.stop()
        proc.start()
        reader = await join(proc.url, "PROJ/reader")
        _, after = await ask(reader, "PROJ/reader")
        assert [m["payload"] for m in after["messages"]] == ADDRESSED
        assert after == before, (before, after)
        await reader.close()
    finally:
        proc.stop()

"""Hostile peers and wrong pins, against real hubd processes over mTLS.

- A pinned, granted peer that sends malformed or oversized forwards gets a
  typed answer for each (or an error frame where there is no forward_id to
  answer by); only the well-formed forward is journaled and the hub serves on.
- A watched peer that answers log pulls with malformed snapshots is refused
  snapshot by snapshot (its cursor does not move, nothing is folded) and the
  hub serves on.
- A --claim-peer or --multihub-watch whose pin does not match the peer's
  certificate never sends it a frame: claims are refused naming the owner,
  the watch reports pin_mismatch.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time

import pytest

from federation.tls import peer_client_context
from hubd.timing import Timing
from tests.support.federation import fake_peer_hub, make_pki, site_flags, write_serving_policy
from tests.support.procs import free_port, hubd_process
from tests.support.wsprobe import WsProbe, joined


@pytest.fixture
def pki(tmp_path):
    return make_pki(tmp_path / "pki", ["east", "west", "north"])


async def serves_on(url, name="PROJ/zed"):
    """The hub still answers an ordinary agent."""
    probe = await joined(url, name)
    await probe.chat(name, name.split("/")[0] + "/nobody", "still here", client_msg_id="alive")
    await probe.send_json({"sender": name, "type": "who_request", "target": "System"})
    snapshot = await probe.recv_type("who_snapshot", timeout=10)
    assert name in snapshot["online_agents"]
    await probe.close()


def forward(forward_id, **over):
    frame = {"sender": "east", "target": "System", "type": "multihub_message_forward",
             "forward_id": forward_id, "kind": "chat", "sender_seat": "PROJ/alice",
             "target_seat": "PROJ/bob", "body": {"payload": "hi"}}
    frame.update(over)
    return frame


def forwarded_payloads(db_path) -> list[str]:
    db = sqlite3.connect(db_path)
    try:
        rows = db.execute("SELECT payload, route FROM events WHERE kind = 'chat'").fetchall()
    finally:
        db.close()
    return [json.loads(p)["payload"] for p, r in rows if "forwarded" in json.loads(r or "{}")]


def test_malformed_and_oversized_forwards_get_typed_answers(tmp_path, pki):
    policy = write_serving_policy(tmp_path / "west-policy", pki, {"east": ["PROJ"]})
    west = hubd_process(tmp_path / "west", *site_flags(pki, "west", policy).serve,
                        "--max-msg-kb", "512", hub_id="west", scheme="wss")
    west.start()
    try:
        async def scenario():
            bob = await joined(west.url, "PROJ/bob")
            context = peer_client_context(pki.file("east", "client", "cert"),
                                          pki.file("east", "client", "key"))
            peer = await WsProbe.open(west.url, ssl=context)

            async def answer(frame):
                await peer.send_json(frame)
                return await peer.recv(lambda f: f.get("type") in (
                    "multihub_message_result", "multihub_message_result_batch", "error"))

            big = "x" * 300_000  # under the 512 KB frame cap, over the 256 KB body cap
            cases = [
                (forward("f-body-str", body="just text"), "invalid_shape"),
                (forward("f-body-list", body=["a"]), "invalid_shape"),
                (forward("f-body-big", body={"payload": big}), "invalid_shape"),
                (forward("f-no-target", target_seat=None), "invalid_target"),
                (forward("f-glob", target_seat="PROJ/*"), "invalid_target"),
                (forward("f-other-hub", target_seat="PROJ/bob@north"), "invalid_target"),
                (forward("f-bad-sender", sender_seat=7), "invalid_shape"),
                (forward("f-kind", kind="claim"), "unknown_request"),
                (forward("f-ungranted", target_seat="OTHER/zed"), "namespace_not_granted"),
            ]
            for frame, code in cases:
                got = await answer(frame)
                assert got["type"] == "multihub_message_result", got
                assert got["forward_id"] == frame["forward_id"]
                assert (got["disposition"], got["reason_code"]) == ("refused", code), got
                assert len(got["detail"].encode()) <= 512
            # no forward_id to answer by: an error frame, and the link stays
            for bad_id in (None, "", 7, "f" * 129):
                got = await answer(forward(bad_id))
                assert got["type"] == "error" and "forward_id" in got["payload"], got
            # batches: not a list, empty, too long; then a mixed one answered entry by entry
            for forwards in ("nope", [], [forward(f"b{i}") for i in range(1025)]):
                got = await answer({"sender": "east", "target": "System",
                                    "type": "multihub_message_forward_batch",
                                    "forwards": forwards})
                assert got["type"] == "error" and "forward batch" in got["payload"], got
            mixed = [forward("m-good", body={"payload": "the good one"}),
                     forward("m-bad", body="text"), "not an object", {"forward_id": 5}]
            got = await answer({"sender": "east", "target": "System",
                                "type": "multihub_message_forward_batch", "forwards": mixed})
            assert got["type"] == "multihub_message_result_batch", got
            assert [(r["forward_id"], r["disposition"], r["reason_code"]) for r in got["results"]] \
                == [("m-good", "accepted", ""), ("m-bad", "refused", "invalid_shape")]
            await bob.recv_type("chat", payload="the good one", timeout=10)
            # a frame over --max-msg-kb ends that connection (1009), not the hub
            await peer.send_json(forward("f-huge", body={"payload": "y" * 600_000}))
            closed = await peer.wait_closed(10)
            assert closed.code == 1009, closed
            await peer.close()
            again = await WsProbe.open(west.url, ssl=context)
            await again.send_json(forward("f-after", body={"payload": "after the storm"}))
            after = await again.recv_type("multihub_message_result", timeout=10)
            assert after["disposition"] == "accepted"
            await bob.recv_type("chat", payload="after the storm", timeout=10)
            await again.close()
            await bob.close()
            await serves_on(west.url)

        asyncio.run(scenario())
        assert sorted(forwarded_payloads(west.argv[west.argv.index("--db") + 1])) == \
            ["after the storm", "the good one"]
        assert west.get_json("/health")["status"] == "ok"
    finally:
        west.stop()


BAD_SNAPSHOTS = [
    ({"events": "all of them", "next_cursor": 0, "log_end_seq": 0}, "events must be a list"),
    ({"events": [{"seq": 1, "ts": 1.0, "kind": "chat", "payload": {}, "extra": 1}],
      "next_cursor": 1, "log_end_seq": 1}, "unexpected field"),
    ({"events": [{"seq": True, "ts": 1.0, "kind": "chat", "payload": {}}],
      "next_cursor": 1, "log_end_seq": 1}, "seq"),
    ({"events": [], "next_cursor": -4, "log_end_seq": 0}, "next_cursor"),
    ({"events": [{"seq": 2, "ts": 1.0, "kind": "chat", "payload": {}},
                 {"seq": 1, "ts": 1.0, "kind": "chat", "payload": {}}],
      "next_cursor": 2, "log_end_seq": 2}, "is not above the previous"),
]


def test_malformed_log_snapshots_are_refused_and_the_watcher_serves_on(tmp_path, pki):
    """west is a small TLS server with west's certificate that answers every
    log pull with the next malformed snapshot; east watches it."""
    served: list[int] = []

    async def hostile(ws, frame):
        if frame.get("type") == "multihub_log_request":
            bad = BAD_SNAPSHOTS[min(len(served), len(BAD_SNAPSHOTS) - 1)][0]
            served.append(1)
            await ws.send_json({"sender": "SynapseHub", "target": frame.get("sender"),
                                "type": "multihub_log_snapshot", "payload": "",
                                "hub_id": "west", **bad})

    async def scenario():
        async with fake_peer_hub(pki, "west", 5, hostile) as port:
            east = hubd_process(tmp_path / "east", "--namespace-owner", "PROJ=east",
                                "--multihub-watch", f"west=wss://127.0.0.1:{port}/",
                                "--multihub-watch-pin", f"west={pki.server_pin('west')}",
                                *site_flags(pki, "east", None).connect, hub_id="east",
                                # a poll every 0.2 s (the flag's floor is 1 s)
                                timing=Timing(watch_interval=0.2))
            await asyncio.to_thread(east.start)
            try:
                deadline = time.monotonic() + 60
                while True:
                    status = (await asyncio.to_thread(east.get_json, "/health"))["multihub"]
                    watch = status["watches"]["west"]
                    # a refused snapshot moves nothing: no cursor, no success, no fold
                    assert watch["cursor"] == 0 and watch["last_success"] is None, watch
                    assert status["partitioned"] == [] and status["quarantined"] == []
                    if len(served) > len(BAD_SNAPSHOTS) and watch["polls"] > len(BAD_SNAPSHOTS):
                        break  # every malformed snapshot was served and its poll finished
                    assert time.monotonic() < deadline, (len(served), watch)
                    await asyncio.sleep(0.2)
                await serves_on(east.url)
            finally:
                east.stop()
            return east.log()

    log = asyncio.run(scenario())
    # (polls before the link first came up fail "link down"; those are not answers)
    failures = [line for line in log.splitlines()
                if "watch poll failed" in line and "link down" not in line]
    assert len(failures) >= len(BAD_SNAPSHOTS), log[-3000:]
    for (_, words), line in zip(BAD_SNAPSHOTS, failures):
        assert words in line, (words, line)


def test_wrong_claim_peer_pin_and_watch_pin_send_nothing(tmp_path, pki):
    policy = write_serving_policy(tmp_path / "west-policy", pki, {"east": ["PROJ"]})
    west = hubd_process(tmp_path / "west", *site_flags(pki, "west", policy).serve,
                        *site_flags(pki, "west", policy).connect, "--namespace-owner",
                        "PROJ=west", hub_id="west", scheme="wss")
    west.start()
    url = f"wss://127.0.0.1:{west.port}/"
    wrong = pki.server_pin("north")  # a valid pin, of another hub's certificate
    east = hubd_process(tmp_path / "east", "--namespace-owner", "PROJ=west",
                        "--claim-peer", f"west={url}", "--claim-peer-pin", f"west={wrong}",
                        "--multihub-watch", f"west={url}", "--multihub-watch-pin",
                        f"west={wrong}", "--multihub-watch-interval", "1",
                        *site_flags(pki, "east", None).connect, hub_id="east")
    east.start()
    try:
        def health():
            return east.get_json("/health")["multihub"]

        deadline = time.monotonic() + 30
        while True:
            h = health()
            watch, route = h["watches"]["west"], h["claim_routes"]["west"]
            if watch["polls"] >= 1 and route["last_error"] and watch["link_error"]:
                break
            assert time.monotonic() < deadline, h
            time.sleep(0.2)
        assert route["link"] == "down" and route["last_error"]["cause"] == "pin_mismatch", route
        assert watch["link"] == "down" and watch["link_error"]["cause"] == "pin_mismatch", watch
        assert watch["cursor"] == 0 and watch["last_success"] is None

        async def claim():
            amy = await joined(east.url, "PROJ/amy")
            await amy.send_json({"sender": "PROJ/amy", "target": "System", "type": "claim",
                                 "payload": "t-1", "task_id": "t-1", "worktree": "/repo",
                                 "paths": ["src"], "ttl_seconds": 60})
            denied = await amy.recv_type("claim_denied", timeout=20)
            await amy.close()
            return denied
        denied = asyncio.run(claim())
        assert denied["owner_hub_id"] == "west" and denied["ownership"] == "remote", denied
        assert denied["reason_code"] == "CLAIM_DENIED", denied
        # west never saw east register: the certificate check came first
        assert "peer link registered" not in west.log()
    finally:
        east.stop()
        west.stop()


def test_the_right_pins_do_connect(tmp_path, pki):
    """The control for the test above: the same flags with west's pin work."""
    policy = write_serving_policy(tmp_path / "west-policy", pki, {"east": ["PROJ"]})
    west = hubd_process(tmp_path / "west", *site_flags(pki, "west", policy).serve,
                        "--namespace-owner", "PROJ=west", hub_id="west", scheme="wss",
                        port=free_port())
    west.start()
    url = f"wss://127.0.0.1:{west.port}/"
    pin = pki.server_pin("west")
    east = hubd_process(tmp_path / "east", "--namespace-owner", "PROJ=west",
                        "--claim-peer", f"west={url}", "--claim-peer-pin", f"west={pin}",
                        "--multihub-watch", f"west={url}", "--multihub-watch-pin", f"west={pin}",
                        "--multihub-watch-interval", "1", *site_flags(pki, "east", None).connect,
                        hub_id="east")
    east.start()
    try:
        deadline = time.monotonic() + 30
        while True:
            h = east.get_json("/health")["multihub"]
            if h["watches"]["west"]["last_success"] and h["claim_routes"]["west"]["link"] == "up":
                break
            assert time.monotonic() < deadline, h
            time.sleep(0.2)
    finally:
        east.stop()
        west.stop()

"""Hostile REDSYN requests over real HTTP against a real hubd process (issue 30
items 1 and 2): text that is not UTF-8 and fields of the wrong type are typed
4xx answers, and one person's bad request never costs another person's write."""

from __future__ import annotations

import json
import threading
import time

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from hubd.journal import principals as store
from hubd.wire.redsyn.envelope import b64url
from tests.support.procs import hubd_process
from tests.support.redsyn_client import Client, login
from tests.support.waiting import wait_for

JOEL = "acme/dev/joel"
ANA = "acme/dev/ana"


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    work = tmp_path_factory.mktemp("redsyn-hostile")
    db = work / "hubd.db"
    tokens = {"joel": login(db, JOEL, "laptop"), "ana": login(db, ANA, "laptop")}
    proc = hubd_process(work, db=db).start()
    yield proc, Client(proc.http_url, tokens["joel"]), Client(proc.http_url, tokens["ana"])
    proc.stop()  # fails the test if a handler raised


# (method, path, raw body): each stores text that is not valid UTF-8
NOT_UTF8 = [
    ("PUT", f"/agents/{JOEL}/s", rb'{"listening": true, "description": "\ud800"}'),
    ("PUT", f"/agents/{JOEL}/s", b'{"listening": true, "description": "\xed\xa0\x80"}'),
    ("POST", "/messages", rb'{"v": 1, "kind": "request", "from": "a", "to": "s", '
                          rb'"body": {"type": "text/plain", "text": "x\udfffy"}}'),
    ("POST", "/messages", rb'{"v": 1, "kind": "request", "from": "a", "to": "s", '
                          rb'"body": {"type": "text/plain", "text": "x"}, '
                          rb'"refs": [{"url": "https://a.example", "note": "\udc00"}]}'),
    ("POST", "/messages", rb'{"v": 1, "kind": "request", "from": "a", "to": "s", '
                          rb'"body": {"type": "application/json", "json": {"k": "\ud83d"}}}'),
    ("POST", "/messages", b'{"v": 1, "kind": "request", "from": "a", "to": "s", '
                          b'"body": {"type": "text/plain", "text": "\xed\xb0\x80"}}'),
]


def test_text_that_is_not_utf8_is_400_and_anothers_write_at_that_moment_succeeds(hub):
    proc, joel, ana = hub
    box = f"{ANA}/inbox"
    sent = []
    for round_ in range(8):
        statuses: dict = {}
        start = threading.Barrier(len(NOT_UTF8) + 1)

        def hostile(i, method, path, raw):
            start.wait()
            statuses[i] = joel.call(method, path, raw=raw)

        def honest():
            start.wait()
            id_ = f"ok-{round_}"
            statuses["ana"] = ana.send({"id": id_, "kind": "request", "from": "cli",
                                        "to": box, "body": {"type": "text/plain", "text": id_}})
            sent.append(id_)

        threads = [threading.Thread(target=hostile, args=(i, *case))
                   for i, case in enumerate(NOT_UTF8)] + [threading.Thread(target=honest)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        for i in range(len(NOT_UTF8)):
            answer = statuses[i]
            assert answer.status == 400, (NOT_UTF8[i], answer.status, answer.body)
            assert "UTF-8" in answer.json["error"]
        assert statuses["ana"].status == 201, statuses["ana"].body
    got = ana.take_until(box, len(sent))
    assert sorted(item["id"] for item in got) == sorted(sent)
    assert ana.ack(box, [item["id"] for item in got]).status == 200
    # nothing of joel's was stored
    assert joel.call("GET", f"/agents/{JOEL}/s").status == 404


def test_wrong_types_and_numbers_without_a_canonical_form_are_400(hub):
    proc, joel, _ = hub
    base = {"v": 1, "kind": "request", "from": "cli", "to": f"{JOEL}/box",
            "body": {"type": "text/plain", "text": "x"}}
    raw_cases = [
        json.dumps({**base, "kind": ["request"]}).encode(),
        json.dumps({**base, "kind": {"request": True}}).encode(),
        json.dumps({**base, "body": {"type": "application/json",
                                     "json": 9007199254740992}}).encode(),
        json.dumps({**base, "refs": [{"url": "https://a.example",
                                      "extra": -9007199254740993}]}).encode(),
        json.dumps({**base, "ts": 2**64}).encode(),
        json.dumps({**base, "files": {"zip": 12}}).encode(),
        json.dumps({**base, "body": {"type": "x", "n": 1}}).encode().replace(b"1}", b"1e400}"),
        json.dumps({**base, "body": {"type": "x", "n": 1}}).encode().replace(b"1}", b"NaN}"),
        json.dumps({**base, "body": {"type": "x", "deep": json.loads("[" * 70 + "]" * 70)}}
                   ).encode(),  # nested deeper than RFC 8785's encoder goes (64)
    ]
    for raw in raw_cases:
        answer = joel.call("POST", "/messages", raw=raw)
        assert answer.status == 400, (raw[:120], answer.status, answer.body)
        assert answer.json["status"] == 400 and answer.json["error"]
    assert joel.take(f"{JOEL}/box") == []
    log = proc.log()
    assert "handler failed" not in log and "Traceback" not in log


def test_a_null_sig_from_a_node_with_a_key_is_an_unsigned_message(hub):
    proc, joel, _ = hub
    key = Ed25519PrivateKey.generate()
    assert joel.call("PUT", "/nodes/key", {
        "public_key": b64url(key.public_key().public_bytes_raw())}).status == 200
    box = f"{JOEL}/nullsig"
    answer = joel.send({"id": "nullsig-1", "kind": "request", "from": "cli", "to": box,
                        "ts": int(time.time()), "body": {"type": "text/plain", "text": "x"},
                        "sig": None})
    assert answer.status == 201, answer.body
    [item] = joel.take(box)
    assert item["id"] == "nullsig-1" and item["signed"] is False and "sig" not in item
    joel.ack(box, ["nullsig-1"])
    # a receiver that takes only signed messages refuses it
    assert joel.announce(box, policy={"signed_only": True}).status == 200
    refused = joel.send({"id": "nullsig-2", "kind": "request", "from": "cli", "to": box,
                         "body": {"type": "text/plain", "text": "x"}, "sig": None})
    assert refused.status == 403, refused.body


def test_a_token_speaks_only_for_its_principals_seats(tmp_path):
    """`hubd principal add acme/dev/kim --seat acme/dev/kim/laptop`: its token
    is a REDSYN node of the person acme/dev/kim that announces, takes, acks,
    subscribes and sends as that seat only (issue 30 item 4)."""
    db = tmp_path / "hubd.db"
    store.add(db, "acme/dev/kim", ["acme/dev/kim/laptop"])
    kim = store.new_token(db, "acme/dev/kim", "laptop")
    ana_token = login(db, ANA, "laptop")
    proc = hubd_process(tmp_path, db=db).start()
    try:
        node, ana = Client(proc.http_url, kim), Client(proc.http_url, ana_token)
        mine, other = "acme/dev/kim/laptop", "acme/dev/kim/other"
        assert ana.send({"id": "for-other", "kind": "request", "from": "cli", "to": other,
                         "body": {"type": "text/plain", "text": "x"}}).status == 201
        refused = [
            node.announce(other),
            node.call("GET", f"/inbox/{other}"),
            node.ack(other, ["for-other"]),
            node.call("POST", "/topics/acme/dev/news/subscribe", {"agent": other}),
            node.send({"kind": "request", "from": other, "to": mine,
                       "body": {"type": "text/plain", "text": "x"}}),
            node.send({"kind": "request", "from": "other", "to": mine,
                       "body": {"type": "text/plain", "text": "x"}}),
        ]
        for answer in refused:
            assert answer.status == 403, (answer.status, answer.body)
            assert "acme/dev/kim/laptop" in answer.json["error"]
        # each is an auth denial in the log: the door, whose token, what it asked, why
        denials = wait_for(lambda: len(found := [line for line in proc.log().splitlines()
                                                 if "auth denied" in line]) == len(refused)
                           and found)
        for line in denials:
            assert "door=redsyn" in line and "principal=acme/dev/kim" in line, line
            assert "acme/dev/kim/laptop" in line and "seat=" in line, line
        # its own seat works on every endpoint
        assert node.announce(mine).status == 200
        assert node.call("POST", "/topics/acme/dev/news/subscribe", {"agent": mine}).status == 200
        sent = node.send({"id": "from-laptop", "kind": "request", "from": "laptop",
                          "to": f"{ANA}/cli", "body": {"type": "text/plain", "text": "hi"}})
        assert sent.status == 201, sent.body
        [got] = ana.take_until(f"{ANA}/cli", 1)
        assert got["from"].startswith(mine + "#")
    finally:
        proc.stop()

"""REDSYN over real HTTP against real hubd processes (seed 003)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from hubd.timing import Timing
from hubd.wire.redsyn import e2e, signing
from hubd.wire.redsyn.envelope import b64url
from tests.support.procs import hubd_process
from tests.support.redsyn_client import Client, login
from tests.support.webhook_listener import Hook

SHORT_LEASE = 0.1

SUPPORT = Path(__file__).resolve().parents[1] / "support"

NODES = {
    "joel": ("acme/general/joel", "laptop"),
    "ana": ("acme/general/ana", "laptop"),
    "ana_server": ("acme/general/ana", "server"),
    "ops": ("acme/ops/olga", "box"),
    "bob": ("globex/erp/bob", "box"),
}


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    work = tmp_path_factory.mktemp("redsyn")
    db = work / "hubd.db"
    tokens = {key: login(db, person, name) for key, (person, name) in NODES.items()}
    # A failing webhook is retried after 0.002 s, then 0.004, 0.008, ...
    # (doubling, as in production from 10 s): its ten attempts take about a
    # second. Takes may
    # lease for a tenth of a second (production: 1 s at least), and expiry is
    # swept ten times a second.
    proc = hubd_process(work, "--redsyn-allow-loopback-webhooks",
                        "--redsyn-webhook-first-retry", "0.002", db=db,
                        timing=Timing(redsyn_min_lease=SHORT_LEASE, sweep=0.1)).start()
    clients = {key: Client(proc.http_url, token) for key, token in tokens.items()}
    yield SimpleNamespace(proc=proc, db=db, work=work, tokens=tokens, **clients)
    proc.stop()


def test_the_seeds_complete_agent_answers_and_the_reply_reaches_the_asker(hub):
    env = dict(os.environ, REDSYN_RELAY=hub.proc.http_url + "/redsyn/v1",
               REDSYN_TOKEN=hub.tokens["joel"], REDSYN_ME="acme/general/joel/shout")
    out = hub.work / "agent.out"
    with open(out, "wb") as sink:
        agent = subprocess.Popen([sys.executable, str(SUPPORT / "redsyn_complete_agent.py")],
                                 env=env, stdout=sink, stderr=subprocess.STDOUT)
    try:
        sent = []
        for text in ("hello", "is invoice 123 paid?"):
            answer = hub.ana.send({"kind": "request", "from": "cli",
                                   "to": "acme/general/joel/shout",
                                   "body": {"type": "text/plain", "text": text}})
            assert answer.status == 201, answer.body
            sent.append(answer.json)
        replies = hub.ana.take_until("acme/general/ana/cli", 2)
        by_request = {r["reply_to"]: r for r in replies}
        for request, text in zip(sent, ("HELLO", "IS INVOICE 123 PAID?")):
            reply = by_request[request["id"]]
            assert reply["kind"] == "reply" and reply["body"]["text"] == text
            assert reply["to"] == request["from"]  # the asker's own session
            assert reply["from"].startswith("acme/general/joel/shout#s")
        assert hub.ana.ack("acme/general/ana/cli", list(by_request_ids(replies))).status == 200
        log = out.read_text()
        assert "announced: 200" in log and log.count(": 201") == 2
        # the agent confirmed what it took: nothing waits for it
        status = hub.joel.call("GET", "/agents/acme/general/joel/shout").json
        assert status["online"] is True and status["waiting"] == 0
    finally:
        agent.kill()
        agent.wait()


def by_request_ids(replies):
    return [r["id"] for r in replies]


def test_versions_tokens_and_persons(hub):
    anonymous = Client(hub.proc.http_url, None)
    answer = anonymous.call("GET", "/inbox/acme/general/joel/shout")
    assert answer.status == 401 and answer.json["status"] == 401 and answer.json["error"]
    assert answer.headers["Redsyn-Version"] == "2026-09-25"
    assert Client(hub.proc.http_url, "rsn_nope").call("GET", "/inbox/a/b/c/d").status == 401
    unknown = Client(hub.proc.http_url, hub.tokens["joel"], version="2020-01-01")
    answer = unknown.call("GET", "/inbox/acme/general/joel/shout")
    assert answer.status == 400 and answer.json["known"] == ["2026-09-25"]
    undated = Client(hub.proc.http_url, hub.tokens["joel"], version=None)
    answer = undated.call("GET", "/inbox/acme/general/joel/x")
    assert answer.status == 200 and answer.headers["Redsyn-Version"] == "2026-09-25"
    # a node speaks for its person's agents only
    answer = hub.joel.call("GET", "/inbox/acme/general/ana/cli")
    assert answer.status == 403 and answer.json == {"error": answer.json["error"], "status": 403}
    answer = hub.joel.send({"kind": "request", "from": "acme/general/ana/cli", "to": "x",
                            "body": {"type": "text/plain", "text": "hi"}})
    assert answer.status == 403
    assert hub.joel.call("GET", "/nothing/here").status == 404


def test_a_token_made_while_the_hub_runs_is_accepted_and_logout_revokes(hub):
    token = login(hub.db, "acme/general/lea", "tablet")
    lea = Client(hub.proc.http_url, token)
    for _ in range(200):  # the hub re-reads the table twice a second
        if lea.call("GET", "/inbox/acme/general/lea/x").status == 200:
            break
        time.sleep(0.05)
    assert lea.call("GET", "/inbox/acme/general/lea/x").status == 200
    subprocess.run([sys.executable, "-m", "hubd", "redsyn", "logout", "--db", str(hub.db),
                    "--person", "acme/general/lea", "--name", "tablet"], check=True,
                   capture_output=True, timeout=60)
    for _ in range(200):
        if lea.call("GET", "/inbox/acme/general/lea/x").status == 401:
            break
        time.sleep(0.05)
    assert lea.call("GET", "/inbox/acme/general/lea/x").status == 401


def test_bad_input_gets_its_status_and_changes_nothing(hub):
    box = "acme/general/joel/quiet"
    cases = [
        ({"v": 2, "kind": "request", "from": "a", "to": "quiet",
          "body": {"type": "text/plain", "text": "x"}}, 400),
        ({"v": 1, "kind": "request", "from": "a", "to": "quiet", "body": "x"}, 400),
        ({"v": 1, "kind": "request", "from": "a", "to": "globex/erp/bob/x",
          "body": {"type": "text/plain", "text": "x"}}, 403),
        ({"v": 1, "kind": "request", "from": "a", "to": "quiet",
          "body": {"type": "text/plain", "text": "x" * 300_000}}, 413),
    ]
    for document, status in cases:
        answer = hub.joel.call("POST", "/messages", document)
        assert answer.status == status and answer.json["status"] == status, answer.body
    assert hub.joel.call("POST", "/messages", raw=b"{not json").status == 400
    assert hub.joel.call("POST", "/messages", raw=b"x" * (9 * 1024 * 1024)).status == 413
    assert hub.joel.take(box) == []
    assert hub.joel.call("GET", f"/inbox/{box}?wait=61").status == 400
    assert hub.joel.call("GET", f"/inbox/{box}?lease=0").status == 400


def test_open_polls_are_bounded_per_node_and_counted_on_metrics(hub):
    """A node holds at most 16 open long polls; the 17th is 429, and /metrics
    counts it, beside the door's answers by status code."""
    from hubd.doors.redsyn.door import MAX_POLLS_PER_NODE

    box = "globex/erp/bob/poller"
    refused_before = hub.proc.metric("hubd_redsyn_polls_refused_total")
    answered_429 = 'hubd_redsyn_requests_total{code="429"}'
    codes_before = hub.proc.metric(answered_429)
    # 17 long polls at once: the bound refuses exactly one of them (and that
    # 429 proves the other 16 were all open at that moment). A probe poll
    # beside them would race them for the 16th place.
    statuses: list[int] = []
    polls = [threading.Thread(target=lambda: statuses.append(
        hub.bob.call("GET", f"/inbox/{box}?wait=30").status))
        for _ in range(MAX_POLLS_PER_NODE + 1)]
    for poll in polls:
        poll.start()
    deadline = time.monotonic() + 25
    while not statuses:
        assert time.monotonic() < deadline, "no poll was refused"
        time.sleep(0.02)
    assert statuses == [429]
    for n in range(MAX_POLLS_PER_NODE):  # one message ends each open poll
        sent = hub.bob.send({"kind": "request", "from": "tester", "to": "poller",
                             "body": {"type": "text/plain", "text": f"wake {n}"}})
        assert sent.status in (200, 201, 202), sent.body
    for poll in polls:
        poll.join(timeout=60)
    assert sorted(statuses) == [200] * MAX_POLLS_PER_NODE + [429]
    assert hub.proc.metric("hubd_redsyn_polls_refused_total") == refused_before + 1
    assert hub.proc.metric(answered_429) == codes_before + 1
    assert hub.proc.metric('hubd_redsyn_requests_total{code="200"}') >= MAX_POLLS_PER_NODE
    # the node's polls are free again
    assert hub.bob.call("GET", f"/inbox/{box}?wait=0").status == 200


def register_keys(client: Client):
    signing_private = Ed25519PrivateKey.generate()
    public = b64url(signing_private.public_key().public_bytes_raw())
    enc_private, enc_key = e2e.new_enc_key()
    answer = client.call("PUT", "/nodes/key", {
        "public_key": public, "enc_key": enc_key,
        "enc_sig": signing.sign_enc_key(signing_private, enc_key)})
    assert answer.status == 200, answer.body
    return SimpleNamespace(sign=signing_private, public=public, enc=enc_private,
                           enc_key=enc_key)


def signed_envelope(keys, **fields):
    document = {"v": 1, "ts": int(time.time()), **fields}
    document["sig"] = signing.sign(keys.sign, document)
    return document


def test_signatures_both_ways_and_an_encrypted_request_and_reply(hub):
    joel = register_keys(hub.joel)
    ana_server = register_keys(hub.ana_server)
    vault = "acme/general/ana/vault"
    assert hub.ana_server.announce(vault, description="keeps secrets").status == 200
    key = hub.joel.call("GET", f"/agents/{vault}/key")
    assert key.status == 200 and key.json["node"] == "acme/general/ana:server"
    assert signing.verify_enc_sig(key.json["signing_key"], key.json["enc_key"],
                                  key.json["enc_sig"])
    assert hub.joel.call("GET", "/agents/acme/general/joel/nokey/key").status == 404

    # a plain signed request: the receiver checks it with the seed's signed_by
    plain = signed_envelope(joel, id="sig-plain-1", kind="request", to=vault,
                            body={"type": "text/plain", "text": "signed"},
                            **{"from": "acme/general/joel/cli"})
    assert hub.joel.call("POST", "/messages", plain).status == 201
    # tampered after signing, or signed too long ago: 401, nothing stored
    tampered = {**plain, "id": "sig-plain-1", "body": {"type": "text/plain", "text": "x"}}
    tampered["id"] = "sig-tampered"
    assert hub.joel.call("POST", "/messages", tampered).status == 401
    old = {"v": 1, "ts": int(time.time()) - 660, "id": "sig-old", "kind": "request",
           "from": "acme/general/joel/cli", "to": vault,
           "body": {"type": "text/plain", "text": "old"}}
    old["sig"] = signing.sign(joel.sign, old)
    assert hub.joel.call("POST", "/messages", old).status == 401
    foreign = {**plain, "id": "sig-foreign"}
    foreign["sig"] = signing.sign(Ed25519PrivateKey.generate(), foreign)
    assert hub.joel.call("POST", "/messages", foreign).status == 401

    [got] = hub.ana_server.take_until(vault, 1)
    assert got["id"] == "sig-plain-1" and got["signed"] is True
    assert signing.signed_by(got) == joel.public
    assert got["sig"]["node"] == "acme/general/joel:laptop"
    assert hub.ana_server.ack(vault, [got["id"]]).status == 200

    # sealed for ana's server: her laptop does not get it, the server opens it
    body, _ = e2e.seal(key.json["enc_key"], "enc-1", "request",
                       {"type": "text/plain", "text": "the code is 1234"}, [], joel.enc_key)
    sealed = signed_envelope(joel, id="enc-1", kind="request", to=vault, body=body, refs=[],
                             **{"from": "acme/general/joel/cli"})
    assert hub.joel.call("POST", "/messages", sealed).status == 201
    assert hub.ana.take(vault) == []
    [got] = hub.ana_server.take_until(vault, 1)
    assert signing.signed_by(got) == joel.public
    opened = e2e.open_envelope(got, ana_server.enc)
    assert opened["body"]["text"] == "the code is 1234"
    assert e2e.open_envelope(got, e2e.new_enc_key()[0]) is None
    reply_body, _ = e2e.seal(opened["reply_key"], "enc-1-reply", "reply",
                             {"type": "text/plain", "text": "noted"}, [], ana_server.enc_key)
    reply = signed_envelope(ana_server, id="enc-1-reply", kind="reply", reply_to="enc-1",
                            body=reply_body, refs=[], **{"from": vault})
    assert hub.ana_server.call("POST", "/messages", reply).status == 201
    [back] = hub.joel.take_until("acme/general/joel/cli", 1)
    assert back["reply_to"] == "enc-1" and back["body"]["type"] == \
        "application/redsyn+encrypted"
    assert signing.signed_by(back) == ana_server.public
    assert e2e.open_envelope(back, joel.enc)["body"]["text"] == "noted"
    hub.joel.ack("acme/general/joel/cli", [back["id"]])


def test_leases_ten_takes_expiry_and_cancel(hub):
    worker = "acme/general/joel/flaky"
    asker = "acme/general/ana/asker"
    sent = hub.ana.send({"id": "lease-1", "kind": "request", "from": asker, "to": worker,
                         "body": {"type": "text/plain", "text": "x"}})
    assert sent.status == 201
    attempts = []
    while len(attempts) < 10:
        items = hub.joel.take(worker, wait=5, lease=SHORT_LEASE)
        attempts += [i["attempts"] for i in items if i["id"] == "lease-1"]
    assert attempts == list(range(1, 11))
    [error] = hub.ana.take_until(asker, 1)
    assert error["error"] is True and error["reply_to"] == "lease-1"
    assert error["body"]["text"] == (f"not delivered: {worker} took it 10 times and never "
                                     "confirmed it")
    hub.ana.ack(asker, [error["id"]])

    assert hub.ana.send({"id": "expire-1", "kind": "request", "from": asker, "to": worker,
                         "ttl": 1, "body": {"type": "text/plain", "text": "x"}}).status == 201
    [error] = hub.ana.take_until(asker, 1)
    assert error["body"]["text"] == f"not delivered: it expired before {worker} took it"
    hub.ana.ack(asker, [error["id"]])

    assert hub.ana.send({"id": "cancel-1", "kind": "request", "from": asker, "to": worker,
                         "body": {"type": "text/plain", "text": "x"}}).status == 201
    assert hub.joel.call("DELETE", "/messages/cancel-1").status == 403
    answer = hub.ana.call("DELETE", "/messages/cancel-1")
    assert answer.status == 200 and answer.json["cancelled"] is True
    assert hub.joel.take(worker) == []
    assert hub.ana.call("DELETE", "/messages/cancel-1").status == 404
    assert hub.ana.send({"id": "cancel-2", "kind": "request", "from": asker, "to": worker,
                         "body": {"type": "text/plain", "text": "x"}}).status == 201
    [taken] = hub.joel.take(worker)
    assert hub.ana.call("DELETE", "/messages/cancel-2").status == 409
    hub.joel.ack(worker, [taken["id"]])


def wait_for(predicate, rounds=400):
    for _ in range(rounds):
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def test_webhooks_deliver_genuinely_and_a_failing_one_tells_the_sender(hub):
    good = Hook("a-long-webhook-secret", 200)
    bad = Hook("another-long-secret!", 500)
    try:
        assert hub.joel.announce("acme/general/joel/hooked",
                                 webhook={"url": good.url, "secret": good.secret}).status == 200
        assert hub.joel.announce("acme/general/joel/broken",
                                 webhook={"url": bad.url, "secret": bad.secret}).status == 200
        refused = hub.joel.announce("acme/general/joel/x", webhook={
            "url": "http://hooks.example.com/x", "secret": good.secret})
        assert refused.status == 400
        asker = "acme/general/ana/hookasker"
        assert hub.ana.send({"id": "hook-1", "kind": "request", "from": asker,
                             "to": "acme/general/joel/hooked",
                             "body": {"type": "text/plain", "text": "pushed"}}).status == 201
        assert wait_for(lambda: good.deliveries)
        headers, body, genuine = good.deliveries[0]
        assert genuine and headers["redsyn-delivery"] == "hook-1"
        assert headers["redsyn-version"] == "2026-09-25"
        assert json.loads(body)["body"]["text"] == "pushed"
        assert wait_for(lambda: hub.joel.call(
            "GET", "/agents/acme/general/joel/hooked").json["waiting"] == 0)
        assert hub.joel.call("GET", "/agents/acme/general/joel/hooked").json["online"]

        assert hub.ana.send({"id": "hook-2", "kind": "request", "from": asker,
                             "to": "acme/general/joel/broken",
                             "body": {"type": "text/plain", "text": "x"}}).status == 201
        [error] = hub.ana.take_until(asker, 1, rounds=40)
        assert error["reply_to"] == "hook-2" and error["error"] is True
        assert "webhook did not take it in 10 attempts" in error["body"]["text"]
        assert len(bad.deliveries) == 10 and all(g for _, _, g in bad.deliveries)
        assert len(good.deliveries) == 1
        # while a delivery waits out its back-off the pusher sleeps until it
        # lapses: a few rounds per attempt (plus the loop's 1 s tick), not a
        # loop that keeps turning with nothing to send
        metrics = hub.proc.get_text("/metrics")
        rounds = float(re.search(r"^hubd_redsyn_webhook_rounds_total (\S+)$", metrics,
                                 re.M).group(1))
        assert 'hubd_redsyn_webhook_attempts_total{outcome="failed"} 10.0' in metrics
        assert rounds < 100, rounds
    finally:
        good.close()
        bad.close()


def test_policy_topics_and_files(hub):
    deploy = "acme/ops/olga/deploy"
    assert hub.ops.announce(deploy, policy={"requests_from": ["acme/ops"]}).status == 200
    answer = hub.joel.send({"kind": "request", "from": "cli", "to": deploy,
                            "body": {"type": "text/plain", "text": "x"}})
    assert answer.status == 403 and "acme/ops" in answer.json["error"]
    assert hub.ops.take(deploy) == []

    for client, agent in ((hub.joel, "acme/general/joel/news"),
                          (hub.ana, "acme/general/ana/news")):
        answer = client.call("POST", "/topics/acme/general/news/subscribe", {"agent": agent})
        assert answer.status == 200 and answer.json["subscribed"]
    assert hub.joel.send({"id": "ev-1", "kind": "event", "from": "acme/general/joel/pub",
                          "to": "topic:acme/general/news",
                          "body": {"type": "text/plain", "text": "released"}}).status == 201
    for client, agent in ((hub.joel, "acme/general/joel/news"),
                          (hub.ana, "acme/general/ana/news")):
        [event] = client.take_until(agent, 1)
        assert event["topic"] == "topic:acme/general/news" and event["to"].startswith(agent)
        client.ack(agent, [event["id"]])

    assert hub.joel.send({"id": "files-1", "kind": "request", "from": "cli",
                          "to": "acme/general/ana/reader", "files": {"zip": b64url(b"PK\x03")},
                          "body": {"type": "text/plain", "text": "see files"}}).status == 201
    [item] = hub.ana.take_until("acme/general/ana/reader", 1)
    files = hub.ana.call("GET", "/messages/files-1/files")
    assert files.status == 200 and files.body == b"PK\x03"
    assert hub.bob.call("GET", "/messages/files-1/files").status == 403
    hub.ana.ack("acme/general/ana/reader", ["files-1"])
    assert hub.ana.call("GET", "/messages/files-1/files").status == 410


def test_no_redsyn_turns_the_door_off(tmp_path):
    proc = hubd_process(tmp_path, "--no-redsyn").start()
    try:
        answer = Client(proc.http_url, "x").call("GET", "/inbox/a/b/c/d")
        assert answer.status == 426  # the WebSocket door's answer to plain HTTP
    finally:
        proc.stop()


def test_sigkill_mid_stream_loses_nothing_acknowledged(tmp_path):
    db = tmp_path / "hubd.db"
    sender_token = login(db, "acme/general/ana", "laptop")
    receiver_token = login(db, "acme/general/joel", "laptop")
    proc = hubd_process(tmp_path, db=db).start()
    port = proc.port
    accepted, acked, received = set(), set(), []
    box = "acme/general/joel/sink"
    stop = threading.Event()

    def send():
        client = Client(proc.http_url, sender_token)
        n = 0
        while not stop.is_set():
            id_ = f"k{n}"
            try:
                answer = client.send({"id": id_, "kind": "request", "from": "src", "to": box,
                                      "body": {"type": "text/plain", "text": id_}})
            except OSError:
                time.sleep(0.05)
                continue
            if answer.status == 201 or answer.status == 200:
                accepted.add(id_)
                n += 1
            elif answer.status >= 500:
                time.sleep(0.05)

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    receiver = Client(proc.http_url, receiver_token)
    try:
        while len(acked) < 50:
            items = receiver.take(box, wait=5, lease=3)
            received += [i["id"] for i in items]
            if items:
                assert receiver.ack(box, [i["id"] for i in items]).status == 200
                acked.update(i["id"] for i in items)
        # one batch taken and not confirmed when the hub dies (on the shortest
        # lease: the restarted hub hands it out again once it lapses)
        in_flight = receiver.take(box, wait=5, lease=1)
        assert in_flight
    except BaseException:
        stop.set()  # a failure before the kill must not leave the hub running
        proc.stop()
        raise
    os.kill(proc.pid, signal.SIGKILL)
    proc.proc.wait()
    time.sleep(0.3)
    stop.set()
    sender.join(30)
    proc = hubd_process(tmp_path, db=db, port=port).start()
    try:
        receiver = Client(proc.http_url, receiver_token)
        for _ in range(100):
            missing = accepted - acked
            if not missing:
                break
            items = receiver.take(box, wait=5, lease=30)
            for item in items:
                assert item["id"] not in acked, f"{item['id']} was acked and came again"
            received += [i["id"] for i in items]
            if items:
                assert receiver.ack(box, [i["id"] for i in items]).status == 200
                acked.update(i["id"] for i in items)
        assert accepted <= acked, sorted(accepted - acked)[:10]
        assert {i["id"] for i in in_flight} <= acked  # leased at the crash, came back
    finally:
        proc.stop()


def test_a_waiting_poll_is_answered_when_the_hub_stops(tmp_path):
    """SIGTERM while an agent's poll waits: the poll is answered (no items, as
    if its wait ran out; or 503 if its take was still with the Router) instead
    of being dropped, and the hub exits at once instead of waiting out its
    listener's shutdown timeout for it."""
    db = tmp_path / "hubd.db"
    token = login(db, "acme/general/joel", "laptop")
    proc = hubd_process(tmp_path, db=db).start()
    try:
        client = Client(proc.http_url, token)
        box = "acme/general/joel/idle"
        answers = []
        poll = threading.Thread(target=lambda: answers.append(
            client.call("GET", f"/inbox/{box}?wait=30", timeout=10)))
        poll.start()
        # the poll has begun (a take is the agent's heartbeat)
        assert wait_for(lambda: client.call("GET", f"/agents/{box}").status == 200)
        started = time.monotonic()
        proc.signal(signal.SIGTERM)
        proc.proc.wait(10)
        exited = time.monotonic() - started
        poll.join(10)
        [answer] = answers
        assert (answer.status, answer.json) in ((200, {"items": []}), (503, {
            "error": "the hub is shutting down; retry"})), (answer.status, answer.body)
        assert proc.proc.returncode == 0
        assert exited < 2.0, f"the hub took {exited:.1f} s to exit"
    finally:
        proc.stop()

"""REDSYN organizations and links over real HTTP against a real hubd process
(docs/redsyn.md, "Organizations and links"): two organizations on one hub,
a link proposed, accepted, used, suspended mid-conversation, resumed and
ended; every refusal with its status and body, and nothing journaled."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from types import SimpleNamespace

import pytest

from tests.integration.test_redsyn import register_keys, signed_envelope
from tests.support.procs import hubd_process
from tests.support.redsyn_client import Client, login

NODES = {
    "ivan": ("acme/it/ivan", "laptop"),     # acme's admin
    "gus": ("globex/it/gus", "laptop"),     # globex's admin
    "joel": ("acme/dev/joel", "laptop"),
    "bob": ("globex/erp/bob", "box"),
    "kim": ("globex/erp/kim", "box"),       # of globex, not an admin
}
CLI = "acme/dev/joel/cli"
BILLING = "globex/erp/bob/billing"


def org(db, *args) -> None:
    subprocess.run([sys.executable, "-m", "hubd", "redsyn", "org", *args, "--db", str(db)],
                   check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    work = tmp_path_factory.mktemp("redsyn-links")
    db = work / "hubd.db"
    tokens = {key: login(db, person, name) for key, (person, name) in NODES.items()}
    for name, admin in (("acme", "acme/it/ivan"), ("globex", "globex/it/gus")):
        org(db, "create", name)
        org(db, "add-admin", name, admin)
    proc = hubd_process(work, db=db).start()
    clients = {key: Client(proc.http_url, token) for key, token in tokens.items()}
    yield SimpleNamespace(proc=proc, db=db, **clients)
    proc.stop()


def journal(db) -> list:
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT seq, kind, payload FROM events ORDER BY seq").fetchall()


def refused(hub, answer, status: int, text: str, before: list) -> None:
    """The seed's error body, and nothing journaled."""
    assert answer.status == status, answer.body
    assert set(answer.json) == {"error", "status"} and answer.json["status"] == status
    assert text in answer.json["error"], answer.json
    assert journal(hub.db) == before


def request(client, text: str, to: str = BILLING):
    return client.send({"kind": "request", "from": "cli", "to": to,
                        "body": {"type": "text/plain", "text": text}})


def end_links(hub) -> None:
    for link in hub.ivan.call("GET", "/links").json["links"]:
        if link["state"] != "ended":
            assert hub.ivan.call("POST", f"/links/{link['id']}/end", {}).status == 200


def test_a_link_proposed_accepted_used_suspended_resumed_and_ended(hub):
    assert hub.bob.announce(BILLING).status == 200
    before = journal(hub.db)
    refused(hub, request(hub.joel, "before any link"), 403,
            "acme and globex have no active link", before)

    made = hub.ivan.call("POST", "/links", {
        "org": "acme", "peer": "globex", "reason": "invoices",
        "terms": {"expose": ["acme/dev"], "signed_only": False}})
    assert made.status == 201 and made.json["state"] == "proposed", made.body
    link = made.json["id"]
    before = journal(hub.db)
    refused(hub, request(hub.joel, "too early"), 403, "is proposed, not active", before)
    accepted = hub.gus.call("POST", f"/links/{link}/accept", {
        "terms": {"expose": ["globex/erp"], "signed_only": False}})
    assert accepted.status == 200 and accepted.json["state"] == "active", accepted.body

    # used: a request and its reply cross
    sent = request(hub.joel, "is invoice 123 paid?")
    assert sent.status == 201, sent.body
    [asked] = hub.bob.take_until(BILLING, 1)
    assert asked["body"]["text"] == "is invoice 123 paid?"
    answer = hub.bob.send({"kind": "reply", "from": "billing", "reply_to": asked["id"],
                           "body": {"type": "text/plain", "text": "paid"}})
    assert answer.status == 201, answer.body
    [reply] = hub.joel.take_until(CLI, 1)
    assert reply["body"]["text"] == "paid" and reply["error"] is False
    assert hub.joel.ack(CLI, [reply["id"]]).status == 200

    # suspended mid-conversation: one taken and not confirmed, one waiting;
    # both are answered to joel at once, neither reaches bob again
    leased = request(hub.joel, "second").json["id"]
    assert [i["id"] for i in hub.bob.take_until(BILLING, 1)] == [leased]
    waiting = request(hub.joel, "third").json["id"]
    suspended = hub.gus.call("POST", f"/links/{link}/suspend", {"reason": "audit"})
    assert suspended.status == 200 and suspended.json["suspended_by"] == ["globex"]
    told = hub.joel.take_until(CLI, 2)
    assert sorted(e["reply_to"] for e in told) == sorted([leased, waiting])
    for error in told:
        assert error["error"] is True and error["kind"] == "reply"
        assert error["body"]["text"] == (f"not delivered: link {link} between acme and "
                                         "globex is suspended by globex")
    assert hub.joel.ack(CLI, [e["id"] for e in told]).status == 200
    assert hub.bob.ack(BILLING, [leased]).json == {"acked": [], "unknown": [leased]}
    assert hub.bob.take(BILLING) == []
    before = journal(hub.db)
    refused(hub, request(hub.joel, "while suspended"), 403,
            f"link {link} between acme and globex is suspended by globex", before)
    refused(hub, hub.ivan.call("POST", f"/links/{link}/resume", {}), 409,
            "acme has not suspended", before)

    resumed = hub.gus.call("POST", f"/links/{link}/resume", {})
    assert resumed.status == 200 and resumed.json["state"] == "active"
    again = request(hub.joel, "fourth").json["id"]
    assert [i["id"] for i in hub.bob.take_until(BILLING, 1)] == [again]
    assert hub.bob.ack(BILLING, [again]).status == 200

    ended = hub.ivan.call("POST", f"/links/{link}/end", {})
    assert ended.status == 200 and ended.json["state"] == "ended"
    before = journal(hub.db)
    refused(hub, request(hub.joel, "after the end"), 403, "have no active link", before)
    refused(hub, hub.gus.call("POST", f"/links/{link}/resume", {}), 409, "has ended", before)

    # both sides read the same change log, people and admins alike
    logs = [client.call("GET", f"/links/{link}").json for client in (hub.joel, hub.bob, hub.gus)]
    assert logs[0] == logs[1] == logs[2]
    assert [(e["action"], e["org"]) for e in logs[0]["log"]] == [
        ("propose", "acme"), ("accept", "globex"), ("suspend", "globex"),
        ("resume", "globex"), ("end", "acme")]
    assert logs[0]["log"][0]["by"] == "acme/it/ivan:laptop"
    assert logs[0]["log"][2]["reason"] == "audit"
    assert [x["id"] for x in hub.kim.call("GET", "/links").json["links"]] == [link]

    # the change log is journaled: a restart reads the same links
    hub.proc.stop()
    hub.proc.start()
    assert hub.joel.call("GET", f"/links/{link}").json == logs[0]


def test_every_refusal_has_its_status_and_body_and_stores_nothing(hub):
    end_links(hub)
    before = journal(hub.db)
    refused(hub, hub.kim.call("POST", "/links", {"org": "globex", "peer": "acme"}), 403,
            "globex/erp/kim is not an admin of globex", before)
    refused(hub, hub.joel.call("POST", "/links", {"org": "acme", "peer": "initech"}), 403,
            "not an admin of acme", before)
    refused(hub, hub.ivan.call("POST", "/links", {"org": "acme", "peer": "initech"}), 404,
            "no organization initech", before)
    refused(hub, hub.ivan.call("POST", "/links", {"org": "acme", "peer": "globex",
                                                  "terms": {"expose": ["globex"]}}), 400,
            "acme exposes only its own addresses", before)

    link = hub.ivan.call("POST", "/links", {"org": "acme", "peer": "globex"}).json["id"]
    before = journal(hub.db)
    refused(hub, hub.kim.call("POST", f"/links/{link}/accept", {}), 403,
            "not an admin of globex", before)
    refused(hub, hub.ivan.call("POST", f"/links/{link}/accept", {}), 403,
            "an admin of globex accepts it", before)
    refused(hub, hub.kim.call("GET", "/links/lnk-nope"), 404, "no link lnk-nope", before)
    # globex takes only signed messages (its default), from one network
    assert hub.gus.call("POST", f"/links/{link}/accept", {"terms": {
        "expose": ["globex/erp"], "allow_ips": ["127.0.0.0/8"]}}).status == 200
    before = journal(hub.db)
    refused(hub, request(hub.joel, "unsigned"), 403,
            f"link {link} takes only signed messages into globex", before)
    refused(hub, request(hub.joel, "not exposed", to="globex/it/gus/desk"), 403,
            "globex does not expose globex/it/gus/desk to acme", before)
    keys = register_keys(hub.joel)
    signed = signed_envelope(keys, kind="request", id="signed-1", **{"from": "cli"},
                             to=BILLING, body={"type": "text/plain", "text": "signed"})
    assert hub.joel.send(signed).status == 201
    [got] = hub.bob.take_until(BILLING, 1)
    assert got["id"] == "signed-1" and got["signed"] is True
    assert hub.bob.ack(BILLING, ["signed-1"]).status == 200

    # outside the allow-list (the hub sees this client at 127.0.0.1)
    assert hub.gus.call("PUT", f"/links/{link}/terms", {"terms": {
        "expose": ["globex/erp"], "allow_ips": ["192.0.2.0/24"]}}).status == 200
    before = journal(hub.db)
    signed = signed_envelope(keys, kind="request", id="signed-2", **{"from": "cli"},
                             to=BILLING, body={"type": "text/plain", "text": "signed"})
    refused(hub, hub.joel.send(signed), 403, "127.0.0.1 is not on it", before)
    # across organizations nothing is visible without an exposing link
    refused(hub, hub.joel.call("GET", "/agents/globex/it/gus/desk"), 403,
            "not visible outside globex", before)
    assert hub.joel.call("GET", f"/agents/{BILLING}").status == 200


def test_a_call_without_a_date_gets_its_organizations_pinned_date(hub):
    bare = Client(hub.proc.http_url, hub.joel.token, version=None)
    answer = bare.call("GET", "/orgs/acme")
    assert answer.status == 200 and answer.headers["Redsyn-Version"] == "2026-09-25"
    assert answer.json == {"org": "acme", "redsyn_version": "2026-09-25",
                           "admins": ["acme/it/ivan"]}
    assert bare.call("GET", "/orgs/globex").status == 404  # not its organization

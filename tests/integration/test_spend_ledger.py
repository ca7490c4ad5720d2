"""spend_request against a real pool-owner hub over mTLS
(docs/guard-evidence-and-spend.md, seed 000 "Shared-pool reservations"):

- a granted peer hub (its client certificate pinned by the owner's serving
  policy) reserves, settles and queries in the owner's owner-only ledger
  file; a retry answers the stored reservation; over the limit is refused;
- every refusal has the same not-admitted shape: an ungranted peer, a plain
  client, a pool the peer is no grantee of, a malformed document;
- an unknown action is a plain error; the journal never holds a spend row and
  the ledger file stays 0600;
- a hub without --spend-ledger refuses uniformly.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import stat

import pytest

from federation.tls import peer_client_context
from tests.support.federation import make_pki, site_flags, write_serving_policy
from tests.support.procs import hubd_process
from tests.support.spend_docs import (REFUSED, ledger_file, pool_config, query_doc, reserve_doc,
                                      settle_doc)
from tests.support.waiting import wait_for
from tests.support.wsprobe import WsProbe, joined

NOT_ADMITTED, NOT_SETTLED, NOT_FOUND = (REFUSED[a] for a in ("reserve", "settle", "query"))


@pytest.fixture
def pki(tmp_path):
    return make_pki(tmp_path / "pki", ["owner", "east", "north"])


async def peer(url, pki, hub):
    context = peer_client_context(pki.file(hub, "client", "cert"), pki.file(hub, "client", "key"))
    return await WsProbe.open(url, ssl=context)


async def spend(probe, sender, action, document) -> dict:
    probe._cursor = len(probe.frames)
    await probe.send_json({"sender": sender, "target": "System", "type": "spend_request",
                           "spend_action": action, "spend": document})
    return await probe.recv(lambda f: f.get("type") in ("spend_result", "error"), timeout=10)


def spend_rows(db) -> int:
    conn = sqlite3.connect(db)
    try:
        return conn.execute("SELECT count(*) FROM events WHERE kind LIKE '%spend%' "
                            "OR payload LIKE '%pool_id%'").fetchone()[0]
    finally:
        conn.close()


def test_granted_peer_reserves_settles_and_queries(tmp_path, pki):
    policy = write_serving_policy(tmp_path / "policy", pki, {"east": ["PROJ"], "north": ["PROJ"]})
    ledger = ledger_file(tmp_path, pool_config("gpu"),
                         pool_config("cpu", grantees=(("north", "PROJ"),), hard_bound="10"))
    owner = hubd_process(tmp_path / "owner", *site_flags(pki, "owner", policy).serve,
                         "--spend-ledger", ledger, "--log-format", "json", hub_id="owner",
                         scheme="wss")
    owner.start()
    try:
        async def scenario():
            east = await peer(owner.url, pki, "east")
            got = await spend(east, "east", "reserve", reserve_doc("job-1", "60"))
            assert got["type"] == "spend_result" and got["spend_action"] == "reserve", got
            first = got["spend_result"]
            assert (first["admitted"], first["exposure"], first["pool_id"]) == \
                (True, "60", "gpu"), first
            # a retry answers the same reservation; the ledger is unchanged
            again = await spend(east, "east", "reserve", reserve_doc("job-1", "60"))
            assert again["spend_result"] == first
            # over the pool's bound, another pool, a malformed document: one shape
            for document in (reserve_doc("job-2", "50"), reserve_doc("job-3", "1", pool_id="cpu"),
                             reserve_doc("job-4", "1", pool_id="nope"),
                             reserve_doc("job-5", "1.5e999"), reserve_doc("job-1", "61"),
                             {k: v for k, v in reserve_doc("job-6", "1").items()
                              if k != "upper_bound"}):
                refused = await spend(east, "east", "reserve", document)
                assert refused["spend_result"] == NOT_ADMITTED, (document, refused)
            rid = first["reservation_id"]
            settled = await spend(east, "east", "settle", settle_doc(rid, "u1", "42.5"))
            assert settled["spend_result"] == {"settled": True, "reservation_id": rid,
                                               "usage_ref": "u1", "overrun": False}, settled
            closed = await spend(east, "east", "settle", settle_doc(rid, "u2", "1"))
            assert closed["spend_result"] == NOT_SETTLED  # the final settlement closed it
            found = await spend(east, "east", "query", query_doc("job-1"))
            assert found["spend_result"] == {"found": True, "response": first}
            # the settled amount frees the rest of the pool
            more = await spend(east, "east", "reserve", reserve_doc("job-7", "57.5"))
            assert more["spend_result"]["admitted"] is True, more
            # an unknown action, a missing document: a plain error
            for frame in ({"spend_action": "drain", "spend": {}}, {"spend_action": "query"},
                          {"spend_action": "query", "spend": "x"}):
                east._cursor = len(east.frames)
                await east.send_json({"sender": "east", "target": "System",
                                      "type": "spend_request", **frame})
                bad = await east.recv(lambda f: f.get("type") in ("spend_result", "error"))
                assert (bad["type"], bad["payload"]) == ("error", "Malformed spend request"), bad
            await east.close()

            # north: served by the policy, but another caller: sees nothing of east's
            north = await peer(owner.url, pki, "north")
            hidden = await spend(north, "north", "query", query_doc("job-1"))
            assert hidden["spend_result"] == NOT_FOUND
            settle = await spend(north, "north", "settle", settle_doc(rid, "u9", "1"))
            assert settle["spend_result"] == NOT_SETTLED
            await north.close()

            # a plain client is never served
            client = await joined(owner.url, "PROJ/alice")
            plain = await spend(client, "PROJ/alice", "query", query_doc("job-1"))
            assert plain["spend_result"] == NOT_FOUND
            await client.close()
        asyncio.run(scenario())
    finally:
        owner.stop()
    saved = json.loads(open(ledger).read())
    assert sorted((r["caller"], r["settled"], r["closed"]) for r in
                  saved["reservations"].values()) == [("east", "0", False),
                                                      ("east", "42.5", True)]
    assert stat.S_IMODE(os.stat(ledger).st_mode) == 0o600
    assert spend_rows(tmp_path / "owner" / "hubd.db") == 0
    # the peers saw one shape; the owner's log says each refusal's cause
    logged = [json.loads(line) for line in owner.log().splitlines() if line.startswith("{")]
    refused = [entry for entry in logged if entry["event"] == "spend request refused"]
    assert {(r["peer"], r["reason"]) for r in refused} >= {
        ("east", "bound_exceeded"), ("east", "caller_not_granted"), ("east", "unknown_pool"),
        ("east", "malformed_document"), ("east", "idempotency_conflict"),
        ("east", "reservation_closed"), ("north", "not_found"),
        ("north", "unknown_reservation")}, refused


def test_ungranted_peer_and_ledgerless_hub_get_the_uniform_refusal(tmp_path, pki):
    policy = write_serving_policy(tmp_path / "policy", pki, {"east": ["PROJ"]})
    ledger = ledger_file(tmp_path, pool_config(grantees=(("east", "PROJ"), ("north", "PROJ"))))
    owner = hubd_process(tmp_path / "owner", *site_flags(pki, "owner", policy).serve,
                         "--spend-ledger", ledger, hub_id="owner", scheme="wss")
    bare = hubd_process(tmp_path / "bare", *site_flags(pki, "owner", policy).serve,
                        hub_id="owner", scheme="wss")
    owner.start()
    bare.start()
    try:
        async def scenario():
            north = await peer(owner.url, pki, "north")  # not in the serving policy
            for action, document, refusal in (
                    ("reserve", reserve_doc("k", "1"), NOT_ADMITTED),
                    ("settle", settle_doc("rsv-x", "u1", "1"), NOT_SETTLED),
                    ("query", query_doc("k"), NOT_FOUND)):
                got = await spend(north, "north", action, document)
                assert got["spend_result"] == refusal, got
            await north.close()
            east = await peer(bare.url, pki, "east")
            got = await spend(east, "east", "reserve", reserve_doc("k", "1"))
            assert got["spend_result"] == NOT_ADMITTED
            await east.close()
        asyncio.run(scenario())
    finally:
        owner.stop()
        bare.stop()
    assert "reservations" not in json.loads(open(ledger).read())  # never written


def test_a_peer_hub_relays_its_agents_spend_requests_over_the_link(tmp_path, pki):
    """Two real hubs over mTLS: east's agent asks the owner through east's
    peer link; the owner scopes the reservation to east (its certificate)."""
    policy = write_serving_policy(tmp_path / "policy", pki, {"east": ["PROJ"]})
    ledger = ledger_file(tmp_path, pool_config(hard_bound="10"))
    owner = hubd_process(tmp_path / "owner", *site_flags(pki, "owner", policy).serve,
                         "--spend-ledger", ledger, hub_id="owner", scheme="wss").start()
    site = site_flags(pki, "east", None)
    # east relays only for the agents its ACL policy lets spend at the owner
    acl = tmp_path / "east-acl.json"
    acl.write_text(json.dumps({"rules": [{"permission": "spend-request", "target_kind": "hub",
                                          "target_pattern": "owner",
                                          "namespace": "PROJ"}]}))
    acl.chmod(0o600)
    east = hubd_process(tmp_path / "east", *site.peer_flags(pki, "owner", owner.url),
                        *site.connect, "--acl-policy", str(acl), hub_id="east").start()
    try:
        wait_for(lambda: east.get_json("/health")["message_forward"]["owner"]["link"] == "up",
                 what="east's link to the owner")

        async def scenario():
            alice = await joined(east.url, "PROJ/alice")

            async def ask(action, document, agent=alice, name="PROJ/alice", **extra):
                agent._cursor = len(agent.frames)
                await agent.send_json({"sender": name, "target": "System",
                                       "type": "spend_request", "owner_hub": "owner",
                                       "spend_action": action, "spend": document, **extra})
                return await agent.recv(lambda f: f.get("type") in ("spend_result", "error"),
                                        timeout=20)

            # an agent of another project: no rule lets it spend, nothing reaches the owner
            other = await joined(east.url, "OTHER/mallory")
            denied = await ask("reserve", reserve_doc("m1", "1"), agent=other,
                               name="OTHER/mallory")
            assert denied["spend_result"] == NOT_ADMITTED, denied
            await other.close()
            got = await ask("reserve", reserve_doc("r1", "7"))
            assert got["spend_result"]["admitted"] is True, got
            assert got["target"] == "PROJ/alice"
            refused = await ask("reserve", reserve_doc("r2", "7"))
            assert refused["spend_result"] == NOT_ADMITTED
            found = await ask("query", query_doc("r1"))
            assert found["spend_result"]["response"]["exposure"] == "7"
            # a hub east has no link to: the uniform refusal, at once
            alice._cursor = len(alice.frames)
            await alice.send_json({"sender": "PROJ/alice", "target": "System",
                                   "type": "spend_request", "owner_hub": "elsewhere",
                                   "spend_action": "settle",
                                   "spend": settle_doc("rsv-x", "u1", "1")})
            nowhere = await alice.recv(lambda f: f.get("type") == "spend_result")
            assert nowhere["spend_result"] == NOT_SETTLED
            await alice.close()
        asyncio.run(scenario())
    finally:
        east.stop()
        owner.stop()
    saved = json.loads(open(ledger).read())
    assert [r["caller"] for r in saved["reservations"].values()] == ["east"]
    assert spend_rows(tmp_path / "owner" / "hubd.db") == 0
    assert spend_rows(tmp_path / "east" / "hubd.db") == 0


def test_pipelined_reserves_are_decided_in_order_one_write_at_a_time(tmp_path, pki):
    """Requests that arrive while the ledger file is being written wait their
    turn: twenty reserves of 1 on a pool of 10, sent without waiting, get
    ten admissions then ten refusals, and the file holds exactly ten."""
    policy = write_serving_policy(tmp_path / "policy", pki, {"east": ["PROJ"]})
    ledger = ledger_file(tmp_path, pool_config(hard_bound="10", max_agents=20))
    owner = hubd_process(tmp_path / "owner", *site_flags(pki, "owner", policy).serve,
                         "--spend-ledger", ledger, hub_id="owner", scheme="wss").start()
    try:
        async def scenario():
            east = await peer(owner.url, pki, "east")
            for i in range(20):
                await east.send_json({"sender": "east", "target": "System",
                                      "type": "spend_request", "spend_action": "reserve",
                                      "spend": reserve_doc(f"k{i}", "1")})
            answers = []
            for _ in range(20):
                got = await east.recv(lambda f: f.get("type") == "spend_result", timeout=20)
                east._cursor = east.frames.index(got) + 1
                answers.append(got["spend_result"])
            await east.close()
            return answers
        answers = asyncio.run(scenario())
    finally:
        owner.stop()
    assert [a["admitted"] for a in answers[:10]] == [True] * 10
    assert [a["sequence"] for a in answers[:10]] == list(range(2, 12))
    assert answers[10:] == [NOT_ADMITTED] * 10
    assert len(json.loads(open(ledger).read())["reservations"]) == 10

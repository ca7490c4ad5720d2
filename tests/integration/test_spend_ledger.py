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
from tests.support.waiting import wait_for
from tests.support.wsprobe import WsProbe, joined

NOT_ADMITTED = {"admitted": False, "reason": "not-admitted"}
NOT_SETTLED = {"settled": False, "reason": "not-admitted"}
NOT_FOUND = {"found": False}


@pytest.fixture
def pki(tmp_path):
    return make_pki(tmp_path / "pki", ["owner", "east", "north"])


def ledger_file(folder, pools) -> str:
    path = folder / "spend-ledger.json"
    path.write_text(json.dumps({"pools": pools, "reservations": []}))
    path.chmod(0o600)
    return str(path)


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
    ledger = ledger_file(tmp_path, {
        "gpu": {"limit": "100", "unit": "tokens", "grantees": ["east"]},
        "cpu": {"limit": "10", "unit": "tokens", "grantees": ["north"]}})
    owner = hubd_process(tmp_path / "owner", *site_flags(pki, "owner", policy).serve,
                         "--spend-ledger", ledger, hub_id="owner", scheme="wss")
    owner.start()
    try:
        async def scenario():
            east = await peer(owner.url, pki, "east")
            got = await spend(east, "east", "reserve",
                              {"pool_id": "gpu", "key": "job-1", "upper_bound": "60"})
            assert got["type"] == "spend_result" and got["spend_action"] == "reserve", got
            first = got["spend_result"]
            assert first["admitted"] is True and first["upper_bound"] == "60", first
            # a retry answers the same reservation; the ledger is unchanged
            again = await spend(east, "east", "reserve",
                                {"pool_id": "gpu", "key": "job-1", "upper_bound": "60"})
            assert again["spend_result"] == first
            # over the pool's limit, another pool, a malformed document: one shape
            for document in ({"pool_id": "gpu", "key": "job-2", "upper_bound": "50"},
                             {"pool_id": "cpu", "key": "job-3", "upper_bound": "1"},
                             {"pool_id": "nope", "key": "job-4", "upper_bound": "1"},
                             {"pool_id": "gpu", "key": "job-5", "upper_bound": "1.5e999"},
                             {"pool_id": "gpu", "key": "job-6"}):
                refused = await spend(east, "east", "reserve", document)
                assert refused["spend_result"] == NOT_ADMITTED, (document, refused)
            settled = await spend(east, "east", "settle",
                                  {"pool_id": "gpu", "key": "job-1", "actual": "42.5"})
            assert settled["spend_result"]["settled"] is True, settled
            assert settled["spend_result"]["actual"] == "42.5"
            over = await spend(east, "east", "settle",
                               {"pool_id": "gpu", "key": "job-1", "actual": "43"})
            assert over["spend_result"] == NOT_SETTLED
            found = await spend(east, "east", "query", {"pool_id": "gpu", "key": "job-1"})
            assert found["spend_result"]["found"] is True
            assert found["spend_result"]["reservation"]["actual"] == "42.5"
            # the settled amount frees the rest of the pool
            more = await spend(east, "east", "reserve",
                               {"pool_id": "gpu", "key": "job-7", "upper_bound": "57.5"})
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
            hidden = await spend(north, "north", "query", {"pool_id": "gpu", "key": "job-1"})
            assert hidden["spend_result"] == NOT_FOUND
            settle = await spend(north, "north", "settle",
                                 {"pool_id": "gpu", "key": "job-1", "actual": "1"})
            assert settle["spend_result"] == NOT_SETTLED
            await north.close()

            # a plain client is never served
            client = await joined(owner.url, "PROJ/alice")
            plain = await spend(client, "PROJ/alice", "query", {"pool_id": "gpu", "key": "job-1"})
            assert plain["spend_result"] == NOT_FOUND
            await client.close()
        asyncio.run(scenario())
    finally:
        owner.stop()
    saved = json.loads(open(ledger).read())
    assert [(r["key"], r["settled"]) for r in saved["reservations"]] == \
        [("job-1", True), ("job-7", False)]
    assert stat.S_IMODE(os.stat(ledger).st_mode) == 0o600
    assert spend_rows(tmp_path / "owner" / "hubd.db") == 0


def test_ungranted_peer_and_ledgerless_hub_get_the_uniform_refusal(tmp_path, pki):
    policy = write_serving_policy(tmp_path / "policy", pki, {"east": ["PROJ"]})
    ledger = ledger_file(tmp_path, {"gpu": {"limit": "100", "unit": "t",
                                            "grantees": ["east", "north"]}})
    owner = hubd_process(tmp_path / "owner", *site_flags(pki, "owner", policy).serve,
                         "--spend-ledger", ledger, hub_id="owner", scheme="wss")
    bare = hubd_process(tmp_path / "bare", *site_flags(pki, "owner", policy).serve,
                        hub_id="owner", scheme="wss")
    owner.start()
    bare.start()
    try:
        async def scenario():
            north = await peer(owner.url, pki, "north")  # not in the serving policy
            for action, refusal in (("reserve", NOT_ADMITTED), ("settle", NOT_SETTLED),
                                    ("query", NOT_FOUND)):
                got = await spend(north, "north", action,
                                  {"pool_id": "gpu", "key": "k", "upper_bound": "1",
                                   "actual": "1"})
                assert got["spend_result"] == refusal, got
            await north.close()
            east = await peer(bare.url, pki, "east")
            got = await spend(east, "east", "reserve",
                              {"pool_id": "gpu", "key": "k", "upper_bound": "1"})
            assert got["spend_result"] == NOT_ADMITTED
            await east.close()
        asyncio.run(scenario())
    finally:
        owner.stop()
        bare.stop()
    assert json.loads(open(ledger).read())["reservations"] == []


def test_a_peer_hub_relays_its_agents_spend_requests_over_the_link(tmp_path, pki):
    """Two real hubs over mTLS: east's agent asks the owner through east's
    peer link; the owner scopes the reservation to east (its certificate)."""
    policy = write_serving_policy(tmp_path / "policy", pki, {"east": ["PROJ"]})
    ledger = ledger_file(tmp_path, {"gpu": {"limit": "10", "unit": "t", "grantees": ["east"]}})
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
            denied = await ask("reserve", {"pool_id": "gpu", "key": "m1", "upper_bound": "1"},
                               agent=other, name="OTHER/mallory")
            assert denied["spend_result"] == NOT_ADMITTED, denied
            await other.close()
            got = await ask("reserve", {"pool_id": "gpu", "key": "r1", "upper_bound": "7"})
            assert got["spend_result"]["admitted"] is True, got
            assert got["target"] == "PROJ/alice"
            refused = await ask("reserve", {"pool_id": "gpu", "key": "r2", "upper_bound": "7"})
            assert refused["spend_result"] == NOT_ADMITTED
            found = await ask("query", {"pool_id": "gpu", "key": "r1"})
            assert found["spend_result"]["reservation"]["upper_bound"] == "7"
            # a hub east has no link to: the uniform refusal, at once
            alice._cursor = len(alice.frames)
            await alice.send_json({"sender": "PROJ/alice", "target": "System",
                                   "type": "spend_request", "owner_hub": "elsewhere",
                                   "spend_action": "settle",
                                   "spend": {"pool_id": "gpu", "key": "r1", "actual": "1"}})
            nowhere = await alice.recv(lambda f: f.get("type") == "spend_result")
            assert nowhere["spend_result"] == NOT_SETTLED
            await alice.close()
        asyncio.run(scenario())
    finally:
        east.stop()
        owner.stop()
    saved = json.loads(open(ledger).read())
    assert [(r["caller"], r["key"]) for r in saved["reservations"]] == [("east", "r1")]
    assert spend_rows(tmp_path / "owner" / "hubd.db") == 0
    assert spend_rows(tmp_path / "east" / "hubd.db") == 0


def test_pipelined_reserves_are_decided_in_order_one_write_at_a_time(tmp_path, pki):
    """Requests that arrive while the ledger file is being written wait their
    turn: twenty reserves of 1 on a pool of 10, sent without waiting, get
    ten admissions then ten refusals, and the file holds exactly ten."""
    policy = write_serving_policy(tmp_path / "policy", pki, {"east": ["PROJ"]})
    ledger = ledger_file(tmp_path, {"gpu": {"limit": "10", "unit": "t", "grantees": ["east"]}})
    owner = hubd_process(tmp_path / "owner", *site_flags(pki, "owner", policy).serve,
                         "--spend-ledger", ledger, hub_id="owner", scheme="wss").start()
    try:
        async def scenario():
            east = await peer(owner.url, pki, "east")
            for i in range(20):
                await east.send_json({"sender": "east", "target": "System",
                                      "type": "spend_request", "spend_action": "reserve",
                                      "spend": {"pool_id": "gpu", "key": f"k{i}",
                                                "upper_bound": "1"}})
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
    assert [a.get("key") for a in answers[:10]] == [f"k{i}" for i in range(10)]
    assert answers[10:] == [NOT_ADMITTED] * 10
    assert len(json.loads(open(ledger).read())["reservations"]) == 10

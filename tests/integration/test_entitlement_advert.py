"""entitlement_advert against a real hubd process (seed 000, "Fleet planning
input"; docs/guard-evidence-and-spend.md): a proven sender the
entitlement-advertise ACL allows gets applied:true and one audit-only journal
row; nothing is broadcast; every refusal is applied:false, audit_seq:null with
the reason, and records nothing; a hub that does not bind identities refuses
every advertisement."""

from __future__ import annotations

import asyncio
import copy
import json
import sqlite3

from tests.support.procs import hubd_process
from tests.support.signed_site import SignedProbe, SignedSite, envelope
from tests.support.wsprobe import joined

ACL = [{"permission": "entitlement-advertise", "target_kind": "pool-alias",
        "target_pattern": "team-*"}]
ADVERT = {"schema": 1, "pool_alias": "team-gpu", "unit": "tokens", "resource_kind": None,
          "capabilities": ["chat"], "data_classes": [], "eligible_projects": ["p"],
          "account_usable": True, "as_of": "2026-12-02T12:00:00+00:00",
          "windows": [{"window_ref": "0123456789abcdef", "ends_at": "2026-12-03T00:00:00+00:00",
                       "current": True, "remaining_bucket": ">50%",
                       "balance_evidence": "observed", "observation_age_seconds": 5,
                       "forecast_state": "quiet", "confidence": "operator"}]}


def advert(**over) -> dict:
    doc = copy.deepcopy(ADVERT)
    doc.update(over)
    return doc


def audit_rows(db) -> list[dict]:
    conn = sqlite3.connect(db)
    try:
        rows = conn.execute("SELECT payload FROM events WHERE kind = 'entitlement_advert'"
                            " ORDER BY seq").fetchall()
    finally:
        conn.close()
    return [json.loads(p) for (p,) in rows]


async def ask(conn: SignedProbe, **fields) -> dict:
    conn.probe._cursor = len(conn.probe.frames)
    await conn.probe.send_json(envelope(conn.seat.name, "entitlement_advert", **fields))
    return await conn.probe.recv(lambda f: f.get("type") in ("entitlement_advert_result",
                                                             "error"), timeout=10)


def test_proven_authorised_sender_is_recorded_never_broadcast(tmp_path):
    site = SignedSite.make(tmp_path / "site", None, {"p/owner": [], "p/watcher": []}, ACL)
    hub = hubd_process(tmp_path / "hub", *site.flags).start()
    try:
        async def scenario():
            owner = await SignedProbe.open(hub.url, site.seats["p/owner"])
            watcher = await SignedProbe.open(hub.url, site.seats["p/watcher"])
            got = await ask(owner, advert=ADVERT)
            assert (got["type"], got["pool_alias"], got["applied"]) == \
                ("entitlement_advert_result", "team-gpu", True), got
            assert isinstance(got["audit_seq"], int) and got["target"] == "p/owner"
            assert got["payload"] == "advertisement recorded for 'team-gpu'"
            for fields, alias, text in [
                ({"advert": advert(pool_alias="other")}, "other",
                 "not authorised to advertise this pool alias"),
                ({"advert": advert(extra=1)}, "team-gpu",
                 "an advertisement has exactly the documented fields"),
                ({"advert": advert(schema=2)}, "team-gpu", "advertisement schema must be 1"),
                ({"advert": advert(as_of="2026-12-02T12:00:00")}, "team-gpu",
                 "as_of must include a UTC offset"),
                ({"advert": advert(windows=[{**ADVERT["windows"][0],
                                             "remaining_bucket": "lots"}])}, "team-gpu",
                 "remaining_bucket must be one of depleted, <10%, 10-50%, >50%, unknown"),
                ({**ADVERT}, "", "an advertisement has exactly the documented fields"),
            ]:
                refused = await ask(owner, **fields)
                assert (refused["applied"], refused["audit_seq"], refused["pool_alias"],
                        refused["payload"]) == (False, None, alias, text), (fields, refused)
            seen = await watcher.probe.drain(0.3)
            assert not [f for f in seen if "entitlement" in f.get("type", "")
                        or f.get("pool_alias")], seen
            await owner.close()
            await watcher.close()
            return got["audit_seq"]
        seq = asyncio.run(scenario())
    finally:
        hub.stop()
    rows = audit_rows(tmp_path / "hub" / "hubd.db")
    assert rows == [{"advertiser": "p/owner", "hub_id": "test-hub", "advert": ADVERT}]
    assert seq > 0


def test_unbound_hub_refuses_every_advertisement(tmp_path):
    hub = hubd_process(tmp_path, "--open-network").start()
    try:
        async def scenario():
            owner = await joined(hub.url, "p/owner")
            await owner.send_json(envelope("p/owner", "entitlement_advert", advert=ADVERT))
            got = await owner.recv_type("entitlement_advert_result")
            assert (got["applied"], got["audit_seq"], got["pool_alias"], got["payload"]) == \
                (False, None, "team-gpu",
                 "advertisements require a cryptographically proven sender"), got
            await owner.close()
        asyncio.run(scenario())
    finally:
        hub.stop()
    assert audit_rows(tmp_path / "hubd.db") == []

"""The pure decisions of guard evidence, entitlement adverts and the spend
ledger (hubd/state/guard_evidence.py, entitlements.py, spend_ledger.py)."""

from __future__ import annotations

import copy
import json
from datetime import datetime, timedelta, timezone

import pytest

from hubd.cli import load
from hubd.config_file import ConfigProblems
from hubd.state import entitlements as ent
from hubd.state import guard_evidence as guard
from hubd.state import spend_ledger as spend
from tests.support.spend_docs import pool_config, query_doc, reserve_doc, settle_doc

SHA = "0f" * 32


def frame(**over):
    base = {"provider": "codex", "reason_code": "GUARD_NO_CLAIM", "path_count": 0,
            "actor_sha256": SHA, "call_sha256": SHA, "scope_sha256": SHA}
    base.update(over)
    return base


def test_read_denial_keeps_only_the_closed_fields():
    denial = guard.read_denial(frame(path="/secret", payload="body"))
    assert isinstance(denial, guard.Denial)
    row = guard.record(denial, "cred-digest", "claim-hook/x-1")
    assert "/secret" not in repr(row) and "body" not in repr(row)
    assert row["credential_principal_sha256"] != "cred-digest"
    assert row["recorder_sha256"] == guard.sha256_text("claim-hook/x-1")


@pytest.mark.parametrize("over,text", [
    ({"reason_code": "GUARD_NO_CLAIM", "provider": 1}, "guard denial provider is not recognised"),
    ({"reason_code": None, "provider": "vim"}, "guard denial reason_code is not recognised"),
    ({"path_count": 1.0}, "guard denial path_count must be an integer"),
    ({"path_count": 513}, "guard denial path_count is outside the supported bound"),
    ({"actor_sha256": SHA[:-1]}, "guard denial actor_sha256 must be lowercase SHA-256"),
    ({"scope_sha256": SHA + "\n"}, "guard denial scope_sha256 must be lowercase SHA-256"),
])
def test_read_denial_refusals_in_the_reference_order(over, text):
    assert guard.read_denial(frame(**over)) == text


def test_window_counts_events_and_bytes_and_slides():
    window = guard.EvidenceWindow(events=2, max_bytes=100, seconds=10, max_credentials=2)
    assert window.check("a", 40, 0) is None
    window.count("a", 40, 0)
    assert window.check("a", 70, 1) == "bytes"
    window.count("a", 10, 1)
    assert window.check("a", 1, 2) == "events"
    assert window.check("b", 1, 2) is None  # another credential, its own bucket
    assert window.check("a", 1, 10.5) is None  # the first entry left the window
    window.count("b", 1, 3)
    window.count("c", 1, 3)  # over max_credentials: the least recently seen goes
    assert window.tracked() == 2


ADVERT = {"schema": 1, "pool_alias": "team-gpu", "unit": "tokens", "resource_kind": None,
          "capabilities": [], "data_classes": [], "eligible_projects": [],
          "account_usable": False, "as_of": "2026-01-01T00:00:00Z", "windows": []}


def test_read_advert():
    assert ent.read_advert({"advert": ADVERT}) == ADVERT
    bad = copy.deepcopy(ADVERT)
    bad["windows"] = [{}] * 17
    assert ent.read_advert({"advert": bad}) == "windows must be a list of at most 16"
    bad = dict(ADVERT, account_usable="yes")
    assert ent.read_advert({"advert": bad}) == "account_usable must be a boolean"
    bad = dict(ADVERT, schema=True)
    assert ent.read_advert({"advert": bad}) == "advertisement schema must be 1"
    assert ent.alias_of({"advert": dict(ADVERT, pool_alias="bad alias")}) == ""


NOW = datetime.now(timezone.utc)


def owner_ledger(**over) -> dict:
    config = pool_config(grantees=(("east", "PROJ"), ("west", "PROJ")), hard_bound="10", **over)
    return spend.parse(json.dumps({"pools": {"gpu": config}}).encode(), "owner")


def test_spend_reserve_settle_query_on_the_reference_documents():
    ledger = owner_ledger()
    ok, after, _ = spend.decide(ledger, "east", "reserve", reserve_doc("k", "6"), NOW)
    assert (ok["admitted"], ok["exposure"], ok["unit"], ok["epoch"], ok["sequence"]) == \
        (True, "6", "tokens", 1, 2)
    assert ok["reservation_id"].startswith("rsv-") and after is not ledger
    assert ledger["reservations"] == {}  # the ledger before is unchanged
    # the same document again: the stored answer; another one for the scope: refused
    assert spend.decide(after, "east", "reserve", reserve_doc("k", "6"), NOW) == (ok, after, None)
    assert spend.decide(after, "east", "reserve", reserve_doc("k", "5"), NOW) == \
        (spend.REFUSALS["reserve"], after, "idempotency_conflict")
    # west cannot see or settle east's reservation; over the bound is refused
    assert spend.decide(after, "west", "query", query_doc("k"), NOW) == \
        ({"found": False}, after, "not_found")
    assert spend.decide(after, "east", "query", query_doc("k"), NOW)[0] == \
        {"found": True, "response": ok}
    rid = ok["reservation_id"]
    assert spend.decide(after, "west", "settle", settle_doc(rid, "u1", "1"), NOW) == \
        (spend.REFUSALS["settle"], after, "unknown_reservation")
    assert spend.decide(after, "west", "reserve", reserve_doc("k2", "5"), NOW) == \
        (spend.REFUSALS["reserve"], after, "bound_exceeded")
    settled, done, _ = spend.decide(after, "east", "settle", settle_doc(rid, "u1", "2"), NOW)
    assert settled == {"settled": True, "reservation_id": rid, "usage_ref": "u1",
                       "overrun": False}
    # final: closed, its remaining exposure released; no further usage
    assert spend.decide(done, "east", "settle", settle_doc(rid, "u2", "1"), NOW) == \
        (spend.REFUSALS["settle"], done, "reservation_closed")
    more, _, _ = spend.decide(done, "west", "reserve", reserve_doc("k3", "8"), NOW)
    assert more["admitted"] is True and more["sequence"] == 4
    for doc in (reserve_doc("k4", "NaN"), reserve_doc("k4", "0"), reserve_doc("k4", "1", x=1),
                reserve_doc("k4", "1", pool_id=["gpu"]), reserve_doc("k4", "1", depth=True),
                reserve_doc("k4", "1", tax="vat")):
        assert spend.decide(done, "east", "reserve", doc, NOW) == \
            (spend.REFUSALS["reserve"], done, "malformed_document")


def test_spend_refusal_reasons_in_the_reference_order():
    ledger = owner_ledger(max_agents=1, fixed_fee="1", minimum_charge="3")
    pool = spend._pool(ledger, "gpu")
    def why(caller="east", **over):
        doc = reserve_doc("k", over.pop("upper", "2"), **over)
        return spend.reserve_refusal(ledger, pool, caller, doc, spend._amount(doc["upper_bound"]),
                                     over.pop("now", NOW))
    assert why() is None and pool.exposure(spend._amount("2")) == 4  # max(2, 3) + 1
    assert why(caller="north") == "caller_not_granted"
    assert why(project="OTHER") == "caller_not_granted"
    assert why(unit="usd") == "unit_mismatch"
    assert why(tax="pre_tax") == "tax_basis_mismatch"
    assert why(price_revision="r2") == "price_revision_mismatch"
    assert why(depth=5) == "depth_exceeded"
    assert why(wall_seconds=601) == "wall_time_exceeded"
    assert why(upper="10") == "bound_exceeded"
    assert spend.reserve_refusal(ledger, None, "east", reserve_doc("k", "1"), 1, NOW) == \
        "unknown_pool"
    _, held, _ = spend.decide(ledger, "east", "reserve", reserve_doc("k", "2"), NOW)
    assert spend.reserve_refusal(held, pool, "east", reserve_doc("k2", "1", seat="PROJ/bob"),
                                 spend._amount("1"), NOW) == "agents_exceeded"
    assert spend.reserve_refusal(held, pool, "east", reserve_doc("k2", "1"),
                                 spend._amount("1"), NOW + timedelta(hours=2)) == "outside_window"


def test_an_overrun_blocks_new_grants():
    ledger = owner_ledger()
    ok, after, _ = spend.decide(ledger, "east", "reserve", reserve_doc("k", "2"), NOW)
    over, after, _ = spend.decide(after, "east", "settle",
                               settle_doc(ok["reservation_id"], "u1", "3", final=False), NOW)
    assert over["overrun"] is True
    assert spend.decide(after, "east", "reserve", reserve_doc("k2", "1"), NOW) == \
        (spend.REFUSALS["reserve"], after, "unreconciled_overrun")


def test_spend_ledger_file_is_bounded_and_checked():
    with pytest.raises(spend.LedgerError):
        spend.parse(b"[]", "owner")
    with pytest.raises(spend.LedgerError, match="exactly the reference's fields"):
        spend.parse(b'{"pools": {"p": {"limit": "x", "grantees": []}}}', "owner")
    with pytest.raises(spend.LedgerError, match="this hub's id"):
        spend.parse(json.dumps({"pools": {"gpu": pool_config(owner="other")}}).encode(),
                    "owner")
    with pytest.raises(spend.LedgerError, match="window must end"):
        spend.parse(json.dumps({"pools": {"gpu": pool_config(hours=-1)}}).encode(), "owner")
    with pytest.raises(spend.LedgerError, match="no configured pool"):
        spend.parse(b'{"pools": {}, "reservations": {"r": {"pool_id": "gone"}}}', "owner")
    with pytest.raises(spend.LedgerError):
        spend.parse(b" " * (spend.MAX_FILE_BYTES + 1), "owner")


def test_flags(tmp_path):
    with pytest.raises(ConfigProblems) as info:
        load(["--db", str(tmp_path / "h.db"), "--spend-ledger", str(tmp_path / "l.json"),
              "--guard-evidence-window-events", "0"])
    text = " ".join(info.value.problems)
    assert "--spend-ledger needs --hub-id and --multihub-serving-policy" in text
    assert "--guard-evidence-window-events must be positive" in text
    _, config = load(["--db", str(tmp_path / "h.db"), "--guard-evidence-window-bytes", "9"])
    assert config.evidence.window_bytes == 9 and config.evidence.spend_ledger is None

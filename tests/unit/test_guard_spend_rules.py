"""The pure decisions of guard evidence, entitlement adverts and the spend
ledger (hubd/state/guard_evidence.py, entitlements.py, spend_ledger.py)."""

from __future__ import annotations

import copy

import pytest

from hubd.cli import load
from hubd.config_file import ConfigProblems
from hubd.state import entitlements as ent
from hubd.state import guard_evidence as guard
from hubd.state import spend_ledger as spend

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


LEDGER = {"pools": {"p": {"limit": "10", "unit": "t", "grantees": ["east", "west"]}},
          "reservations": []}


def test_spend_reserve_settle_query_and_uniform_refusals():
    ledger = spend.parse(spend.dump(LEDGER))
    ok, after = spend.decide(ledger, "east", "reserve",
                             {"pool_id": "p", "key": "k", "upper_bound": "6"})
    assert ok["admitted"] is True and after is not ledger and ledger["reservations"] == []
    refused, same = spend.decide(after, "west", "reserve",
                                 {"pool_id": "p", "key": "k", "upper_bound": "5"})
    assert refused == spend.REFUSALS["reserve"] and same is after
    # west cannot see or settle east's reservation
    assert spend.decide(after, "west", "query", {"pool_id": "p", "key": "k"})[0] == \
        {"found": False}
    assert spend.decide(after, "west", "settle", {"pool_id": "p", "key": "k",
                                                  "actual": "1"})[0] == spend.REFUSALS["settle"]
    settled, done = spend.decide(after, "east", "settle",
                                 {"pool_id": "p", "key": "k", "actual": "2"})
    assert settled["settled"] is True and after["reservations"][0]["settled"] is False
    more, _ = spend.decide(done, "west", "reserve",
                           {"pool_id": "p", "key": "k", "upper_bound": "8"})
    assert more["admitted"] is True
    for doc in ({"pool_id": "p", "key": "k2", "upper_bound": "NaN"},
                {"pool_id": "p", "key": "k2", "upper_bound": "0"},
                {"pool_id": "p", "key": "k2", "upper_bound": "1", "x": 1},
                {"pool_id": ["p"], "key": "k2", "upper_bound": "1"}):
        assert spend.decide(done, "east", "reserve", doc) == (spend.REFUSALS["reserve"], done)


def test_spend_ledger_file_is_bounded_and_checked():
    with pytest.raises(spend.LedgerError):
        spend.parse(b"[]")
    with pytest.raises(spend.LedgerError):
        spend.parse(b'{"pools": {"p": {"limit": "x", "grantees": []}}}')
    with pytest.raises(spend.LedgerError):
        spend.parse(b'{"pools": {}, "reservations": [{"pool_id": "gone"}]}')
    with pytest.raises(spend.LedgerError):
        spend.parse(b" " * (spend.MAX_FILE_BYTES + 1))


def test_flags(tmp_path):
    with pytest.raises(ConfigProblems) as info:
        load(["--db", str(tmp_path / "h.db"), "--spend-ledger", str(tmp_path / "l.json"),
              "--guard-evidence-window-events", "0"])
    text = " ".join(info.value.problems)
    assert "--spend-ledger needs --hub-id and --multihub-serving-policy" in text
    assert "--guard-evidence-window-events must be positive" in text
    _, config = load(["--db", str(tmp_path / "h.db"), "--guard-evidence-window-bytes", "9"])
    assert config.evidence.window_bytes == 9 and config.evidence.spend_ledger is None

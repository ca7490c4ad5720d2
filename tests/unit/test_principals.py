"""Principals: seat patterns, grants, the table and the decisions made with it
(hubd/state/principals.py), and their tables in a real journal file
(hubd/journal/principals.py)."""

import json
import sqlite3

import pytest

from hubd.journal import principals as store
from hubd.state.principals import (SHARED_TOKEN_PRINCIPAL, PrincipalError, admission_refusal,
                                   build_table, claim_refusal, control_granted, make_principal, parse_principals_file,
                                   seat_matches, session_refusal, speak_refusal,
                                   takeover_refusal, token_digest)


def test_seat_patterns():
    assert seat_matches("PROJ/alice", "PROJ/alice")
    assert not seat_matches("PROJ/alice", "PROJ/alicex")
    assert seat_matches("PROJ/*", "PROJ/bob") and seat_matches("PROJ/*", "PROJ/a/b")
    assert not seat_matches("PROJ/*", "PROJ/") and not seat_matches("PROJ/*", "PROJX/bob")
    assert seat_matches("acme/dev/joel/*", "acme/dev/joel/laptop")
    assert not seat_matches("acme/dev/joel/*", "acme/dev/joelle/x")
    assert seat_matches("*", "anything")


@pytest.mark.parametrize("bad", ["", "PR*J", "PROJ/a*", "PROJ/?", "PROJ//x", "/x", "a b",
                                 "PROJ/x@west", 7, None])
def test_bad_seat_patterns_are_refused(bad):
    with pytest.raises(PrincipalError):
        make_principal("p", [bad])


def test_speaks_for_its_seats_and_their_rx_sidecars():
    alice = make_principal("alice", ["PROJ/alice"])
    assert alice.speaks_for("PROJ/alice") and alice.speaks_for("PROJ/alice-rx")
    assert not alice.speaks_for("PROJ/bob") and not alice.speaks_for("PROJ/bob-rx")
    team = make_principal("team", ["PROJ/*"])
    assert team.speaks_for("PROJ/anyone") and not team.speaks_for("OTHER/x")


def test_grants_default_to_the_seats_namespaces():
    joel = make_principal("acme/dev/joel", ["acme/dev/joel/*", "PROJ/joel"])
    assert joel.own_namespaces() == ("PROJ", "acme")
    assert joel.may_claim_in("PROJ") and joel.may_claim_in("acme")
    assert not joel.may_claim_in("OTHER") and not joel.may_claim_in(None)
    assert joel.may_post_board_in("PROJ") and not joel.may_post_board_in("OTHER")
    assert joel.may_read_mailbox("PROJ/joel") and not joel.may_read_mailbox("PROJ/ana")


def test_explicit_grants_replace_the_defaults():
    bot = make_principal("bot", ["PROJ/*"], {"claim": [], "board": ["OPS"],
                                             "mailbox": ["PROJ/alice"]})
    assert not bot.may_claim_in("PROJ")
    assert bot.may_post_board_in("OPS") and not bot.may_post_board_in("PROJ")
    assert bot.may_read_mailbox("PROJ/alice")
    everywhere = make_principal("ops", ["OPS/*"], {"claim": ["*"]})
    assert everywhere.may_claim_in("ANY")
    with pytest.raises(PrincipalError, match="unknown grant"):
        make_principal("x", ["P/x"], {"admin": ["*"]})
    with pytest.raises(PrincipalError, match="namespace pattern"):
        make_principal("x", ["P/x"], {"claim": ["P/x"]})


def test_control_is_granted_only_explicitly():
    lead = make_principal("lead", ["PROJ/lead"], {"control": ["PROJ/worker/*", "OPS/bot"]})
    assert lead.may_control("PROJ/worker/1") and lead.may_control("OPS/bot")
    assert not lead.may_control("PROJ/lead") and not lead.may_control("OPS/bot2")
    # not even its own seats by default
    assert not make_principal("x", ["PROJ/*"]).may_control("PROJ/x")
    with pytest.raises(PrincipalError, match="seat pattern"):
        make_principal("x", ["P/x"], {"control": ["PROJ/a*"]})
    table = build_table([lead], [("lead", token_digest("t-lead"), "laptop")], "shared")
    assert control_granted(table, token_digest("t-lead"), "PROJ/worker/1")
    assert not control_granted(table, token_digest("t-lead"), "PROJ/lead")
    assert not control_granted(table, token_digest("shared"), "PROJ/worker/1")
    assert not control_granted(table, token_digest("revoked"), "PROJ/worker/1")
    assert not control_granted(table, None, "PROJ/worker/1")
    assert not control_granted(build_table([], []), None, "PROJ/worker/1")


def test_table_authenticates_by_digest_and_refuses_duplicates():
    alice = make_principal("alice", ["PROJ/alice"])
    table = build_table([alice], [("alice", token_digest("t-1"), "laptop")], "shared")
    assert table.authenticate("t-1").principal is alice
    assert table.authenticate("t-1").label == "laptop"
    assert table.authenticate("shared").principal.name == SHARED_TOKEN_PRINCIPAL
    assert table.authenticate("nope") is None
    assert table.enforcing and not table.open
    with pytest.raises(PrincipalError, match="two principals"):
        build_table([alice, make_principal("bob", ["PROJ/bob"])],
                    [("alice", token_digest("t"), "a"), ("bob", token_digest("t"), "b")])
    with pytest.raises(PrincipalError, match="shared --token"):
        build_table([alice], [("alice", token_digest("same"), "a")], "same")
    with pytest.raises(PrincipalError, match="does not exist"):
        build_table([], [("ghost", token_digest("t"), "a")])
    with pytest.raises(PrincipalError, match="shared --token's principal"):
        make_principal(SHARED_TOKEN_PRINCIPAL, ["*"])


def test_decisions():
    alice = make_principal("alice", ["PROJ/alice"])
    table = build_table([alice], [("alice", token_digest("t"), "laptop")], "shared")
    mine = table.authenticate("t")
    assert speak_refusal(table, mine, "PROJ/alice") is None
    refused = speak_refusal(table, mine, "PROJ/bob")
    assert "alice" in refused and "PROJ/bob" in refused and "PROJ/alice" in refused
    assert speak_refusal(table, table.authenticate("shared"), "PROJ/bob") is None
    assert takeover_refusal("alice", "alice", "PROJ/alice") is None
    assert "another principal" in takeover_refusal("bob", "alice", "PROJ/alice")
    # a shared-token-only hub binds no seats
    shared_only = build_table([], [], "shared")
    assert not shared_only.enforcing
    assert speak_refusal(shared_only, shared_only.authenticate("shared"), "X/y") is None
    # an open hub: loopback only unless opened on purpose
    open_hub = build_table([], [])
    assert open_hub.open and open_hub.tokenless
    assert admission_refusal(open_hub, None, "127.0.0.1", False, "PROJ/a") is None
    assert admission_refusal(open_hub, None, "::1", False, "PROJ/a") is None
    assert "loopback" in admission_refusal(open_hub, None, "192.0.2.7", False, "PROJ/a")
    assert admission_refusal(open_hub, None, "192.0.2.7", True, "PROJ/a") is None
    assert admission_refusal(table, mine.digest, "192.0.2.7", False, "PROJ/a") is None
    # with the shared --token, nothing without a token (a TLS client
    # certificate alone is a peer hub's way in, never an agent's)
    assert not table.tokenless
    assert admission_refusal(table, None, "127.0.0.1", True, "PROJ/zed") == \
        "Authentication token required."
    # after a change
    assert session_refusal(table, mine.digest, "PROJ/alice") is None
    assert session_refusal(table, token_digest("revoked"), "PROJ/alice") == "Token revoked."
    assert "requires a token" in session_refusal(table, None, "PROJ/alice")
    assert session_refusal(open_hub, None, "PROJ/alice") is None
    narrowed = build_table([make_principal("alice", ["PROJ/alice-new"])],
                           [("alice", mine.digest, "laptop")])
    assert "may not speak" in session_refusal(narrowed, mine.digest, "PROJ/alice")


def test_principals_without_a_shared_token_bind_their_seats_only():
    """Issue 22 item 6: on a hub without --token, a principal's seats need its
    token; every other seat stays as open as before (loopback, or any address
    with --open-network), before and after the principal appeared."""
    kim = make_principal("acme/dev/kim", ["acme/dev/kim/*"])
    alice = make_principal("alice", ["PROJ/alice"])
    table = build_table([kim, alice], [("alice", token_digest("t"), "laptop")])
    assert table.tokenless and not table.open and table.enforcing
    for seat in ("acme/dev/kim/laptop", "acme/dev/kim/a/b", "PROJ/alice", "PROJ/alice-rx"):
        assert table.held(seat), seat
        assert "needs that principal's token" in admission_refusal(
            table, None, "127.0.0.1", True, seat)
        assert "now belongs to a principal" in session_refusal(table, None, seat)
    for seat in ("acme/dev/kimberly", "acme/dev/kim", "PROJ/alice2", "PROJ/bob", "solo"):
        assert not table.held(seat), seat
        assert admission_refusal(table, None, "127.0.0.1", False, seat) is None
        assert admission_refusal(table, None, "192.0.2.7", True, seat) is None
        assert "loopback" in admission_refusal(table, None, "192.0.2.7", False, seat)
        assert session_refusal(table, None, seat) is None
    # a token still speaks for its own seats only
    alices = table.authenticate("t")
    assert admission_refusal(table, alices.digest, "192.0.2.7", False, "PROJ/bob") is None
    assert "may not speak" in speak_refusal(table, alices, "PROJ/bob")
    # a seat pattern of '*' holds every seat
    everything = build_table([make_principal("root", ["*"])], [])
    assert everything.held("anything/at/all")
    # no grant is checked for an agent without a token (as on an open hub);
    # a revoked token holds none
    assert claim_refusal(table, None, "open-host:127.0.0.1", ["PROJ"]) is None
    assert claim_refusal(table, token_digest("gone"), "alice", ["PROJ"]) is not None


def test_principals_file():
    doc = {"principals": [{"name": "alice", "seats": ["PROJ/alice"],
                           "tokens": [{"sha256": token_digest("t"), "label": "laptop"}],
                           "grants": {"mailbox": ["PROJ/bob"]}},
                          {"name": "ci", "seats": ["PROJ/ci-*"]}]}
    with pytest.raises(PrincipalError):  # PROJ/ci-* is not a pattern
        parse_principals_file(doc)
    doc["principals"][1]["seats"] = ["PROJ/ci/*"]
    table = parse_principals_file(doc, source="f.json")
    assert table.authenticate("t").principal.may_read_mailbox("PROJ/bob")
    assert set(table.principals) == {"alice", "ci"} and table.source == "f.json"
    for bad in ({}, {"principals": {}}, {"principals": [], "extra": 1},
                {"principals": [{"name": "a", "seats": ["P/a"], "tokens": [{"token": "t"}]}]},
                {"principals": [{"name": "a", "seats": ["P/a"],
                                 "tokens": [{"sha256": "short"}]}]},
                {"principals": [{"name": "a", "seats": ["P/a"], "grants": []}]},
                {"principals": [{"name": "a", "seats": []}]},
                {"principals": [{"name": "a", "seats": ["P/a"]}, {"name": "a", "seats": ["P/b"]}]}):
        with pytest.raises(PrincipalError):
            parse_principals_file(bad)


def test_journal_tables_store_digests_and_bump_the_version(tmp_path):
    db = tmp_path / "hub.db"
    store.add(db, "alice", ["PROJ/alice"], {"claim": ["PROJ", "OPS"]})
    with pytest.raises(PrincipalError, match="exists"):
        store.add(db, "alice", ["PROJ/x"])
    token = store.new_token(db, "alice", "laptop")
    assert token.startswith("hubd_")
    assert token.encode() not in db.read_bytes() and token.encode() not in (
        db.with_name("hub.db-wal").read_bytes() if db.with_name("hub.db-wal").exists() else b"")
    source = store.JournalPrincipals(db)
    table = source.read(None)
    assert table.authenticate(token).principal.may_claim_in("OPS")
    assert source.read(None) is None  # unchanged: not re-read
    replaced = store.new_token(db, "alice", "laptop")  # same label: the old one stops
    table = source.read(None)
    assert table.authenticate(token) is None and table.authenticate(replaced) is not None
    second = store.new_token(db, "alice", "phone")
    assert store.revoke_token(db, "alice", "laptop") == 1
    table = source.read(None)
    assert table.authenticate(replaced) is None and table.authenticate(second) is not None
    with pytest.raises(PrincipalError, match="no principal"):
        store.new_token(db, "bob", "x")
    [row] = store.listing(db)
    assert row["name"] == "alice" and [t["label"] for t in row["tokens"]] == ["phone"]
    assert row["grants"] == {"claim": ["PROJ", "OPS"], "board": None, "mailbox": None,
                             "control": None, "org_admin": None}
    assert "digest" not in json.dumps(row)
    assert store.remove(db, "alice") and not store.remove(db, "alice")
    table = source.read(None)
    assert table.open and table.authenticate(second) is None
    source.close()


def test_a_journal_from_before_principals_keeps_its_redsyn_nodes(tmp_path):
    db = tmp_path / "old.db"
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE redsyn_nodes (node TEXT PRIMARY KEY, person TEXT NOT NULL, "
                 "name TEXT NOT NULL, digest TEXT NOT NULL UNIQUE, created_at REAL NOT NULL)")
    conn.execute("INSERT INTO redsyn_nodes VALUES ('acme/dev/joel:laptop', 'acme/dev/joel', "
                 "'laptop', ?, 1.0)", (token_digest("rsn_old"),))
    conn.commit()
    conn.close()
    db.chmod(0o600)  # older hubds made journals 0644: the refusal's one-line fix first
    table = store.JournalPrincipals(db).read(None)
    credential = table.authenticate("rsn_old")
    assert credential.principal.name == "acme/dev/joel" and credential.label == "laptop"
    assert credential.principal.seats == ("acme/dev/joel/*",)
    tables = {r[0] for r in sqlite3.connect(db).execute(
        "SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert "redsyn_nodes" not in tables

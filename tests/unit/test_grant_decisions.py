"""The seat-level ACL's decisions (hubd/state/principals.py: claim_refusal,
board_refusal, mailbox_choice, refusal_evidence; hubd/state/board.py:
namespaces_touched), pure: a table, a credential, a request."""

import json

from hubd.state import board as bd
from hubd.state.principals import (ACL_DENIAL, NOT_GRANTED, board_refusal, build_table,
                                   claim_refusal, make_principal, mailbox_choice,
                                   refusal_evidence, token_digest)


def _table(shared=None):
    principals = [
        make_principal("alice", ["PROJ/alice"]),
        make_principal("ci", ["PROJ/ci/*"], {"claim": [], "board": ["OPS"]}),
        make_principal("ops", ["OPS/*"], {"claim": ["*"], "mailbox": ["PROJ/*"]}),
        make_principal("solo", ["solo"]),
        make_principal("narrow", ["solo2"], {"claim": ["PROJ"]}),
    ]
    tokens = [(p.name, token_digest(p.name + "-token"), "l") for p in principals]
    return build_table(principals, tokens, shared)


def cred(name):
    return token_digest(name + "-token")


TABLE = _table("shared")


def test_claims_default_to_the_principals_own_namespaces():
    assert claim_refusal(TABLE, cred("alice"), "alice", ["PROJ"]) is None
    refused = claim_refusal(TABLE, cred("alice"), "alice", ["OPS"])
    assert refused.reason_code == NOT_GRANTED and refused.grant == "claim"
    assert refused.namespace == "OPS" and refused.principal == "alice"
    assert "may not claim in namespace 'OPS'" in refused.text
    assert "its own namespaces: PROJ" in refused.text
    # every namespace asked must be granted (a handoff: holder and recipient)
    assert claim_refusal(TABLE, cred("alice"), "alice", ["PROJ", "OPS"]).namespace == "OPS"


def test_explicit_claim_grants_narrow_and_widen():
    assert claim_refusal(TABLE, cred("ci"), "ci", ["PROJ"]).text.endswith("(its claim grant: none).")
    assert claim_refusal(TABLE, cred("ops"), "ops", ["ANY", "PROJ", None]) is None


def test_a_bare_seat_claims_without_a_namespace_only_by_default_or_star():
    assert claim_refusal(TABLE, cred("solo"), "solo", [None]) is None
    assert "no namespace" in claim_refusal(TABLE, cred("alice"), "alice", [None]).text
    # an explicit grant covers no namespace unless it is '*'
    assert claim_refusal(TABLE, cred("narrow"), "narrow", [None]) is not None
    assert claim_refusal(TABLE, cred("narrow"), "narrow", ["PROJ"]) is None


def test_no_acl_without_principals_of_the_hubs_own():
    shared_only = build_table([], [], "shared")
    open_hub = build_table([], [])
    for table, credential in ((shared_only, token_digest("shared")), (open_hub, None)):
        assert claim_refusal(table, credential, "shared-token", ["X"]) is None
        assert board_refusal(table, credential, "x", ["X", None]) is None
        # mailbox_for another seat falls back to the own mailbox, as before principals
        assert mailbox_choice(table, credential, "x", "PROJ/alice", "PROJ/bob") == (
            "PROJ/alice", None)


def test_the_shared_token_beside_principals_holds_every_grant():
    shared = token_digest("shared")
    assert claim_refusal(TABLE, shared, "shared-token", ["X", None]) is None
    assert board_refusal(TABLE, shared, "shared-token", ["X"]) is None
    assert mailbox_choice(TABLE, shared, "shared-token", "OPS/a", "PROJ/bob") == (
        "PROJ/bob", None)


def test_a_session_without_a_known_token_beside_principals_holds_no_grant():
    for credential in (None, token_digest("revoked")):
        assert claim_refusal(TABLE, credential, "alice", ["PROJ"]).principal == "alice"
        assert board_refusal(TABLE, credential, "", ["PROJ"]).principal == "unknown"
        assert mailbox_choice(TABLE, credential, "alice", "PROJ/alice", "PROJ/bob")[1]
        # its own mailbox needs no grant
        assert mailbox_choice(TABLE, credential, "alice", "PROJ/alice", "PROJ/alice") == (
            "PROJ/alice", None)


def test_board_grants():
    assert board_refusal(TABLE, cred("alice"), "alice", ["PROJ"]) is None
    assert board_refusal(TABLE, cred("ci"), "ci", ["OPS"]) is None
    refused = board_refusal(TABLE, cred("ci"), "ci", ["PROJ"])
    assert refused.grant == "board" and refused.namespace == "PROJ"
    assert "may not post to the board in namespace 'PROJ' (its board grant: OPS)" in refused.text


def test_mailbox_for():
    alice = cred("alice")
    # own seat, the -rx sidecar's seat: no grant needed
    assert mailbox_choice(TABLE, alice, "alice", "PROJ/alice", None) == ("PROJ/alice", None)
    assert mailbox_choice(TABLE, alice, "alice", "PROJ/alice", "") == ("PROJ/alice", None)
    assert mailbox_choice(TABLE, alice, "alice", "PROJ/alice-rx", "PROJ/alice") == (
        "PROJ/alice", None)
    # her own sidecar's mailbox is one of her seats
    assert mailbox_choice(TABLE, alice, "alice", "PROJ/alice", "PROJ/alice-rx") == (
        "PROJ/alice-rx", None)
    identity, refused = mailbox_choice(TABLE, alice, "alice", "PROJ/alice", "PROJ/bob")
    assert identity == "PROJ/alice" and refused.grant == "mailbox"
    assert refused.mailbox == "PROJ/bob" and refused.reason_code == NOT_GRANTED
    # ops's grant covers PROJ/*
    assert mailbox_choice(TABLE, cred("ops"), "ops", "OPS/x", "PROJ/bob") == ("PROJ/bob", None)
    assert mailbox_choice(TABLE, cred("ops"), "ops", "OPS/x", "OTHER/z")[1] is not None
    # a long name is cut in the refusal (and so in the evidence)
    _, refused = mailbox_choice(TABLE, alice, "alice", "PROJ/alice", "PROJ/" + "b" * 1000)
    assert len(refused.mailbox) == 256


def test_the_evidence_is_content_minimised():
    refused = board_refusal(TABLE, cred("ci"), "ci", ["PROJ"])
    row = refusal_evidence(refused, "ledger_task", "PROJ/ci/1", task_id="secret task t1")
    assert row == {"decision": "deny", "durable": True, "grant": "board", "principal": "ci",
                   "reason_code": NOT_GRANTED, "seat": "PROJ/ci/1", "verb": "ledger_task",
                   "namespace": "PROJ", "task_id_sha256": row["task_id_sha256"]}
    assert "secret" not in json.dumps(row) and len(row["task_id_sha256"]) == 64
    _, refused = mailbox_choice(TABLE, cred("alice"), "alice", "PROJ/alice", "PROJ/bob")
    row = refusal_evidence(refused, "heartbeat", "PROJ/alice")
    assert row["mailbox"] == "PROJ/bob" and "namespace" not in row
    assert ACL_DENIAL == "acl_denial"


def test_the_namespaces_a_board_write_touches():
    board = bd.BoardState()
    board.put_task({"task_id": "t1", "title": "x", "project": "", "created_by": "PROJ/alice",
                    "status": "open", "depends_on": [], "version": 1})
    board.put_task({"task_id": "t2", "title": "x", "project": "OPS/sub",
                    "created_by": "PROJ/alice", "status": "open", "depends_on": [], "version": 1})
    touched = bd.namespaces_touched
    # a new task: its project's first segment, else the sender's namespace
    assert touched(board, {"task_id": "n", "project": "OPS"}, "PROJ/ci", "ledger_task") == ("OPS",)
    assert touched(board, {"task_id": "n"}, "PROJ/ci", "ledger_task") == ("PROJ",)
    assert touched(board, {"task_id": "n"}, "solo", "ledger_task") == (None,)
    # an existing task: its namespace (project, else its creator's), whoever writes
    assert touched(board, {"task_id": "t1"}, "OPS/bot", "ledger_task") == ("PROJ",)
    assert touched(board, {"task_id": "t2"}, "PROJ/alice", "ledger_task_update") == ("OPS",)
    assert touched(board, {"task_id": "t2", "project": None}, "X/y", "ledger_task_update") == (
        "OPS",)
    # re-scoped: where it is and where it goes
    assert touched(board, {"task_id": "t1", "project": "OPS"}, "PROJ/a", "ledger_task") == (
        "PROJ", "OPS")
    assert touched(board, {"task_id": "t2", "project": ""}, "PROJ/a", "ledger_task_update") == (
        "OPS", "PROJ")
    assert touched(board, {"task_id": "t2", "project": "OPS"}, "PROJ/a",
                   "ledger_task_update") == ("OPS",)
    # a progress note: its task's namespace, else the sender's
    assert touched(board, {"task_id": "t2"}, "PROJ/a", "ledger_progress") == ("OPS",)
    assert touched(board, {"task_id": "nope"}, "PROJ/a", "ledger_progress") == ("PROJ",)
    assert touched(board, {}, "PROJ/a", "ledger_progress") == ("PROJ",)

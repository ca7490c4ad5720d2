"""Pure claim decisions: reading a claim, the grant decision, receipts, denial
evidence, digests; the board and capability-card rules."""

import hashlib
import json

import pytest

from hubd.state import board as bd
from hubd.state import capabilities as cap
from hubd.state import claims as cl
from hubd.state import lease_rules as lr
from hubd.state import idem
from hubd.state.events import Event
from hubd.handlers import core_plugin
from hubd.state.hub import HubState, apply

LIMITS = cl.LeaseLimits()


def read(frame, who="p/alice", limits=LIMITS):
    return cl.read_claim(frame, who, limits, "open-host:127.0.0.1")


def grant(state, frame, who="p/alice", now=1000.0, limits=LIMITS):
    decision = cl.decide_claim(state, read(frame, who, limits), now, limits)
    if isinstance(decision, cl.Grant):
        state.put(decision.lease)
    return decision


def test_reading_a_claim():
    req = read({"payload": " t-1 ", "note": {"a": 1}, "worktree": 5,
                "paths": ["src/b/", "./src/b", "a//x"], "ttl_seconds": 5,
                "git": {"branch": "main"}})
    assert req.task_id == "t-1" and req.refusal is None
    assert req.paths == ["src/b", "a/x"] and req.worktree == "5"
    assert req.ttl == LIMITS.min_ttl and req.note == "{'a': 1}"
    assert req.git == {"branch": "main", "auto_release_on": "merge"}
    assert read({"task_id": "t", "ttl_seconds": "abc"}).ttl == 3600.0
    assert read({"task_id": "t", "ttl_seconds": True}).ttl == 3600.0
    assert read({"task_id": "t", "ttl_seconds": 10 ** 12}).ttl == LIMITS.max_ttl
    assert read({"task_id": ""}).refusal[0] == cl.TASK_ID_REQUIRED
    assert read({"task_id": "t", "paths": ["../etc"]}).refusal[0] == cl.PATH_IDENTITY_INVALID
    assert read({"task_id": "t", "paths": "src"}).refusal[0] == cl.PATH_IDENTITY_INVALID
    assert read({"task_id": "t", "paths": [5]}).refusal[0] == cl.PATH_IDENTITY_INVALID
    wide = read({"task_id": "t", "paths": [f"p{i}" for i in range(4)]},
                limits=cl.LeaseLimits(max_paths_per_claim=3))
    assert wide.paths == [""] and wide.widened


def test_grant_decision_order_and_texts():
    state = cl.ClaimState()
    first = grant(state, {"task_id": "t-1", "worktree": "/r", "paths": ["src"]})
    assert isinstance(first, cl.Grant) and first.lease["epoch"] == 1
    live = grant(state, {"task_id": "t-1", "worktree": "/r", "paths": ["x"]}, who="p/bob")
    assert live == cl.Deny(cl.LEASE_LIVE, "Task 't-1' is already claimed by p/alice.", "t-1",
                           "p/alice")
    scope = grant(state, {"task_id": "t-2", "worktree": "/r", "paths": ["src/a.py"]}, who="p/bob")
    assert scope == cl.Deny(cl.SCOPE_CONFLICT, "Task 't-2' file scope conflicts with 't-1' held "
                                               "by p/alice.", "t-1", "p/alice")
    # the same owner's other task may not overlap either (no two live overlapping grants)
    mine = grant(state, {"task_id": "t-3", "worktree": "/r", "paths": ["src/b"]})
    assert isinstance(mine, cl.Deny) and mine.reason_code == cl.SCOPE_CONFLICT
    # another worktree is independent
    assert isinstance(grant(state, {"task_id": "t-4", "worktree": "/r2", "paths": ["src"]},
                            who="p/bob"), cl.Grant)


def test_renewal_and_expiry():
    state = cl.ClaimState()
    grant(state, {"task_id": "t", "paths": ["a"], "note": "one"}, now=0.0)
    updated = dict(state.leases["t"], checkpoint="cp", version=3, status="working")
    state.put(updated)
    renewed = grant(state, {"task_id": "t", "paths": ["a", "b"], "note": "two"}, now=10.0)
    assert renewed.renewal
    lease = renewed.lease
    assert (lease["epoch"], lease["version"], lease["status"], lease["checkpoint"],
            lease["note"], lease["lease_expires_at"]) == (2, 0, "claimed", "cp", "two", 3610.0)
    # once expired, anyone may claim it (and the epoch keeps counting)
    later = grant(state, {"task_id": "t", "paths": ["a"]}, who="p/bob", now=3610.0)
    assert isinstance(later, cl.Grant) and not later.renewal and later.lease["epoch"] == 3
    assert later.lease["checkpoint"] == ""


def test_quota_counts_live_claims():
    limits = cl.LeaseLimits(max_claims_per_agent=2)
    state = cl.ClaimState()
    for t in ("a", "b"):
        assert isinstance(grant(state, {"task_id": t, "paths": [t], "ttl_seconds": 100},
                                limits=limits, now=0.0), cl.Grant)
    over = grant(state, {"task_id": "c", "paths": ["c"]}, limits=limits, now=1.0)
    assert over.reason_code == cl.QUOTA_EXCEEDED
    assert over.text == "Agent p/alice holds the maximum 2 claims."
    # renewing a held task is not a new claim
    assert isinstance(grant(state, {"task_id": "a", "paths": ["a"]}, limits=limits, now=2.0),
                      cl.Grant)
    # expired leases do not count
    assert isinstance(grant(state, {"task_id": "c", "paths": ["c"]}, limits=limits, now=500.0),
                      cl.Grant)


def test_denial_evidence_is_content_minimised():
    req = read({"task_id": "t-2", "worktree": "/repo", "paths": ["src/b/c.py"],
                "note": "secret plan"}, who="p2/bob")
    row = cl.denial_evidence("p2/bob", req, cl.SCOPE_CONFLICT)
    # the same correlations the reference hub computes (captured from its journal)
    assert row["scope_sha256"] == "754c7d9d0686a662c3da51bf9572df290e88139f9e1b0fc8cb0409a18a605c21"
    assert row["task_id_sha256"] == "b1ad9ff6eb8dad4aa41950317bd6fb7b6269b2b24b2da52e6312b190d5d2d5eb"
    assert row["claimant_sha256"] == hashlib.sha256(b"p2/bob").hexdigest()
    assert row["path_count"] == 1 and row["decision"] == "deny" and row["durable"] is True
    text = json.dumps(row)
    for secret in ("t-2", "/repo", "src/b", "secret plan"):
        assert secret not in text
    long = cl.denial_evidence("x" * 300, req, cl.CLAIM_DENIED)
    assert long["claimant_truncated"] and len(long["claimant"]) == cl.CLAIMANT_CHARS


def test_request_digest_matches_the_reference_client():
    # frames and digests captured from the reference CLI (synapse lock / release)
    lock = {"sender": "p1/alice", "target": "System", "type": "release", "payload": "t-lock",
            "task_id": "t-lock", "epoch": 1, "idem_key": "d8b3a5e5f4e6446793d7fa2cb7d94105",
            "timestamp": 1.5}
    assert idem.request_digest(lock) == (
        "fe350342c4abee997bf980f5ecfecebcd640e1fe758143710622c03ab564af10")
    rel = {"sender": "p/rel", "target": "System", "type": "release", "payload": "t-none",
           "timestamp": 1796017815.1120481, "task_id": "t-none",
           "idem_key": "18eefefa3eb6479bb9f0316ae992e894", "evidence": ["ok"],
           "artifacts": ["out.txt"], "confidence": "high"}
    assert idem.request_digest(rel) == (
        "dbcb21b3724c8c3e37c8d9470caf5d544119096ed4f2f64ba55f421892871890")
    assert idem.idem_key_of({"idem_key": 5}) == "5"
    assert idem.idem_key_of({"idem_key": ""}) is None
    assert idem.idem_key_of({"idem_key": True}) is None


@pytest.mark.parametrize("extra,status,reasons", [
    ({}, "unsupported", ["no positive evidence, artifact, changed file, generated artifact, "
                         "or approval"]),
    ({"known_failures": ["f"]}, "degraded",
     ["known failures declared", "no positive evidence, artifact, changed file, generated "
                                 "artifact, or approval"]),
    ({"approvals": ["lgtm"]}, "needs_freshness",
     ["positive evidence present", "freshness_seconds missing"]),
    ({"evidence": ["e"], "freshness_seconds": 10}, "unverified",
     ["positive evidence present", "fresh evidence present but unverified"]),
    ({"evidence": ["e"], "freshness_seconds": 100000}, "stale",
     ["positive evidence present", "evidence age exceeds 3600 seconds"]),
    ({"evidence": ["e"], "known_failures": ["k"], "freshness_seconds": 3}, "degraded",
     ["known failures declared", "positive evidence present"]),
])
def test_receipt_epistemic_status(extra, status, reasons):
    receipt, _ = lr.build_receipt(extra, "t", "p/a")
    assert receipt["epistemic_status"] == status and receipt["epistemic_reasons"] == reasons


def test_receipt_shapes_and_note():
    receipt, evidence = lr.build_receipt(
        {"evidence": [1, "", " x "], "artifacts": "one", "confidence": 5,
         "freshness_seconds": -1, "changed_files": {"not": "a list"}}, "t", "p/a")
    assert receipt["evidence"] == ["1", "x"] and receipt["artifacts"] == ["one"]
    assert receipt["changed_files"] == [] and receipt["confidence"] == "5"
    assert receipt["freshness_seconds"] == 0.0 and evidence
    assert lr.receipt_note_text(receipt) == (
        "release receipt: evidence=1, x; artifacts=one; confidence=5; freshness_seconds=0.0; "
        "epistemic_status=unverified; epistemic_reasons=positive evidence present, fresh "
        "evidence present but unverified")
    _, none = lr.build_receipt({"freshness_seconds": True}, "t", "p/a")
    assert not none


def test_transitions_table():
    assert lr.transition_refusal("t", "claimed", "working") is None
    assert lr.transition_refusal("t", "working", "input_required") is None
    assert lr.transition_refusal("t", "done", "working") == "Task 't' cannot transition done -> working."
    assert lr.transition_refusal("t", "claimed", "in_progress") is not None


def test_deadlock_detection():
    state = cl.ClaimState()
    grant(state, {"task_id": "A", "paths": ["a"]}, who="p/alice")
    grant(state, {"task_id": "B", "paths": ["b"]}, who="p/bob")
    epoch = state.leases["A"]["epoch"]
    waits = {"p/bob": ("A", epoch)}  # bob waits for alice's task
    assert lr.deadlock(state, waits, "p/alice", "p/bob", 1000.0)  # alice waiting for bob closes it
    assert not lr.deadlock(state, {}, "p/alice", "p/bob", 1000.0)
    # a wait on a lease that has since ended (or been renewed) no longer counts
    assert not lr.deadlock(state, {"p/bob": ("A", epoch - 1)}, "p/alice", "p/bob", 1000.0)


def test_lease_events_replay_to_the_same_state():
    core = core_plugin()
    state = HubState.fresh(core.appliers, core.projections)
    lease = cl.decide_claim(cl.claims_of(state), read({"task_id": "t", "paths": ["a"]}), 5.0,
                            LIMITS).lease
    apply(state, Event(1, 5.0, cl.CLAIM, lease))
    assert cl.claims_of(state).epoch == 1
    # a release of an older epoch changes nothing; the right one ends the lease
    apply(state, Event(2, 6.0, cl.RELEASE, {"task_id": "t", "owner": "p/alice", "epoch": 0}))
    assert "t" in cl.claims_of(state).leases
    apply(state, Event(3, 6.0, cl.RELEASE, {"task_id": "t", "owner": "p/alice", "epoch": 1}))
    assert cl.claims_of(state).leases == {} and cl.claims_of(state).epoch == 1
    # a claim_denial row is audit only
    apply(state, Event(4, 7.0, cl.CLAIM_DENIAL, {"reason_code": "SCOPE_CONFLICT"}))
    assert cl.claims_of(state).leases == {}
    # a reference-shaped release (task id only) is understood too
    apply(state, Event(5, 8.0, cl.CLAIM, dict(lease, epoch=2)))
    apply(state, Event(6, 8.0, cl.RELEASE, {"task_id": "t"}))
    assert cl.claims_of(state).leases == {}


# -- board

def test_board_declare_update_and_ready():
    board = bd.BoardState()
    w = bd.decide_declare(board, {"task_id": "T1", "title": "one", "project": "p"}, "p/a", 1.0)
    board.put_task(w.task)
    assert w.created and w.task["version"] == 1 and w.task["status"] == "open"
    w2 = bd.decide_declare(board, {"task_id": "T2", "title": 5, "depends_on": ["T1", 5, "", "T1"]},
                           "p/a", 2.0)
    board.put_task(w2.task)
    assert w2.task["title"] == "5" and w2.task["depends_on"] == ["T1", "5"]
    assert board.ready() == ["T1"]
    assert bd.decide_declare(board, {"task_id": "T1", "title": "x", "project": "q"}, "p/b", 3.0) == (
        "Task 'T1' project conflict: already scoped to 'p', cannot re-scope to 'q'.")
    assert bd.decide_declare(board, {"task_id": "T3", "title": "x", "expected_version": 1},
                             "p/a", 3.0) == "Task 'T3' version conflict: expected v1, board has v0."
    with pytest.raises(bd.Malformed, match="'expected_version' must be an integer"):
        bd.decide_declare(board, {"task_id": "T3", "title": "x", "expected_version": True},
                          "p/a", 3.0)
    assert bd.decide_declare(board, {"task_id": "T1", "title": "x", "depends_on": ["T2"]},
                             "p/a", 3.0) == "Task 'T1' dependencies would form a cycle."
    up = bd.decide_update(board, {"task_id": "T1", "status": "done", "expected_version": 1}, 4.0)
    board.put_task(up.task)
    assert up.task["version"] == 2 and board.ready() == []  # T2 needs T1 and "5"
    assert bd.decide_update(board, {"task_id": "T1", "status": "weird"}, 5.0) == (
        "Unknown ledger status 'weird'.")
    assert bd.decide_update(board, {"task_id": "nope"}, 5.0) == "Task 'nope' is not on the board."
    # re-declaration keeps status, creator and project
    again = bd.decide_declare(board, {"task_id": "T1", "title": "again"}, "p/b", 6.0)
    assert (again.task["status"], again.task["created_by"], again.task["project"],
            again.task["version"], again.created) == ("done", "p/a", "p", 3, False)


@pytest.mark.parametrize("parent,reason", [
    ("east:3:abc", "causal_parent must be an object"),
    ({"hub_id": "e", "seq": 3}, "causal_parent must contain exactly hub_id, seq, and "
                                "event_fingerprint"),
    ({"hub_id": "e", "seq": 0, "event_fingerprint": "a" * 64},
     "causal parent seq must be an integer from 1 through 2^63-1"),
    ({"hub_id": "e", "seq": True, "event_fingerprint": "a" * 64},
     "causal parent seq must be an integer from 1 through 2^63-1"),
    ({"hub_id": "e", "seq": 3, "event_fingerprint": "A" * 64},
     "causal parent event_fingerprint must be lowercase SHA-256"),
    ({"hub_id": "", "seq": 3, "event_fingerprint": "a" * 64},
     "causal parent hub_id must be non-empty and at most 512 bytes"),
    ({"hub_id": "x" * 513, "seq": 3, "event_fingerprint": "a" * 64},
     "causal parent hub_id must be non-empty and at most 512 bytes"),
])
def test_causal_parent_validation(parent, reason):
    with pytest.raises(bd.Malformed) as err:
        bd.causal_parent({"causal_parent": parent})
    assert str(err.value) == reason
    assert bd.causal_parent({"causal_parent": None}) is None
    good = {"hub_id": "east", "seq": 3, "event_fingerprint": "a" * 64}
    assert bd.causal_parent({"causal_parent": good}) == good


def test_progress_notes_are_bounded_per_task():
    board = bd.BoardState()
    for seq in range(1, bd.MAX_PROGRESS_PER_TASK + 11):
        board.add_note(seq, {"task_id": "T", "author": f"p/{seq % 7}", "kind": "note",
                             "text": str(seq), "posted_at": 0.0})
    assert len(board.progress) == bd.MAX_PROGRESS_PER_TASK
    assert next(iter(board.progress.values()))["text"] == "11"
    assert bd.read_progress({"kind": "weird"}, "p/a", 0.0) == "Unknown progress kind 'weird'."
    note = bd.read_progress({"payload": "via payload", "text": "via text"}, "p/a", 1.0)
    assert note["text"] == "via text" and note["kind"] == "note" and note["task_id"] == ""


# -- capability cards

def test_card_normalisation():
    card = cap.card({"description": None, "skills": ["python", 5, "", "python"],
                     "task_classes": "review", "model": 7, "project": "other",
                     "contracts": [{"task_class": "review", "input_schema": {"type": "object"},
                                    "output_schema": "bad", "preconditions": "tests pass"},
                                   {"bad": 1}, "junk", {"task_class": ""}]},
                    "p2/alice", 9.0)
    assert card["skills"] == ["python", "5"] and card["task_classes"] == []
    assert card["model"] == "7" and card["project"] == "p2" and card["description"] == ""
    assert card["contracts"] == [{"task_class": "review", "input_schema": {"type": "object"},
                                  "output_schema": {}, "preconditions": ["tests pass"],
                                  "postconditions": []}]
    assert card["verification"] == {}  # hubd/state/card_trust.py verify_card fills it
    mapped = cap.contracts({"build": {"input_schema": {"a": 1}}, "x": "not a spec"})
    assert mapped == [{"task_class": "build", "input_schema": {"a": 1}, "output_schema": {},
                       "preconditions": [], "postconditions": []}]


def test_advert_rules():
    assert cap.read_advert({"persist": "yes"}, "p/a") == (
        "Malformed frame: 'persist' must be a boolean.")
    assert cap.read_advert({"dispatchable": 1}, "p/a") == (
        "Malformed frame: 'dispatchable' must be a boolean.")
    assert "another identity" in cap.read_advert({"agent": "p/b"}, "p/a")
    assert cap.read_advert({"agent": "p/a", "persist": True}, "p/a-rx") == cap.Advert(
        "p/a", True, True)
    assert "project-scoped" in cap.read_advert({"persist": True}, "solo")

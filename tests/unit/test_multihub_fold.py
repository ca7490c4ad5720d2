"""The observed view (federation/fold.py): board heads and provenance, conflicts,
progress, observed claims and the asserting-hubs signal, over both hubd's and
the reference hub's journal payloads."""

from __future__ import annotations

import json

from hypothesis import given, settings, strategies as st

from federation.fold import asserting_hubs, fold, namespace_of, record_fingerprint
from federation.log_model import LogEvent, event_fingerprint
from federation.merge import MergedLog
from hubd.state import claims as cl

NOW = 1000.0
LIVE, DEAD = NOW + 3600, NOW - 1


def merged(*events: LogEvent) -> list[LogEvent]:
    """The union of the given events, in merged order (each hub's events must
    be its contiguous log from seq 1)."""
    log = MergedLog()
    by_hub: dict[str, list] = {}
    for e in events:
        by_hub.setdefault(e.hub_id, []).append(e)
    for hub, evs in by_hub.items():
        evs.sort(key=lambda e: e.seq)
        log.accept(hub, 0, evs, evs[-1].seq, evs[-1].seq)
    return log.ordered()


def task(hub, seq, ts, task_id, title, status="open", parent=None, **extra):
    payload = {"task_id": task_id, "title": title, "description": "", "depends_on": [],
               "status": status, "suggested_owner": "", "project": "", "version": 1,
               "created_by": "PROJ/a", "created_at": ts, "updated_at": ts, **extra}
    if parent is not None:
        payload["_causal_parent"] = {"hub_id": parent.hub_id, "seq": parent.seq,
                                     "event_fingerprint": parent.fingerprint}
    return LogEvent(hub, seq, ts, "ledger_task", payload)


def lease(hub, seq, task_id, owner, epoch, expires=LIVE, kind="claim", ts=None):
    """A lease record exactly as hubd's grant decision journals it."""
    claims = cl.ClaimState()
    claims.epoch = epoch - 1
    req = cl.read_claim({"task_id": task_id, "paths": ["src"], "ttl_seconds": 3600}, owner,
                        cl.LeaseLimits(), "open-host:127.0.0.1")
    decision = cl.decide_claim(claims, req, expires - 3600, cl.LeaseLimits())
    return LogEvent(hub, seq, float(seq if ts is None else ts), kind, decision.lease)


def hubd_release(hub, seq, task_id, owner, epoch):
    return LogEvent(hub, seq, float(seq), "release",
                    {"task_id": task_id, "owner": owner, "epoch": epoch, "released_at": 1.0})


# -- the walkthrough

def test_walkthrough_rendering():
    west = fold(merged(task("west", 1, 1.0, "docs", "Write the docs")))
    assert west.render("west") == (
        "observing peer 'west' — 1 tasks, 0 progress notes, 0 observed claims\n"
        "board (verified causal heads; display LWW among unresolved heads — non-authoritative):\n"
        "  [open] docs — Write the docs [display source west#1 @ 1]")
    east = fold(merged(task("east", 1, 1.0, "build", "Build the wheel"),
                       lease("east", 2, "build", "PROJ/alice", 1)))
    assert east.render("east", now=NOW) == (
        "observing peer 'east' — 1 tasks, 0 progress notes, 1 observed claims\n"
        "board (verified causal heads; display LWW among unresolved heads — non-authoritative):\n"
        "  [open] build — Build the wheel [display source east#1 @ 1]\n"
        "observed claims (advisory — not granted):\n"
        "  build -> PROJ/alice @ east")
    assert fold([]).render("x") == "observing peer 'x' — 0 tasks, 0 progress notes, " \
                                   "0 observed claims"


def test_json_shape():
    first = task("west", 1, 1.0, "docs", "Write the docs")
    view = fold(merged(first, LogEvent("west", 2, 2.0, "ledger_progress",
                                       {"task_id": "docs", "author": "PROJ/a", "kind": "note",
                                        "text": "halfway", "posted_at": 2.0}),
                       lease("west", 3, "build", "PROJ/alice", 7))).to_json()
    assert set(view) == {"board", "board_policy", "board_provenance", "board_conflicts",
                         "progress", "observed_claims"}
    assert view["board"]["docs"]["title"] == "Write the docs"
    assert view["board_policy"]["authoritative"] is False
    assert view["board_policy"]["order"] == ["timestamp", "hub_id", "seq"]
    assert view["board_provenance"]["docs"] == {
        "task_id": "docs", "hub_id": "west", "seq": 1, "timestamp": 1.0,
        "order_key": [1.0, "west", 1], "event_fingerprint": first.fingerprint,
        "selection": "display-order", "display_winner": True, "authoritative": False,
        "causal": False}
    assert view["progress"] == [{"task_id": "docs", "author": "PROJ/a", "kind": "note",
                                 "text": "halfway", "posted_at": 2.0}]
    claim = view["observed_claims"]["build"]
    assert claim["hub_id"] == "west" and claim["observed"] is True
    assert claim["claim"]["owner"] == "PROJ/alice" and claim["claim"]["epoch"] == 7
    json.dumps(view)  # plain JSON


# -- the board

def test_verified_parent_beats_a_clock_that_is_ahead():
    """West wrote first but its clock is ahead; east's write names west's as
    its parent. The verified head wins although its timestamp is older."""
    west = task("west", 1, 500.0, "docs", "old title")
    east = task("east", 1, 100.0, "docs", "new title", parent=west)
    view = fold(merged(west, east))
    assert view.board["docs"]["title"] == "new title"
    assert "_causal_parent" not in view.board["docs"]
    prov = view.board_provenance["docs"]
    assert (prov.hub_id, prov.seq, prov.causal, prov.causal_parent_status) == (
        "east", 1, True, "verified")
    assert view.board_conflicts == {}
    text = view.render("multi")
    assert "[display source east#1 @ 100; causal head; parent verified]" in text


def test_bad_parents_suppress_nothing():
    west = task("west", 1, 500.0, "docs", "west title")
    other = task("west", 2, 501.0, "other", "another task")
    cases = {
        "fingerprint-mismatch": {"hub_id": "west", "seq": 1, "event_fingerprint": "a" * 64},
        "missing": {"hub_id": "north", "seq": 1, "event_fingerprint": west.fingerprint},
        "wrong-task": {"hub_id": "west", "seq": 2, "event_fingerprint": other.fingerprint},
        "invalid": {"hub_id": "west", "seq": 1},
    }
    for status, parent in cases.items():
        east = LogEvent("east", 1, 100.0, "ledger_task",
                        {**task("east", 1, 100.0, "docs", "east title").payload,
                         "_causal_parent": parent})
        view = fold(merged(west, other, east))
        # display LWW among both heads: west's clock is ahead
        assert view.board["docs"]["title"] == "west title", status
        assert view.board_provenance["docs"].causal is False
        conflict = view.board_conflicts["docs"].to_json()
        assert [c["hub_id"] for c in conflict["contenders"]] == ["east", "west"]
        assert [c.get("causal_parent_status") for c in conflict["contenders"]] == [status, None]
        assert "title" not in json.dumps(conflict)  # payload-free
        assert conflict["status"] == "unresolved" and conflict["causal"] is False


def test_equal_heads_are_not_a_conflict_and_same_hub_is_linear():
    a = task("west", 1, 1.0, "docs", "same", created_at=1.0, updated_at=1.0)
    b = task("east", 1, 2.0, "docs", "same", created_at=1.0, updated_at=1.0)
    view = fold(merged(a, b))
    assert view.board_conflicts == {}
    assert view.board_provenance["docs"].hub_id == "east"
    # one hub's later write supersedes its earlier one even with a clock behind
    first = task("west", 1, 9.0, "docs", "first")
    second = task("west", 2, 3.0, "docs", "second")
    view = fold(merged(first, second))
    assert view.board["docs"]["title"] == "second" and view.board_conflicts == {}
    assert view.board_provenance["docs"].causal is False


def test_record_fingerprint_ignores_the_parent():
    a = task("west", 1, 1.0, "docs", "same")
    b = task("east", 1, 2.0, "docs", "same", parent=a)
    assert record_fingerprint(a.payload) != record_fingerprint(
        {**a.payload, "title": "other"})
    assert record_fingerprint(b.payload) == record_fingerprint(
        {k: v for k, v in b.payload.items() if k != "_causal_parent"})


def test_chain_across_three_hubs():
    w = task("west", 1, 30.0, "t", "w")
    e = task("east", 1, 20.0, "t", "e", parent=w)
    n = task("north", 1, 10.0, "t", "n", parent=e)
    view = fold(merged(w, e, n))
    assert view.board["t"]["title"] == "n" and view.board_provenance["t"].causal
    assert view.board_conflicts == {}


def test_a_parent_cycle_is_rejected():
    """Content-bound parents alone cannot form a cycle (each would embed the
    other's fingerprint); with a hub's content-free sequence edges they can,
    if that hub shows a later write to a peer before publishing an earlier
    one. Then no cross-hub edge counts and both heads stay unresolved."""
    w1 = task("west", 1, 1.0, "t", "w1")
    e1 = task("east", 1, 2.0, "t", "e1", parent=w1)
    w2 = task("west", 2, 3.0, "t", "w2", parent=e1)
    assert fold(merged(w1, e1, w2)).board["t"]["title"] == "w2"  # an honest chain
    late = task("west", 2, 3.0, "t", "late")
    east = task("east", 1, 2.0, "t", "east", parent=late)
    early = task("west", 1, 1.0, "t", "early", parent=east)  # west#2 -> west#1 -> east#1 -> west#2
    view = fold(merged(early, late, east))
    statuses = {(c.hub_id, c.seq): c.causal_parent_status
                for c in view.board_conflicts["t"].contenders}
    assert statuses == {("east", 1): "cycle-rejected", ("west", 2): "none"}
    assert view.board["t"]["title"] == "late" and not view.board_provenance["t"].causal


def test_progress_is_grow_only_in_merged_order():
    notes = [LogEvent(h, s, ts, "ledger_progress", {"task_id": "t", "author": h,
                                                    "kind": "note", "text": f"{h}{s}",
                                                    "posted_at": ts})
             for h, s, ts in (("w", 1, 3.0), ("e", 1, 1.0), ("w", 2, 2.0), ("e", 2, 2.0))]
    view = fold(merged(*notes))
    assert [n["text"] for n in view.progress] == ["e1", "e2", "w2", "w1"]


# -- observed claims

def test_claims_clear_on_release_expiry_and_handoff():
    events = [lease("east", 1, "a", "PROJ/alice", 1),
              lease("east", 2, "b", "PROJ/bob", 2),
              lease("east", 3, "c", "PROJ/carol", 3),
              hubd_release("east", 4, "a", "PROJ/alice", 1),
              LogEvent("east", 5, 5.0, "lease_expired",
                       {"task_id": "b", "owner": "PROJ/bob", "epoch": 2,
                        "lease_expires_at": 5.0, "reason": "ttl", "expired_at": 5.0}),
              lease("east", 6, "c", "OTHER/dave", 4, kind="handoff")]
    view = fold(merged(*events))
    assert set(view.observed_claims) == {"c"}
    assert view.observed_claims["c"].owner == "OTHER/dave"
    assert asserting_hubs(view, NOW) == {"OTHER": {"east"}}


def test_release_of_an_older_epoch_keeps_the_claim():
    events = [lease("east", 1, "a", "PROJ/alice", 1),
              lease("east", 2, "a", "PROJ/alice", 2),  # renewal: new epoch
              hubd_release("east", 3, "a", "PROJ/alice", 1)]
    assert set(fold(merged(*events)).observed_claims) == {"a"}


def test_reference_payloads():
    """The reference's release is {task_id} only and it journals no expiry;
    its task_update/checkpoint rows carry the whole lease."""
    ref_claim = {"task_id": "fw-a", "owner": "PROJ/alice", "note": "cap", "claimed_at": 1.0,
                 "lease_expires_at": LIVE, "status": "claimed", "data_ref": "",
                 "worktree": "/wt", "paths": ["src/core"], "epoch": 1, "version": 0,
                 "checkpoint": "", "git": None, "quota_principal": "federation-peer:west"}
    denial = {"claimant": "PROJ/bob", "claimant_sha256": "aa", "claimant_truncated": False,
              "decision": "deny", "path_count": 1, "reason_code": "SCOPE_CONFLICT",
              "scope_sha256": "dd", "task_id_sha256": "68"}
    events = [LogEvent("ref", 1, 1.0, "claim", ref_claim),
              LogEvent("ref", 2, 2.0, "claim_denial", denial),
              LogEvent("ref", 3, 3.0, "task_update", {**ref_claim, "status": "working",
                                                      "version": 1}),
              LogEvent("ref", 4, 4.0, "claim", {**ref_claim, "task_id": "fw-b", "epoch": 2,
                                                "lease_expires_at": DEAD})]
    view = fold(merged(*events))
    assert view.observed_claims["fw-a"].claim["status"] == "working"
    assert asserting_hubs(view, NOW) == {"PROJ": {"ref"}}  # fw-b has expired
    released = fold(merged(*events, LogEvent("ref", 5, 5.0, "release", {"task_id": "fw-a"})))
    assert set(released.observed_claims) == {"fw-b"}
    assert asserting_hubs(released, NOW) == {}


def test_a_release_on_one_hub_cannot_erase_another_hubs_claim():
    events = [lease("east", 1, "t", "PROJ/alice", 1, ts=1.0),
              lease("north", 1, "t", "PROJ/nina", 1, ts=2.0),
              hubd_release("north", 2, "t", "PROJ/nina", 1)]
    view = fold(merged(*events))
    assert view.observed_claims["t"].hub_id == "east"  # the display falls back to east's
    assert asserting_hubs(view, NOW) == {"PROJ": {"east"}}
    both = fold(merged(*events[:2]))
    assert both.observed_claims["t"].hub_id == "north"  # latest in merged order
    assert asserting_hubs(both, NOW) == {"PROJ": {"east", "north"}}
    assert asserting_hubs(both, NOW, hub="north") == {"PROJ": {"north"}}
    assert asserting_hubs(both, NOW, hub="west") == {}


def test_namespace_derivation():
    assert namespace_of("PROJ/alice") == "PROJ"
    assert namespace_of("PROJ/team/alice") == "PROJ"
    assert namespace_of("alice") is None and namespace_of("/alice") is None
    assert namespace_of(None) is None
    view = fold(merged(lease("e", 1, "a", "solo", 1), lease("e", 2, "b", "/x", 2)))
    assert len(view.observed_claims) == 2 and asserting_hubs(view, NOW) == {}
    assert asserting_hubs(view, DEAD - 10000) == {}


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["east", "north"]), st.sampled_from(["a", "b"]),
                          st.sampled_from(["claim", "release", "handoff", "lease_expired"]),
                          st.sampled_from(["PROJ/x", "OTHER/y"]),
                          st.sampled_from([DEAD, LIVE])), max_size=20))
def test_asserting_hubs_matches_a_per_hub_replay(steps):
    """asserting_hubs equals replaying each hub's lease events alone with
    hubd's own claim projection (per hub, by seq), whatever the interleaving."""
    seqs: dict[str, int] = {}
    events, ts = [], 0.0
    for hub, task_id, kind, owner, expires in steps:
        seq = seqs[hub] = seqs.get(hub, 0) + 1
        ts += 1.0
        if kind in ("claim", "handoff"):
            payload = {"task_id": task_id, "owner": owner, "epoch": seq,
                       "lease_expires_at": expires}
        else:
            payload = {"task_id": task_id}
        events.append(LogEvent(hub, seq, 100.0 - ts if hub == "north" else ts, kind, payload))
    expected: dict[str, set] = {}
    for hub in seqs:
        held = {}
        for e in sorted((e for e in events if e.hub_id == hub), key=lambda e: e.seq):
            if e.kind in ("claim", "handoff"):
                held[e.payload["task_id"]] = e.payload
            else:
                held.pop(e.payload["task_id"], None)
        for record in held.values():
            if record["lease_expires_at"] > NOW:
                expected.setdefault(record["owner"].split("/")[0], set()).add(hub)
    view = fold(merged(*events)) if events else fold([])
    assert asserting_hubs(view, NOW) == expected


def test_fingerprints_in_provenance_name_the_event():
    event = task("west", 1, 1.0, "docs", "Write the docs")
    view = fold(merged(event))
    assert view.board_provenance["docs"].event_fingerprint == event_fingerprint(
        "west", 1, 1.0, "ledger_task", event.payload)

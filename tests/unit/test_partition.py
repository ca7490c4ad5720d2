"""Partition detection (federation/partition.py): the journaled transitions, the
never-heal-on-no-evidence rule, and restore after restart."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from federation.ownership import NamespaceOwnership
from federation.partition import (MULTIHUB_HEAL, MULTIHUB_PARTITION, UNKNOWN_CONTESTANT,
                                  PartitionDetector)

OWNERSHIP = NamespaceOwnership.from_flags(["PROJ=east", "DOCS=west", "OPS=east"], "east")
PEERS = ["north", "south", "west"]


def detector(**kw) -> PartitionDetector:
    return PartitionDetector("east", OWNERSHIP, **kw)


def test_enter_update_and_heal_payloads():
    d = detector()
    rows = d.observe("north", {"PROJ": {"north"}}, True, True)
    assert rows == [(MULTIHUB_PARTITION, {
        "namespace": "PROJ", "local_hub_id": "east", "owner_hub_id": "east",
        "contesting_hubs": ["north"], "outcome": "partitioned", "transition": "entered"})]
    assert d.is_partitioned("PROJ") and d.partitioned() == {"PROJ"}
    assert d.observe("north", {"PROJ": {"north"}}, True, True) == []  # unchanged: nothing
    rows = d.observe("south", {"PROJ": ["south"]}, True, True)
    assert rows[0].payload["contesting_hubs"] == ["north", "south"]
    assert rows[0].payload["transition"] == "updated"
    rows = d.observe("north", {}, True, True)  # north released: south still contests
    assert rows[0].payload["contesting_hubs"] == ["south"]
    assert rows[0].payload["transition"] == "updated"
    rows = d.observe("south", {"OTHER": {"south"}}, True, True)
    assert rows == [(MULTIHUB_HEAL, {
        "namespace": "PROJ", "local_hub_id": "east", "owner_hub_id": "east",
        "previous_contesting_hubs": ["south"], "outcome": "local",
        "observation_refreshed": True})]
    assert d.partitioned() == frozenset()


def test_owner_local_and_ungoverned_never_contest():
    d = detector()
    assert d.observe("west", {"DOCS": {"west"}, "PROJ": {"east"}, "FREE": {"west"}},
                     True, True) == []
    rows = d.observe("north", {"DOCS": {"north"}}, True, True)  # a remote-owned namespace
    assert rows[0].payload["owner_hub_id"] == "west"
    rows = d.observe("north", {}, True, True)
    assert rows[0].kind == MULTIHUB_HEAL and rows[0].payload["outcome"] == "remote"


def test_failed_refused_and_empty_polls_never_heal():
    d = detector()
    d.observe("north", {"PROJ": {"north"}}, True, True)
    assert d.observe("north", {}, False, False) == []  # failed
    assert d.observe("north", None, True, True) == []  # no view
    assert d.observe("north", {}, True, False) == []  # empty / refused log
    assert d.partitioned() == {"PROJ"}
    # an empty poll may still add evidence
    rows = d.observe("south", {"PROJ": {"south"}}, True, False)
    assert rows[0].payload["contesting_hubs"] == ["north", "south"]
    # south's empty-history assertion is only cleared by its own refresh
    assert d.observe("north", {}, True, True)[0].payload["contesting_hubs"] == ["south"]
    assert d.observe("south", {}, True, True)[0].kind == MULTIHUB_HEAL


def test_no_map_no_partition():
    d = PartitionDetector("east", NamespaceOwnership.from_flags([], "east"))
    assert d.observe("north", {"PROJ": {"north"}}, True, True) == []


def test_restore():
    rows = [
        (MULTIHUB_PARTITION, {"namespace": "PROJ", "contesting_hubs": ["north"]}),
        {"kind": MULTIHUB_PARTITION, "payload": {"namespace": "OPS", "contesting_hubs": "x"}},
        (MULTIHUB_PARTITION, {"namespace": "DOCS", "contesting_hubs": ["south"]}),
        (MULTIHUB_HEAL, {"namespace": "DOCS", "observation_refreshed": "true"}),  # not a heal
        (MULTIHUB_PARTITION, {"namespace": "GONE", "contesting_hubs": ["north"]}),
        (MULTIHUB_HEAL, {"namespace": "GONE", "observation_refreshed": True}),
        ("claim", {"namespace": "PROJ"}), (MULTIHUB_PARTITION, {"namespace": " "}),
    ]
    d = detector(watched=PEERS)
    assert d.restore(rows) == {"PROJ", "OPS", "DOCS"}
    assert d.contesting("OPS") == (UNKNOWN_CONTESTANT,)
    assert d.contesting("DOCS") == ("south",)
    # a restored contestant must prove itself: others' refreshes do not heal it
    assert d.observe("south", {}, True, True)[0].payload["namespace"] == "DOCS"
    assert d.observe("west", {}, True, True) == []
    assert d.partitioned() == {"PROJ", "OPS"}
    heal = d.observe("north", {}, True, True)
    # north proves PROJ; the unknown contestant of OPS clears once every watched
    # peer has refreshed with history
    assert [(r.kind, r.payload["namespace"]) for r in heal] == [
        (MULTIHUB_HEAL, "OPS"), (MULTIHUB_HEAL, "PROJ")]
    assert d.partitioned() == frozenset()


def test_unknown_contestant_without_a_watch_list_stays():
    d = detector()
    d.restore([(MULTIHUB_PARTITION, {"namespace": "PROJ", "contesting_hubs": []})])
    for peer in PEERS:
        d.observe(peer, {}, True, True)
    assert d.contesting("PROJ") == (UNKNOWN_CONTESTANT,)
    # a new contest keeps the unknown one in the journaled set, so a restart keeps it
    rows = d.observe("north", {"PROJ": {"north"}}, True, True)
    assert rows[0].payload["contesting_hubs"] == [UNKNOWN_CONTESTANT, "north"]


# -- properties

HUBS = ["north", "south", "west", "east"]
observations = st.lists(st.tuples(
    st.sampled_from(PEERS),
    st.none() | st.dictionaries(st.sampled_from(["PROJ", "DOCS", "OPS", "FREE"]),
                                st.sets(st.sampled_from(HUBS), max_size=3), max_size=3),
    st.booleans(), st.booleans()), max_size=25)


def run(d: PartitionDetector, steps) -> list:
    rows = []
    for peer, asserting, ok, non_empty in steps:
        before = {ns: set(d.contesting(ns)) for ns in d.partitioned()}
        out = d.observe(peer, asserting, ok, non_empty)
        if not (ok and non_empty and asserting is not None):
            # no evidence of absence: nothing healed, no contestant dropped
            assert all(r.kind == MULTIHUB_PARTITION for r in out)
            for ns, hubs in before.items():
                assert hubs <= set(d.contesting(ns))
        for r in out:
            assert r.payload["namespace"] in OWNERSHIP.owners
            if r.kind == MULTIHUB_PARTITION:
                hubs = r.payload["contesting_hubs"]
                assert hubs == sorted(hubs) and "east" not in hubs
                assert r.payload["transition"] == ("updated" if r.payload["namespace"] in before
                                                   else "entered")
        rows.extend(out)
    return rows


@settings(max_examples=300, deadline=None)
@given(observations)
def test_a_transition_only_on_change_and_heal_only_on_evidence(steps):
    d = detector()
    rows = run(d, steps)
    # replaying the rows reproduces the live refusing set
    live = {ns: d.contesting(ns) for ns in d.partitioned()}
    restored = detector()
    restored.restore(rows)
    assert {ns: restored.contesting(ns) for ns in restored.partitioned()} == live
    # consecutive rows of a namespace always change something
    last: dict = {}
    for r in rows:
        ns = r.payload["namespace"]
        state = tuple(r.payload.get("contesting_hubs", ()))
        assert last.get(ns) != state
        last[ns] = state


@settings(max_examples=300, deadline=None)
@given(observations, st.permutations(HUBS), st.booleans())
def test_every_contestant_refreshed_heals(steps, order, restart):
    d = detector()
    rows = run(d, steps)
    if restart:
        d = detector()
        d.restore(rows)
    before = d.partitioned()
    heals = []
    for hub in order:  # every hub that could contest, including ones never watched
        heals += d.observe(hub, {}, True, True)
    assert d.partitioned() == frozenset()
    assert {r.payload["namespace"] for r in heals if r.kind == MULTIHUB_HEAL} == before
    assert all(r.payload["observation_refreshed"] is True
               for r in heals if r.kind == MULTIHUB_HEAL)


@settings(max_examples=200, deadline=None)
@given(observations, st.data())
def test_restored_contestant_needs_its_own_refresh(steps, data):
    live = detector()
    rows = run(live, steps)
    partitioned = sorted(live.partitioned())
    if not partitioned:
        return
    ns = data.draw(st.sampled_from(partitioned))
    holdout = data.draw(st.sampled_from(live.contesting(ns)))
    d = detector()
    d.restore(rows)
    for hub in HUBS:
        if hub != holdout:
            d.observe(hub, {}, True, True)
    assert holdout in d.contesting(ns)
    assert d.observe(holdout, {}, True, True)[-1].kind == MULTIHUB_HEAL


def test_watch_round_trip():
    """The pieces as a standing watch wires them: pull -> decode -> accept ->
    fold -> asserting_hubs(hub=peer) -> observe(peer, ...)."""
    from federation.fold import FOLDED_KINDS, asserting_hubs, fold
    from federation.log_model import Equivocation
    from federation.log_snapshot import decode_snapshot
    from federation.merge import MergedLog

    now = 1000.0
    north_log = [
        {"seq": 1, "ts": 1.0, "kind": "chat", "payload": {"text": "hi"}},
        {"seq": 2, "ts": 2.0, "kind": "claim", "payload": {
            "task_id": "t", "owner": "PROJ/nina", "epoch": 1, "lease_expires_at": now + 60}},
        {"seq": 3, "ts": 3.0, "kind": "release", "payload": {"task_id": "t", "epoch": 1}},
    ]
    union = MergedLog(retain=FOLDED_KINDS.__contains__)
    d = detector()

    def poll(frame):
        snap = decode_snapshot(frame)
        result = union.accept("north", union.cursor("north"), snap.events, snap.next_cursor,
                              snap.log_end_seq)
        seen = asserting_hubs(fold(union.ordered()), now, hub="north")
        return d.observe("north", seen, not result.refused, result.complete)

    def page(upto, end):
        after = union.cursor("north")
        events = north_log[after:upto]
        return {"type": "multihub_log_snapshot", "events": events,
                "next_cursor": upto if events else after, "log_end_seq": end}

    assert poll(page(2, 2))[0].payload["transition"] == "entered"
    assert poll({"events": [], "next_cursor": 2, "log_end_seq": None}) == []  # refused
    tampered = page(3, 3)
    tampered["events"] = [dict(north_log[1], ts=2.5)] + tampered["events"]
    tampered["next_cursor"] = 3
    union_before = union.ordered()
    d_before = d.partitioned()
    with pytest.raises(Equivocation):  # the watch quarantines north; nothing is published
        union.accept("north", 1, decode_snapshot(tampered).events, 3, 3)
    assert union.ordered() == union_before and union.cursor("north") == 2
    assert d.partitioned() == d_before
    heal = poll(page(3, 3))
    assert heal[0].kind == MULTIHUB_HEAL and d.partitioned() == frozenset()

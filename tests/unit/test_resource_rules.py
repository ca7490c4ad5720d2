"""The pure decisions of resource offers (hubd/state/resources.py)."""

from __future__ import annotations

from hubd.state import resources as res

A = "p/alice"


def _state(*records) -> res.ResourceState:
    state = res.ResourceState()
    for r in records:
        state.put(r)
    return state


def _record(agent=A, kind="gpu", name="a100", capacity=1, meta=None) -> dict:
    return {"agent": agent, "kind": kind, "name": name, "capacity": capacity, "meta": meta or {}}


def test_an_offer_becomes_its_record_with_the_defaults():
    assert res.read_offer({"kind": "gpu", "name": "a100"}, A, _state()) == _record()
    assert res.read_offer({"kind": "gpu", "name": "a100", "capacity": 4, "meta": {"z": 1}}, A,
                          _state()) == _record(capacity=4, meta={"z": 1})


def test_the_references_refusals_in_its_order():
    state = _state()
    for frame in ({}, {"kind": "gpu"}, {"name": "x"}, {"kind": "", "name": "x"},
                  {"kind": "gpu", "name": ""}):
        assert res.read_offer(frame, A, state) == res.NEEDS_KIND_AND_NAME, frame
    full = _state(_record(name="one"), _record(name="two"))
    assert res.read_offer({"kind": "gpu", "name": "three"}, A, full, 2) == res.QUOTA_EXCEEDED
    # a replacement is not a new key; another agent has its own quota
    assert res.read_offer({"kind": "gpu", "name": "two", "capacity": 9}, A, full, 2) == \
        _record(name="two", capacity=9)
    assert isinstance(res.read_offer({"kind": "gpu", "name": "x"}, "p/bob", full, 2), dict)


def test_what_the_reference_would_coerce_is_refused_with_its_reason():
    state = _state()
    assert res.read_offer({"kind": 5, "name": "x"}, A, state) == res.BAD_TEXT
    assert res.read_offer({"kind": "k" * 257, "name": "x"}, A, state) == res.BAD_TEXT
    for capacity in (0, -1, "lots", 1.5, True):
        assert res.read_offer({"kind": "g", "name": "x", "capacity": capacity}, A, state) == \
            res.BAD_CAPACITY, capacity
    assert res.read_offer({"kind": "g", "name": "x", "meta": []}, A, state) == res.BAD_META
    big = {"blob": "x" * res.MAX_META_BYTES}
    assert res.read_offer({"kind": "g", "name": "x", "meta": big}, A, state) == res.BAD_META


def test_the_hub_wide_bound_refuses_a_new_key_only():
    state = res.ResourceState()
    for i in range(res.MAX_OFFERS):
        state.offers[(f"p/a{i}", "k", "n")] = _record(agent=f"p/a{i}")
    assert res.read_offer({"kind": "k", "name": "n"}, "p/new", state) == res.HUB_FULL
    assert isinstance(res.read_offer({"kind": "k", "name": "n"}, "p/a1", state), dict)


def test_records_replace_by_key_and_list_in_key_order():
    state = _state(_record(name="b"), _record(name="a"), _record(name="b", capacity=5))
    assert state.listing() == [_record(name="a"), _record(name="b", capacity=5)]
    assert state.per_agent == {A: 2}
    assert res.offer_key(_record()) == "p/alice:gpu:a100"

"""The content-bound log union (federation/merge.py; its events and
fingerprints are federation/log_model.py, the pull answer's decoding
federation/log_snapshot.py): fingerprints, batch validation, decode of the
pull answer, and the convergence properties."""

from __future__ import annotations

import copy
import math

import pytest
from hypothesis import HealthCheck, assume, given, settings, strategies as st

from federation.fold import FOLDED_KINDS, fold
from federation.log_model import (_canonical_iterative, CursorMismatch, CursorRollback,
                                  Equivocation, LogEvent, LogGap, SnapshotInvalid,
                                  Unfingerprintable, canonical_value, event_fingerprint)
from federation.log_snapshot import decode_snapshot
from federation.merge import MergedLog, merge_logs

SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# -- strategies

keys = st.text(min_size=0, max_size=6)
scalars = (st.none() | st.booleans() | st.integers(-2 ** 70, 2 ** 70)
           | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8))
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(keys, inner, max_size=4), max_leaves=12)
payloads = st.dictionaries(keys, json_values, max_size=5)

TASKS = ["build", "docs", "t3"]
OWNERS = ["PROJ/alice", "PROJ/bob", "OTHER/carol", "solo"]


@st.composite
def honest_logs(draw, hubs=("east", "west", "north")):
    """Append-only logs of several hubs written over one shared timeline, with
    task writes that sometimes name an earlier task write (any hub) as their
    causal parent, correctly or not."""
    used = draw(st.lists(st.sampled_from(hubs), min_size=1, max_size=3, unique=True))
    logs = {h: [] for h in used}
    task_writes = []
    for step in range(draw(st.integers(0, 24))):
        hub = draw(st.sampled_from(used))
        seq = len(logs[hub]) + 1
        # clocks of different hubs disagree a little; ties happen
        ts = float(step // 2) + draw(st.sampled_from([0.0, 0.5, -0.5]))
        kind = draw(st.sampled_from(["ledger_task", "ledger_progress", "claim", "release",
                                     "lease_expired", "handoff", "chat"]))
        task = draw(st.sampled_from(TASKS))
        if kind == "ledger_task":
            payload = {"task_id": task, "title": draw(st.sampled_from(["A", "B"])),
                       "status": draw(st.sampled_from(["open", "done"])), "version": seq}
            if task_writes and draw(st.booleans()):
                parent = draw(st.sampled_from(task_writes))
                fingerprint = parent.fingerprint if draw(st.booleans()) else "0" * 64
                payload["_causal_parent"] = {"hub_id": parent.hub_id, "seq": parent.seq,
                                             "event_fingerprint": fingerprint}
        elif kind == "ledger_progress":
            payload = {"task_id": task, "author": "PROJ/a", "kind": "note", "text": str(step)}
        elif kind in ("claim", "handoff"):
            payload = {"task_id": task, "owner": draw(st.sampled_from(OWNERS)), "epoch": step,
                       "lease_expires_at": draw(st.sampled_from([5.0, 1e12]))}
        elif kind in ("release", "lease_expired"):
            payload = {"task_id": task}
            if draw(st.booleans()):
                payload["epoch"] = draw(st.integers(0, 24))
        else:
            payload = {"payload": draw(payloads)}
        event = LogEvent(hub, seq, ts, kind, payload)
        logs[hub].append(event)
        if kind == "ledger_task":
            task_writes.append(event)
    return logs


def as_pulled(event: LogEvent) -> dict:
    return {"seq": event.seq, "ts": event.ts, "kind": event.kind,
            "payload": copy.deepcopy(dict(event.payload))}


@st.composite
def deliveries(draw, logs):
    """A random delivery of the logs: each hub's log cut into contiguous
    batches (some re-sent from an earlier cursor, which must collapse), the
    hubs' batches interleaved in a random arrival order."""
    plans = {}
    for hub, events in logs.items():
        batches, start = [], 0
        while start < len(events):
            size = draw(st.integers(1, max(1, len(events) - start)))
            end = start + size
            # sometimes re-ask from an earlier cursor (a retry after a lost answer)
            back = draw(st.integers(0, start)) if start and draw(st.booleans()) else 0
            batches.append((start - back, events[start - back:end]))
            start = end
        if not batches or draw(st.booleans()):
            batches.append((len(events), []))  # a caught-up poll
        plans[hub] = batches
    order = []
    for hub, batches in plans.items():
        order.extend([hub] * len(batches))
    order = draw(st.permutations(order))
    cursors = {hub: 0 for hub in plans}
    out = []
    for hub in order:
        after, batch = plans[hub][cursors[hub]]
        cursors[hub] += 1
        out.append((hub, after, batch))
    return out


def deliver(log: MergedLog, plan, logs) -> None:
    for hub, after, batch in plan:
        end = len(logs[hub])
        log.accept(hub, after, [as_pulled(e) for e in batch], after + len(batch), end)


def state_of(log: MergedLog):
    return ([(e.identity, e.fingerprint) for e in log.ordered()], log.cursors(),
            {h: log.log_end(h) for h in log.hubs()})


# -- fingerprints

def test_fingerprint_matches_the_reference_hub():
    """Values printed by the reference hub's `synapse multihub observe --json`
    (0.99.38) for these events; hubd observers must name events identically."""
    docs = {"task_id": "docs", "title": "Write the docs", "description": "", "depends_on": [],
            "status": "open", "suggested_owner": "", "project": "", "version": 1,
            "created_by": "p/alice", "created_at": 1796015532.39, "updated_at": 1796015532.39}
    assert event_fingerprint("west", 1, 1796015532.39, "ledger_task", docs) == (
        "b3d074b3cff8fe06866780443be0cf2656a105474e8f0215ceafc6f1346a54f2")
    assert event_fingerprint("h", 1, 5.5, "ledger_task",
                             {"task_id": "zz", "title": "Last", "status": "done"}) == (
        "f7757e5624988553f35d4bc2116755a65d6a6487688ef603d988639751ca82ef")
    assert event_fingerprint("h", 8, 4.8, "ledger_task", {
        "task_id": "aa", "title": "First v2", "status": "open",
        "_causal_parent": {"hub_id": "h", "seq": 2, "event_fingerprint": "0" * 64}}) == (
        "66ab55125deeaad536b353a9e919cd9a818725f0ee96e462e50365907d4216b2")


def test_canonical_form_by_hand():
    frame = lambda tag, body: tag + len(body).to_bytes(8, "big") + body  # noqa: E731
    assert canonical_value(None) == b"n"
    assert canonical_value(True) == b"b1" and canonical_value(False) == b"b0"
    assert canonical_value(-12) == frame(b"i", b"-12")
    assert canonical_value("é") == frame(b"s", "é".encode())
    assert canonical_value([1, None]) == frame(b"l", frame(b"v", frame(b"i", b"1"))
                                               + frame(b"v", b"n"))
    assert canonical_value({"b": 1, "a": None}) == frame(
        b"o", frame(b"k", b"a") + frame(b"v", b"n") + frame(b"k", b"b")
        + frame(b"v", frame(b"i", b"1")))


@SETTINGS
@given(json_values | payloads)
def test_both_encoders_agree(value):
    assert canonical_value(value) == _canonical_iterative(value)


def _reorder(value, draw):
    if isinstance(value, dict):
        items = [(k, _reorder(v, draw)) for k, v in value.items()]
        return dict(draw(st.permutations(items)))
    if isinstance(value, list):
        return [_reorder(v, draw) for v in value]
    return value


@SETTINGS
@given(payloads, st.data())
def test_fingerprint_ignores_mapping_order(payload, data):
    shuffled = _reorder(payload, data.draw)
    assert event_fingerprint("h", 1, 1.0, "k", payload) == event_fingerprint(
        "h", 1, 1.0, "k", shuffled)


TYPE_VARIANTS = [1, 1.0, "1", True, [1], {"1": 1}, None, 0, False, ""]


@SETTINGS
@given(payloads, keys, st.sampled_from(range(len(TYPE_VARIANTS))),
       st.sampled_from(range(len(TYPE_VARIANTS))), st.booleans())
def test_fingerprint_sees_type_changes(payload, key, a, b, nested):
    assume(a != b)
    assume(not (TYPE_VARIANTS[a] in (0, False) and TYPE_VARIANTS[b] in (0, False)
                and type(TYPE_VARIANTS[a]) is type(TYPE_VARIANTS[b])))

    def place(value):
        p = copy.deepcopy(payload)
        if nested:
            p[key] = {"inner": [value]}
        else:
            p[key] = value
        return p
    assert event_fingerprint("h", 1, 1.0, "k", place(TYPE_VARIANTS[a])) != event_fingerprint(
        "h", 1, 1.0, "k", place(TYPE_VARIANTS[b]))


def test_fingerprint_binds_every_field():
    base = event_fingerprint("west", 3, 10.0, "claim", {"a": 1})
    assert len({base, event_fingerprint("east", 3, 10.0, "claim", {"a": 1}),
                event_fingerprint("west", 4, 10.0, "claim", {"a": 1}),
                event_fingerprint("west", 3, 10.000001, "claim", {"a": 1}),
                event_fingerprint("west", 3, 10.0, "release", {"a": 1}),
                event_fingerprint("west", 3, 10.0, "claim", {"a": 2})}) == 6
    # the timestamp is the instant: an int ts is the same value as its float
    assert event_fingerprint("west", 3, 10, "claim", {"a": 1}) == base
    # no ambiguity between a key/value split and another one
    assert event_fingerprint("h", 1, 0.0, "k", {"ab": "c"}) != event_fingerprint(
        "h", 1, 0.0, "k", {"a": "bc"})


def test_unfingerprintable_content():
    for bad in ({"x": float("nan")}, {"x": "\ud800"}, {"x": object()}, {1: "x"}):
        with pytest.raises(Unfingerprintable):
            event_fingerprint("h", 1, 1.0, "k", bad)
    with pytest.raises(Unfingerprintable):
        event_fingerprint("h", 1, math.inf, "k", {})
    deep = {}
    node = deep
    for _ in range(5000):  # deeper than Python's recursion limit
        node["x"] = {}
        node = node["x"]
    assert len(event_fingerprint("h", 1, 1.0, "k", deep)) == 64


# -- convergence

@SETTINGS
@given(st.data())
def test_any_delivery_converges(data):
    """Random honest logs, delivered in random batchings (with retries from an
    earlier cursor) and arrival orders, merge to the same ordered view, the same
    cursors and the same fold."""
    logs = data.draw(honest_logs())
    expected = merge_logs({h: [as_pulled(e) for e in evs] for h, evs in logs.items()})
    for _ in range(2):
        log = MergedLog()
        deliver(log, data.draw(deliveries(logs)), logs)
        assert state_of(log) == state_of(expected)
        assert fold(log.ordered()).to_json() == fold(expected.ordered()).to_json()
        # what the union kept is exactly what was fingerprinted
        assert all(event_fingerprint(e.hub_id, e.seq, e.ts, e.kind, e.payload) == e.fingerprint
                   for e in log.ordered())
    # keeping only what the fold reads changes neither the fold nor the cursors
    lean = MergedLog(retain=FOLDED_KINDS.__contains__)
    deliver(lean, data.draw(deliveries(logs)), logs)
    assert fold(lean.ordered()).to_json() == fold(expected.ordered()).to_json()
    assert lean.cursors() == expected.cursors() and len(lean) == len(expected)
    assert all(e.kind in FOLDED_KINDS for e in lean.ordered())
    ordered = expected.ordered()
    assert [e.order_key for e in ordered] == sorted(e.order_key for e in ordered)
    assert expected.cursors() == {h: len(evs) for h, evs in logs.items()}


@SETTINGS
@given(st.data())
def test_equivocation_is_detected_and_changes_nothing(data):
    logs = data.draw(honest_logs())
    hub = data.draw(st.sampled_from(sorted(logs)))
    events = logs[hub]
    assume(events)
    # also when the union keeps no content at all: fingerprints suffice
    log = MergedLog(retain=data.draw(st.sampled_from([None, lambda kind: False])))
    deliver(log, data.draw(deliveries(logs)), logs)
    before = state_of(log)
    # a batch re-sent from an earlier cursor with one event's content changed
    start = data.draw(st.integers(0, len(events) - 1))
    batch = [as_pulled(e) for e in events[start:]]
    victim = data.draw(st.integers(0, len(batch) - 1))
    change = data.draw(st.sampled_from(["ts", "kind", "payload", "type"]))
    if change == "ts":
        batch[victim]["ts"] += 0.25
    elif change == "kind":
        batch[victim]["kind"] += "!"
    elif change == "payload":
        batch[victim]["payload"]["extra"] = 1
    else:
        batch[victim]["payload"]["task_id"] = [batch[victim]["payload"].get("task_id")]
    # and possibly some honest new events after it in the same batch
    batch += [{"seq": len(events) + i + 1, "ts": 99.0, "kind": "chat", "payload": {}}
              for i in range(data.draw(st.integers(0, 2)))]
    end = batch[-1]["seq"]
    with pytest.raises(Equivocation) as info:
        log.accept(hub, start, batch, end, end)
    assert info.value.hub_id == hub and info.value.seq == start + victim + 1
    assert info.value.accepted_fingerprint == events[start + victim].fingerprint
    assert info.value.offered_fingerprint != info.value.accepted_fingerprint
    assert state_of(log) == before


def test_equivocation_inside_one_batch():
    log = MergedLog()
    batch = [{"seq": 1, "ts": 1.0, "kind": "a", "payload": {}},
             {"seq": 1, "ts": 1.0, "kind": "a", "payload": {"x": 1}}]
    with pytest.raises(LogGap):  # a repeated seq is not the next one
        log.accept("h", 0, batch, 1, 1)
    assert len(log) == 0 and log.cursors() == {}


@SETTINGS
@given(st.data())
def test_a_gap_is_never_skipped(data):
    logs = data.draw(honest_logs())
    hub = data.draw(st.sampled_from(sorted(logs)))
    events = logs[hub]
    assume(len(events) >= 2)
    log = MergedLog()
    cut = data.draw(st.integers(0, len(events) - 2))
    log.accept(hub, 0, [as_pulled(e) for e in events[:cut]], cut, len(events))
    before = state_of(log)
    rest = [as_pulled(e) for e in events[cut:]]
    missing = data.draw(st.integers(0, len(rest) - 1))
    if missing == len(rest) - 1:
        assume(len(rest) >= 2)
        missing = data.draw(st.integers(0, len(rest) - 2))
    del rest[missing]
    with pytest.raises(LogGap):
        log.accept(hub, cut, rest, rest[-1]["seq"], len(events))
    assert state_of(log) == before
    # starting past the cursor is a gap too
    with pytest.raises(LogGap):
        log.accept(hub, cut + 1, [as_pulled(e) for e in events[cut + 1:]], len(events),
                   len(events))
    assert state_of(log) == before


def test_cursor_rules():
    log = MergedLog()
    ev = [{"seq": i, "ts": float(i), "kind": "chat", "payload": {"i": i}} for i in range(1, 6)]
    log.accept("w", 0, ev[:3], 3, 5)
    before = state_of(log)
    with pytest.raises(CursorMismatch):  # next_cursor is not the last seq
        log.accept("w", 3, ev[3:], 4, 5)
    with pytest.raises(CursorMismatch):  # empty batch must echo after_seq
        log.accept("w", 3, [], 5, 5)
    with pytest.raises(CursorMismatch):  # log_end below the events just sent
        log.accept("w", 3, ev[3:], 5, 4)
    with pytest.raises(CursorRollback):  # the peer's log is shorter than what we hold
        log.accept("w", 0, [], 0, 2)
    with pytest.raises(CursorRollback):  # log_end behind what it reported before
        log.accept("w", 3, [], 3, 4)
    assert state_of(log) == before
    refused = log.accept("w", 3, [], 3, None)
    assert refused.refused and not refused.non_empty and state_of(log) == before
    with pytest.raises(CursorMismatch):
        log.accept("w", 3, ev[3:], 5, None)
    result = log.accept("w", 1, ev[1:], 5, 5)  # a re-fetch from an older cursor
    assert (result.added, result.duplicates, result.cursor) == (2, 2, 5)
    assert result.caught_up and result.non_empty and result.complete
    page = MergedLog().accept("w", 0, ev[:2], 2, 5)
    assert page.non_empty and not page.caught_up and not page.complete
    empty = MergedLog().accept("e", 0, [], 0, 0)
    assert not empty.non_empty and empty.caught_up and not empty.refused


def test_history_before_the_first_cursor_is_not_invented():
    log = MergedLog()
    log.accept("w", 2, [{"seq": 3, "ts": 3.0, "kind": "k", "payload": {}}], 3, 3)
    with pytest.raises(CursorRollback):
        log.accept("w", 1, [{"seq": 2, "ts": 2.0, "kind": "k", "payload": {}},
                            {"seq": 3, "ts": 3.0, "kind": "k", "payload": {}}], 3, 3)


def test_accepted_content_is_owned():
    log = MergedLog()
    payload = {"task_id": "t", "nested": {"a": [1]}}
    log.accept("w", 0, [{"seq": 1, "ts": 1.0, "kind": "k", "payload": payload}], 1, 1)
    payload["nested"]["a"].append(2)
    event = log.get("w", 1)
    assert event.payload == {"task_id": "t", "nested": {"a": [1]}}
    assert event.fingerprint == event_fingerprint("w", 1, 1.0, "k", event.payload)
    # a LogEvent of another hub cannot be slipped into a batch
    with pytest.raises(CursorMismatch):
        log.accept("w", 1, [LogEvent("x", 2, 1.0, "k", {})], 2, 2)


def test_forget_restarts_a_peer_from_zero():
    log = MergedLog()
    log.accept("w", 0, [{"seq": 1, "ts": 1.0, "kind": "k", "payload": {}}], 1, 1)
    log.accept("e", 0, [{"seq": 1, "ts": 1.0, "kind": "k", "payload": {}}], 1, 1)
    assert log.forget("w") == 1
    assert log.cursor("w") == 0 and log.hubs() == ["e"]
    log.accept("w", 0, [{"seq": 1, "ts": 2.0, "kind": "k2", "payload": {}}], 1, 1)
    assert log.get("w", 1).kind == "k2"


# -- decoding the pull answer

GOOD = {"type": "multihub_log_snapshot", "hub_id": "east",
        "events": [{"seq": 1, "ts": 1796015532.39, "kind": "claim", "payload": {"task_id": "a"}},
                   {"seq": 2, "ts": 5, "kind": "release", "payload": {"task_id": "a"}}],
        "next_cursor": 2, "log_end_seq": 8}


def test_decode_snapshot():
    snap = decode_snapshot(GOOD)
    events, next_cursor, log_end = snap
    assert (next_cursor, log_end, snap.refused) == (2, 8, False)
    assert events[1] == {"seq": 2, "ts": 5.0, "kind": "release", "payload": {"task_id": "a"}}
    assert isinstance(events[1]["ts"], float)
    refusal = decode_snapshot({"type": "multihub_log_snapshot", "events": [], "next_cursor": 3,
                               "log_end_seq": None})
    assert refusal.refused and refusal.events == () and refusal.next_cursor == 3
    caught_up = decode_snapshot({"events": [], "next_cursor": 8, "log_end_seq": 8})
    assert not caught_up.refused


def _bad(**change):
    frame = copy.deepcopy(GOOD)
    for key, value in change.items():
        if key.startswith("ev_"):
            frame["events"][0][key[3:]] = value
        elif value is KeyError:
            del frame[key]
        else:
            frame[key] = value
    return frame


@pytest.mark.parametrize("frame", [
    _bad(events={"seq": 1}), _bad(events=None), _bad(events=KeyError),
    _bad(next_cursor=KeyError), _bad(log_end_seq=KeyError),
    _bad(next_cursor=True), _bad(log_end_seq=False), _bad(next_cursor=-1),
    _bad(log_end_seq=-3), _bad(next_cursor=2.0), _bad(log_end_seq="8"),
    _bad(ev_seq=True), _bad(ev_seq=-1), _bad(ev_seq="1"), _bad(ev_seq=1.0),
    _bad(ev_ts=float("nan")), _bad(ev_ts=float("inf")), _bad(ev_ts=True), _bad(ev_ts="1"),
    _bad(ev_kind=None), _bad(ev_payload=[]), _bad(ev_payload="{}"), _bad(ev_extra=1),
    _bad(ev_seq=2), _bad(type="error"),
    {"events": [{"seq": 1, "ts": 1.0, "kind": "k"}], "next_cursor": 1, "log_end_seq": 1},
    {"events": [GOOD["events"][0]], "next_cursor": 1, "log_end_seq": None},
    [], "snapshot",
])
def test_decode_snapshot_is_strict(frame):
    with pytest.raises(SnapshotInvalid):
        decode_snapshot(frame)


def test_a_decoded_snapshot_feeds_accept():
    log = MergedLog()
    snap = decode_snapshot(GOOD)
    result = log.accept("east", 0, snap.events, snap.next_cursor, snap.log_end_seq)
    assert result.added == 2 and not result.caught_up and log.log_end("east") == 8

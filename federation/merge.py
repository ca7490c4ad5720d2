"""The content-bound union of several hubs' event logs (observe-only, no IO).

Each hub's journal is append-only with its own sequence. Tag every event with
the hub that authored it and the union of several logs is a grow-only set keyed
by ``(hub_id, seq)``; replaying it in ``(ts, hub_id, seq)`` order gives every
observer the same sequence whatever order the logs arrived in. That total order
is deterministic, not causal: it orders by wall clocks of different hosts.

The union is only a CRDT for honest peers, so each identity is bound to one
content fingerprint. An exact duplicate collapses; a second fingerprint for an
accepted identity is equivocation and raises -- no arrival-order or timestamp
winner is ever chosen. A pulled batch is validated as a whole before anything
is published: on any error the prior view and cursors stay exactly as they were.

Event fingerprint (wire-visible: a task write names its parent by it, and
operators compare it across observers). Lowercase hex SHA-256 over the bytes

    DOMAIN || F("h", hub_id) || F("q", seq) || F("t", ts) || F("k", kind) || F("p", V(payload))

where ``DOMAIN`` is ``b"synapse-channel:multihub-event-fingerprint:v1\\x00"``,
``F(tag, body) = tag (1 ASCII byte) || len(body) as 8-byte big-endian || body``,
``hub_id`` and ``kind`` are UTF-8, ``seq`` is its decimal ASCII digits and
``ts`` is the IEEE-754 binary64 big-endian encoding of ``float(ts)`` (the exact
timestamp, so 1 and 1.0 are the same instant). ``V`` tags every JSON value with
its type, so 1, 1.0, "1" and true never collide:

    null  -> b"n"            true -> b"b1"          false -> b"b0"
    int   -> F("i", decimal ASCII digits, "-" for negatives)
    float -> F("f", binary64 big-endian)   (finite only)
    str   -> F("s", UTF-8)
    list  -> F("l", concat of F("v", V(item)) in list order)
    object-> F("o", concat of F("k", UTF-8 key) || F("v", V(value)) with the
             members sorted by the UTF-8 bytes of their keys)

Sorting object members makes the digest independent of mapping insertion order;
list order is content. This is byte-for-byte the reference hub's encoding
(checked against fingerprints its ``multihub observe --json`` prints; see
tests/unit/test_multihub_merge.py), so hubd and reference observers name the
same event by the same value. Strings that are not valid UTF-8 (lone
surrogates), non-finite floats and non-JSON types cannot be fingerprinted and
raise ``Unfingerprintable``.
"""

from __future__ import annotations

import copy
import hashlib
import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Callable, Iterable, NamedTuple, Sequence

import orjson

FINGERPRINT_DOMAIN = b"synapse-channel:multihub-event-fingerprint:v1\x00"
SNAPSHOT_TYPE = "multihub_log_snapshot"
EVENT_FIELDS = frozenset({"seq", "ts", "kind", "payload"})


# -- errors (all subclasses of MergeError; each leaves the MergedLog unchanged)

class MergeError(Exception):
    """A pulled batch that cannot be published."""


class Unfingerprintable(MergeError, ValueError):
    """An event whose content has no canonical form (not JSON-shaped)."""


class Equivocation(MergeError):
    """One identity (hub_id, seq) presented with two different contents."""

    def __init__(self, hub_id: str, seq: int, accepted_fingerprint: str,
                 offered_fingerprint: str):
        super().__init__(f"hub {hub_id!r} equivocated at seq {seq}: accepted "
                         f"{accepted_fingerprint}, offered {offered_fingerprint}")
        self.hub_id = hub_id
        self.seq = seq
        self.accepted_fingerprint = accepted_fingerprint
        self.offered_fingerprint = offered_fingerprint


class LogGap(MergeError):
    """A batch that would skip sequence numbers (never published: a gap is
    never skipped, the follower re-asks from its cursor)."""

    def __init__(self, hub_id: str, expected_seq: int, observed_seq: int | None, detail: str):
        super().__init__(f"hub {hub_id!r}: {detail}")
        self.hub_id = hub_id
        self.expected_seq = expected_seq
        self.observed_seq = observed_seq


class CursorRollback(MergeError):
    """The peer answers as if its log were shorter than what was accepted, or
    re-sends a sequence behind the cursor this observer never saw."""

    def __init__(self, hub_id: str, detail: str):
        super().__init__(f"hub {hub_id!r}: {detail}")
        self.hub_id = hub_id


class CursorMismatch(MergeError):
    """next_cursor / log_end_seq inconsistent with the events of the batch."""

    def __init__(self, hub_id: str, detail: str):
        super().__init__(f"hub {hub_id!r}: {detail}")
        self.hub_id = hub_id


class SnapshotInvalid(MergeError, ValueError):
    """A multihub_log_snapshot frame that does not decode strictly."""


# -- canonical form

def _frame(tag: bytes, body: bytes) -> bytes:
    return tag + len(body).to_bytes(8, "big") + body


def _utf8(text: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:  # a lone surrogate has no UTF-8 form
        raise Unfingerprintable("text is not valid UTF-8") from exc


def _float(value: float) -> bytes:
    if not math.isfinite(value):
        raise Unfingerprintable("non-finite number")
    return struct.pack(">d", value)


def canonical_value(value: Any) -> bytes:
    """V(value): the type-tagged encoding of one JSON value (see the module
    docstring). A recursive encoder does the common shallow case (about twice
    as fast); a value nested deeper than the Python stack allows falls back to
    the iterative one, so depth alone can never fail a fingerprint."""
    try:
        return _encode(value)
    except RecursionError:
        return _canonical_iterative(value)


def _encode(v: Any) -> bytes:
    t = type(v)
    if t is str:
        b = _utf8(v)
        return b"s" + len(b).to_bytes(8, "big") + b
    if v is None:
        return b"n"
    if v is True:
        return b"b1"
    if v is False:
        return b"b0"
    if t is int:
        b = str(v).encode("ascii")
        return b"i" + len(b).to_bytes(8, "big") + b
    if t is float:
        return _frame(b"f", _float(v))
    if t is dict or (t is not list and isinstance(v, Mapping)):
        parts = []
        for key in v:
            if not isinstance(key, str):
                raise Unfingerprintable("object keys must be strings")
        # code-point order of valid text is the UTF-8 byte order (lone
        # surrogates are refused by _utf8 below)
        for key in sorted(v):
            kb, vb = _utf8(key), _encode(v[key])
            parts.append(b"k" + len(kb).to_bytes(8, "big") + kb
                         + b"v" + len(vb).to_bytes(8, "big") + vb)
        body = b"".join(parts)
        return b"o" + len(body).to_bytes(8, "big") + body
    if t is list or t is tuple:
        parts = []
        for item in v:
            vb = _encode(item)
            parts.append(b"v" + len(vb).to_bytes(8, "big") + vb)
        body = b"".join(parts)
        return b"l" + len(body).to_bytes(8, "big") + body
    if isinstance(v, int):
        return _frame(b"i", str(int(v)).encode("ascii"))
    if isinstance(v, float):
        return _frame(b"f", _float(v))
    if isinstance(v, str):
        return _frame(b"s", _utf8(v))
    raise Unfingerprintable(f"unsupported payload type {type(v).__name__}")


def _canonical_iterative(value: Any) -> bytes:
    """The same encoding without recursion (for very deep values)."""
    out: list[bytes] = []
    # A work stack of either values to encode or ("close", tag, start) marks:
    # a container's body is everything emitted after `start`, framed on close.
    stack: list[Any] = [("value", value)]
    while stack:
        item = stack.pop()
        if item[0] == "close":
            _, tag, start = item
            body = b"".join(out[start:])
            del out[start:]
            out.append(_frame(tag, body))
            continue
        if item[0] == "raw":
            out.append(item[1])
            continue
        if item[0] == "wrap":  # F("v", V(x)): V(x) first, then framed as "v"
            _, inner = item
            stack.append(("close", b"v", len(out)))
            stack.append(("value", inner))
            continue
        v = item[1]
        if v is None:
            out.append(b"n")
        elif v is True:
            out.append(b"b1")
        elif v is False:
            out.append(b"b0")
        elif isinstance(v, int):
            out.append(_frame(b"i", str(int(v)).encode("ascii")))
        elif isinstance(v, float):
            out.append(_frame(b"f", _float(v)))
        elif isinstance(v, str):
            out.append(_frame(b"s", _utf8(v)))
        elif isinstance(v, (list, tuple)):
            stack.append(("close", b"l", len(out)))
            for child in reversed(v):
                stack.append(("wrap", child))
        elif isinstance(v, Mapping):
            members = []
            for key, child in v.items():
                if not isinstance(key, str):
                    raise Unfingerprintable("object keys must be strings")
                members.append((_utf8(key), child))
            members.sort(key=lambda m: m[0])
            stack.append(("close", b"o", len(out)))
            for key, child in reversed(members):
                stack.append(("wrap", child))
                stack.append(("raw", _frame(b"k", key)))
        else:
            raise Unfingerprintable(f"unsupported payload type {type(v).__name__}")
    return out[0]


def event_fingerprint(hub_id: str, seq: int, ts: float, kind: str, payload: Mapping) -> str:
    """The fingerprint of one complete event (see the module docstring)."""
    if not isinstance(hub_id, str) or not hub_id:
        raise Unfingerprintable("hub_id must be a non-empty string")
    if isinstance(seq, bool) or not isinstance(seq, int) or seq < 0:
        raise Unfingerprintable("seq must be a non-negative integer")
    if isinstance(ts, bool) or not isinstance(ts, (int, float)):
        raise Unfingerprintable("ts must be a number")
    if not isinstance(kind, str):
        raise Unfingerprintable("kind must be a string")
    if not isinstance(payload, Mapping):
        raise Unfingerprintable("payload must be an object")
    digest = hashlib.sha256(FINGERPRINT_DOMAIN)
    digest.update(_frame(b"h", _utf8(hub_id)))
    digest.update(_frame(b"q", str(seq).encode("ascii")))
    digest.update(_frame(b"t", _float(float(ts))))
    digest.update(_frame(b"k", _utf8(kind)))
    digest.update(_frame(b"p", canonical_value(payload)))
    return digest.hexdigest()


@dataclass(frozen=True)
class LogEvent:
    """One journal event tagged with the hub that authored it. `payload` is
    owned by the event: MergedLog deep-copies what it accepts, so a caller
    mutating its own dict later cannot rewrite an accepted identity."""

    hub_id: str
    seq: int
    ts: float
    kind: str
    payload: Mapping = field(default_factory=dict)

    @property
    def identity(self) -> tuple[str, int]:
        return (self.hub_id, self.seq)

    @property
    def order_key(self) -> tuple[float, str, int]:
        return (self.ts, self.hub_id, self.seq)

    @cached_property
    def fingerprint(self) -> str:
        return event_fingerprint(self.hub_id, self.seq, self.ts, self.kind, self.payload)


# -- the pull answer

class Snapshot(NamedTuple):
    """A decoded multihub_log_snapshot. Unpacks as (events, next_cursor,
    log_end_seq); `events` are mappings with exactly seq (int), ts (float),
    kind (str) and payload (dict), in the peer's order."""

    events: tuple
    next_cursor: int
    log_end_seq: int | None

    @property
    def refused(self) -> bool:
        """The peer refused (or has no journal): no events, log_end_seq null.
        The same shape as "nothing new" on purpose, so it must never count as a
        successful refresh of what the peer asserts."""
        return self.log_end_seq is None


def _strict_int(value, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SnapshotInvalid(f"{what} must be an integer")
    if value < 0:
        raise SnapshotInvalid(f"{what} must not be negative")
    return value


def decode_snapshot(frame: Mapping) -> Snapshot:
    """Validate a multihub_log_snapshot frame strictly (multihub-facts.md §2).

    Refused: a non-list `events`, an event that is not an object with exactly
    seq/ts/kind/payload, a bool where an integer belongs, a negative seq or
    cursor, a non-finite or non-numeric ts, a non-string kind, a non-object
    payload, seqs not strictly ascending, or events beside a null log_end_seq.
    Raises SnapshotInvalid; the caller's cursor stays where it was.
    """
    if not isinstance(frame, Mapping):
        raise SnapshotInvalid("snapshot is not an object")
    if frame.get("type", SNAPSHOT_TYPE) != SNAPSHOT_TYPE:
        raise SnapshotInvalid(f"frame type {frame.get('type')!r} is not {SNAPSHOT_TYPE}")
    for name in ("events", "next_cursor", "log_end_seq"):
        if name not in frame:
            raise SnapshotInvalid(f"snapshot has no {name}")
    raw_events = frame["events"]
    if not isinstance(raw_events, list):
        raise SnapshotInvalid("events must be a list")
    next_cursor = _strict_int(frame["next_cursor"], "next_cursor")
    log_end = frame["log_end_seq"]
    if log_end is not None:
        log_end = _strict_int(log_end, "log_end_seq")
    events = []
    previous = None
    for index, raw in enumerate(raw_events):
        where = f"events[{index}]"
        if not isinstance(raw, Mapping):
            raise SnapshotInvalid(f"{where} is not an object")
        missing = EVENT_FIELDS - raw.keys()
        if missing:
            raise SnapshotInvalid(f"{where} has no {sorted(missing)[0]}")
        extra = raw.keys() - EVENT_FIELDS
        if extra:
            raise SnapshotInvalid(f"{where} has an unexpected field {sorted(extra)[0]!r}")
        seq = _strict_int(raw["seq"], f"{where}.seq")
        ts = raw["ts"]
        if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not math.isfinite(ts):
            raise SnapshotInvalid(f"{where}.ts must be a finite number")
        kind = raw["kind"]
        if not isinstance(kind, str):
            raise SnapshotInvalid(f"{where}.kind must be a string")
        payload = raw["payload"]
        if not isinstance(payload, dict):
            raise SnapshotInvalid(f"{where}.payload must be an object")
        if previous is not None and seq <= previous:
            raise SnapshotInvalid(f"{where}.seq {seq} is not above the previous {previous}")
        previous = seq
        events.append({"seq": seq, "ts": float(ts), "kind": kind, "payload": payload})
    if log_end is None and events:
        raise SnapshotInvalid("events beside a null log_end_seq")
    return Snapshot(tuple(events), next_cursor, log_end)


# -- the union

@dataclass(frozen=True)
class AcceptResult:
    """What one accepted batch changed (nothing, when `refused`)."""

    hub_id: str
    added: int  # new identities published
    duplicates: int  # exact duplicates collapsed
    cursor: int  # the hub's cursor after the batch
    log_end_seq: int | None  # as the peer reported it (None: refused)
    refused: bool = False
    held: int = 0  # events of this hub the union holds after the batch

    @property
    def caught_up(self) -> bool:
        """The observer holds the peer's whole log as the peer reported it."""
        return self.log_end_seq is not None and self.cursor >= self.log_end_seq

    @property
    def non_empty(self) -> bool:
        """A successful answer backed by history: the observer holds at least
        one of the peer's events. Refusals and empty journals are not."""
        return not self.refused and self.held > 0

    @property
    def complete(self) -> bool:
        """Evidence of what the peer shows *now*: non-empty and caught up to the
        log_end_seq it reported (a page in the middle of its log is not). This
        is what PartitionDetector.observe takes as `non_empty`."""
        return self.non_empty and self.caught_up


class MergedLog:
    """Grow-only union of hub-tagged events keyed by (hub_id, seq), with a
    per-hub cursor (the highest contiguously accepted seq) and the highest
    log_end_seq each peer reported.

    `retain(kind)` chooses which events keep their content (default: all).
    Every accepted identity keeps its fingerprint, which is all equivocation
    detection needs, so a follower can keep only the kinds it folds
    (fold.FOLDED_KINDS) and not a peer's whole chat history."""

    def __init__(self, retain: Callable[[str], bool] | None = None) -> None:
        self._retain = retain
        self._fingerprints: dict[tuple[str, int], str] = {}  # every accepted identity
        self._events: dict[tuple[str, int], LogEvent] = {}  # the retained ones
        self._cursors: dict[str, int] = {}
        self._log_ends: dict[str, int] = {}
        self._base: dict[str, int] = {}  # the after_seq of a hub's first batch
        self._counts: dict[str, int] = {}  # events held per hub
        self._floors: dict[str, int] = {}  # compact() dropped content-free events below this
        self._ordered: list[LogEvent] | None = []

    # reads

    def __len__(self) -> int:
        """Accepted identities (retained or not)."""
        return len(self._fingerprints)

    def __contains__(self, identity) -> bool:
        return identity in self._fingerprints

    def get(self, hub_id: str, seq: int) -> LogEvent | None:
        """The retained event with this identity."""
        return self._events.get((hub_id, seq))

    def fingerprint_of(self, hub_id: str, seq: int) -> str | None:
        return self._fingerprints.get((hub_id, seq))

    def cursor(self, hub_id: str) -> int:
        return self._cursors.get(hub_id, 0)

    def cursors(self) -> dict[str, int]:
        return dict(self._cursors)

    def log_end(self, hub_id: str) -> int | None:
        return self._log_ends.get(hub_id)

    def hubs(self) -> list[str]:
        return sorted(self._cursors)

    def ordered(self) -> list[LogEvent]:
        """Every retained event in the deterministic (ts, hub_id, seq) order."""
        if self._ordered is None:
            self._ordered = sorted(self._events.values(), key=lambda e: e.order_key)
        return list(self._ordered)

    # writes

    def accept(self, hub_id: str, after_seq: int, batch: Iterable,
               next_cursor: int, log_end_seq: int | None) -> AcceptResult:
        """Publish one pulled batch of `hub_id`'s log, or raise and change nothing.

        `batch` holds LogEvents of `hub_id` or pulled mappings {seq, ts, kind,
        payload} (as decode_snapshot returns them). Rules, all checked before
        anything is published:
        - after_seq must not be past the cursor (that would skip events: LogGap);
        - events run contiguously from after_seq+1 (a missing seq: LogGap);
          events at or below the cursor must be exact duplicates (else
          Equivocation, or CursorRollback for a seq this log never held);
        - next_cursor equals the last event's seq, or after_seq when the batch is
          empty; log_end_seq is not below next_cursor (CursorMismatch);
        - log_end_seq is not below the cursor nor below a log_end_seq the peer
          reported before (CursorRollback).
        A refusal (log_end_seq None, no events) changes nothing and returns
        refused=True; it is never a successful refresh.
        """
        events = [self._tag(hub_id, item) for item in batch]
        if log_end_seq is None:
            if events:
                raise CursorMismatch(hub_id, "events beside a null log_end_seq")
            return AcceptResult(hub_id, 0, 0, self.cursor(hub_id), None, refused=True,
                                held=self._counts.get(hub_id, 0))
        for value, what in ((after_seq, "after_seq"), (next_cursor, "next_cursor"),
                            (log_end_seq, "log_end_seq")):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise CursorMismatch(hub_id, f"{what} must be a non-negative integer")

        known = hub_id in self._cursors
        cursor = self._cursors.get(hub_id, after_seq)
        base = self._base.get(hub_id, after_seq)
        if after_seq > cursor:
            raise LogGap(hub_id, cursor + 1, after_seq + 1,
                         f"batch starts after seq {after_seq} but the cursor is {cursor}")

        staged: dict[tuple[str, int], str] = {}  # identity -> fingerprint
        keep: list[LogEvent] = []
        duplicates = 0
        expected = after_seq + 1
        for event in events:
            if event.seq != expected:
                raise LogGap(hub_id, expected, event.seq,
                             f"expected seq {expected}, got {event.seq}")
            expected += 1
            fingerprint = event.fingerprint  # raises Unfingerprintable
            if event.seq <= cursor:
                accepted = self._fingerprints.get(event.identity)
                if accepted is None:
                    raise CursorRollback(hub_id, f"seq {event.seq} is at or below the "
                                                 f"cursor {cursor} but was never accepted "
                                                 f"(history starts after {base})")
                if accepted != fingerprint:
                    raise Equivocation(hub_id, event.seq, accepted, fingerprint)
                duplicates += 1
                continue
            staged[event.identity] = fingerprint
            if self._retain is None or self._retain(event.kind):
                keep.append(event)

        last = events[-1].seq if events else after_seq
        if next_cursor != last:
            raise CursorMismatch(hub_id, f"next_cursor {next_cursor} is not the last seq "
                                         f"of the batch ({last})")
        if log_end_seq < next_cursor:
            raise CursorMismatch(hub_id, f"log_end_seq {log_end_seq} is below next_cursor "
                                         f"{next_cursor}")
        if log_end_seq < cursor:
            raise CursorRollback(hub_id, f"log_end_seq {log_end_seq} is behind the accepted "
                                         f"cursor {cursor}")
        previous_end = self._log_ends.get(hub_id)
        if previous_end is not None and log_end_seq < previous_end:
            raise CursorRollback(hub_id, f"log_end_seq {log_end_seq} is behind the "
                                         f"{previous_end} reported before")

        # publish: nothing above can fail past this point
        self._fingerprints.update(staged)
        for event in keep:
            # the union owns what it keeps: a caller mutating its dict later
            # cannot rewrite an accepted identity
            owned = LogEvent(hub_id, event.seq, event.ts, event.kind, _owned(event.payload))
            owned.__dict__["fingerprint"] = staged[event.identity]  # the cached_property's slot
            self._events[event.identity] = owned
        if keep:
            self._ordered = None
        new_cursor = max(cursor, last)
        self._cursors[hub_id] = new_cursor
        self._log_ends[hub_id] = max(log_end_seq, previous_end or 0)
        held = self._counts[hub_id] = self._counts.get(hub_id, 0) + len(staged)
        if not known:
            self._base[hub_id] = base
        return AcceptResult(hub_id, len(staged), duplicates, new_cursor, log_end_seq,
                            held=held)

    def compact(self, hub_id: str, below_seq: int) -> int:
        """Forget the fingerprints of events below `below_seq` whose content is
        not retained, so a long-lived follower's memory follows what it folds,
        not the peer's whole history. Re-pulls must then start at or above
        below_seq - 1 (a follower re-reads only a recent tail). Returns how many
        identities were dropped."""
        floor = self._floors.get(hub_id, 1)
        dropped = 0
        for seq in range(floor, below_seq):
            identity = (hub_id, seq)
            if identity not in self._events and self._fingerprints.pop(identity, None) is not None:
                dropped += 1
        if below_seq > floor:
            self._floors[hub_id] = below_seq
            self._counts[hub_id] = self._counts.get(hub_id, 0) - dropped
        return dropped

    def forget(self, hub_id: str) -> int:
        """Drop a hub's history and cursor. Only for the operator recovery
        ceremony (after multihub_equivocation_recovery is journaled): the next
        poll then starts from zero. Returns how many events were dropped."""
        gone = [identity for identity in self._fingerprints if identity[0] == hub_id]
        for identity in gone:
            del self._fingerprints[identity]
            self._events.pop(identity, None)
        self._cursors.pop(hub_id, None)
        self._log_ends.pop(hub_id, None)
        self._base.pop(hub_id, None)
        self._counts.pop(hub_id, None)
        if gone:
            self._ordered = None
        return len(gone)

    @staticmethod
    def _tag(hub_id: str, item) -> LogEvent:
        if isinstance(item, LogEvent):
            if item.hub_id != hub_id:
                raise CursorMismatch(hub_id, f"batch holds an event of hub {item.hub_id!r}")
            return item
        if not isinstance(item, Mapping):
            raise SnapshotInvalid("a batch event is not an object")
        seq, ts, kind, payload = (item.get("seq"), item.get("ts"), item.get("kind"),
                                  item.get("payload"))
        if isinstance(seq, bool) or not isinstance(seq, int) or seq < 0:
            raise SnapshotInvalid("event seq must be a non-negative integer")
        if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not math.isfinite(ts):
            raise SnapshotInvalid("event ts must be a finite number")
        if not isinstance(kind, str) or not isinstance(payload, Mapping):
            raise SnapshotInvalid("event kind must be a string and payload an object")
        return LogEvent(hub_id, seq, float(ts), kind, payload)


def _owned(payload: Mapping) -> dict:
    """A private deep copy of a JSON payload (orjson round trip: several
    times faster than copy.deepcopy; the content was already fingerprinted, so
    it is finite JSON; deepcopy for what orjson cannot encode, e.g. >64-bit ints)."""
    try:
        return orjson.loads(orjson.dumps(payload))
    except (TypeError, orjson.JSONEncodeError):
        return copy.deepcopy(dict(payload))


def merge_logs(logs: Mapping[str, Sequence]) -> MergedLog:
    """A MergedLog holding whole logs (hub_id -> that hub's events from seq 1),
    as an offline reader has them. Raises like MergedLog.accept."""
    merged = MergedLog()
    for hub_id, events in logs.items():
        events = list(events)
        last = events[-1]["seq"] if events and isinstance(events[-1], Mapping) else (
            events[-1].seq if events else 0)
        merged.accept(hub_id, 0, events, last, last)
    return merged

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

The events, their fingerprint and the errors are federation/log_model.py; a
pulled page is decoded by federation/log_snapshot.py.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from collections.abc import Mapping
from typing import Callable, Iterable, Sequence

import orjson

from federation.log_model import (CursorMismatch, CursorRollback, Equivocation, LogEvent, LogGap,
                                  SnapshotInvalid)


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

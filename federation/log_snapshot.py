"""Decoding a peer's answer to a log pull (`multihub_log_snapshot`), strictly.

What the follower (federation/actors/watch.py) and `hubd multihub follow`
read from a peer before anything reaches the union (federation/merge.py): a
frame that does not decode is refused whole, SnapshotInvalid, and the
caller's cursor stays where it was.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import NamedTuple

from federation.log_model import SnapshotInvalid

SNAPSHOT_TYPE = "multihub_log_snapshot"
EVENT_FIELDS = frozenset({"seq", "ts", "kind", "payload"})


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

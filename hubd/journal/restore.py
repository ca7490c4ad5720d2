"""The projection of a journal: the newest usable snapshot plus the events
after it (docs/journal.md, "Snapshots"). Used at start, by the Router's
rebuilds (hubd/actors/recovery.py) and by the process that takes a snapshot
(hubd/snapshot_worker.py), so all three build the same state the same way.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import structlog

from hubd.state.frozen import FrozenStateError, fingerprint, freeze, thaw
from hubd.state.hub import HubState, apply

from . import snapshots
from .snapshots import SnapshotFile, SnapshotInvalid
from .store import CorruptRow, JournalReader, UnknownKinds, chain_anchor

log = structlog.get_logger("hubd.journal.snapshots")

DEFAULT_MAX_BYTES = 1 << 30


@dataclass(frozen=True)
class SnapshotPolicy:
    """Which snapshots a hub may use: its own (hub id, fingerprint), at most
    max_bytes each."""

    db: Path
    hub_id: str
    fingerprint: str
    max_bytes: int = DEFAULT_MAX_BYTES

    @property
    def directory(self) -> Path:
        return snapshots.snapshot_dir(self.db)


@dataclass
class Projection:
    state: HubState
    corrupt: list[CorruptRow] = field(default_factory=list)
    unknown: UnknownKinds = field(default_factory=UnknownKinds)
    # the seq of the snapshot it started from (0: the journal's start), and
    # how many events were applied after it
    from_snapshot: int = 0
    applied: int = 0
    # snapshots passed over, as (seq, why)
    skipped: list[tuple[int, str]] = field(default_factory=list)


def policy_for(db: Path, hub_id: str, fresh: Callable[[], HubState],
               max_bytes: int = DEFAULT_MAX_BYTES) -> SnapshotPolicy:
    return SnapshotPolicy(Path(db), hub_id, fingerprint(fresh()), max_bytes)


def project(reader: JournalReader, fresh: Callable[[], HubState],
            policy: SnapshotPolicy | None, upto: int | None = None) -> Projection:
    """The journal's projection (up to seq `upto`, else all of it): from the
    newest snapshot `policy` allows (none when it is None), else from the
    start. A snapshot that cannot be used is logged and the one before it tried."""
    skipped: list[tuple[int, str]] = []
    projection = _from_snapshot(reader, fresh, policy, upto, skipped) if policy else None
    if projection is None:
        projection = Projection(fresh(), skipped=skipped)
    anchor = chain_anchor(reader.conn)[0]
    if anchor and projection.from_snapshot <= anchor:
        # the rows before the anchor are gone: a replay from here would build
        # a state missing them, never the journal's
        raise JournalCompacted(
            f"the journal was compacted through seq {anchor} and no snapshot after it can be "
            "used (" + ("; ".join(f"seq {seq}: {why}" for seq, why in skipped) or "none found")
            + "): run the hubd version, with the flags, that wrote its newest snapshot, or "
            "restore the journal from a backup taken before the compaction")
    state, known = projection.state, projection.state.appliers
    for event in reader.replay(state.last_seq, corrupt=projection.corrupt):
        if upto is not None and event.seq > upto:
            break
        if event.kind not in known:
            projection.unknown.count(event)
        apply(state, event)
        projection.applied += 1
    return projection


class JournalCompacted(RuntimeError):
    """The journal's early rows were compacted away and no snapshot after them
    can be used: its projection cannot be built."""


def _from_snapshot(reader: JournalReader, fresh, policy: SnapshotPolicy, upto: int | None,
                   skipped: list[tuple[int, str]]) -> Projection | None:
    for file in snapshots.listed(policy.directory):
        if upto is not None and file.seq > upto:
            continue
        try:
            state, notes = _load(reader, file, fresh, policy)
        except (SnapshotInvalid, FrozenStateError) as exc:
            skipped.append((file.seq, str(exc)))
            log.warning("snapshot skipped; trying the one before (or the journal's start)",
                        path=str(file.path), seq=file.seq, reason=str(exc))
            continue
        return Projection(state, list(notes["corrupt"]), notes["unknown"],
                          from_snapshot=file.seq, skipped=skipped)
    return None


def _load(reader: JournalReader, file: SnapshotFile, fresh,
          policy: SnapshotPolicy) -> tuple[HubState, dict]:
    header, body = snapshots.read(file, policy.max_bytes)
    if header.get("hub_id") != policy.hub_id:
        raise SnapshotInvalid(f"written for hub {header.get('hub_id')!r}, not {policy.hub_id!r}")
    if header.get("fingerprint") != policy.fingerprint:
        raise SnapshotInvalid(f"written by another hubd version or configuration "
                              f"({header.get('hubd')!r}; its projections may differ)")
    row = reader.row_at(file.seq)
    if row is None or snapshots.row_digest(row) != header.get("row"):
        raise SnapshotInvalid("the journal's row at its seq is not the one it was taken "
                              "at (another or a restored journal?)")
    state, notes = thaw(body, fresh().appliers)
    if state.last_seq != file.seq:
        raise SnapshotInvalid(f"its state is at seq {state.last_seq}, not {file.seq}")
    return state, notes


@dataclass(frozen=True)
class Taken:
    seq: int
    path: Path | None  # None: nothing new to take
    bytes: int
    seconds: float
    from_snapshot: int
    applied: int


class SnapshotTooLarge(RuntimeError):
    """The projection is larger than the snapshot bound: no snapshot is written."""


def take(db: Path, fresh: Callable[[], HubState], policy: SnapshotPolicy, keep: int,
         midway: Callable[[], None] | None = None, upto: int | None = None) -> Taken:
    """Write a snapshot of the journal as one read transaction sees it (the
    newest usable snapshot plus the rows after it, up to seq `upto` if
    given), on this process's own read-only connection: the hub's writer is
    never waited on. A file of the same seq that could not be used (damaged,
    another hubd's) is replaced."""
    started = time.perf_counter()
    reader = JournalReader(db)
    try:
        reader.conn.execute("BEGIN")  # one consistent view of the journal
        last = reader.max_seq()
        upto = last if upto is None else min(upto, last)
        projection = project(reader, fresh, policy, upto)
        state = projection.state
        row = reader.row_at(state.last_seq)
        reader.conn.execute("COMMIT")
    finally:
        reader.close()
    if row is None or projection.from_snapshot == state.last_seq:
        # nothing to take (no row, or the newest usable snapshot is of the
        # last one); the bound still holds (`keep` may be lower than before)
        snapshots.prune(policy.directory, keep)
        return Taken(state.last_seq, None, 0, time.perf_counter() - started,
                     projection.from_snapshot, projection.applied)
    # rows after the state's seq (undecodable ones) are found again by the tail's replay
    corrupt = [c for c in projection.corrupt if c.seq <= state.last_seq]
    body = freeze(state, {"corrupt": corrupt, "unknown": projection.unknown})
    header = {"format": snapshots.FORMAT, "hubd": _version(), "fingerprint": policy.fingerprint,
              "hub_id": policy.hub_id, "seq": state.last_seq,
              "row": snapshots.row_digest(row), "created": time.time()}
    data = snapshots.encode(header, body)
    if len(data) > policy.max_bytes:
        raise SnapshotTooLarge(f"a snapshot at seq {state.last_seq} would be {len(data)} bytes, "
                               f"over the bound of {policy.max_bytes}")
    path = snapshots.write(policy.directory, state.last_seq, data, keep, midway)
    return Taken(state.last_seq, path, len(data), time.perf_counter() - started,
                 projection.from_snapshot, projection.applied)


def _version() -> str:
    import hubd
    return hubd.__version__

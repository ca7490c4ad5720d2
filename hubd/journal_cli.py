"""`hubd journal verify --db PATH [--json]`: is this journal and its
snapshots what a hub can trust (docs/journal.md, "Verifying")?

One replay of the journal from its start, on a read-only connection (a
running hub is not disturbed): every row must decode and be of a kind this
hubd knows, and its hash-chain link must hold (hubd/journal/chain_audit.py:
the first bad seq is named); every signed checkpoint must hold and name the
chain's link at its seq; every snapshot beside it must be whole (checksum, format), of
this journal (hub id, the digest of its row), readable, and equal to the
replay at its seq. A snapshot written by another hubd version or with other
flags is reported as one a hub would pass over (not a fault: the hub
replays past it), and is only compared when this hubd can read it.

Exit 0 when nothing is wrong, 1 with a line per fault (where and what), 2
when the journal cannot be opened. The hub's flags are the defaults: a
snapshot written with other limits (--max-history, ...) is reported as
written with other flags.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
from dataclasses import dataclass, field
from pathlib import Path

from hubd.composition import plugins_for
from hubd.config import HubConfig, journal_command
from hubd.core.plugin import Installed
from hubd.hub import fresh_state
from hubd.journal import chain_audit, compaction, snapshots
from hubd.journal.offline import OfflineJournalError
from hubd.journal.snapshots import SnapshotInvalid
from hubd.journal.store import CorruptRow, JournalReader, UnknownKinds, chain_anchor
from hubd.state.frozen import FrozenStateError, canonical, fingerprint, thaw
from hubd.state.hub import apply


@dataclass
class SnapshotReport:
    file: str
    seq: int
    bytes: int
    # ok: equal to the replay; stale: a hub would pass over it (another hubd
    # or flags); invalid: damaged or not of this journal
    status: str = "ok"
    detail: str = ""


@dataclass
class Report:
    db: str
    hub_id: str | None = None
    rows: int = 0
    last_seq: int = 0
    problems: list[dict] = field(default_factory=list)
    snapshots: list[SnapshotReport] = field(default_factory=list)
    chain: dict = field(default_factory=dict)  # the hash chain's audit (chain_audit.py)

    def fault(self, where: str, what: str) -> None:
        self.problems.append({"where": where, "what": what})


def verify(db: Path) -> Report:
    report = Report(str(db))
    config = HubConfig(db=db)
    installed = Installed(plugins_for(config))
    fresh = lambda: fresh_state(installed, config)  # noqa: E731
    ours = fingerprint(fresh())
    reader = JournalReader(db)
    try:
        reader.conn.execute("BEGIN")  # one view of the journal, however long this takes
        row = reader.conn.execute("SELECT value FROM meta WHERE key = 'hub_id'").fetchone()
        report.hub_id = row[0] if row else None
        anchor = chain_anchor(reader.conn)[0]
        waiting = _snapshots_to_compare(reader, db, report, ours, installed.appliers, anchor)
        state, base = _base(db, anchor, waiting, fresh, installed.appliers, report)
        corrupt: list[CorruptRow] = []
        unknown = UnknownKinds()
        for event in reader.replay(corrupt=corrupt):
            if event.kind not in state.appliers:
                unknown.count(event)
            report.rows += 1
            if event.seq <= base:  # in the base snapshot's state already
                continue
            apply(state, event)
            if event.seq in waiting:
                _compare(waiting.pop(event.seq), state, report)
        report.last_seq = state.last_seq
        for seq, (entry, _) in waiting.items():  # a corrupt row at its seq: never reached
            entry.status, entry.detail = "invalid", f"the replay never reached seq {seq}"
            report.fault(f"snapshot {entry.file}", entry.detail)
        audited = chain_audit.audit(reader.conn, report.hub_id)
        reader.conn.execute("COMMIT")
    finally:
        reader.close()
    report.chain = {"head": audited.head, "rows": audited.rows,
                    "checkpoints": audited.checkpoints, "anchor_seq": audited.anchor_seq,
                    "first_bad_seq": audited.first_bad_seq}
    for where, what in audited.problems:
        report.fault(where, what)
    for bad in corrupt:
        report.fault(f"row {bad.seq}", f"undecodable {bad.kind} row: {bad.error}")
    if unknown.events:
        report.fault(f"row {unknown.first_seq}",
                     f"{unknown.events} events of kinds this hubd does not know: "
                     f"{', '.join(unknown.names())}")
    return report


def _base(db: Path, anchor: int, waiting: dict, fresh, appliers, report: Report):
    """The state the replay starts from, and its seq: empty at 0, or for a
    journal compacted through `anchor`, the oldest readable snapshot after it
    (the rows before it are gone; a hub starts from a snapshot too)."""
    if not anchor:
        return fresh(), 0
    seq = min((s for s in waiting if s > anchor), default=None)
    if seq is None:
        report.fault(f"row {anchor}", "the journal was compacted through this seq and no "
                                      "snapshot after it can be read: its state cannot be "
                                      "rebuilt")
        return fresh(), 1 << 62
    entry, _ = waiting.pop(seq)
    file = next(f for f in snapshots.listed(snapshots.snapshot_dir(db)) if f.seq == seq)
    state, _ = thaw(snapshots.read(file, 1 << 40)[1], appliers)
    entry.detail = "the base the compacted journal's rows after it are replayed on"
    return state, seq


def _snapshots_to_compare(reader, db: Path, report: Report, ours: str, appliers,
                          anchor: int) -> dict:
    """Check each snapshot file on its own; those this hubd can read, by seq,
    with their state, to compare with the replay when it gets there."""
    waiting: dict = {}
    for file in sorted(snapshots.listed(snapshots.snapshot_dir(db)), key=lambda f: f.seq):
        entry = SnapshotReport(file.path.name, file.seq, file.path.stat().st_size)
        report.snapshots.append(entry)
        if file.seq <= anchor:
            entry.status = "compacted"
            entry.detail = "its row was compacted away: a hub passes over it"
            continue
        try:
            header, body = snapshots.read(file, 1 << 40)
            if header.get("hub_id") != report.hub_id:
                raise SnapshotInvalid(f"written for hub {header.get('hub_id')!r}, the journal "
                                      f"is hub {report.hub_id!r}'s")
            row = reader.row_at(file.seq)
            if row is None or snapshots.row_digest(row) != header.get("row"):
                raise SnapshotInvalid("the journal's row at its seq is not the one it was taken at")
            if header.get("fingerprint") != ours:
                entry.status = "stale"
                entry.detail = (f"written by hubd {header.get('hubd')} with other code or flags: "
                                "a hub of this version passes over it")
                continue
            state, _ = thaw(body, appliers)
        except (SnapshotInvalid, FrozenStateError) as exc:
            entry.status, entry.detail = "invalid", str(exc)
            report.fault(f"snapshot {entry.file}", str(exc))
            continue
        waiting[file.seq] = (entry, canonical(state))
    return waiting


def _compare(waiting: tuple, state, report: Report) -> None:
    entry, frozen = waiting
    if frozen != canonical(state):
        entry.status = "invalid"
        entry.detail = "its state differs from the replay of the journal at its seq"
        report.fault(f"snapshot {entry.file}", entry.detail)
    else:
        entry.detail = "equals the replay of the journal at its seq"


def _print(report: Report) -> None:
    print(f"journal {report.db}: hub {report.hub_id}, {report.rows:,} rows replayed "
          f"(last seq {report.last_seq})")
    for entry in report.snapshots:
        print(f"  snapshot {entry.file} ({entry.bytes:,} bytes): {entry.status}: {entry.detail}")
    if not report.snapshots:
        print("  no snapshots")
    chain = report.chain
    if chain:
        bad = chain["first_bad_seq"]
        print(f"  hash chain: {chain['rows']:,} rows from "
              f"{'seq ' + str(chain['anchor_seq']) if chain['anchor_seq'] else 'the start'}, "
              f"head {chain['head'][:16]}.., {chain['checkpoints']} signed checkpoint(s)"
              + (f"; first bad seq {bad}" if bad is not None else ""))
    for problem in report.problems:
        print(f"FAULT {problem['where']}: {problem['what']}")
    print("ok" if not report.problems else f"{len(report.problems)} fault(s)")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="hubd journal",
                                     description="Check or compact a hub's journal.")
    sub = parser.add_subparsers(dest="command", required=True)
    journal_command(sub, "verify", "replay the journal once and check every row, the hash "
                    "chain, its signed checkpoints and every snapshot (exit 0: nothing wrong; "
                    "1: faults, each named)")
    compact = journal_command(
        sub, "compact", "drop the event rows the newest snapshot makes unnecessary, as far "
        "as the retention given allows, never what the mailbox, unsettled forwards or peers' "
        "log pulls still read (the hub stopped; docs/journal.md)")
    keep = compact.add_mutually_exclusive_group(required=True)
    keep.add_argument("--keep-after-seq", type=int, metavar="N",
                      help="keep every row after seq N")
    keep.add_argument("--keep-days", type=float, metavar="D",
                      help="keep every row from the first one younger than D days on")
    args = parser.parse_args(argv)
    db = Path(args.db)
    if not db.is_file():
        print(f"hubd journal: no journal at {db}", file=sys.stderr)
        return 2
    if args.command == "compact":
        return _compact(args, db)
    try:
        report = verify(db)
    except sqlite3.DatabaseError as exc:
        print(f"hubd journal: {db} cannot be read as a hubd journal: {exc}", file=sys.stderr)
        return 2
    if args.json:
        out = {**report.__dict__, "snapshots": [s.__dict__ for s in report.snapshots],
               "ok": not report.problems}
        print(json.dumps(out, indent=2))
    else:
        _print(report)
    return 1 if report.problems else 0


def _compact(args, db: Path) -> int:
    if (args.keep_after_seq is not None and args.keep_after_seq < 0) or (
            args.keep_days is not None and not args.keep_days >= 0):
        print("hubd journal compact: the retention must be 0 or more", file=sys.stderr)
        return 2
    try:
        installed = Installed(plugins_for(HubConfig(db=db)))
        done = compaction.compact(db, installed, args.keep_after_seq, args.keep_days)
    except (compaction.CompactRefused, OfflineJournalError, sqlite3.DatabaseError) as exc:
        print(f"hubd journal compact: nothing dropped: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(done.to_json(), indent=2))
        return 0
    limits = ", ".join(f"{name} {seq}" for name, seq in sorted(done.limits.items()))
    if done.cut:
        print(f"dropped {done.dropped:,} rows through seq {done.cut} (anchored at the signed "
              f"checkpoint there); newest snapshot at seq {done.snapshot_seq}")
    else:
        print("nothing dropped: no signed checkpoint at or below what may go")
    print(f"  retention allows through seq {done.requested}; limits: {limits}")
    return 0

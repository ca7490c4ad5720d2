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
from hubd.config import DEFAULT_DB, HubConfig
from hubd.core.plugin import Installed
from hubd.hub import fresh_state
from hubd.journal import chain_audit, snapshots
from hubd.journal.snapshots import SnapshotInvalid
from hubd.journal.store import CorruptRow, JournalReader, UnknownKinds
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
        waiting = _snapshots_to_compare(reader, db, report, ours, installed.appliers)
        state = fresh()
        corrupt: list[CorruptRow] = []
        unknown = UnknownKinds()
        for event in reader.replay(corrupt=corrupt):
            if event.kind not in state.appliers:
                unknown.count(event)
            apply(state, event)
            report.rows += 1
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


def _snapshots_to_compare(reader, db: Path, report: Report, ours: str, appliers) -> dict:
    """Check each snapshot file on its own; those this hubd can read, by seq,
    with their state, to compare with the replay when it gets there."""
    waiting: dict = {}
    for file in sorted(snapshots.listed(snapshots.snapshot_dir(db)), key=lambda f: f.seq):
        entry = SnapshotReport(file.path.name, file.seq, file.path.stat().st_size)
        report.snapshots.append(entry)
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
                                     description="Check a hub's journal and snapshots.")
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("verify", help="replay the journal once and check every row and "
                           "snapshot (exit 0: nothing wrong; 1: faults, each named)")
    check.add_argument("--db", default=DEFAULT_DB,
                       help=f"the hub's journal database (default ./{DEFAULT_DB})")
    check.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args(argv)
    db = Path(args.db)
    if not db.is_file():
        print(f"hubd journal: no journal at {db}", file=sys.stderr)
        return 2
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

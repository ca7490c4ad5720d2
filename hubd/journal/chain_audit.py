"""Checking a journal's hash chain and its signed checkpoints, read-only
(`hubd journal verify`, `hubd journal compact`; docs/journal.md).

The chain is recomputed from the rows' content, from the journal's start
(or from the anchor a compaction left: the link of the last dropped row,
which a signed checkpoint at that seq must name). A row whose stored link is
not the recomputed one is where the journal was changed after it was
written; the walk goes on from its stored link, so every changed row is
named, not only the first. Every checkpoint must be of this hub, signed by
the journal's key, and name the recomputed link at its seq.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field

from hubd.journal import chain, chain_checkpoints as checkpoints
from hubd.journal.store import chain_anchor

MAX_NAMED = 20  # changed rows named one by one; the rest are counted


@dataclass
class ChainReport:
    rows: int = 0
    head: str = ""  # the recomputed link of the last row, hex
    anchor_seq: int = 0  # 0: the chain starts at the journal's start
    checkpoints: int = 0
    broken: list[int] = field(default_factory=list)  # seqs whose stored link does not hold
    broken_more: int = 0
    problems: list[tuple[str, str]] = field(default_factory=list)  # (where, what)

    @property
    def first_bad_seq(self) -> int | None:
        return self.broken[0] if self.broken else None


def audit(conn: sqlite3.Connection, hub_id: str | None) -> ChainReport:
    """Run inside the caller's read transaction (one view of the journal)."""
    report = ChainReport()
    if "chain" not in {row[1] for row in conn.execute("PRAGMA table_info(events)")}:
        report.problems.append(("journal", "no hash chain: written by a hubd from before it; "
                                           "a start of this hubd links it in place, once"))
        return report
    key_row = conn.execute("SELECT value FROM meta WHERE key = 'chain_key'").fetchone()
    journal_key = key_row[0] if key_row else None
    try:
        start, prev = chain_anchor(conn)
    except (ValueError, KeyError, TypeError) as exc:
        report.problems.append(("meta chain_anchor", f"unreadable: {exc}"))
        return report
    report.anchor_seq = start
    signed = {cp.seq: cp for cp in checkpoints.between(conn, 0, 1 << 62)}
    report.checkpoints = len(signed)
    computed: dict[int, bytes] = {start: prev} if start else {}
    cursor = start
    while True:
        batch = conn.execute(
            "SELECT seq, ts, kind, payload, route, principal, chain FROM events WHERE seq > ? "
            "ORDER BY seq LIMIT 5000", (cursor,)).fetchall()
        if not batch:
            break
        for row in batch:
            expected = chain.row_link(prev, row)
            if row[0] in signed:
                computed[row[0]] = expected
            stored = row[6]
            if stored is None or bytes(stored) != expected:
                if len(report.broken) < MAX_NAMED:
                    report.broken.append(row[0])
                else:
                    report.broken_more += 1
                # go on from what the next row was linked to
                prev = bytes(stored) if stored is not None else expected
            else:
                prev = expected
            report.rows += 1
        cursor = batch[-1][0]
    report.head = prev.hex()
    below = conn.execute("SELECT COUNT(*) FROM events WHERE seq <= ?", (start,)).fetchone()[0]
    if below:
        report.problems.append((f"row {start}", f"{below} rows at or below the compaction "
                                                "anchor: the anchor does not fit this journal"))
    for seq in report.broken:
        report.problems.append((f"row {seq}", "its hash-chain link does not hold: the row was "
                                              "changed (or one before it removed) after it was "
                                              "written"))
    if report.broken_more:
        report.problems.append(("rows", f"{report.broken_more} more rows whose link does "
                                        "not hold"))
    _check_checkpoints(signed, computed, hub_id, journal_key, start, report)
    return report


def _check_checkpoints(signed: dict, computed: dict, hub_id, journal_key, start: int,
                       report: ChainReport) -> None:
    anchored = start == 0
    for seq, checkpoint in sorted(signed.items()):
        where = f"checkpoint {seq}"
        try:
            checkpoints.check(checkpoint)
        except checkpoints.CheckpointInvalid as exc:
            report.problems.append((where, str(exc)))
            continue
        if checkpoint.hub_id != hub_id:
            report.problems.append((where, f"signed for hub {checkpoint.hub_id!r}, the journal "
                                           f"is hub {hub_id!r}'s"))
        if journal_key is not None and checkpoint.key != journal_key:
            report.problems.append((where, "signed by another key than the journal's "
                                           "(meta chain_key)"))
        link = computed.get(seq)
        if link is None:
            if seq > start:
                report.problems.append((where, "names a seq this journal does not hold"))
            continue
        if checkpoint.head != link.hex():
            report.problems.append((where, f"signs head {checkpoint.head[:16]}.., the chain's "
                                           f"link there is {link.hex()[:16]}..: the history "
                                           "before it was rewritten after it was signed"))
        elif seq == start:
            anchored = True
    if not anchored:
        report.problems.append((f"row {start}", "the compaction anchor is not named by a "
                                                "signed checkpoint at its seq"))

"""`hubd journal compact`: drop the event rows a snapshot makes unnecessary,
only as far as the operator's retention says and never what is still read
back (docs/journal.md, "Compaction").

The cut is the highest seq all of these allow, then lowered to a signed
checkpoint's seq (the anchor: the chain after it stays verifiable from the
link that checkpoint signs):
- the retention: --keep-after-seq N (rows after N stay), or --keep-days D
  (rows younger than D days stay, and every row after the first of them);
- the newest usable snapshot: rows before its seq only (its own row binds
  it to the journal, and a start needs it);
- what the state still reads back by seq: the mailbox index, and every
  plugin's `journal_needs` (federation's unsettled forwards);
- the peers that pull this hub's log: the after_seq each last asked from,
  less PULL_MARGIN (a follower re-reads behind its cursor).
Rows are deleted in one transaction with the anchor; the hub must be
stopped (the exclusive lock is refused otherwise).
"""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path

from hubd.journal import chain_checkpoints as checkpoints, snapshots
from hubd.journal.offline import exclusive
from hubd.journal.snapshots import SnapshotInvalid
from hubd.journal.store import PULL_CURSOR_META, chain_anchor, set_chain_anchor
from hubd.state.frozen import FrozenStateError, thaw

PULL_MARGIN = 1000  # a follower re-reads up to this far behind where it asked from


class CompactRefused(RuntimeError):
    """Nothing was dropped; the message says why."""


@dataclass
class CompactPlan:
    requested: int  # the retention's cut
    limits: dict[str, int] = field(default_factory=dict)  # what else bounds it: name -> seq
    cut: int = 0  # rows at or below it are dropped (0: none)
    dropped: int = 0
    snapshot_seq: int = 0

    def to_json(self) -> dict:
        return dict(self.__dict__)


def decide_cut(requested: int, limits: dict[str, int], signed_seqs: list[int],
               anchor: int) -> int:
    """The highest signed checkpoint's seq at or below the retention and every
    limit (each limit is the highest seq that may go), above the anchor a
    compaction left before; 0 when there is none (nothing to drop). Pure."""
    bound = min([requested, *limits.values()])
    usable = [seq for seq in signed_seqs if anchor < seq <= bound]
    return max(usable) if usable else 0


def retention_cut(conn: sqlite3.Connection, keep_after_seq: int | None,
                  keep_days: float | None, now: float) -> int:
    if keep_after_seq is not None:
        return keep_after_seq
    threshold = now - keep_days * 86400
    first_young = conn.execute("SELECT MIN(seq) FROM events WHERE ts >= ?",
                               (threshold,)).fetchone()[0]
    if first_young is None:
        return conn.execute("SELECT COALESCE(MAX(seq), 0) FROM events").fetchone()[0]
    return first_young - 1


def _newest_snapshot(conn, db: Path, hub_id: str, installed):
    """The newest snapshot that is whole, of this journal, and readable; its
    state. The running hub's flags may differ from the defaults this reads
    with, so the fingerprint is not required here: a hub that cannot use it
    after compaction refuses to start (restore.py), it never replays a part."""
    for file in snapshots.listed(snapshots.snapshot_dir(db)):
        try:
            header, body = snapshots.read(file, 1 << 40)
            if header.get("hub_id") != hub_id:
                continue
            row = conn.execute("SELECT seq, ts, kind, payload FROM events WHERE seq = ?",
                               (file.seq,)).fetchone()
            if row is None or snapshots.row_digest(row) != header.get("row"):
                continue
            state, _ = thaw(body, installed.appliers)
        except (SnapshotInvalid, FrozenStateError):
            continue
        return file.seq, state
    return None


def plan(conn: sqlite3.Connection, db: Path, installed, keep_after_seq: int | None,
         keep_days: float | None, now: float | None = None) -> CompactPlan:
    """`installed`: the plugins of the hub's configuration (their appliers
    read the snapshot, their journal_needs say what it still reads)."""
    now = time.time() if now is None else now
    requested = retention_cut(conn, keep_after_seq, keep_days, now)
    result = CompactPlan(requested)
    hub_id = (conn.execute("SELECT value FROM meta WHERE key = 'hub_id'").fetchone() or [""])[0]
    found = _newest_snapshot(conn, db, hub_id, installed)
    if found is None:
        raise CompactRefused("no usable snapshot beside the journal: every row is still needed "
                             "to start (let the hub write one: --snapshot-every)")
    seq, state = found
    result.snapshot_seq = seq
    limits = {"snapshot": seq - 1}
    needs = [("mailbox", state.mailbox.oldest_seq())]
    needs += [(f"plugin {p.name}", p.journal_needs(state)) for p in installed.plugins
              if p.journal_needs is not None]
    for name, oldest in needs:
        if oldest is not None:
            limits[name] = oldest - 1
    for key, value in conn.execute("SELECT key, value FROM meta WHERE key LIKE ?",
                                   (PULL_CURSOR_META + "%",)):
        limits[f"peer {key[len(PULL_CURSOR_META):]}"] = max(0, int(value) - PULL_MARGIN)
    result.limits = limits
    anchor = chain_anchor(conn)[0]
    signed = [cp.seq for cp in checkpoints.between(conn, anchor, max(requested, 0))]
    result.cut = decide_cut(requested, limits, signed, anchor)
    return result


def compact(db: str | Path, installed, keep_after_seq: int | None, keep_days: float | None,
            now: float | None = None) -> CompactPlan:
    """Plan and drop, under the exclusive lock (the hub stopped)."""
    db = Path(db)
    with exclusive(db) as conn:
        result = plan(conn, db, installed, keep_after_seq, keep_days, now)
        if result.cut <= 0:
            return result
        link = conn.execute("SELECT chain FROM events WHERE seq = ?", (result.cut,)).fetchone()
        signed = checkpoints.between(conn, result.cut - 1, result.cut)
        if link is None or not signed or signed[0].head != bytes(link[0]).hex():
            raise CompactRefused(f"the checkpoint at seq {result.cut} does not sign the "
                                 "journal's link there: run `hubd journal verify`")
        result.dropped = conn.execute("DELETE FROM events WHERE seq <= ?",
                                      (result.cut,)).rowcount
        set_chain_anchor(conn, result.cut, bytes(link[0]))
    return result

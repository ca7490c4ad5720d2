"""Offline access to hub journal files for the multihub operator commands.

Two jobs, both outside a running hub:

- read any hub's events read-only: hubd's journal (``events(seq, ts, kind,
  payload, route)``) or the reference hub's (``events(seq, ts, kind, payload,
  mac)``, see docs/reference-observed.md §6.2). The file is opened with SQLite's
  read-only URI mode, so observing a peer never changes it (WAL lets the read
  run beside the live peer hub). An encrypted (SQLCipher) reference journal is
  not readable and is reported as such.
- append one operator row (the equivocation recovery) to a *stopped* hubd
  journal, at the next seq, linked into its hash chain (hubd/journal/offline.py
  checks "stopped").
"""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import orjson

from hubd.journal import chain, offline
from hubd.journal.offline import OfflineJournalError, exclusive
from hubd.journal.store import INSERT, chain_head
from hubd.state.events import Event

HUBD = "hubd"
REFERENCE = "reference"
_NEEDED = ("seq", "ts", "kind", "payload")


class JournalError(Exception):
    """The file is missing, not a hub journal, damaged, or in use."""


class HubRunning(JournalError):
    """The journal is open in another process (a running hub)."""


@dataclass(frozen=True)
class JournalEvents:
    path: Path
    schema: str  # HUBD or REFERENCE
    events: list  # [{seq, ts, kind, payload}] in seq order


def _schema(conn: sqlite3.Connection, path: Path) -> str:
    try:
        columns = {row[1] for row in conn.execute("PRAGMA table_info(events)")}
    except sqlite3.DatabaseError as exc:
        raise JournalError(f"{path} is not a readable SQLite journal ({exc}); an encrypted "
                           "(SQLCipher) reference journal cannot be read here") from exc
    if not columns:
        raise JournalError(f"{path} has no events table: not a hub journal")
    missing = [c for c in _NEEDED if c not in columns]
    if missing:
        raise JournalError(f"{path}: events table has no {', '.join(missing)} column")
    if "route" in columns:
        return HUBD
    return REFERENCE


def _open_readonly(path: Path) -> sqlite3.Connection:
    if not path.is_file():
        raise JournalError(f"journal not found: {path}")
    try:
        conn = sqlite3.connect(f"file:{path.resolve()}?mode=ro", uri=True,
                               isolation_level=None)
        conn.execute("PRAGMA busy_timeout=5000")
    except sqlite3.Error as exc:
        raise JournalError(f"cannot open {path} read-only: {exc}") from exc
    return conn


def read_events(path: str | Path, kinds: tuple[str, ...] | None = None) -> JournalEvents:
    """Every event of a hub journal (or only `kinds`), read-only, in seq order.
    A row whose payload is not a JSON object raises JournalError naming its
    seq: an observer cannot skip it without leaving a gap in the peer's log."""
    path = Path(path)
    conn = _open_readonly(path)
    try:
        schema = _schema(conn, path)
        sql = "SELECT seq, ts, kind, payload FROM events"
        params: tuple = ()
        if kinds is not None:
            sql += f" WHERE kind IN ({','.join('?' * len(kinds))})"
            params = tuple(kinds)
        events = []
        try:
            rows = conn.execute(sql + " ORDER BY seq", params)
            for seq, ts, kind, text in rows:
                try:
                    payload = orjson.loads(text)
                except (orjson.JSONDecodeError, TypeError) as exc:
                    raise JournalError(f"{path}: event seq {seq} has an undecodable "
                                       f"payload ({exc})") from exc
                if not isinstance(payload, dict):
                    raise JournalError(f"{path}: event seq {seq} payload is not an object")
                events.append({"seq": seq, "ts": float(ts), "kind": str(kind),
                               "payload": payload})
        except sqlite3.DatabaseError as exc:
            raise JournalError(f"cannot read {path}: {exc}") from exc
        return JournalEvents(path, schema, events)
    finally:
        conn.close()


def append_operator_row(path: str | Path, kind: str,
                        build: Callable[[list[dict]], dict], *,
                        reads: tuple[str, ...], now: float | None = None) -> Event:
    """Append one row to a stopped hubd journal, atomically.

    Under the exclusive lock: read the rows of kinds `reads`, call
    `build(rows)` for the payload (it raises to refuse; nothing is written),
    then insert it at max(seq)+1 with ts `now`, and commit (synchronous=FULL).
    Raises HubRunning when another process has the journal open, JournalError
    for a missing or non-hubd journal."""
    path = Path(path)
    try:
        with exclusive(path) as conn:
            schema = _schema(conn, path)
            if schema != HUBD:
                raise JournalError(
                    f"{path} is a reference hub journal (rows carry a per-row MAC hubd cannot "
                    "compute); use the reference's own `synapse multihub recover` for it")
            rows = []
            cursor = conn.execute(
                f"SELECT seq, ts, kind, payload FROM events WHERE kind IN "
                f"({','.join('?' * len(reads))}) ORDER BY seq", reads)
            for seq, ts, row_kind, text in cursor:
                try:
                    payload = orjson.loads(text)
                except orjson.JSONDecodeError:
                    continue  # a damaged row proves nothing either way
                if isinstance(payload, dict):
                    rows.append({"seq": seq, "ts": ts, "kind": row_kind, "payload": payload})
            payload = build(rows)
            seq = conn.execute("SELECT COALESCE(MAX(seq), 0) FROM events").fetchone()[0] + 1
            event = Event(seq, time.time() if now is None else now, kind, payload)
            conn.execute(INSERT, (*event.row(), chain.row_link(chain_head(conn), event.row())))
            return event
    except offline.HubRunning as exc:
        raise HubRunning(str(exc)) from exc
    except OfflineJournalError as exc:
        raise JournalError(str(exc)) from exc

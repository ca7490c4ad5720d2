"""The SQLite event journal: schema, group append, replay and reads.

One table of events keyed by a hub-wide sequence, plus a small meta table (the
hub's stable id). WAL with synchronous=FULL: a commit is on disk when it
returns; batching many events per commit is what keeps it fast.

The write connection belongs to the JournalWriter's thread; readers open their
own connections (WAL lets them read beside the writer).
"""

from __future__ import annotations

import functools
import itertools
import json
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import structlog

from hubd.state.events import Event
from hubd.wire.codec import loads_stored

from . import chain, chain_checkpoints as checkpoints
from .files import prepare_for_writing

log = structlog.get_logger("hubd.journal")

# 2: every row carries its hash-chain link (hubd/journal/chain.py); a hubd
# that reads only schema 1 would append rows without one, so it refuses
SCHEMA_VERSION = "2"
INSERT = ("INSERT INTO events (seq, ts, kind, payload, route, principal, chain) "
          "VALUES (?, ?, ?, ?, ?, ?, ?)")
# meta key (+ peer) of the after_seq a peer's last log pull asked from
# (federation/handlers/logpull.py writes it, hubd/journal/compaction.py reads it)
PULL_CURSOR_META = "pull_after:"
# Rows per multi-row INSERT: 7 parameters each, well under SQLite's 32,766.
ROWS_PER_STATEMENT = 1000


@functools.lru_cache(maxsize=64)
def _insert_rows(n: int) -> str:
    return ("INSERT INTO events (seq, ts, kind, payload, route, principal, chain) VALUES "
            + ",".join(["(?,?,?,?,?,?,?)"] * n))


def _connect(path: str | Path, *, readonly: bool = False) -> sqlite3.Connection:
    if readonly:
        conn = sqlite3.connect(f"file:{Path(path).resolve()}?mode=ro", uri=True,
                               isolation_level=None, check_same_thread=False)
    else:
        prepare_for_writing(path)  # owner-only; a path that cannot serve is explained
        conn = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        # Checkpoints run beside the writer (hubd.journal.checkpoint), never
        # inside a commit: a checkpoint's page copying and fsync would
        # otherwise stall every chat waiting on that commit.
        conn.execute("PRAGMA wal_autocheckpoint=0")
    conn.execute("PRAGMA busy_timeout=5000")
    return conn


class NotAHubdJournal(RuntimeError):
    """The file is a SQLite database, but not one hubd wrote."""


class JournalTooNew(RuntimeError):
    """A newer hubd wrote the journal in a schema this one does not read."""


EXPECTED_COLUMNS = {"seq", "ts", "kind", "payload", "route"}
# The events table as ensure_schema creates it (the create and the start's
# check that there is nothing to create both read this).
EVENT_COLUMNS = {"seq": int, "ts": float, "kind": str, "payload": str, "route": str,
                 "principal": str, "chain": bytes}


def check_schema_version(stored: str) -> None:
    """Refuse a journal schema newer than SCHEMA_VERSION (older ones are
    upgraded in place by ensure_schema)."""
    ours = int(SCHEMA_VERSION)
    try:
        theirs = int(stored)
    except ValueError:
        theirs = None
    if theirs is None or theirs > ours:
        raise JournalTooNew(
            f"written by a newer hubd (journal schema {stored}; this hubd reads schema "
            f"{ours} and older): run a hubd that reads it, or start with a new --db")


def schema_current(conn: sqlite3.Connection) -> bool:
    """The journal already is what ensure_schema makes: its tables (the chain's
    checkpoints among them), the events columns and this hubd's schema version."""
    tables = {name for (name,) in conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' "
        "AND name IN ('events', 'meta', 'checkpoints')")}
    if tables != {"events", "meta", "checkpoints"}:
        return False
    stored = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    if stored is None or str(stored[0]) != SCHEMA_VERSION:
        return False
    return set(EVENT_COLUMNS) <= {row[1] for row in conn.execute("PRAGMA table_info(events)")}


def ensure_schema(conn: sqlite3.Connection) -> None:
    if schema_current(conn):
        # every start but a journal's first (or an upgrade's): nothing to
        # create, so sqlite-utils (importing it and loading its plugins'
        # entry points cost a start 0.1-0.5 s) is not needed
        return
    import sqlite_utils

    db = sqlite_utils.Database(conn)
    if db["events"].exists():
        columns = {c.name for c in db["events"].columns}
        if not EXPECTED_COLUMNS <= columns or not db["meta"].exists():
            raise NotAHubdJournal(
                "this database has an events table hubd did not write (the reference hub's "
                "journal looks like this); start hubd with a new --db — history does not "
                "carry over (see docs/migration-from-reference.md)")
    if db["meta"].exists():
        stored = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        if stored is not None:
            check_schema_version(str(stored[0]))
    db["events"].create(EVENT_COLUMNS, pk="seq", not_null={"ts", "kind", "payload"},
                        if_not_exists=True)
    if "principal" not in {c.name for c in db["events"].columns}:
        # a journal from before principals: its events were nobody's
        conn.execute("ALTER TABLE events ADD COLUMN principal TEXT")
    db["meta"].create({"key": str, "value": str}, pk="key", if_not_exists=True)
    conn.execute("INSERT OR IGNORE INTO meta (key, value) VALUES ('schema_version', ?)",
                 (SCHEMA_VERSION,))
    if "chain" not in {c.name for c in db["events"].columns}:
        upgrade_chain(conn)
    checkpoints.ensure_table(conn)


def upgrade_chain(conn: sqlite3.Connection) -> None:
    """A journal from before the hash chain: add the column and link every
    row in one transaction (all linked, or the journal as it was), once."""
    started = time.perf_counter()
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute("ALTER TABLE events ADD COLUMN chain BLOB")
        prev, rows, cursor = chain.GENESIS, 0, -1
        while True:
            batch = conn.execute(
                "SELECT seq, ts, kind, payload, route, principal FROM events WHERE seq > ? "
                "ORDER BY seq LIMIT 5000", (cursor,)).fetchall()
            if not batch:
                break
            linked, prev = chain.chained(prev, batch)
            conn.executemany("UPDATE events SET chain = ? WHERE seq = ?",
                             [(row[6], row[0]) for row in linked])
            cursor = batch[-1][0]
            rows += len(batch)
        conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('schema_version', ?)",
                     (SCHEMA_VERSION,))
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    log.warning("journal upgraded in place: hash chain computed over its existing rows "
                "(once; a hubd older than this one no longer opens it)", rows=rows,
                head=prev.hex(), seconds=round(time.perf_counter() - started, 3))


def chain_anchor(conn: sqlite3.Connection) -> tuple[int, bytes]:
    """(seq, link) the chain continues from: (0, GENESIS), or the last row a
    compaction dropped and its link (hubd/journal/compaction.py)."""
    row = conn.execute("SELECT value FROM meta WHERE key = 'chain_anchor'").fetchone()
    if row is None:
        return 0, chain.GENESIS
    value = json.loads(row[0])
    return int(value["seq"]), bytes.fromhex(value["link"])


def set_chain_anchor(conn: sqlite3.Connection, seq: int, link: bytes) -> None:
    conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('chain_anchor', ?)",
                 (json.dumps({"seq": seq, "link": link.hex()}),))


def link_at(conn: sqlite3.Connection, seq: int) -> bytes | None:
    """The chain's link at seq: GENESIS at 0, the row's, or a compaction's
    anchor; None where this journal cannot say (a compacted row)."""
    if seq == 0:
        return chain.GENESIS
    row = conn.execute("SELECT chain FROM events WHERE seq = ?", (seq,)).fetchone()
    if row is not None:
        return bytes(row[0]) if row[0] is not None else None
    anchor_seq, anchor_link = chain_anchor(conn)
    return anchor_link if anchor_seq == seq else None


def chain_head(conn: sqlite3.Connection) -> bytes:
    """The link of the last row (for a journal without rows, GENESIS, or the
    anchor of a compaction that dropped them all)."""
    row = conn.execute("SELECT chain FROM events ORDER BY seq DESC LIMIT 1").fetchone()
    if row is None:
        return chain_anchor(conn)[1]
    if row[0] is None:
        raise sqlite3.DatabaseError("the journal's last row has no hash-chain link "
                                    "(written by a tool that does not chain rows)")
    return bytes(row[0])


@dataclass(frozen=True, slots=True)
class CorruptRow:
    seq: int
    kind: str
    error: str


class UnknownKinds:
    """Events of kinds no installed plugin declares, seen by a replay: how
    many, the first seq, and the kinds (at most MAX_NAMES, each cut to 64
    characters: they come from the file)."""

    MAX_NAMES = 20

    def __init__(self) -> None:
        self.events = 0
        self.first_seq: int | None = None
        self.kinds: dict[str, int] = {}

    def count(self, event) -> None:
        self.events += 1
        if self.first_seq is None:
            self.first_seq = event.seq
        kind = str(event.kind)[:64]
        if kind in self.kinds or len(self.kinds) < self.MAX_NAMES:
            self.kinds[kind] = self.kinds.get(kind, 0) + 1

    def names(self) -> list[str]:
        return sorted(self.kinds)


def row_to_event(row) -> Event:
    seq, ts, kind, payload, route = row
    return Event(seq, ts, kind, loads_stored(payload), loads_stored(route) if route else None,
                 payload)


def replay_events(conn: sqlite3.Connection, after_seq: int = 0, batch: int = 5000,
                  corrupt: list[CorruptRow] | None = None) -> Iterator[Event]:
    """Every event after after_seq in seq order. Undecodable rows are reported
    in `corrupt` (when given) and skipped, never applied."""
    cursor = after_seq
    while True:
        rows = conn.execute(
            "SELECT seq, ts, kind, payload, route FROM events WHERE seq > ? ORDER BY seq LIMIT ?",
            (cursor, batch)).fetchall()
        if not rows:
            return
        for row in rows:
            cursor = row[0]
            try:
                event = row_to_event(row)
                if not isinstance(event.payload, dict):
                    raise ValueError("payload is not a JSON object")
            except (ValueError, TypeError) as exc:  # orjson.JSONDecodeError is a ValueError
                if corrupt is None:
                    raise
                corrupt.append(CorruptRow(row[0], str(row[2]), str(exc)))
                continue
            yield event


class JournalStore:
    """The write side. Every method runs on the thread that owns the connection."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.conn = _connect(self.path)
        ensure_schema(self.conn)
        # the link of the last committed row: the next row links to it
        self.head = chain_head(self.conn)
        self.signer: checkpoints.Signer | None = None  # once the hub knows its id and key

    def start_signing(self, hub_id: str, private, every: int) -> None:
        """Checkpoints from now on (hubd/journal/chain_checkpoints.py); the head as
        it is now is signed if the last checkpoint is older than it."""
        self.signer = checkpoints.Signer(self.conn, hub_id, private, every)
        seq = self.max_seq()
        if seq > self.signer.last_seq:
            self.signer.at(seq, self.head)

    def checkpoint_at(self, seq: int) -> "checkpoints.Checkpoint | None":
        """Sign the chain's link at seq (a snapshot's), if that row is here."""
        row = self.conn.execute("SELECT chain FROM events WHERE seq = ?", (seq,)).fetchone()
        if self.signer is None or row is None or row[0] is None:
            return None
        return self.signer.at(seq, bytes(row[0]))

    def close(self) -> None:
        self.conn.close()

    def append(self, rows: list[tuple]) -> None:
        """Commit rows atomically: all of them are durable, or none.

        Up to ROWS_PER_STATEMENT rows go in one multi-row INSERT outside an
        explicit transaction: one statement is its own transaction (all its
        rows or none; with synchronous=FULL durable when it returns), and it
        is a single sqlite3 step. The caller runs this on the writer's thread,
        and every step gives the GIL up and takes it back: with BEGIN, one
        step per row and COMMIT, each taking back waited for the event loop's
        thread to let go (up to the 5 ms switch interval when it was busy),
        once per row, behind every commit.

        Each row gets its hash-chain link here, in the statement that stores
        it; the head moves on only once the rows are committed."""
        conn = self.conn
        rows, head = chain.chained(self.head, rows)
        if len(rows) <= ROWS_PER_STATEMENT:
            conn.execute(_insert_rows(len(rows)), list(itertools.chain.from_iterable(rows)))
        else:
            self._append_many(rows)
        self.head = head
        if self.signer is not None:
            try:
                self.signer.committed(rows)
            except sqlite3.Error as exc:  # the rows are committed all the same
                log.warning("journal checkpoint not written; the next is at the next multiple "
                            "of --checkpoint-every", seq=rows[-1][0], error=repr(exc))

    def _append_many(self, rows: list[tuple]) -> None:
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            for start in range(0, len(rows), ROWS_PER_STATEMENT):
                chunk = rows[start:start + ROWS_PER_STATEMENT]
                conn.execute(_insert_rows(len(chunk)), list(itertools.chain.from_iterable(chunk)))
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    def max_seq(self) -> int:
        return self.conn.execute("SELECT COALESCE(MAX(seq), 0) FROM events").fetchone()[0]

    def get_meta(self, key: str) -> str | None:
        row = self.conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return row[0] if row else None

    def set_meta(self, key: str, value: str) -> None:
        self.conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value))



class JournalReader:
    """A read-only connection for queries made while the hub runs."""

    def __init__(self, path: str | Path):
        self.conn = _connect(path, readonly=True)

    def close(self) -> None:
        self.conn.close()

    def replay(self, after_seq: int = 0, corrupt: list[CorruptRow] | None = None) -> Iterator[Event]:
        return replay_events(self.conn, after_seq, corrupt=corrupt)

    def row_at(self, seq: int) -> tuple | None:
        """(seq, ts, kind, payload) of the row at seq, or None."""
        return self.conn.execute("SELECT seq, ts, kind, payload FROM events WHERE seq = ?",
                                 (seq,)).fetchone()

    def payloads(self, seqs: list[int]) -> list[tuple[int, str]]:
        out: list[tuple[int, str]] = []
        for start in range(0, len(seqs), 500):
            chunk = seqs[start:start + 500]
            marks = ",".join("?" * len(chunk))
            out.extend(self.conn.execute(
                f"SELECT seq, payload FROM events WHERE seq IN ({marks}) ORDER BY seq", chunk))
        return out

    def events_at(self, seqs: list[int]) -> list[Event]:
        """The events with these seqs that are committed, in seq order."""
        out: list[Event] = []
        for start in range(0, len(seqs), 500):
            chunk = seqs[start:start + 500]
            marks = ",".join("?" * len(chunk))
            out.extend(row_to_event(row) for row in self.conn.execute(
                f"SELECT seq, ts, kind, payload, route FROM events WHERE seq IN ({marks}) "
                "ORDER BY seq", chunk))
        return out

    def since(self, after_seq: int, limit: int | None) -> list[tuple]:
        if limit is None:
            limit = -1
        return self.conn.execute(
            "SELECT seq, ts, kind, payload, route FROM events WHERE seq > ? ORDER BY seq LIMIT ?",
            (after_seq, limit)).fetchall()

    def chain_page(self, after_seq: int, limit: int) -> tuple[list[tuple], bytes | None, list]:
        """A log pull's rows after after_seq, (seq, ts, kind, payload, route,
        principal, link), the link at after_seq (None: not held here, below
        a compaction's anchor) and the signed checkpoints in the rows' range.
        Three statements, no transaction: the reader threads share this
        connection, and committed rows and checkpoints never change under a
        running hub."""
        conn = self.conn
        rows = conn.execute(
            "SELECT seq, ts, kind, payload, route, principal, chain FROM events "
            "WHERE seq > ? ORDER BY seq LIMIT ?", (after_seq, limit)).fetchall()
        prev = link_at(conn, after_seq)
        signed = checkpoints.between(conn, after_seq, rows[-1][0]) if rows else []
        return rows, prev, signed

    def inbox_rows(self, after_seq: int, limit: int) -> list[tuple]:
        """(seq, kind, chat frame or None) after after_seq, in seq order: the
        payload is read and decoded for chats only (an undecodable one is
        None: replay has quarantined it already)."""
        out = []
        for seq, kind, payload in self.conn.execute(
                "SELECT seq, kind, CASE WHEN kind = 'chat' THEN payload END FROM events "
                "WHERE seq > ? ORDER BY seq LIMIT ?", (after_seq, limit)):
            frame = None
            if payload is not None:
                try:
                    frame = loads_stored(payload)
                except ValueError:  # orjson.JSONDecodeError is a ValueError
                    frame = None
                if not isinstance(frame, dict):
                    frame = None
            out.append((seq, kind, frame))
        return out

    def max_seq(self) -> int:
        return self.conn.execute("SELECT COALESCE(MAX(seq), 0) FROM events").fetchone()[0]

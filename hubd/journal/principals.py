"""Principals in the journal database (`hubd principal ...`).

Three tables beside the event journal: `principals` (name, seats, grants),
`principal_tokens` (SHA-256 digests only: a token is printed once and never
stored) and a version row bumped by every change; the REDSYN organizations'
table (`redsyn_orgs.py`) is read with them and bumps the same row. The CLI changes them
whether or not a hub runs; a running hub re-reads them when the version moves
(it looks twice a second), so a change applies within a second.

They are not journal events: the CLI cannot append to a journal whose
sequence a running hub owns, and a credential is not coordination history.
What a principal *did* is: every event its connections cause records its name.

REDSYN nodes (`hubd redsyn login`) are tokens of the person's principal (seats
ORG/TEAM/USER/*), labelled with the machine's name; a database from before
principals has its `redsyn_nodes` rows moved here when it is first opened.
"""

from __future__ import annotations

import json
import secrets
import sqlite3
import threading
import time
from pathlib import Path

from hubd.state.principals import (GRANTS, MAX_TOKENS_PER_PRINCIPAL, Principal,
                                   PrincipalError, PrincipalTable, build_table, check_label,
                                   make_principal, token_digest)

SCHEMA = (
    "CREATE TABLE IF NOT EXISTS principals (name TEXT PRIMARY KEY, seats TEXT NOT NULL, "
    "grants TEXT NOT NULL, created_at REAL NOT NULL)",
    "CREATE TABLE IF NOT EXISTS principal_tokens (digest TEXT PRIMARY KEY, "
    "principal TEXT NOT NULL, label TEXT NOT NULL, created_at REAL NOT NULL, "
    "UNIQUE (principal, label))",
    "CREATE TABLE IF NOT EXISTS principals_version (id INTEGER PRIMARY KEY CHECK (id = 1), "
    "version INTEGER NOT NULL)",
    "INSERT OR IGNORE INTO principals_version (id, version) VALUES (1, 0)",
    # REDSYN organizations (hubd/journal/redsyn_orgs.py): read with the principals
    "CREATE TABLE IF NOT EXISTS redsyn_orgs (name TEXT PRIMARY KEY, "
    "redsyn_version TEXT NOT NULL, created_at REAL NOT NULL)",
)
TOKEN_PREFIX = "hubd_"


def connect(path: str | Path) -> sqlite3.Connection:
    from hubd.journal.files import JournalFileError
    from hubd.journal.store import JournalTooNew, NotAHubdJournal, _connect, ensure_schema

    try:
        conn = _connect(path)
    except JournalFileError as exc:
        raise PrincipalError(str(exc)) from None
    try:
        ensure_schema(conn)  # a journal made here is a hubd journal the hub will open
    except (NotAHubdJournal, JournalTooNew) as exc:
        conn.close()
        raise PrincipalError(f"journal {path}: {exc}") from None
    for statement in SCHEMA:
        conn.execute(statement)
    _move_redsyn_nodes(conn)
    return conn


def _move_redsyn_nodes(conn: sqlite3.Connection) -> None:
    """A journal from before principals keeps its REDSYN node tokens."""
    exists = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' "
                          "AND name = 'redsyn_nodes'").fetchall()
    if not exists:
        return
    with conn:
        conn.execute("BEGIN IMMEDIATE")
        rows = conn.execute("SELECT person, name, digest, created_at FROM redsyn_nodes").fetchall()
        for person, machine, digest, created in rows:
            _ensure_person(conn, person, created)
            conn.execute("INSERT OR REPLACE INTO principal_tokens (digest, principal, label, "
                         "created_at) VALUES (?, ?, ?, ?)", (digest, person, machine, created))
        conn.execute("DROP TABLE redsyn_nodes")
        conn.execute("DROP TABLE IF EXISTS redsyn_nodes_version")
        _bump(conn)


def _ensure_person(conn: sqlite3.Connection, person: str, now: float) -> None:
    conn.execute("INSERT OR IGNORE INTO principals (name, seats, grants, created_at) "
                 "VALUES (?, ?, ?, ?)", (person, json.dumps([person + "/*"]), "{}", now))


def _bump(conn: sqlite3.Connection) -> None:
    conn.execute("UPDATE principals_version SET version = version + 1")


def _write(path: str | Path, change) -> object:
    conn = connect(path)
    try:
        with conn:
            conn.execute("BEGIN IMMEDIATE")
            result = change(conn)
            _bump(conn)
        return result
    finally:
        conn.close()


def _row_principal(name: str, seats: str, grants: str) -> Principal:
    return make_principal(name, json.loads(seats), json.loads(grants))


def add(path: str | Path, name: str, seats: list[str], grants: dict | None = None,
        *, replace: bool = False) -> Principal:
    """Make a principal (or, with replace, change its seats and grants)."""
    principal = make_principal(name, seats, grants)

    def change(conn):
        if not replace and conn.execute("SELECT 1 FROM principals WHERE name = ?",
                                        (name,)).fetchall():
            raise PrincipalError(f"principal {name!r} exists (use --replace to change it)")
        conn.execute("INSERT INTO principals (name, seats, grants, created_at) VALUES "
                     "(?, ?, ?, ?) ON CONFLICT(name) DO UPDATE SET seats = excluded.seats, "
                     "grants = excluded.grants",
                     (name, json.dumps(list(principal.seats)),
                      json.dumps({g: v for g, v in principal.grants().items() if v is not None}),
                      time.time()))
        return principal

    return _write(path, change)


def new_token(path: str | Path, name: str, label: str = "default",
              prefix: str = TOKEN_PREFIX) -> str:
    """A new token for the principal, labelled (a machine's name); a label it
    already has gets a new token and the old one stops working. Shown once."""
    check_label(label)
    token = prefix + secrets.token_urlsafe(32)

    def change(conn):
        if not conn.execute("SELECT 1 FROM principals WHERE name = ?", (name,)).fetchall():
            raise PrincipalError(f"no principal {name!r} (hubd principal add {name} --seat ...)")
        [(count,)] = conn.execute("SELECT count(*) FROM principal_tokens WHERE principal = ? "
                                  "AND label != ?", (name, label)).fetchall()
        if count >= MAX_TOKENS_PER_PRINCIPAL:
            raise PrincipalError(f"principal {name!r} has {count} tokens, the most it may have")
        conn.execute("DELETE FROM principal_tokens WHERE principal = ? AND label = ?",
                     (name, label))
        conn.execute("INSERT INTO principal_tokens (digest, principal, label, created_at) "
                     "VALUES (?, ?, ?, ?)", (token_digest(token), name, label, time.time()))

    _write(path, change)
    return token


def person_token(path: str | Path, person: str, machine: str, prefix: str) -> str:
    """`hubd redsyn login`: a token for the person's principal, made if absent."""
    check_label(machine)

    def change(conn):
        _ensure_person(conn, person, time.time())

    _write(path, change)
    return new_token(path, person, machine, prefix)


def revoke_token(path: str | Path, name: str, label: str | None = None) -> int:
    """Revoke one labelled token, or (label None) every token of the principal."""
    def change(conn):
        if label is None:
            return conn.execute("DELETE FROM principal_tokens WHERE principal = ?",
                                (name,)).rowcount
        return conn.execute("DELETE FROM principal_tokens WHERE principal = ? AND label = ?",
                            (name, label)).rowcount

    return _write(path, change)


def remove(path: str | Path, name: str) -> bool:
    def change(conn):
        conn.execute("DELETE FROM principal_tokens WHERE principal = ?", (name,))
        return conn.execute("DELETE FROM principals WHERE name = ?", (name,)).rowcount > 0

    return _write(path, change)


def listing(path: str | Path) -> list[dict]:
    """Every principal with its tokens' labels and when each was made (no digests)."""
    conn = connect(path)
    try:
        rows = conn.execute("SELECT name, seats, grants, created_at FROM principals "
                            "ORDER BY name").fetchall()
        tokens: dict[str, list] = {}
        for principal, label, created in conn.execute(
                "SELECT principal, label, created_at FROM principal_tokens ORDER BY label"):
            tokens.setdefault(principal, []).append({"label": label, "created_at": created})
    finally:
        conn.close()
    out = []
    for name, seats, grants, created in rows:
        stored = json.loads(grants)
        out.append({"name": name, "seats": json.loads(seats),
                    "grants": {g: stored.get(g) for g in GRANTS},
                    "tokens": tokens.get(name, []), "created_at": created})
    return out


class JournalPrincipals:
    """A hub's view of the tables: re-read when the version row moves (on a
    reader thread; refresh and close may run on different threads)."""

    def __init__(self, path: str | Path):
        self.path = path
        self.version = -1
        self._conn: sqlite3.Connection | None = None
        self._closed = False
        self._lock = threading.Lock()

    def read(self, shared_token: str | None) -> PrincipalTable | None:
        """The table, if it changed since the last read (else None)."""
        with self._lock:
            if self._closed:
                return None
            if self._conn is None:
                self._conn = connect(self.path)
            conn = self._conn
            # fetchall: a half-read cursor would hold its read snapshot open
            [(version,)] = conn.execute("SELECT version FROM principals_version").fetchall()
            if version == self.version:
                return None
            with conn:
                conn.execute("BEGIN")  # one snapshot for both tables
                rows = conn.execute("SELECT name, seats, grants FROM principals").fetchall()
                tokens = conn.execute("SELECT principal, digest, label FROM "
                                      "principal_tokens").fetchall()
                orgs = conn.execute("SELECT name, redsyn_version, created_at FROM "
                                    "redsyn_orgs").fetchall()
            table = build_table([_row_principal(*row) for row in rows], tokens, shared_token,
                                orgs={name: {"redsyn_version": version, "created_at": created}
                                      for name, version, created in orgs})
            self.version = version
            return table

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._conn is not None:
                self._conn.close()
                self._conn = None

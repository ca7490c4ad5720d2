"""Nodes and their bearer tokens (`hubd redsyn login/logout`).

A token is shown once; the journal database keeps only its SHA-256 digest,
in a table of its own beside the event journal (`redsyn_nodes`), so a token
can be made whether or not the hub runs: the hub re-reads the table when its
version row changes (checked twice a second), which is how a running hub
accepts a new token within a second and forgets a revoked one as fast.

Tokens are not journal events: the CLI cannot append to a journal whose
sequence a running hub owns, and a token is a credential, not coordination
history.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import re
import secrets
import sqlite3
import sys
import threading
import time
from pathlib import Path

from hubd.wire.redsyn.envelope import NAME, RedsynError, parse_person
from hubd.state.redsyn import Node

_MACHINE = re.compile(NAME)

SCHEMA = (
    "CREATE TABLE IF NOT EXISTS redsyn_nodes (node TEXT PRIMARY KEY, person TEXT NOT NULL, "
    "name TEXT NOT NULL, digest TEXT NOT NULL UNIQUE, created_at REAL NOT NULL)",
    "CREATE TABLE IF NOT EXISTS redsyn_nodes_version (id INTEGER PRIMARY KEY CHECK (id = 1), "
    "version INTEGER NOT NULL)",
    "INSERT OR IGNORE INTO redsyn_nodes_version (id, version) VALUES (1, 0)",
)


def digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def node_id(person: str, name: str) -> str:
    return f"{person}:{name}"


def connect(path: str | Path) -> sqlite3.Connection:
    from hubd.journal.store import _connect, ensure_schema

    conn = _connect(path)
    ensure_schema(conn)  # a journal made here is a hubd journal the hub will open
    for statement in SCHEMA:
        conn.execute(statement)
    return conn


def login(path: str | Path, person: str, name: str) -> tuple[str, str]:
    """A new token for the node person:name (replacing any it had)."""
    parse_person(person)
    if not _MACHINE.fullmatch(name):
        raise RedsynError(400, "a machine name is lowercase letters, digits, '.', '-', '_'")
    token = "rsn_" + secrets.token_urlsafe(32)
    node = node_id(person, name)
    conn = connect(path)
    try:
        with conn:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO redsyn_nodes (node, person, name, digest, created_at) "
                         "VALUES (?, ?, ?, ?, ?) ON CONFLICT(node) DO UPDATE SET "
                         "digest = excluded.digest, created_at = excluded.created_at",
                         (node, person, name, digest(token), time.time()))
            conn.execute("UPDATE redsyn_nodes_version SET version = version + 1")
    finally:
        conn.close()
    return token, node


def logout(path: str | Path, person: str, name: str) -> bool:
    parse_person(person)
    conn = connect(path)
    try:
        with conn:
            conn.execute("BEGIN IMMEDIATE")
            gone = conn.execute("DELETE FROM redsyn_nodes WHERE node = ?",
                                (node_id(person, name),)).rowcount
            conn.execute("UPDATE redsyn_nodes_version SET version = version + 1")
    finally:
        conn.close()
    return gone > 0


class TokenTable:
    """The hub's view of the node table (used on a reader thread)."""

    def __init__(self, path: str | Path):
        self.path = path
        self.version = -1
        self.by_digest: dict[str, Node] = {}
        self._conn: sqlite3.Connection | None = None
        self._closed = False
        self._lock = threading.Lock()  # refresh and close may run on different threads

    def refresh(self) -> bool:
        """Re-read the table if it changed; True when it did."""
        with self._lock:
            if self._closed:
                return False
            return self._refresh()

    def _refresh(self) -> bool:
        if self._conn is None:
            self._conn = connect(self.path)
        # fetchall: a half-read cursor would hold its read snapshot open
        [(version,)] = self._conn.execute("SELECT version FROM redsyn_nodes_version").fetchall()
        if version == self.version:
            return False
        rows = self._conn.execute("SELECT node, person, digest FROM redsyn_nodes").fetchall()
        self.by_digest = {d: Node(n, p) for n, p, d in rows}
        self.version = version
        return True

    def node_for(self, token: str) -> Node | None:
        wanted = digest(token)
        node = self.by_digest.get(wanted)
        # The dict lookup already matched on the digest; compare again in
        # constant time so the answer's timing says nothing about near misses.
        if node is not None and hmac.compare_digest(wanted, digest(token)):
            return node
        return None

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._conn is not None:
                self._conn.close()
                self._conn = None


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="hubd redsyn",
                                     description="REDSYN nodes: bearer tokens for HTTP agents")
    sub = parser.add_subparsers(dest="command", required=True)
    for verb, text in (("login", "make a node and print its new bearer token (shown once)"),
                       ("logout", "revoke a node's token")):
        p = sub.add_parser(verb, help=text, description=text)
        p.add_argument("--db", required=True, help="the hub's journal database")
        p.add_argument("--person", required=True, metavar="ORG/TEAM/USER",
                       help="the person whose agents the node speaks for")
        p.add_argument("--name", required=True, metavar="MACHINE", help="the machine's name")
        p.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args(argv)
    try:
        if args.command == "login":
            token, node = login(args.db, args.person, args.name)
            if args.json:
                print(json.dumps({"token": token, "node": node, "person": args.person}))
            else:
                print(token)
            return 0
        gone = logout(args.db, args.person, args.name)
        node = node_id(args.person, args.name)
        if args.json:
            print(json.dumps({"node": node, "revoked": gone}))
        else:
            print(f"{node}: token revoked" if gone else f"{node}: no such node")
        return 0 if gone else 1
    except RedsynError as exc:
        print(f"hubd redsyn: {exc.error}", file=sys.stderr)
        return 2
    except sqlite3.Error as exc:
        print(f"hubd redsyn: cannot use {args.db}: {exc}", file=sys.stderr)
        return 2

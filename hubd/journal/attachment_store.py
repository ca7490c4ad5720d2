"""Scoped attachments on disk (docs/attachments.md): content in files under
the owner-only `--attachment-root`, metadata and references in the owner-only
ledger `attachments.sqlite3` beside them. Never in the event log.

    <root>/attachments.sqlite3   objects(scope, digest, ...), refs(scope, digest, ref)
    <root>/objects/<64 hex>      one committed object (a random name, not its digest)
    <root>/staging/<upload id>   an open upload's bytes so far

An upload is written to its staging file; its commit fsyncs that file,
renames it into objects/, fsyncs the directory and then inserts the ledger
row (a SQLite transaction, synchronous FULL). A crash between the rename and
the row leaves an object file no row names: the next open removes it, with
every staging file, so a SIGKILL at any point leaves either the committed
object or nothing. Blocking calls: the hub runs them on one worker thread
(hubd/handlers/attachments.py).
"""

from __future__ import annotations

import os
import secrets
import sqlite3
import stat
from pathlib import Path

from hubd.state.attachment_rules import Metadata

LEDGER = "attachments.sqlite3"
_SCHEMA = """
CREATE TABLE IF NOT EXISTS objects (
    scope TEXT NOT NULL, digest TEXT NOT NULL, length INTEGER NOT NULL,
    media_type TEXT NOT NULL, provenance TEXT NOT NULL, expires_at REAL NOT NULL,
    filename TEXT NOT NULL UNIQUE, PRIMARY KEY (scope, digest));
CREATE TABLE IF NOT EXISTS refs (
    scope TEXT NOT NULL, digest TEXT NOT NULL, ref TEXT NOT NULL,
    PRIMARY KEY (scope, digest, ref),
    FOREIGN KEY (scope, digest) REFERENCES objects(scope, digest) ON DELETE CASCADE);
CREATE TABLE IF NOT EXISTS peer_read_audit (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, read_at REAL NOT NULL, recipient TEXT NOT NULL,
    scope TEXT NOT NULL, digest TEXT NOT NULL, action TEXT NOT NULL,
    allowed INTEGER NOT NULL CHECK (allowed IN (0, 1)));
CREATE TRIGGER IF NOT EXISTS peer_read_audit_bound AFTER INSERT ON peer_read_audit
BEGIN
    DELETE FROM peer_read_audit WHERE seq <= NEW.seq - 256;
END;
"""
# what a peer read's audit row keeps of a field: the reference keeps the last
# 256 rows; a row holds no content
AUDIT_TEXT = 256


class StoreError(ValueError):
    """The root cannot be used; the text says why."""


class Stored:
    """One committed object as the hub keeps it in memory."""

    __slots__ = ("meta", "filename", "refs")

    def __init__(self, meta: Metadata, filename: str, refs: set[str]):
        self.meta, self.filename, self.refs = meta, filename, refs


def _owner_only_dir(path: Path) -> None:
    try:
        info = path.stat()
    except FileNotFoundError:
        raise StoreError(f"cannot open attachment store: {path} does not exist") from None
    if not stat.S_ISDIR(info.st_mode):
        raise StoreError(f"cannot open attachment store: {path} is not a directory")
    if info.st_mode & 0o077 or info.st_uid != os.geteuid():
        raise StoreError("cannot open attachment store: attachment directory must be owner-only")


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_small_owner_only(path: Path, limit: int) -> bytes | None:
    """A policy file re-read per request: its bytes, or None when it cannot be
    used (missing, readable or writable by others, too big)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_mode & 0o077 or info.st_size > limit:
            return None
        return os.read(fd, limit + 1)
    finally:
        os.close(fd)


class AttachmentStore:
    def __init__(self, root: Path):
        self.root = root
        self.objects = root / "objects"
        self.staging = root / "staging"
        self._db: sqlite3.Connection | None = None

    def open(self) -> dict[tuple[str, str], Stored]:
        """Check the root, make its parts, discard what no commit finished
        (staging files, object files no ledger row names) and return the
        committed objects."""
        _owner_only_dir(self.root)
        for part in (self.objects, self.staging):
            part.mkdir(mode=0o700, exist_ok=True)
            _owner_only_dir(part)
        ledger = self.root / LEDGER
        fd = os.open(ledger, os.O_RDWR | os.O_CREAT, 0o600)
        os.close(fd)
        if os.stat(ledger).st_mode & 0o077:
            raise StoreError(f"cannot open attachment store: {ledger} must be owner-only")
        db = sqlite3.connect(ledger, isolation_level=None, check_same_thread=False)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        db.execute("PRAGMA foreign_keys=ON")
        db.executescript(_SCHEMA)
        self._db = db
        for name in os.listdir(self.staging):
            os.unlink(self.staging / name)
        found: dict[tuple[str, str], Stored] = {}
        for row in db.execute("SELECT scope, digest, length, media_type, provenance, "
                              "expires_at, filename FROM objects"):
            found[(row[0], row[1])] = Stored(Metadata(*row[:6]), row[6], set())
        for scope, digest, ref in db.execute("SELECT scope, digest, ref FROM refs"):
            found[(scope, digest)].refs.add(ref)
        named = {stored.filename for stored in found.values()}
        for name in os.listdir(self.objects):
            if name not in named:
                os.unlink(self.objects / name)
        _fsync_dir(self.staging)
        _fsync_dir(self.objects)
        return found

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    # -- uploads (staging)

    def stage(self, upload_id: str) -> None:
        fd = os.open(self.staging / upload_id, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.close(fd)

    def write(self, upload_id: str, offset: int, data: bytes) -> None:
        fd = os.open(self.staging / upload_id, os.O_WRONLY)
        try:
            os.pwrite(fd, data, offset)
        finally:
            os.close(fd)

    def discard(self, upload_id: str) -> None:
        try:
            os.unlink(self.staging / upload_id)
        except FileNotFoundError:
            pass

    def commit(self, upload_id: str, meta: Metadata) -> str:
        """Make the staged bytes the object `meta` names; its file name."""
        staged = self.staging / upload_id
        fd = os.open(staged, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        filename = secrets.token_hex(32)
        os.rename(staged, self.objects / filename)
        _fsync_dir(self.objects)
        _fsync_dir(self.staging)
        with self._db:
            self._db.execute(
                "INSERT INTO objects VALUES (?, ?, ?, ?, ?, ?, ?)",
                (meta.scope, meta.digest, meta.length, meta.media_type, meta.provenance,
                 meta.expires_at, filename))
        return filename

    # -- committed objects

    def read(self, filename: str, offset: int, size: int) -> bytes:
        fd = os.open(self.objects / filename, os.O_RDONLY)
        try:
            return os.pread(fd, size, offset)
        finally:
            os.close(fd)

    def set_ref(self, scope: str, digest: str, ref: str, present: bool) -> None:
        with self._db:
            if present:
                self._db.execute("INSERT OR IGNORE INTO refs VALUES (?, ?, ?)",
                                 (scope, digest, ref))
            else:
                self._db.execute("DELETE FROM refs WHERE scope=? AND digest=? AND ref=?",
                                 (scope, digest, ref))

    def audit(self, at: float, recipient: str, scope: str, digest: str, action: str,
              allowed: bool) -> None:
        """One cross-hub read request, served or not (the last 256 are kept)."""
        with self._db:
            self._db.execute(
                "INSERT INTO peer_read_audit (read_at, recipient, scope, digest, action, "
                "allowed) VALUES (?, ?, ?, ?, ?, ?)",
                (at, recipient[:AUDIT_TEXT], scope[:AUDIT_TEXT], digest[:AUDIT_TEXT],
                 action[:AUDIT_TEXT], int(allowed)))

    def delete(self, scope: str, digest: str, filename: str) -> None:
        """The row first: a crash after it leaves a file the next open removes."""
        with self._db:
            self._db.execute("DELETE FROM objects WHERE scope=? AND digest=?", (scope, digest))
        try:
            os.unlink(self.objects / filename)
        except FileNotFoundError:
            pass

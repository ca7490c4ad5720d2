"""Writing to a STOPPED hub's journal (operator commands: `hubd multihub
recover`, `hubd journal compact`): one exclusive lock, one transaction.

"Stopped" is checked, not assumed: the write takes SQLite's exclusive lock
without waiting, which a running hub's open journal connection prevents, so
an operator command cannot race a live process that would keep its
in-memory state and never see the change.
"""

from __future__ import annotations

import sqlite3
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


class OfflineJournalError(Exception):
    """The file is missing, cannot be opened, or cannot be locked."""


class HubRunning(OfflineJournalError):
    """The journal is open in another process (a running hub)."""


@contextmanager
def exclusive(path: str | Path) -> Iterator[sqlite3.Connection]:
    """A connection holding the journal's exclusive lock in one transaction:
    committed when the block ends, rolled back if it raises."""
    path = Path(path)
    if not path.is_file():
        raise OfflineJournalError(f"journal not found: {path}")
    try:
        conn = sqlite3.connect(f"file:{path.resolve()}?mode=rw", uri=True,
                               isolation_level=None, timeout=0)
    except sqlite3.Error as exc:
        raise OfflineJournalError(f"cannot open {path} for writing: {exc}") from exc
    try:
        try:
            # EXCLUSIVE locking in WAL mode: the lock is taken on the database
            # file itself and held until close, so any other open connection
            # (a running hub always has one) makes this fail at once.
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute("PRAGMA locking_mode=EXCLUSIVE")
            conn.execute("BEGIN EXCLUSIVE")
        except sqlite3.OperationalError as exc:
            if "locked" in str(exc) or "busy" in str(exc):
                raise HubRunning(f"{path} is in use by another process; stop the hub first "
                                 "and run this again") from exc
            raise OfflineJournalError(f"cannot lock {path}: {exc}") from exc
        try:
            yield conn
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
    finally:
        conn.close()

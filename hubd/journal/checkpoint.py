"""WAL checkpoints off the commit path.

The writer connection has automatic checkpoints turned off, so a commit is
only its own WAL append and fsync. This task copies the WAL back into the
database on its own connection and thread once the WAL has grown past a few
megabytes, with PASSIVE checkpoints: they never block the writer, and the
writer starts reusing the WAL from its beginning once one has caught up.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import time
from pathlib import Path

import structlog

from hubd.journal.thread import DbThread

log = structlog.get_logger("hubd.journal.checkpoint")

WAL_BYTES = 4 * 1024 * 1024


class Checkpointer:
    def __init__(self, path: Path, metrics, every: float):
        self.path = Path(path)
        self.every = every  # seconds between looks at the WAL's size
        self.wal = Path(f"{path}-wal")
        self.metrics = metrics
        self._thread = DbThread("journal-checkpoint")
        self._conn: sqlite3.Connection | None = None

    def _checkpoint(self) -> tuple[int, int, int]:
        if self._conn is None:
            self._conn = sqlite3.connect(str(self.path), isolation_level=None,
                                         check_same_thread=False)
            self._conn.execute("PRAGMA busy_timeout=5000")
        busy, wal_pages, copied = self._conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        return busy, wal_pages, copied

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.every)
            try:
                size = os.stat(self.wal).st_size
            except FileNotFoundError:
                continue
            if size < WAL_BYTES:
                continue
            started = time.perf_counter()
            try:
                busy, wal_pages, copied = await self._thread.call(self._checkpoint)
            except sqlite3.Error as exc:
                log.warning("WAL checkpoint failed; the next one retries", error=str(exc))
                continue
            self.metrics.checkpoints += 1
            self.metrics.checkpoint_seconds += time.perf_counter() - started
            if copied < wal_pages:
                log.info("WAL checkpoint incomplete (a reader is behind)", wal_pages=wal_pages,
                         copied=copied)

    async def close(self) -> None:
        def close():
            if self._conn is not None:
                self._conn.close()
                self._conn = None
        await self._thread.call(close)
        self._thread.stop()

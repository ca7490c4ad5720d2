"""Snapshotter: takes snapshots of the projection, off the hot path
(docs/journal.md, "Snapshots").

Once `snapshot_events` events were committed since the newest snapshot (and
no sooner than `timing.snapshot_interval` after the last attempt), it starts a child
process (hubd/snapshot_worker.py) that reads the journal on its own read-only
connection, builds the projection from the newest snapshot plus the rows
after it, and writes the next snapshot. Nothing of the Router's state is
touched or copied, the writer's connection is never waited on, and the
child's CPU (replaying, pickling) is not the event loop's. One child at a
time; one that runs past `timing.snapshot_worker` is killed; a failure is
logged and counted (hubd_snapshots_total{outcome}) and the next attempt
waits for the next interval.
"""

from __future__ import annotations

import asyncio
import pickle
import sqlite3
import sys
import time

import orjson
import structlog

log = structlog.get_logger("hubd.snapshots")

# what a worker may print on stdout (its one JSON line)
MAX_REPORT_BYTES = 64 * 1024
WORKER_MODULE = "hubd.snapshot_worker"
# the worker's exit codes
EXIT_WRITTEN, EXIT_FAILED, EXIT_REFUSED, EXIT_TOO_LARGE = 0, 1, 2, 3
OUTCOMES = {EXIT_WRITTEN: "written", EXIT_REFUSED: "refused", EXIT_TOO_LARGE: "too_large"}


class Snapshotter:
    def __init__(self, hub):
        self.hub = hub
        self.config = hub.config
        # the seq of the newest usable snapshot: the one the hub started from
        # (the next is due once snapshot_events more are committed; at once
        # if the hub found none it could use and the journal is that long)
        self.seq = 0
        self._last_attempt = float("-inf")

    def due(self, committed: int, now: float) -> bool:
        events = self.config.snapshot_events
        return (events > 0 and committed - self.seq >= events
                and now - self._last_attempt >= self.config.timing.snapshot_interval)

    async def run(self) -> None:
        if self.config.snapshot_events <= 0:
            return
        self.seq = self.hub.projected.from_snapshot
        while True:
            await asyncio.sleep(self.config.timing.snapshot_check)
            if self.due(self.hub.writer.committed_seq, time.monotonic()):
                await self.take()

    async def take(self) -> dict:
        """Run one worker to its end; its report (outcome, seq, bytes, seconds)."""
        self._last_attempt = time.monotonic()
        started = time.perf_counter()
        request = pickle.dumps({"config": self.config, "hub_id": self.hub.hub_id,
                                "fingerprint": self.hub.snapshot_policy.fingerprint})
        worker = await asyncio.create_subprocess_exec(
            sys.executable, "-m", WORKER_MODULE, stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE)
        try:
            out, _ = await asyncio.wait_for(worker.communicate(request),
                                            self.config.timing.snapshot_worker)
        except TimeoutError:
            _kill(worker)
            await worker.wait()
            out = b""
        except BaseException:  # the hub stops: its worker stops with it
            _kill(worker)
            raise
        seconds = time.perf_counter() - started
        report = _report(out[:MAX_REPORT_BYTES])
        outcome = OUTCOMES.get(worker.returncode, "failed")
        metrics = self.hub.metrics
        if outcome == "written" and report.get("path") is None:
            outcome = "current"  # the newest usable snapshot is of the journal's last row
        metrics.snapshots[outcome] = metrics.snapshots.get(outcome, 0) + 1
        metrics.snapshot_seconds += seconds
        if outcome in ("written", "current"):
            self.seq = max(self.seq, int(report.get("seq") or 0))
            log.info("snapshot written" if outcome == "written" else "snapshot already current",
                     seq=report.get("seq"), bytes=report.get("bytes"),
                     seconds=round(seconds, 3), replayed=report.get("applied"),
                     from_snapshot=report.get("from_snapshot"))
            if outcome == "written":
                await self._checkpoint(int(report.get("seq") or 0))
        else:
            log.error("snapshot not written; the next attempt follows the next interval",
                      outcome=outcome, exit_code=worker.returncode,
                      reason=report.get("error", "the worker died (see its log lines above)"),
                      seconds=round(seconds, 3))
        return {"outcome": outcome, "seconds": seconds, **report}

    async def _checkpoint(self, seq: int) -> None:
        """Every snapshot's seq gets a signed checkpoint of the chain there
        (docs/journal.md): compaction anchors at one."""
        writer = self.hub.writer
        if writer.store is None:
            return
        try:
            await writer.call(writer.store.checkpoint_at, seq)
        except sqlite3.Error as exc:
            log.warning("journal checkpoint at the snapshot's seq not written", seq=seq,
                        error=repr(exc))


def _kill(worker: asyncio.subprocess.Process) -> None:
    if worker.returncode is None:
        try:
            worker.kill()
        except ProcessLookupError:
            pass


def _report(out: bytes) -> dict:
    try:
        report = orjson.loads(out.strip() or b"{}")
    except orjson.JSONDecodeError:
        return {"error": f"unreadable worker report {out[:200]!r}"}
    return report if isinstance(report, dict) else {"error": "worker report is not an object"}

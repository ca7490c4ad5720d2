"""How the Router gets back to a projection of the journal (docs/architecture.md,
"Router"): a mixin of the Router, whose private state it shares.

- a command that fails leaves no trace: the state is rebuilt from the
  journal when the command had applied an event, once everything queued is
  committed, and the principal whose command it was may not change state
  for a while (hubd/state/suspensions.py), so no client can keep the hub
  replaying;
- a row SQLite refuses at commit fails its own command only, and the state
  is rebuilt the same way;
- a failed commit is answered by the writer with private errors; the state
  is rebuilt and mutations are refused for a back-off that doubles while
  failures repeat (timing.journal_retry_first to journal_retry_max), so a full
  disk costs one rebuild per back-off period rather than one per batch.
"""

from __future__ import annotations

import asyncio
import time

import structlog

from .journal_writer import Flush, Resync

log = structlog.get_logger("hubd.router")


class Recovery:

    async def _wait_committed(self) -> None:
        done = asyncio.get_running_loop().create_future()
        await self.hub.writer.inbox.put(Flush(done))
        await done

    async def _rebuild(self, reason: str) -> float:
        """Replace the state with a replay of the journal; the seconds it took."""
        started = time.perf_counter()
        self.state = await self.hub.load_state()
        for restored in self.installed.hooks("restored"):
            restored(self.state)
        for rebuilt in self.installed.hooks("rebuilt"):
            rebuilt(self)
        seconds = time.perf_counter() - started
        self.metrics.count_rebuild(reason, seconds)
        return seconds

    async def _rebuild_after_crash(self) -> None:
        """The state may hold part of a failed command: once everything queued
        is committed, replay the journal, and suspend whoever caused it."""
        await self._wait_committed()
        self._needs_rebuild = False
        seconds = await self._rebuild(self._dirty_reason)
        self._suspend_dirty_by(seconds)

    def _suspend_dirty_by(self, rebuild_seconds: float) -> None:
        principal = self._dirty_by
        suspended = self.suspensions.suspend(principal, time.time(), rebuild_seconds)
        if suspended:
            self.metrics.suspensions += 1
        log.warning("state rebuilt from the journal after a failed command",
                    reason=self._dirty_reason,
                    principal=principal if principal is not None else "(the hub)",
                    rebuild_seconds=round(rebuild_seconds, 3),
                    changes_refused_seconds=round(suspended, 3), last_seq=self.state.last_seq,
                    # live suspensions dropped at the table's bound, ever
                    suspensions_evicted=self.suspensions.evicted_live)

    def refuse_permanently(self, reason: str) -> None:
        self.refusing_mutations = reason
        self._refusal_permanent = True

    async def _recover_from_journal_failure(self) -> None:
        self._journal_failed = False
        dirty, self._needs_rebuild = self._needs_rebuild, False
        try:
            seconds = await self._rebuild("journal_failure")
            if dirty:  # a failed command made it dirty too: this rebuild is its
                self._suspend_dirty_by(seconds)
        except Exception:
            # The journal cannot even be read: keep serving reads from the
            # last state and refuse mutations until an operator intervenes.
            log.exception("journal unreadable after a failed commit; refusing mutations")
            self.refuse_permanently("journal unreadable")
        if not self._refusal_permanent:
            self.refusing_mutations = "journal write failed"
            self._refuse_until = time.time() + self._backoff
            log.warning("state rebuilt from the journal after a failed commit; refusing "
                        "mutations for a while", last_seq=self.state.last_seq,
                        seconds=self._backoff)
            self._backoff = min(self._backoff * 2, self.config.timing.journal_retry_max)
        await self.hub.writer.inbox.put(Resync())

"""The hub: its actors, its journal, and its lifetime.

Startup: open the journal, settle the hub id, load the journal's projection
(the newest usable snapshot plus the rows after it, applied with the same
`apply` the Router uses live: hubd/journal/restore.py), then start the actors. The
HTTP listener starts first so /health answers during a long replay; WebSocket
upgrades are refused (503) until the replay is done (/readyz says when).

Supervision: the actors run in one TaskGroup. An actor that dies with an
unexpected exception stops the hub with a non-zero exit; the journal makes the
restart correct.

What the hub does beyond this is its plugins' (hubd/core/plugin.py): the core
plugin and, from the composition root, federation's. The hub runs their
hooks; it knows none of them by name.
"""

from __future__ import annotations

import asyncio
import secrets
import sqlite3
import time
from concurrent.futures import ThreadPoolExecutor

import structlog

from typing import Iterable

from hubd.actors.identity import IdentityWatch
from hubd.actors.journal_writer import JournalWriter
from hubd.actors.journal_writer import Flush
from hubd.actors.router import Router
from hubd.actors.snapshotter import Snapshotter
from hubd.auth_log import AuthDenials
from hubd.config import HubConfig
from hubd.core.commands import TICK, ConfigReloaded
from hubd.core.endpoints import Endpoints
from hubd.core.message import CLOSE_GOING_AWAY
from hubd.core.plugin import Installed, Plugin
from hubd.health import OK, journal_problems, judge
from hubd.journal import chain_checkpoints as checkpoints, snapshots
from hubd.journal.checkpoint import Checkpointer
from hubd.journal.restore import (JournalCompacted, Projection, SnapshotPolicy, policy_for,
                                  project)
from hubd.journal.files import JournalFileError
from hubd.journal.store import (CorruptRow, JournalReader, JournalTooNew, NotAHubdJournal,
                                UnknownKinds)
from hubd.metrics import HubMetrics
from hubd.owner_only import OwnerOnlyFileError
from hubd.state.hub import HubState
from hubd.wire.envelope import PROTOCOL_VERSION

log = structlog.get_logger("hubd.hub")


class JournalRefused(RuntimeError):
    """The journal cannot be opened as this hub's (another hub's id, or not a
    hubd journal at all): refuse to start rather than guess."""


class Hub:
    def __init__(self, config: HubConfig, plugins: Iterable[Plugin]):
        self.config = config
        self.installed = Installed(plugins)
        self.metrics = HubMetrics()
        self.auth_denials = AuthDenials()
        self.hub_id: str = config.hub_id or ""
        # every open endpoint of every door, by id: where released messages go
        self.endpoints = Endpoints()
        self.writer = JournalWriter(config.db, self.metrics, self.endpoints,
                                    self._journal_failed)
        self.checkpointer = Checkpointer(config.db, self.metrics,
                                         config.timing.wal_checkpoint_poll)
        # the principals: who each token is and which seats it may speak for
        self.identity = IdentityWatch(config)
        self.router: Router | None = None
        self.ready = False
        self.started = time.time()
        self.corrupt_rows: list[CorruptRow] = []
        # set by open(): which snapshots this hub may start from, and who takes them
        self.snapshot_policy: SnapshotPolicy | None = None
        self.snapshotter: Snapshotter | None = None
        # the last projection loaded (where it started from, how many events it applied)
        self.projected: Projection | None = None
        self.unknown_kinds = UnknownKinds()
        self._reader_thread = ThreadPoolExecutor(2, thread_name_prefix="journal-reader")
        self._reader: JournalReader | None = None
        self._background: set[asyncio.Task] = set()
        self._stopping = asyncio.Event()

    # -- journal access

    async def read_journal(self, method: str, *args):
        """Run a JournalReader query on the reader threads."""
        def run():
            if self._reader is None:
                self._reader = JournalReader(self.config.db)
            return getattr(self._reader, method)(*args)
        return await asyncio.get_running_loop().run_in_executor(self._reader_thread, run)

    def fresh_state(self) -> HubState:
        return fresh_state(self.installed, self.config)

    def _project(self, use_snapshots: bool) -> Projection:
        reader = JournalReader(self.config.db)
        try:
            return project(reader, self.fresh_state,
                           self.snapshot_policy if use_snapshots else None)
        finally:
            reader.close()

    async def load_state(self, use_snapshots: bool = True) -> HubState:
        """The journal's projection: the newest usable snapshot plus the
        events after it (or, use_snapshots=False, a replay from the start)."""
        try:
            projection = await asyncio.get_running_loop().run_in_executor(
                self._reader_thread, self._project, use_snapshots)
        except JournalCompacted as exc:
            raise JournalRefused(f"journal {self.config.db}: {exc}") from exc
        self.corrupt_rows = projection.corrupt
        self.unknown_kinds = projection.unknown
        self.metrics.replayed_events += projection.applied
        self.projected = projection
        return projection.state

    async def reload(self, config: HubConfig | None = None) -> bool:
        """SIGHUP: each plugin re-reads its files (pins, peers, the serving
        policy, certificates), from `config` when the configuration file gave
        a new one (its changes are ones a running hub takes: the caller
        checked), else from the running configuration. A plugin that refuses
        (ValueError, OSError) keeps the running configuration and says why."""
        changed: dict = {}
        try:
            changed.update(self.identity.reload())
            for reload in self.installed.hooks("reload"):
                changed.update(reload(self, config or self.config))
        except (ValueError, OSError) as exc:
            self.refuse_reload(str(exc))
            return False
        if self.router is not None:  # the Router swaps it in its own task
            self.router.post_control(ConfigReloaded(self.config))
        self.metrics.reloads += 1
        log.info("configuration reloaded", **changed)
        return True

    def refuse_reload(self, reason: str) -> None:
        """A reload that cannot be applied: counted, logged, nothing changed."""
        self.metrics.reload_failures += 1
        log.error("reload refused; the running configuration is kept", reason=reason)

    def health_base(self) -> dict:
        """The /health facts that are not the Router's (hubd/handlers/status.py
        adds presence and the plugins' sections, inside the Router)."""
        document = {
            "status": OK,
            "reasons": [],
            "hub_id": self.hub_id,
            "version": f"hubd {__import__('hubd').__version__}",
            "protocol_version": PROTOCOL_VERSION,
            "uptime_seconds": round(time.time() - self.started, 3),
            "ready": self.ready,
            "journal_seq": self.writer.committed_seq,
            "journal_corrupt_rows": len(self.corrupt_rows),
            # events of kinds this hubd does not know (a newer hubd wrote them)
            "journal_unknown_events": self.unknown_kinds.events,
            "journal_unknown_kinds": self.unknown_kinds.names(),
            "identity": self.identity.summary(),
        }
        return judge(document, (journal_problems,))

    def _journal_failed(self, failure) -> None:
        if self.router is not None:
            self.router.post_control(failure)

    def track(self, task: asyncio.Task) -> None:
        """Keep a short task of some door or plugin (a mailbox replay, a log
        pull) until it ends; one that fails is logged and counted as a handler
        crash, not left for the garbage collector to mention."""
        self._background.add(task)
        task.add_done_callback(self._tracked_done)

    def _tracked_done(self, task: asyncio.Task) -> None:
        self._background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self.metrics.handler_crashes += 1
            log.error("background task failed", task=task.get_name(), exc_info=task.exception())

    # -- lifetime

    def bind_plugins(self) -> None:
        """Each plugin reads its configuration files (errors are ValueErrors)."""
        for bind in self.installed.hooks("bind"):
            bind(self)

    def listener_ssl(self):
        """The listener's TLS context, if a plugin serves TLS."""
        for listener_ssl in self.installed.hooks("listener_ssl"):
            context = listener_ssl()
            if context is not None:
                return context
        return None

    async def open(self) -> None:
        try:
            store = await self.writer.open()
        except JournalFileError as exc:  # says which file and what to do
            raise JournalRefused(str(exc)) from exc
        except (NotAHubdJournal, JournalTooNew, sqlite3.DatabaseError) as exc:
            raise JournalRefused(f"journal {self.config.db}: {exc}") from exc
        stored = await self.writer.call(store.get_meta, "hub_id")
        if stored and self.config.hub_id and stored != self.config.hub_id:
            raise JournalRefused(
                f"journal {self.config.db} belongs to hub '{stored}'; start with "
                f"--hub-id {stored} or use a new --db")
        self.hub_id = self.config.hub_id or stored or f"hubd-{secrets.token_hex(4)}"
        if stored != self.hub_id:
            await self.writer.call(store.set_meta, "hub_id", self.hub_id)
        try:
            chain_key = checkpoints.load_or_create_key(self.config.db)
        except (OwnerOnlyFileError, OSError) as exc:
            raise JournalRefused(f"journal {self.config.db}: {exc}") from exc
        await self.writer.call(store.start_signing, self.hub_id, chain_key,
                               self.config.checkpoint_events)
        await self.identity.open()
        self.snapshot_policy = policy_for(self.config.db, self.hub_id, self.fresh_state,
                                          self.config.snapshot_max_bytes)
        # a snapshot writer that died (with its hub) left its temporary file
        snapshots.remove_temporaries(self.snapshot_policy.directory)
        self.snapshotter = Snapshotter(self)

    async def replay(self) -> None:
        started = time.perf_counter()
        state = await self.load_state()
        self.router = Router(self, state)
        self.identity.router = self.router
        for restored in self.installed.hooks("restored"):
            restored(state)
        if self.corrupt_rows:
            self.router.refuse_permanently("journal recovery required")
            log.error("journal replay quarantined undecodable rows; mutations are refused",
                      rows=len(self.corrupt_rows), first_seq=self.corrupt_rows[0].seq)
        unknown = self.unknown_kinds
        if unknown.events:
            # a newer hubd wrote them: what they changed is missing from this
            # state, so deciding anything on it could contradict them
            self.router.refuse_permanently("the journal holds events this hubd does not know; "
                                           "run the hubd that wrote them")
            log.error("journal holds events of kinds this hubd does not know (a newer hubd "
                      "wrote them?); they are not applied and mutations are refused",
                      events=unknown.events, kinds=unknown.names(), first_seq=unknown.first_seq)
        self.metrics.gauge("hubd_journal_seq", "Last committed journal sequence.",
                           lambda: self.writer.committed_seq)
        self.metrics.gauge("hubd_connections", "Open WebSocket connections.",
                           lambda: len(self.router.presence.endpoints))
        self.metrics.gauge("hubd_online_agents", "Registered agent names online.",
                           lambda: len(self.router.presence.by_name))
        self.metrics.gauge("hubd_up", "1 while the hub serves.", lambda: 1)
        self.metrics.gauge("hubd_mutations_suspended",
                           "Principals whose changes are refused for now (one of their "
                           "commands made the hub rebuild its state).",
                           lambda: self.router.suspensions.live(time.time()))
        log.info("journal replayed", events=state.last_seq,
                 from_snapshot=self.projected.from_snapshot, applied=self.projected.applied,
                 seconds=round(time.perf_counter() - started, 3), hub_id=self.hub_id)

    async def open_doors(self) -> None:
        """After the replay: the plugins open what they serve on their own
        (OSError or ValueError: the hub must not start)."""
        for opening in self.installed.hooks("opening"):
            await opening(self)

    async def close_doors(self) -> None:
        for closing in self.installed.hooks("closing"):
            await closing()

    async def run(self) -> None:
        """Run the actors until stop() is called or one of them fails."""
        assert self.router is not None
        async with asyncio.TaskGroup() as group:
            group.create_task(self.writer.run(), name="journal-writer")
            group.create_task(self.router.run(), name="router")
            group.create_task(self._sweep(), name="sweeper")
            group.create_task(self.checkpointer.run(), name="wal-checkpoint")
            group.create_task(self.identity.run(), name="identity")
            group.create_task(self.snapshotter.run(), name="snapshotter")
            for start in self.installed.hooks("start"):
                start(self.router, group)
            self.ready = True
            await self._stopping.wait()
            self.ready = False
            await self._drain()
            raise _Stop()

    def stop(self) -> None:
        self._stopping.set()

    async def _drain(self) -> None:
        """On a clean stop, commit and release what the actors already hold."""
        timeout = self.config.timing.shutdown_drain
        done = asyncio.get_running_loop().create_future()
        try:
            await asyncio.wait_for(self.writer.inbox.put(Flush(done)), timeout)
            await asyncio.wait_for(done, timeout)
        except TimeoutError:
            log.warning("journal writer did not drain before shutdown")

    async def shutdown(self) -> None:
        """Close sockets, commit what is queued, close the journal."""
        self.ready = False
        # every door's open endpoints, registered or not (a peer hub's inbound
        # link, a socket that never sent its first frame): the listener's
        # cleanup would otherwise wait out its shutdown timeout for each
        for endpoint in self.endpoints:
            endpoint.close(CLOSE_GOING_AWAY, "hub shutting down")
        await self.checkpointer.close()
        await self.identity.close()
        await self.writer.close()
        if self._reader is not None:
            reader, self._reader = self._reader, None
            await asyncio.get_running_loop().run_in_executor(self._reader_thread, reader.close)
        self._reader_thread.shutdown(wait=True)

    async def _sweep(self) -> None:
        """Every timing.sweep: close endpoints whose writes cannot drain within
        timing.send_stall, and tick the Router (the plugins' periodic work:
        lease expiry and the like)."""
        loop = asyncio.get_running_loop()
        timing = self.config.timing
        while True:
            await asyncio.sleep(timing.sweep)
            now = loop.time()
            for endpoint in self.endpoints:  # the hub's table, not the Router's presence
                if endpoint.write_stalled_for(now) > timing.send_stall:
                    self.metrics.send_timeouts += 1
                    log.warning("write stalled; closing slow consumer", conn=endpoint.id)
                    endpoint.abort()
            await self.router.inbox.put(TICK)


def fresh_state(installed: Installed, config: HubConfig) -> HubState:
    """An empty projection of a hub with these plugins and this configuration."""
    return HubState.fresh(installed.appliers, installed.projections,
                          history_limit=config.max_history,
                          pending_receipts=config.pending_receipts)


class _Stop(Exception):
    """Raised inside the TaskGroup to cancel the actors on a clean stop."""

"""Router: owns the coordination state and decides what every command means.

The Router reads commands (hubd/core/commands.py) from one bounded queue,
hands each to the handler for its verb (hubd/handlers/), and collects the
resulting events and messages. It knows endpoints by id only: which door an
agent came through is the door's business (hubd/doors/).
Everything it drained in one go becomes one batch for the JournalWriter, which
commits it and only then releases the frames. Events are applied to the state
as they are made, with the same `apply` that replays the journal at start.

Recovery keeps the invariant "state is a projection of the journal"
(docs/architecture.md, "Router"):
- a command that fails leaves no trace: its events, replies and callbacks are
  dropped, and only its endpoint hears of it (an unexpected exception closes
  it 1011; an event that cannot be stored gets a typed error). The state is
  rebuilt from the journal only when the command had applied an event, once
  everything queued is committed, and the principal whose command it was may
  not change state for a while (hubd/state/suspensions.py), so no client can
  keep the hub replaying;
- a row SQLite refuses at commit fails its own command only (the writer
  keeps its seq with a journal_row_refused row), and the state is rebuilt
  the same way;
- a failed commit is answered by the writer with private errors, and the
  Router rebuilds from the journal before new events are accepted again.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import Callable

import structlog

from hubd.core.commands import WAKE, Call, Closed, Inbound, Opened, Wake
from hubd.core.message import CLOSE_INTERNAL, CloseEndpoint, Message
from hubd.state.events import Event, UnstorableEvent
from hubd.state.hub import HubState, apply
from hubd.state.presence import Presence, Session
from hubd.state.quota import IngressQuota
from hubd.state.suspensions import Suspensions
from hubd.wire import codec
from hubd.wire.envelope import BROADCAST, error_frame, frame_type, hub_frame

from . import sessions
from .journal_writer import JournalFailed, RowsRefused
from .outcome import Flush, Outcome, Resync

log = structlog.get_logger("hubd.router")

INBOX_COMMANDS = 4096
MAX_BATCH_COMMANDS = 2048

class MutationsRefused(Exception):
    """Raised by Router.event() when this command may not change state now;
    `message` tells its sender why (nothing was changed)."""

    error_code: str | None = None

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class JournalUnavailable(MutationsRefused):
    """The journal refuses writes (a failed commit's back-off, corrupt or
    unknown rows)."""

    def __init__(self, reason: str | None):
        super().__init__(f"The hub cannot write its journal right now ({reason}); nothing "
                         "was changed. Reads still work; retry later.")


class PrincipalSuspended(MutationsRefused):
    """A command of this principal made the hub rebuild its state a moment
    ago (hubd/state/suspensions.py)."""

    error_code = "mutations_suspended"

    def __init__(self, principal: str | None, seconds: float):
        who = f"principal {principal}" if principal is not None else "the hub's own work"
        super().__init__(f"The hub refuses changes from {who} for {seconds:.1f} s more: one of "
                         "its commands failed and made the hub rebuild its state. Nothing "
                         "was changed; reads still work.")


# what Router.event() raises to refuse a command, before anything is applied
REFUSALS = (MutationsRefused, UnstorableEvent)


class LazyError:
    """A private error message, built only if it is ever sent (most are not:
    they answer a failed commit)."""

    __slots__ = ("hub_id", "target", "text", "ts", "fields")

    def __init__(self, hub_id: str, target: str, text: str, ts: float, fields: dict):
        self.hub_id, self.target, self.text, self.ts, self.fields = hub_id, target, text, ts, fields

    def __call__(self) -> Message:
        return Message(error_frame(self.hub_id, self.target, self.text, self.ts, **self.fields))


class Router:
    def __init__(self, hub, state: HubState):
        self.hub = hub
        self.endpoints = hub.endpoints
        # the verbs and hooks of the hub's plugins (hubd/core/plugin.py)
        self.installed = installed = hub.installed
        self.handlers = installed.handlers
        # the plugins' own command types (hubd/core/plugin.py `commands`)
        self.commands = installed.commands
        self.config = hub.config
        self.hub_id: str = hub.hub_id
        self.metrics = hub.metrics
        self.state = state
        self.presence = Presence()
        self.quota = IngressQuota(self.config.quota)
        self.identity_changed()
        self.inbox: asyncio.Queue = asyncio.Queue(INBOX_COMMANDS)
        self._control: deque = deque()
        self._batch: list[Outcome] = []
        self._needs_rebuild = False
        # why the state is dirty and whose command made it so (None: the hub's own)
        self._dirty_reason = ""
        self._dirty_by: str | None = None
        # an event of the command being handled was applied (or its applier
        # started): if the command fails, the state may hold part of it
        self._applied = False
        self._applied_by: str | None = None
        self.suspensions = Suspensions()
        self._journal_failed = False
        # Why mutations are refused, if they are; a refusal after a failed
        # commit lifts at _refuse_until, one for corrupt rows never does.
        self.refusing_mutations: str | None = None
        self._refusal_permanent = False
        self._refuse_until = 0.0
        # After a failed commit, mutations are refused up front for this long
        # (doubling while failures repeat, timing.journal_retry_*), so a full
        # disk costs one state rebuild per backoff period rather than one per batch.
        self._backoff = self.config.timing.journal_retry_first
        self.now = 0.0
        self.out = Outcome()
        # the principal whose command is being handled: its events record it
        # (a door that decides inside a Call sets it for its caller)
        self.acting: str | None = None
        # Live, not journaled, bookkeeping of handler modules (like presence:
        # rebuilt by clients reconnecting), keyed by module-chosen names.
        self.live: dict = {}

    # -- the actor loop

    async def run(self) -> None:
        inbox = self.inbox
        while True:
            command = await inbox.get()
            await self._handle_control()
            self._dispatch(command)
            handled = 1
            # A round ends early when a handler failed mid-mutation (nothing
            # more is decided on a dirty state) or another actor has news
            # (a failed commit must be handled before the next decision).
            while handled < MAX_BATCH_COMMANDS and not self._needs_rebuild and not self._control:
                try:
                    command = inbox.get_nowait()
                except asyncio.QueueEmpty:
                    break
                self._dispatch(command)
                handled += 1
            await self._flush()
            if self._needs_rebuild:
                await self._rebuild_after_crash()
            await self._handle_control()

    async def _handle_control(self) -> None:
        while self._control:
            self._dispatch(self._control.popleft())
            await self._flush()
            if self._journal_failed:
                await self._recover_from_journal_failure()
            elif self._needs_rebuild:
                await self._rebuild_after_crash()

    def post_control(self, message) -> None:
        """For other actors on this loop (the writer, timers): never blocks.

        The control queue is drained after every inbox round, so it holds at
        most what arrived during one round; the wake-up goes into the inbox
        only when it is empty, so it can never find the inbox full.
        """
        self._control.append(message)
        if self.inbox.empty():
            self.inbox.put_nowait(WAKE)

    async def _flush(self) -> None:
        if self._batch:
            batch, self._batch = self._batch, []
            await self.hub.writer.inbox.put(batch)

    # -- dispatch

    def _dispatch(self, command) -> None:
        kind = type(command)
        self.now = time.time()
        self.out = Outcome()
        self._applied = False
        if kind is Inbound:
            endpoint = command.endpoint
            session = self.presence.sessions.get(endpoint)
            if session is not None:
                self.acting = session.principal
                self._safely(endpoint, self._inbound, session, command.frame, command.size)
                self.acting = None
        elif kind is Opened:
            self._safely(command.endpoint, self._opened, command)
        elif kind is Closed:
            self._safely(command.endpoint, self._closed, command.endpoint)
        elif kind is JournalFailed:
            self._journal_failed = True
        elif kind is RowsRefused:
            self._state_dirty("row_refused", command.principal)
        elif kind is Wake:
            pass
        elif kind in self.commands:
            self._safely(None, self.commands[kind], self, command)
        elif kind is Call:
            self._call(command)
        elif callable(command):
            self._safely(None, command, self)
        else:
            raise TypeError(f"router got an unknown command {command!r}")
        out = self.out  # a failed handler's outcome was replaced by an empty one
        if out.events or out.sends or out.after_release is not None:
            self._batch.append(out)

    def _call(self, command: Call) -> None:
        reply = command.reply
        try:
            result = self._safely(None, command.fn, self, reraise=reply is not None)
        except Exception as exc:  # logged and counted by _safely; the caller hears it
            if not reply.done():
                reply.set_exception(exc)
            return
        if reply is not None and not reply.done():
            reply.set_result(result)

    def _safely(self, endpoint: int | None, fn, *args, reraise: bool = False):
        """Run one handler. A refusal (MutationsRefused, UnstorableEvent)
        answers the session privately; an exception nobody expected closes
        only its endpoint (1011). Either way the command leaves no trace."""
        try:
            return fn(*args)
        except REFUSALS as refused:
            text = self.refuse_command(refused)
            session = args[0] if args and isinstance(args[0], Session) else None
            if session is not None:
                code = getattr(refused, "error_code", None)
                if code is None:
                    self.error(session, text)
                else:
                    self.error(session, text, error_code=code)
                self._batch.append(self.out)
                self.out = Outcome()
        except Exception:
            log.exception("handler failed; closing its endpoint", endpoint=endpoint,
                          state_rebuilt=self._applied)
            self.metrics.handler_crashes += 1
            self.abandon()
            if endpoint is not None:
                self.endpoints.close(endpoint, CLOSE_INTERNAL, "internal error")
            if reraise:
                raise

    def refuse_command(self, refused: MutationsRefused | UnstorableEvent) -> str:
        """Abandon the command being handled because event() refused it; the
        text that tells its sender why (doors with their own error shapes use
        it too)."""
        self.abandon()
        if isinstance(refused, MutationsRefused):
            return refused.message
        metrics = self.metrics
        metrics.unstorable_events += 1
        if metrics.unstorable_events % 1000 == 1:  # the metric counts them all
            log.warning("command refused: an event it made cannot be stored (logged once "
                        "per 1,000)", error=str(refused), total=metrics.unstorable_events)
        return f"This cannot be stored in the hub's journal ({refused}); nothing was changed."

    def abandon(self) -> None:
        """Drop everything the command being handled did so far: its events
        (if one was applied, the state is rebuilt from the journal before the
        next decision), its sends, failure replies and callbacks. What the
        handler queues after this is its answer."""
        if self._applied:
            self._state_dirty("handler_failure", self._applied_by)
            self._applied = False
        self.out = Outcome()

    def _state_dirty(self, reason: str, principal: str | None) -> None:
        if not self._needs_rebuild:
            self._dirty_reason, self._dirty_by = reason, principal
        self._needs_rebuild = True

    def _inbound(self, session: Session, frame: dict, size: int) -> None:
        if session.peer_hub is not None:
            self._from_peer(session, frame, size)
            return
        name = session.name
        sender = frame.get("sender") or name
        if name is None:
            for claim in self.installed.peer_claims:
                if claim(self, session, frame):
                    self._from_peer(session, frame, size)
                    return
            if not sessions.register(self, session, frame):
                return
        elif sender != name:
            sessions.refuse_name_switch(self, session, sender)
            return
        type_ = frame_type(frame)
        # consume-live evidence (docs/receipts.md): a keepalive proves only the socket
        session.last_heard = self.now
        if type_ != "heartbeat":
            session.last_reaction = self.now
        handler = self.handlers.get(type_)
        if handler is None:
            self.error(session, f"Unknown message type '{type_}'.")
            return
        handler(self, session, frame, size)
        out = self.out
        if out.events and not out.failure:
            self.fail_privately(session, f"The hub could not journal this {type_}; it was not "
                                         "applied. Retry later.")

    def _from_peer(self, session: Session, frame: dict, size: int) -> None:
        """A peer hub's link: its identity is its certificate, bound at its first frame."""
        sender = frame.get("sender") or session.peer_hub
        if sender != session.peer_hub:
            sessions.refuse_name_switch(self, session, sender)
            return
        type_ = frame_type(frame)
        if type_ in self.installed.peer_verbs:
            self.handlers[type_](self, session, frame, size)
        elif type_ != "heartbeat":
            self.send(session.endpoint, self.frame(
                "error", session.peer_hub,
                f"A peer hub link speaks hub-to-hub verbs only, not '{type_}'."))

    def _opened(self, command: Opened) -> None:
        sessions.opened(self, command)

    def _closed(self, endpoint: int) -> None:
        session = self.presence.close(endpoint)
        if session is None or session.name is None:
            return
        for hook in self.installed.on_unregister:
            hook(self, session)
        if self.presence.by_name.get(session.name) is None:
            sessions.announce_presence(self, "left", session.name)

    def identity_changed(self) -> None:
        """Once the hub has principals of its own, directed chats go only to
        their recipients (the reference's --team-secure forces this too)."""
        self.private_directed = (self.config.private_directed
                                 or self.hub.identity.table.enforcing)

    # -- the API handlers use

    def mutations_refused(self) -> bool:
        if self.refusing_mutations is None:
            return False
        if not self._refusal_permanent and self.now >= self._refuse_until:
            self.refusing_mutations = None  # try the journal again
            return False
        return True

    def event(self, kind: str, payload: dict, route: dict | None = None,
              payload_text: bytes | None = None, ts: float | None = None) -> Event:
        """Make the next event, apply it, and attach it to this command's outcome.

        Raises, before anything is applied: JournalUnavailable while the
        journal refuses writes, PrincipalSuspended while the acting principal
        may not change state, UnstorableEvent if the event cannot be a
        journal row."""
        if self.refusing_mutations is not None and self.mutations_refused():
            raise JournalUnavailable(self.refusing_mutations)
        acting = self.acting
        if self.suspensions.entries:
            until = self.suspensions.refused_until(acting, self.now)
            if until is not None:
                raise PrincipalSuspended(acting, until - self.now)
        if kind not in self.state.appliers:
            raise ValueError(f"event kind {kind!r} is not declared by any installed plugin "
                             "(Appliers.applies or .records): a replay would not know it")
        event = Event(self.state.last_seq + 1, self.now if ts is None else ts, kind, payload,
                      route, payload_text, acting)
        event.row()  # made now, so a row SQLite cannot store fails here, before apply
        if not self._applied:
            self._applied, self._applied_by = True, acting
        apply(self.state, event)
        self.out.events.append(event)
        return event

    def next_seq(self) -> int:
        return self.state.last_seq + 1

    def frame(self, type_: str, target: str, payload, **fields) -> dict:
        return hub_frame(self.hub_id, type_, target, payload, self.now, **fields)

    def send(self, dest, frame: dict) -> None:
        """Queue a frame to one endpoint id (or a tuple of them) for release.
        It is encoded now: the frame may be changed after this call."""
        self.out.sends.append((dest, Message(frame, codec.encode(frame)), frame["type"]))

    def sends_queued(self) -> int:
        """How many sends this command has queued so far (a mark for send_ahead)."""
        return len(self.out.sends)

    def send_ahead(self, mark: int, dest, frame: dict) -> None:
        """As send, but the frame goes out before the sends this command
        queued since sends_queued() said `mark`."""
        self.out.sends.insert(mark, (dest, Message(frame, codec.encode(frame)), frame["type"]))

    def send_message(self, dest, message: Message) -> None:
        """Queue a message that is already built (a chat, encoded once for the
        journal and every recipient)."""
        self.out.sends.append((dest, message, message.type))

    def send_on_failure(self, dest, type_: str, build: Callable[[], dict]) -> None:
        """The frame `build` makes goes to dest instead of this command's
        sends if its events cannot be committed (built only then)."""
        def message() -> Message:
            frame = build()
            return Message(frame, codec.encode(frame))
        self.out.failure.append((dest, message, type_))

    def reply(self, session: Session, type_: str, payload, **fields) -> None:
        self.send(session.endpoint, self.frame(type_, session.name or BROADCAST, payload,
                                               **fields))

    def broadcast(self, frame: dict) -> None:
        if self.presence.endpoints:
            self.send(self.presence.endpoints, frame)

    def error(self, session: Session, text: str, **fields) -> None:
        self.send(session.endpoint, error_frame(self.hub_id, session.name or BROADCAST, text,
                                                self.now, **fields))

    def fail_privately(self, session: Session, text: str, **fields) -> None:
        """The reply if this command's events cannot be committed (built only then)."""
        self.out.failure.append((session.endpoint, LazyError(
            self.hub_id, session.name or BROADCAST, text, self.now, fields), "error"))

    def close(self, endpoint: int, code: int, reason: str) -> None:
        self.out.sends.append((endpoint, CloseEndpoint(code, reason), "close"))

    def after_release(self, fn: Callable[[], None]) -> None:
        previous = self.out.after_release
        if previous is None:
            self.out.after_release = fn
        else:
            def both():
                previous()
                fn()
            self.out.after_release = both

    # -- recovery

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

    def journal_committed(self) -> None:
        """A commit succeeded: a later failure starts from the short backoff."""
        self._backoff = self.config.timing.journal_retry_first

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

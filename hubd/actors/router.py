"""Router: owns the coordination state and decides what every command means.

The Router reads commands (hubd/core/commands.py) from one bounded queue and
dispatches each on its type through one table: its own (the tick, its
timers, a reload), and the installed plugins' (hub-wire frames go to the
verb named by their type; the shared verbs to the dialect of the endpoint's
door; a plugin's own commands to its handlers). It knows endpoints by id
only: which door an agent came through is the door's business (hubd/doors/).
Everything it drained in one go becomes one batch for the JournalWriter,
which commits it and only then releases the output. Events are applied to the
state as they are made, with the same `apply` that replays the journal at
start. Nothing outside this actor reads or writes its state: doors and other
actors post commands; the probes ask with a Request.

A command that fails leaves no trace: its events, output and answers are
dropped, and only its endpoint hears of it (an unexpected exception closes
it 1011, or fails its reply future; an event that cannot be stored gets a
typed error). How the state gets back to a projection of the journal after a
failed command or commit is hubd/actors/recovery.py.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import Callable, TypeVar

import structlog

from hubd.core.commands import TIMERS_DUE, WAKE, ConfigReloaded, Inbound, Tick, TimersDue
from hubd.core.message import CLOSE_INTERNAL, CloseEndpoint, Message
from hubd.core.refusals import (REFUSALS, JournalUnavailable, MutationsRefused,
                                PrincipalSuspended)
from hubd.state.events import Event, UnstorableEvent
from hubd.state.hub import HubState, apply
from hubd.state.presence import Presence, Session
from hubd.state.quota import IngressQuota
from hubd.state.suspensions import Suspensions
from hubd.wire import codec
from hubd.wire.envelope import BROADCAST, error_frame, frame_type, hub_frame

from .journal_writer import JournalFailed, Outcome, RowsRefused
from .recovery import Recovery
from .timers import TimerHeap

log = structlog.get_logger("hubd.router")

T = TypeVar("T")

INBOX_COMMANDS = 4096
MAX_BATCH_COMMANDS = 2048

class LazyError:
    """A private error message, built only if it is ever sent (most are not:
    they answer a failed commit)."""

    __slots__ = ("hub_id", "target", "text", "ts", "fields")

    def __init__(self, hub_id: str, target: str, text: str, ts: float, fields: dict):
        self.hub_id, self.target, self.text, self.ts, self.fields = hub_id, target, text, ts, fields

    def __call__(self) -> Message:
        return Message(error_frame(self.hub_id, self.target, self.text, self.ts, **self.fields))


class Router(Recovery):
    def __init__(self, hub, state: HubState):
        self.hub = hub
        self.endpoints = hub.endpoints
        # the verbs and hooks of the hub's plugins (hubd/core/plugin.py)
        self.installed = installed = hub.installed
        # hub-wire verbs (Inbound frames) and Request verbs, by name
        self.handlers = installed.handlers
        # checks a frame passes before its verb (per-message auth, the ACL)
        self._frame_gates = installed.frame_gates
        self.requests = installed.requests
        # the hub wire's session rules (the core's: hubd/handlers/sessions.py)
        self._sessions = installed.sessions
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
        # (a handler that decides for a door's caller sets it for its caller)
        self.acting: str | None = None
        self._timers = TimerHeap()
        self._alarm: asyncio.TimerHandle | None = None
        self._alarm_at: float | None = None
        # the one dispatch table: command type -> fn(router, command)
        self._table: dict[type, Callable] = {
            Tick: Router._tick, TimersDue: Router._timers_due,
            ConfigReloaded: Router._config_reloaded,
            JournalFailed: Router._commit_failed, RowsRefused: Router._rows_refused,
            **installed.commands}
        # live (not journaled) bookkeeping of the plugins, one typed home each
        # (like presence: gone with the process, rebuilt by clients returning)
        self._live = {cls: cls(self) for cls in installed.live}

    # -- the actor loop

    async def run(self) -> None:
        inbox = self.inbox
        while True:
            command = await inbox.get()
            await self._handle_control()
            if command is not WAKE:  # a wake-up only brings the control queue in
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
                if command is not WAKE:
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
        if kind is Inbound:  # the hot path
            endpoint = command.endpoint
            session = self.presence.sessions.get(endpoint)
            if session is not None:
                self.acting = session.principal
                self._safely(endpoint, self.inbound, session, command.frame, command.size)
                self.acting = None
        else:
            handler = self._table.get(kind)
            if handler is None:
                raise TypeError(f"router got an unknown command {command!r}")
            self._command(handler, command)
        self._keep()

    def _keep(self) -> None:
        """End of one command: its outcome joins the round's batch. Answers of
        a command that changed nothing need no commit: they are given now."""
        out = self.out  # a failed handler's outcome was replaced by an empty one
        if not out.events and out.answers:
            for future, value in out.answers:
                if not future.done():
                    future.set_result(value)
            out.answers = []
        if out.events or out.sends or out.after_release is not None:
            self._batch.append(out)

    def _command(self, handler, command) -> None:
        """Run one command that is not a hub-wire frame. A command with a
        reply future hears a refusal or a failure through it; one naming an
        endpoint without a future has that endpoint closed (1011) on a failure."""
        try:
            handler(self, command)
        except REFUSALS as refused:
            text = self.refuse_command(refused)
            reply = getattr(command, "reply", None)
            if reply is not None and not reply.done():
                reply.set_exception(refused)
            else:
                session = self.presence.sessions.get(getattr(command, "endpoint", None))
                if session is not None:
                    self._refused_privately(session, refused, text)
        except Exception as exc:
            reply = getattr(command, "reply", None)
            endpoint = getattr(command, "endpoint", None) if reply is None else None
            self._failed(endpoint)
            if reply is not None and not reply.done():
                reply.set_exception(exc)

    def _safely(self, endpoint: int | None, fn, *args):
        """Run one hub-wire handler. A refusal (MutationsRefused, UnstorableEvent)
        answers the session privately; an exception nobody expected closes
        only its endpoint (1011). Either way the command leaves no trace."""
        try:
            return fn(*args)
        except REFUSALS as refused:
            text = self.refuse_command(refused)
            session = args[0] if args and isinstance(args[0], Session) else None
            if session is not None:
                self._refused_privately(session, refused, text)
        except Exception:
            self._failed(endpoint)

    def _refused_privately(self, session: Session, refused, text: str) -> None:
        code = getattr(refused, "error_code", None)
        if code is None:
            self.error(session, text)
        else:
            self.error(session, text, error_code=code)
        self._batch.append(self.out)
        self.out = Outcome()

    def _failed(self, endpoint: int | None) -> None:
        log.exception("handler failed; closing its endpoint", endpoint=endpoint,
                      state_rebuilt=self._applied)
        self.metrics.handler_crashes += 1
        self.abandon()
        if endpoint is not None:
            self.endpoints.close(endpoint, CLOSE_INTERNAL, "internal error")

    def _isolated(self, handler, command) -> None:
        """Run a command as if it came alone (a timer, one periodic hook): its
        own outcome, its own failure. (What the command that runs these
        queues itself is dropped: they are all it does.)"""
        self.now = time.time()
        self.out = Outcome()
        self._applied = False
        self._command(handler, command)
        self._keep()
        self.out = Outcome()

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
        next decision), its sends, failure replies, answers and callbacks. What
        the handler queues after this is its answer."""
        if self._applied:
            self._state_dirty("handler_failure", self._applied_by)
            self._applied = False
        self.out = Outcome()

    def _state_dirty(self, reason: str, principal: str | None) -> None:
        if not self._needs_rebuild:
            self._dirty_reason, self._dirty_by = reason, principal
        self._needs_rebuild = True

    # -- the Router's own commands

    def _commit_failed(self, command: JournalFailed) -> None:
        self._journal_failed = True
        if command.recovered:  # a commit succeeded since: the back-off starts short
            self._backoff = self.config.timing.journal_retry_first

    def _rows_refused(self, command: RowsRefused) -> None:
        self._state_dirty("row_refused", command.principal)

    def _tick(self, command: Tick) -> None:
        """Once a second: each plugin's periodic work, each as its own command."""
        for hook in self.installed.periodic:
            self._isolated(_periodic, hook)

    def _timers_due(self, command: TimersDue) -> None:
        self._alarm = self._alarm_at = None
        for due in self._timers.due(time.time()):
            self._isolated(self._table[type(due)], due)
        self._arm()

    def _config_reloaded(self, command: ConfigReloaded) -> None:
        self.config = command.config

    def inbound(self, session: Session, frame: dict, size: int) -> None:
        """One hub-wire frame from a session (the first one registers it)."""
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
            if not self._sessions.register(self, session, frame):
                return
        elif sender != name:
            self._sessions.refuse_name_switch(self, session, sender)
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
        for gate in self._frame_gates:
            if gate(self, session, frame, type_):
                return
        handler(self, session, frame, size)
        out = self.out
        if out.events and not out.failure and out.if_failed is None:
            self.fail_privately(session, f"The hub could not journal this {type_}; it was not "
                                         "applied. Retry later.")

    def _from_peer(self, session: Session, frame: dict, size: int) -> None:
        """A peer hub's link: its identity is its certificate, bound at its first frame."""
        sender = frame.get("sender") or session.peer_hub
        if sender != session.peer_hub:
            self._sessions.refuse_name_switch(self, session, sender)
            return
        type_ = frame_type(frame)
        if type_ in self.installed.peer_verbs:
            self.handlers[type_](self, session, frame, size)
        elif type_ != "heartbeat":
            self.send(session.endpoint, self.frame(
                "error", session.peer_hub,
                f"A peer hub link speaks hub-to-hub verbs only, not '{type_}'."))

    def identity_changed(self) -> None:
        """Once the hub has principals of its own, directed chats go only to
        their recipients (the reference's --team-secure forces this too)."""
        self.private_directed = (self.config.private_directed
                                 or self.hub.identity.table.enforcing)

    # -- live bookkeeping and timers

    def live_of(self, cls: type[T]) -> T:
        """A plugin's live bookkeeping (declared in its Plugin.live)."""
        return self._live[cls]

    def at(self, when: float, command) -> int:
        """Dispatch `command` (a type in the dispatch table) once the hub's
        clock reaches `when`; the key cancels it."""
        key = self._timers.push(when, command)
        if self._alarm_at is None or when < self._alarm_at:
            self._arm()
        return key

    def cancel_timer(self, key: int | None) -> None:
        self._timers.cancel(key)

    def _arm(self) -> None:
        """One loop alarm, for the earliest timer: it wakes this actor with a
        message (TimersDue), it runs nothing itself."""
        when = self._timers.next_at()
        if when == self._alarm_at:
            return
        if self._alarm is not None:
            self._alarm.cancel()
        self._alarm = self._alarm_at = None
        if when is not None:
            loop = asyncio.get_running_loop()
            self._alarm_at = when
            self._alarm = loop.call_at(loop.time() + max(0.0, when - time.time()),
                                       self.post_control, TIMERS_DUE)

    # -- the API handlers use: state

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

    def has_events(self) -> bool:
        """Did the command being handled make events (so its answers wait for a commit)?"""
        return bool(self.out.events)

    # -- the API handlers use: output, one way per kind. Everything here
    # leaves the hub only after the command's events are committed; nothing
    # outside hubd/actors touches an Outcome.

    def frame(self, type_: str, target: str, payload, **fields) -> dict:
        return hub_frame(self.hub_id, type_, target, payload, self.now, **fields)

    def send(self, dest, item: dict | Message, kind: str | None = None,
             ahead_of: int | None = None) -> None:
        """Queue a frame (a dict: encoded now, so it may be changed after this
        call) or a built Message (a chat, encoded once for the journal and
        every recipient) to one endpoint id or a tuple of them. `kind` names
        it on /metrics (default: its type); `ahead_of` (a mark from
        sends_queued) puts it before what this command queued since then."""
        if type(item) is dict:
            message = Message(item, codec.encode(item))
            entry = (dest, message, kind or item["type"])
        else:
            entry = (dest, item, kind or item.type)
        if ahead_of is None:
            self.out.sends.append(entry)
        else:
            self.out.sends.insert(ahead_of, entry)

    def sends_queued(self) -> int:
        """How many sends this command has queued so far (a mark for ahead_of
        and withdraw)."""
        return len(self.out.sends)

    def withdraw(self, dest, mark: int) -> list[Message]:
        """Take back what this command queued for `dest` since `mark`, oldest
        first (a verb served for a requester that is not an endpoint: its
        answer travels inside another answer)."""
        sends = self.out.sends
        kept, taken = sends[:mark], []
        for entry in sends[mark:]:
            (taken if entry[0] == dest else kept).append(entry)
        self.out.sends = kept
        return [item for _, item, _ in taken]

    def send_on_failure(self, dest, kind: str, build: Callable[[], dict | Message]) -> None:
        """What `build` makes (a frame or a Message) goes to dest instead of
        this command's sends if its events cannot be committed (built only then)."""
        def message() -> Message:
            item = build()
            return item if type(item) is Message else Message(item, codec.encode(item))
        self.out.failure.append((dest, message, kind))

    def fail_privately(self, session: Session, text: str, **fields) -> None:
        """The error if this command's events cannot be committed (built only then)."""
        self.out.failure.append((session.endpoint, LazyError(
            self.hub_id, session.name or BROADCAST, text, self.now, fields), "error"))

    def answer(self, reply: asyncio.Future | None, value) -> None:
        """A door's reply future gets `value`: at once if this command changed
        nothing, else once its events are committed (CommitFailed if not)."""
        if reply is not None:
            self.out.answers.append((reply, value))

    def close(self, endpoint: int, code: int, reason: str) -> None:
        """Close the endpoint once what was queued for it before is out."""
        self.out.sends.append((endpoint, CloseEndpoint(code, reason), "close"))

    def after_release(self, fn: Callable[[], None]) -> None:
        """Run fn once this command's sends are on their endpoints (not if its
        events failed to commit): for work that may only start then."""
        previous = self.out.after_release
        if previous is None:
            self.out.after_release = fn
        else:
            def both():
                previous()
                fn()
            self.out.after_release = both

    def if_not_committed(self, fn: Callable[[], None]) -> None:
        """Run fn if this command's events cannot be committed (instead of
        after_release's work): for work started outside the Router, which
        must hear that the command failed; fn answers the sender itself."""
        self.out.if_failed = fn

    # conveniences over send

    def reply(self, session: Session, type_: str, payload, **fields) -> None:
        self.send(session.endpoint, self.frame(type_, session.name or BROADCAST, payload,
                                               **fields))

    def broadcast(self, frame: dict) -> None:
        if self.presence.endpoints:
            self.send(self.presence.endpoints, frame)

    def error(self, session: Session, text: str, **fields) -> None:
        self.send(session.endpoint, error_frame(self.hub_id, session.name or BROADCAST, text,
                                                self.now, **fields))


def _periodic(router: Router, hook) -> None:
    hook(router)


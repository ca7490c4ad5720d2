"""PeerLink: the actor that owns one persistent, pinned (m)TLS WebSocket to one peer hub.

The link registers under this hub's id, then carries many requests at once.
Nothing is sent before the peer's certificate has matched one of its pins;
connecting and the welcome are bounded, so a peer that accepts TCP and then
hangs costs this hub one idle dial, never a blocked sender.

Its inbox is one bounded queue of messages to write: `Send` (a frame nobody
waits an answer for: the outbox's forwards) and `Ask` (a frame and the future
its answer goes to). Posting never blocks: a link that is down, or an inbox
at its bound, refuses at once (an Ask's future fails with the reason). One
writer loop takes the inbox in order, registers each Ask's future with the
correlation table just before its frame is written, and writes; a write that
has not completed within timing.link_write_stall (a peer that stopped reading)
cuts the link, as the WebSocket door cuts a slow consumer. Answers are read
and correlated in the link's own reader task (Answers, below);
forward results nobody waits for go to the subscribers. When the connection
ends, whatever waited (queued or in flight) hears LinkError at once, and the
subscribers are told the link went down.

Dead links are found by the link itself (federation/liveness.py): it pings
every timing.link_ping, counts anything the peer sends as life, and closes a
link silent past timing.link_silence, then redials with jittered backoff. A sign
of life from the peer elsewhere (wake()) skips the remaining backoff. All of
its timers read the injected clock (federation/clock.py); the socket is
whatever its dialer opens (federation/actors/link_socket.py, or an in-memory
pair in the actor tests).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import deque
from functools import partial
from typing import Callable, NamedTuple

import structlog

from federation import liveness, versions
from federation.actors.link_socket import (AUTH, BINARY, BUSY, CLOSED, PIN_MISMATCH, PING, PONG,
                                           REFUSED, SILENT, STALLED, TEXT, TIMEOUT, Connection,
                                           LinkError, SocketDialer)
from federation.clock import SYSTEM, wait_for
from federation.config import PeerRoute
from federation.pins import describe_certificate, pin_mismatch_detail
from hubd.timing import Timing
from hubd.wire import codec
from hubd.wire.envelope import PROTOCOL_VERSION, strict_int

log = structlog.get_logger("hubd.federation.link")

# what a peer sends unasked, and what this hub lists in its registering
# heartbeat (a reference hub ignores it): federation/delivery_notice_rules.py
PUSHED, LINK_FEATURES = frozenset({"multihub_delivery_notices"}), ["delivery_notices"]

INBOX = 4096  # messages waiting to be written (the outbox keeps at most 1,024 in flight)
LOG_REPEAT = 60.0  # a link failing the same way is logged once a minute


# -- what others post to the link


class Send(NamedTuple):
    """Write `frame`; its answer, if any, goes to the subscribers' on_result."""

    frame: dict


class Ask(NamedTuple):
    """Write `frame`; its answer (matched by `key`, or in order by
    `reply_type`) or the link's failure goes to `reply`."""

    frame: dict
    key: str | None
    reply_type: str | None
    reply: asyncio.Future


_PING, _PONG, _CLOSE = object(), object(), object()  # the link's own writes


class Answers:
    """Where a peer's answers go: the link's correlation table, consulted
    only in its reader task. A request waits on the future of its Ask,
    matched by the id the answer echoes (a forward_id or request_id) or in
    order when the answer echoes none (log snapshots; the reference hub's
    claim results). A waiter leaves the table however its future ends
    (answered, failed when the link went down, cancelled by an asker that gave
    up), so one that gave up is skipped, never handed an answer meant for the
    next. Forward results nobody waits for (the outbox's) go to on_result."""

    def __init__(self, peer: str, on_result: Callable[[str, dict], None],
                 on_rejected: Callable[[str, str], None],
                 on_push: Callable[[str, dict], None] = lambda peer, frame: None):
        self.peer = peer
        self.on_result, self.on_rejected, self.on_push = on_result, on_rejected, on_push
        self._by_key: dict[str, asyncio.Future] = {}  # answers that echo an id
        self._in_order: dict[str, deque] = {}  # reply type -> waiters, for answers without one
        # reply type -> keyed waiters that also take an answer echoing no id
        self._keyed_in_order: dict[str, deque] = {}

    def __len__(self) -> int:
        return len(self._by_key) + sum(len(w) for w in self._in_order.values())

    def expect(self, reply: asyncio.Future, key: str | None, reply_type: str | None) -> None:
        """`reply` waits for the answer echoing `key`, or with no key the
        next answer of `reply_type`. With both, an answer of that type that
        echoes no id at all (the reference hub's multihub_claim_result) is
        matched in order among such waiters."""
        if key is None:
            self._in_order.setdefault(reply_type, deque()).append(reply)
        else:
            self._by_key[key] = reply
            if reply_type is not None:
                self._keyed_in_order.setdefault(reply_type, deque()).append(reply)
        reply.add_done_callback(partial(self._forget, key, reply_type))

    def _forget(self, key: str | None, reply_type: str | None, reply: asyncio.Future) -> None:
        if key is not None and self._by_key.get(key) is reply:
            del self._by_key[key]
        table = self._in_order if key is None else self._keyed_in_order
        waiting = table.get(reply_type)
        if waiting and reply in waiting:
            waiting.remove(reply)

    def route(self, frame: dict) -> None:
        kind = frame.get("type")
        if kind == "multihub_message_result_batch":
            results = frame.get("results")
            if isinstance(results, list):
                for result in results:
                    if isinstance(result, dict):
                        self.on_result(self.peer, result)
        elif kind == "multihub_message_result":
            waiter = self._by_key.get(frame.get("forward_id"))
            if waiter is None:
                self.on_result(self.peer, frame)
            else:
                _answer(waiter, frame)
        elif kind in ("multihub_log_snapshot", "multihub_claim_result"):
            rid = frame.get("request_id")
            if isinstance(rid, str):
                # only the request it names (never another keyed one: a late
                # answer to a request that gave up must not answer the next)
                waiter = self._by_key.get(rid)
            else:
                waiter = _first_live(self._keyed_in_order.get(kind))
            if waiter is None:
                waiter = _first_live(self._in_order.get(kind))
            if waiter is not None:
                _answer(waiter, frame)
        elif kind in PUSHED:
            self.on_push(self.peer, frame)  # asked by nobody: the peer's own news
        elif kind == "error":
            text = str(frame.get("payload", ""))
            if "'multihub_message_forward'" in text:
                # A hub older than wire v5 does not know the verb at all.
                self.on_rejected(self.peer, text)
            else:
                log.warning("peer sent an error", peer=self.peer, error=text)
        else:
            # any other answer a request waits for in order by its type (a
            # cross-hub attachment read's attachment_peer_result)
            waiter = _first_live(self._in_order.get(kind))
            if waiter is not None:
                _answer(waiter, frame)

    def fail_all(self, error: Exception) -> None:
        """The link went down: every waiting request hears it."""
        waiters = list(self._by_key.values())
        for waiting in self._in_order.values():
            waiters.extend(waiting)
        for waiter in waiters:
            if not waiter.done():
                waiter.set_exception(error)


def _first_live(waiting: deque | None) -> asyncio.Future | None:
    while waiting:
        waiter = waiting[0]
        if not waiter.done():
            return waiter
        waiting.popleft()  # gave up; its done callback may not have run yet
    return None


def _answer(waiter: asyncio.Future, frame: dict) -> None:
    if not waiter.done():
        waiter.set_result(frame)


class PeerLink:
    def __init__(self, route: PeerRoute, hub_id: str, ssl_context, timing: Timing, *,
                 on_up: Callable[[str], None] = lambda peer: None,
                 on_down: Callable[[str, str], None] = lambda peer, cause: None,
                 on_result: Callable[[str, dict], None] = lambda peer, frame: None,
                 on_rejected: Callable[[str, str], None] = lambda peer, text: None,
                 on_push: Callable[[str, dict], None] = lambda peer, frame: None,
                 clock=SYSTEM, dialer=None, inbox: int = INBOX):
        self.route = route
        self.peer = route.hub_id
        self.hub_id = hub_id
        self._ssl = ssl_context
        self.timing = timing
        self.clock = clock
        self._dialer = dialer
        self._on_up, self._on_down = on_up, on_down
        self.answers = Answers(self.peer, on_result, on_rejected, on_push)
        # the inbox: (Send | Ask | one of the link's own writes, data)
        self._inbox: deque = deque()
        self.inbox_bound = inbox
        self._writable = asyncio.Event()
        self._ping_queued = False
        self._pong_queued: list | None = None  # [data]: one pong waits, answering the latest
        self._write_started: float | None = None  # clock time the write in progress began
        self._conn: Connection | None = None
        self._cut: tuple[str, str] | None = None  # why the link itself ended the connection
        self.up = False
        self.up_since: float | None = None  # clock (monotonic) time the link came up
        self.last_error: dict | None = None
        self.peer_protocol_version: int | None = None
        # the lowest common wire version, from the last welcome (federation/versions.py)
        self.versions = versions.LinkVersions(self.peer, PROTOCOL_VERSION)
        self.batching = False  # the peer is a hubd that takes batched forwards
        # the hubd extensions the peer's welcome listed; None: the peer is not
        # a hubd (it listed none), so only its protocol_version speaks for it
        self.features: frozenset | None = None
        self.clock_skew: float | None = None
        self.connects = 0
        self.connecting = False
        self.silence_closes = 0  # links closed because the peer fell silent
        self.stall_closes = 0  # links cut because a write did not complete in time
        self.refused_busy = 0  # posts refused at the inbox bound
        self.up_at: float | None = None  # wall time the link last came up
        self.last_inbound: float | None = None  # wall time anything last came from the peer
        self._last_heard = 0.0  # clock time, on this link
        self._wake = asyncio.Event()
        self._logged_at = 0.0
        self._busy_logged_at = 0.0
        self._stop = False

    # -- the inbox (other tasks on this loop; never blocks)

    def post(self, message: Send | Ask) -> bool:
        """Queue a message for the writer. False (an Ask's future failed with
        the reason) when the link is down or the inbox is at its bound."""
        if not self.up:
            why = LinkError(CLOSED, self._down_detail())
        elif len(self._inbox) >= self.inbox_bound:
            self.refused_busy += 1
            now = time.time()
            if now - self._busy_logged_at > LOG_REPEAT:
                self._busy_logged_at = now
                log.warning("peer link inbox full; refusing until the writer catches up",
                            peer=self.peer, bound=self.inbox_bound, refused=self.refused_busy)
            why = LinkError(BUSY, f"{self.inbox_bound} messages to {self.peer} are already "
                                  "waiting to be written")
        else:
            self._inbox.append(message)
            self._writable.set()
            return True
        if type(message) is Ask and not message.reply.done():
            message.reply.set_exception(why)
        return False

    def send(self, frame: dict) -> bool:
        return self.post(Send(frame))

    async def request(self, frame: dict, timeout: float | None, *, key: str | None = None,
                      reply_type: str | None = None) -> dict:
        """Post an Ask and wait for its answer; LinkError when the link cannot
        carry it or the peer does not answer within `timeout` of the clock."""
        if not self.up:
            raise LinkError(CLOSED, self._down_detail())
        reply = asyncio.get_running_loop().create_future()
        self.post(Ask(frame, key, reply_type, reply))
        try:
            if timeout is None:
                return await reply
            return await wait_for(self.clock, reply, timeout)
        except TimeoutError as exc:
            raise LinkError(TIMEOUT, f"no answer from {self.peer} within {timeout:g}s") from exc
        finally:
            if not reply.done():
                reply.cancel()  # the waiter leaves the correlation table

    # -- signals (never queued behind the inbox)

    def wake(self) -> None:
        """The peer showed life elsewhere (its inbound link, a forward, a log
        pull): skip what is left of the reconnect backoff; if the link is up,
        ping now, so a link that died unnoticed is found sooner."""
        self.last_inbound = time.time()
        self._wake.set()
        if self.up and self.clock.monotonic() - self._last_heard > self.timing.link_ping:
            self._queue_ping()

    def reroute(self, route: PeerRoute, ssl_context) -> None:
        """Take new pins/URI/token; a live connection that fails the new pins is closed."""
        self.route = route
        self._ssl = ssl_context
        conn = self._conn
        if conn is not None and route.pins is not None:
            der = conn.certificate_der()
            if der is None or not route.pins.matches(der):
                log.warning("peer certificate no longer matches its pins; closing the link",
                            peer=self.peer, presented=describe_certificate(der))
                self._end(conn, PIN_MISMATCH, pin_mismatch_detail(self.peer, route, der,
                                                                  "the reloaded pins"))

    def stop(self) -> None:
        self._stop = True
        self._wake.set()
        if self._conn is not None:
            self._end(self._conn, CLOSED, "this hub stopped the link")

    # -- the actor

    @property
    def state(self) -> str:
        if self.up:
            return liveness.UP
        return liveness.CONNECTING if self.connecting else liveness.DOWN

    async def run(self) -> None:
        backoff = self.timing.link_backoff_first
        async with (self._dialer or SocketDialer(self.timing)) as dialer:
            while not self._stop:
                self._wake.clear()
                try:
                    await self._connect_and_serve(dialer)
                except LinkError as exc:
                    self._record_error(exc.cause, exc.detail)
                finally:
                    up_for = self.clock.monotonic() - self.up_since if self.up_since else None
                    self._went_down()
                backoff = liveness.next_backoff(backoff, up_for, self.timing)
                if self._wake.is_set() or self._stop:
                    continue  # the peer is alive: redial now
                try:
                    await wait_for(self.clock, self._wake.wait(),
                                   liveness.jittered(backoff, random.random()))
                except TimeoutError:
                    pass

    async def _connect_and_serve(self, dialer) -> None:
        route = self.route
        self.connecting = True
        self._cut = None
        conn = None
        try:
            try:
                async with self.clock.timeout(self.timing.link_connect):
                    conn = await dialer.dial(route, self._ssl)
                    self.connecting = False
                    welcome = await self._handshake(conn, route)
            except TimeoutError as exc:
                raise LinkError(TIMEOUT, "connect or welcome timed out") from exc
            finally:
                self.connecting = False
            if self._stop:
                raise LinkError(CLOSED, "this hub stopped the link")
            self._came_up(conn, welcome)
            await self._serve(conn)
        finally:
            if conn is not None:
                await conn.close(1000, b"")

    async def _handshake(self, conn: Connection, route: PeerRoute) -> dict:
        if route.pins is not None:
            der = conn.certificate_der()
            if der is None or not route.pins.matches(der):
                raise LinkError(PIN_MISMATCH, pin_mismatch_detail(self.peer, route, der,
                                                                  "its pins"))
        register = {"sender": self.hub_id, "target": "System", "type": "heartbeat",
                    "payload": "online", "protocol_version": PROTOCOL_VERSION,
                    "hubd_features": LINK_FEATURES}
        if route.token:
            register["token"] = route.token
        try:
            await conn.send_text(codec.encode(register))
        except ConnectionError as exc:
            raise LinkError(CLOSED, f"{self.peer} closed the link before its welcome") from exc
        while True:
            message = await conn.receive()
            kind = message.type
            if kind is PING or kind is PONG:
                continue
            if kind is not TEXT and kind is not BINARY:
                break
            frame = codec.decode_frame(message.data)
            if isinstance(frame, dict):
                kind = frame.get("type")
                if kind == "welcome":
                    return frame
                if kind in ("auth_denied", "name_conflict"):
                    raise LinkError(AUTH if kind == "auth_denied" else REFUSED,
                                    f"{self.peer} refused the link: {frame.get('payload')}")
        raise LinkError(CLOSED, f"{self.peer} closed the link before its welcome "
                                f"(close code {conn.close_code})")

    def _came_up(self, conn: Connection, welcome: dict) -> None:
        self.peer_protocol_version = strict_int(welcome.get("protocol_version"))
        self.versions.welcomed(welcome.get("protocol_version"))
        features = welcome.get("hubd_features")
        self.features = frozenset(f for f in features if isinstance(f, str)) \
            if isinstance(features, list) else None
        self.batching = self.features is not None and "forward_batch" in self.features
        ts = welcome.get("timestamp")
        if isinstance(ts, (int, float)) and not isinstance(ts, bool):
            self.clock_skew = time.time() - ts
        self._conn = conn
        self.up = True
        self.up_since = self.clock.monotonic()
        self.up_at = time.time()
        self._heard()
        self.connects += 1
        log.info("peer link up", peer=self.peer, uri=self.route.uri,
                 peer_protocol_version=self.peer_protocol_version)
        self._on_up(self.peer)

    async def _serve(self, conn: Connection) -> None:
        """Read until the connection ends, the writer and the watchdog beside.
        Either of those failing in a way nobody expected fails the link's task
        (and so the hub) rather than leaving a link that cannot write."""
        loop = asyncio.get_running_loop()
        helpers = [loop.create_task(self._write(conn), name=f"peer-link-writer-{self.peer}"),
                   loop.create_task(self._watch(conn), name=f"peer-link-watch-{self.peer}")]
        for helper in helpers:
            helper.add_done_callback(lambda task, conn=conn: self._helper_ended(task, conn))
        try:
            await self._read(conn)
        finally:
            for helper in helpers:
                helper.cancel()
            done = await asyncio.gather(*helpers, return_exceptions=True)
            for result in done:
                if isinstance(result, Exception):
                    raise result

    def _helper_ended(self, task: asyncio.Task, conn: Connection) -> None:
        if not task.cancelled() and task.exception() is not None:
            conn.abort()  # the reader ends; _serve raises the helper's exception

    async def _read(self, conn: Connection) -> None:
        receive, route = conn.receive, self.answers.route
        while True:
            message = await receive()
            kind = message.type
            if kind is not TEXT and kind is not BINARY and kind is not PING and \
                    kind is not PONG:
                break  # closing, closed, an error: the connection ended
            self._heard()
            if kind is PING:
                self._pong_queued_for(message.data)
            elif kind is not PONG:
                # The pinned peer's answers nest (batched results); nothing here
                # recurses on them, so orjson's own depth bound is enough.
                frame = codec.decode_frame(message.data, max_depth=None)
                if isinstance(frame, dict):
                    route(frame)
        if self._cut is not None:
            raise LinkError(*self._cut)
        raise LinkError(CLOSED, f"{self.peer} closed the link (code {conn.close_code})")

    async def _write(self, conn: Connection) -> None:
        """The one writer: the inbox in order, each Ask's future registered
        just before its frame leaves (so in-order answers meet their asks in
        the order the peer reads them)."""
        inbox, answers = self._inbox, self.answers
        while True:
            if not inbox:
                self._writable.clear()
                await self._writable.wait()
                continue
            message = inbox.popleft()
            kind = type(message)
            if kind is Ask:
                if message.reply.done():
                    continue  # its asker gave up while it waited here
                answers.expect(message.reply, message.key, message.reply_type)
            self._write_started = self.clock.monotonic()
            try:
                if kind is Send or kind is Ask:
                    await conn.send_text(codec.encode(message.frame))
                elif message is _PING:
                    self._ping_queued = False
                    await conn.ping()
                elif message is _PONG:
                    data, self._pong_queued = self._pong_queued[0], None
                    await conn.pong(data)
                else:  # _CLOSE: the link ends its connection (reload, stop);
                    # shielded: the reader ends at once and this task is cancelled,
                    # the close handshake finishes (bounded by timing.link_close_wait) all the same
                    await asyncio.shield(conn.close(1000, b""))
                    return
            except ConnectionError:
                conn.abort()  # the reader sees the end
                return
            finally:
                self._write_started = None

    async def _watch(self, conn: Connection) -> None:
        """Every PING_INTERVAL: cut a link whose write has not completed within
        the stall deadline, close one silent past the silence deadline (a
        black-holed connection sends no error), else ping."""
        while True:
            await self.clock.sleep(self.timing.link_ping)
            now = self.clock.monotonic()
            if liveness.write_stalled(now, self._write_started, self.timing.link_write_stall):
                self.stall_closes += 1
                self._cut = (STALLED, f"a write to {self.peer} did not complete within "
                                      f"{self.timing.link_write_stall:g}s")
                conn.abort()  # a graceful close would wait behind the stuck write
                return
            if liveness.is_dead(now, self._last_heard, self.timing):
                self.silence_closes += 1
                self._cut = (SILENT, f"nothing heard from {self.peer} for "
                                     f"{liveness.silent_for(now, self._last_heard):.1f}s "
                                     "(pings unanswered)")
                # Bounded by timing.link_close_wait: the peer cannot answer a close either.
                await conn.close(1001, b"no sign of life")
                return
            self._queue_ping()

    def _queue_ping(self) -> None:
        if not self._ping_queued:
            self._ping_queued = True
            self._inbox.append(_PING)
            self._writable.set()

    def _pong_queued_for(self, data) -> None:
        if self._pong_queued is not None:
            self._pong_queued[0] = data  # one pong answers the latest ping
            return
        self._pong_queued = [data]
        self._inbox.append(_PONG)
        self._writable.set()

    def _end(self, conn: Connection, cause: str, detail: str) -> None:
        """Close the connection after the write in progress, ahead of the
        inbox; the link then goes down with this cause."""
        self._cut = (cause, detail)
        self._inbox.appendleft(_CLOSE)
        self._writable.set()

    def _heard(self) -> None:
        self._last_heard = self.clock.monotonic()
        self.last_inbound = time.time()

    def _down_detail(self) -> str:
        return self.last_error["detail"] if self.last_error else "link down"

    def _record_error(self, cause: str, detail: str) -> None:
        now = time.time()
        previous = self.last_error
        if previous is None or previous["cause"] != cause or self.up or \
                now - self._logged_at > LOG_REPEAT:
            log.warning("peer link failed", peer=self.peer, cause=cause, detail=detail)
            self._logged_at = now
        self.last_error = {"cause": cause, "detail": detail, "at": now}

    def _went_down(self) -> None:
        """Whatever waited hears it: queued asks, asks in flight, then the subscribers."""
        was_up = self.up
        self.up = False
        self._conn = None
        self.up_since = None
        error = LinkError(CLOSED, "link went down")
        inbox, self._inbox = self._inbox, deque()
        self._ping_queued, self._pong_queued = False, None
        for message in inbox:
            if type(message) is Ask and not message.reply.done():
                message.reply.set_exception(error)
        self.answers.fail_all(error)
        if was_up:
            cause = self.last_error["cause"] if self.last_error else CLOSED
            self._on_down(self.peer, cause)

    def health(self) -> dict:
        return {"link": "up" if self.up else "down", "state": self.state,
                "connects": self.connects, "silence_closes": self.silence_closes,
                "stall_closes": self.stall_closes,
                "inbox": len(self._inbox), "inbox_bound": self.inbox_bound,
                "refused_busy": self.refused_busy,
                "up_since": self.up_at if self.up else None,
                "last_inbound": self.last_inbound,
                "batching": self.batching,
                "peer_features": sorted(self.features) if self.features is not None else None,
                "last_error": self.last_error, "peer_protocol_version": self.peer_protocol_version,
                "negotiated_protocol_version": self.versions.effective,
                "clock_skew_seconds": round(self.clock_skew, 3) if self.clock_skew is not None
                else None}

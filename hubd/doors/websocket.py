"""The WebSocket door: one Connection per socket, and the aiohttp handler
that upgrades a request into one.

A Connection owns the socket, its send queue and its place before the
session (authentication, the registration deadline). Inbound frames are
decoded and held to their verb's field rules here (sans-IO wire layer:
hubd/wire/codec.py, hubd/wire/fields.py) and handed to the Router as commands
naming this endpoint by id; a frame that cannot be decoded or breaks a rule is
answered here with a typed error and the socket stays open (on a secured hub,
a refused first frame closes it 4010). Outbound messages arrive door-neutral;
each is framed once for every socket that gets it (`ws_text`, cached on the
message). A queue that overflows or a write that cannot drain within the
deadline closes the socket with 1013 (a stalled one gets a graceful attempt
first, then an abort). Every close leaves with a close frame, code and reason
(hubd/http/closing.py).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque

import structlog
from aiohttp import WSMsgType, web

from hubd.core.commands import Closed, Credit, Inbound, Opened
from hubd.core.endpoints import next_endpoint_id
from hubd.core.message import (CLOSE_AUTH, CLOSE_REGISTRATION_TIMEOUT, CLOSE_TRY_AGAIN,
                               Message)
from hubd.http.closing import HubWebSocket, close_frame, lingering_shutdown
from hubd.http.guard import guard
from hubd.wire import codec
from hubd.wire.envelope import HUB_WIRE, hub_frame
from hubd.wire.fields import check_fields, refusal
from hubd.wire.wsframe import text_frame

log = structlog.get_logger("hubd.connection")

SEND_QUEUE_FRAMES = 8192
WRITE_HIGH_WATER = 1024 * 1024

_CLOSE = object()


def ws_text(message: Message) -> bytes:
    """A message as one unmasked text frame (made once per message, see Message.encoded)."""
    return text_frame(message.json)


class Connection:
    def __init__(self, ws: web.WebSocketResponse, stream, peer_host: str, hub):
        self.id = next_endpoint_id()
        self.ws = ws
        self.peer_host = peer_host
        self.hub = hub
        self.principal = f"open-host:{peer_host}"
        self.credential: str | None = None
        # A hub without a shared --token welcomes a connection at once, as an
        # open hub does: agents without a token keep the seats no principal
        # holds. One with a shared token hears nothing before the token.
        self.authenticated = hub.identity.table.tokenless
        # set by the TLS layer for peer hubs: the DER client certificate
        self.peer_cert: bytes | None = None
        self.opened_at = time.monotonic()
        self.closed = False
        self.close_code: int | None = None
        self._stream = stream  # aiohttp's StreamWriter: its transport and drain()
        self._loop = asyncio.get_running_loop()
        self._queue: deque = deque()
        self._flush_scheduled = False
        self._draining = False
        self._write_started: float | None = None
        self._registered = False
        self._stall_closing = False
        # completed-write tracking (when_written): frames ever queued, frames
        # handed to the transport, frames whose write completed (the buffer
        # under WRITE_HIGH_WATER, or drained), and (mark, callback) waiters
        self._frames_queued = 0
        self._frames_sent = 0
        self._frames_done = 0
        self._write_waiters: deque = deque()

    def __repr__(self) -> str:
        return f"<Connection {self.id} {self.peer_host}>"

    # -- send side (called on the event loop by the JournalWriter and the Router)

    def deliver(self, message: Message) -> None:
        """Queue one message, framed by this door. The hot path of every
        fan-out (one call per recipient): the message's cached frame when this
        door framed it first (nearly always), and send's body inline."""
        if self.closed:
            return
        framed = message._wired if message._wire is ws_text else message.encoded(ws_text)
        queue = self._queue
        if len(queue) >= SEND_QUEUE_FRAMES:
            self._overflow()
            return
        queue.append(framed)
        self._frames_queued += 1
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def send(self, framed: bytes) -> None:
        """Queue one WebSocket frame (already framed, see wire.wsframe)."""
        if self.closed:
            return
        if len(self._queue) >= SEND_QUEUE_FRAMES:
            self._overflow()
            return
        self._queue.append(framed)
        self._frames_queued += 1
        self._schedule_flush()

    def when_written(self, callback) -> None:
        """callback(True) once every frame queued so far has completed its
        write, callback(False) if the socket closes, overflows or stalls out
        first (the sweeper's drain deadline, timing.send_stall). Called on the
        event loop."""
        if self.closed:
            callback(False)
        elif self._frames_done >= self._frames_queued:
            callback(True)
        else:
            self._write_waiters.append((self._frames_queued, callback))

    def _written(self, upto: int) -> None:
        self._frames_done = upto
        waiters = self._write_waiters
        while waiters and waiters[0][0] <= upto:
            waiters.popleft()[1](True)

    def _fail_waiters(self) -> None:
        waiters = self._write_waiters
        while waiters:
            waiters.popleft()[1](False)

    def _overflow(self) -> None:
        self.hub.metrics.send_queue_overflows += 1
        log.warning("send queue full; closing slow consumer", conn=self.id,
                    frames=len(self._queue))
        self._queue.clear()
        self._fail_waiters()
        self.close(CLOSE_TRY_AGAIN, "send queue overflow")

    def close(self, code: int, reason: str) -> None:
        """Close after the frames already queued (a refusal reaches the client first)."""
        if self.closed:
            return
        self.closed = True
        self.close_code = code
        self._queue.append((_CLOSE, code, reason))
        self._schedule_flush()

    def _schedule_flush(self) -> None:
        # One flush per loop iteration, however many frames were queued in it:
        # they leave in one transport write.
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._draining or not self._queue:
            return  # the drain task picks up the rest
        transport = self._stream.transport
        queue = self._queue
        if transport is None or transport.is_closing() or self.ws.close_started is not None:
            # The socket is closing (its close frame is written or on its way):
            # nothing may follow the close frame.
            queue.clear()
            self.closed = True
            self._fail_waiters()
            return
        chunks = []
        while queue:
            item = queue.popleft()
            if type(item) is tuple:
                if chunks:
                    transport.write(b"".join(chunks))
                    self._frames_sent += len(chunks)
                    if transport.get_write_buffer_size() <= WRITE_HIGH_WATER:
                        self._written(self._frames_sent)
                self._start(self._close_socket(item[1], item[2]))
                queue.clear()
                self._fail_waiters()
                return
            chunks.append(item)
        transport.write(chunks[0] if len(chunks) == 1 else b"".join(chunks))
        self._frames_sent += len(chunks)
        if transport.get_write_buffer_size() > WRITE_HIGH_WATER:
            self._draining = True
            self._start(self._drain())
        elif self._write_waiters:
            self._written(self._frames_sent)
        else:
            self._frames_done = self._frames_sent

    async def _drain(self) -> None:
        """The peer reads slower than we write: wait (bounded by the sweeper's
        deadline) before writing more."""
        self._write_started = self._loop.time()
        sent = self._frames_sent
        try:
            await self._stream.drain()
        except ConnectionError:
            self.closed = True
            self._fail_waiters()
            return
        finally:
            self._write_started = None
            self._draining = False
        if not self._stall_closing:
            self._written(sent)
        self._flush()

    async def _close_socket(self, code: int, reason: str) -> None:
        # The sweeper watches this close like any write (ws.close_started): a
        # client that never drains it gets the stalled consumer's treatment.
        await self.ws.close(code=code, message=reason.encode())

    def _start(self, coro) -> None:
        self.hub.track(self._loop.create_task(coro))

    def write_stalled_for(self, now: float) -> float:
        """How long a write (or the hub's close frame) has waited to drain;
        0 once the stall is being dealt with (abort() was called)."""
        if self._stall_closing:
            return 0.0
        started = self._write_started
        ws = self.ws
        if ws.close_started is not None and not ws.close_finished:
            started = ws.close_started if started is None else min(started, ws.close_started)
        return 0.0 if started is None else now - started

    @property
    def stall_closing(self) -> bool:
        return self._stall_closing

    def abort(self) -> None:
        """Writes have not drained within the deadline. The seed's rule: one
        graceful close attempt (the 1013 close frame behind what is buffered,
        then the write side shut), and the transport is aborted if that has
        not drained within timing.graceful_close."""
        if self._stall_closing:
            return
        self._stall_closing = True
        self.closed = True
        self.close_code = CLOSE_TRY_AGAIN
        self._queue.clear()
        self._fail_waiters()
        transport = self._stream.transport
        if transport is None or transport.is_closing():
            return
        if self.ws.close_started is None:
            # No close frame is on its way yet; aiohttp must not send another.
            self.ws.close_started = self._loop.time()
            transport.write(close_frame(CLOSE_TRY_AGAIN, "outbound delivery timeout"))
        lingering_shutdown(transport)
        self._loop.call_later(self.hub.config.timing.graceful_close, self._abort_if_stuck,
                              transport)

    def _abort_if_stuck(self, transport) -> None:
        if transport.is_closing():
            return
        if transport.get_write_buffer_size():
            log.info("graceful close did not drain; aborting", conn=self.id)
            self.hub.metrics.send_aborts += 1
            transport.abort()
        else:
            transport.close()

    # -- receive side

    def _refuse(self, frame: dict | None, text: str, code: str, field: str | None = None) -> None:
        """A frame the wire layer refuses: a typed answer to this socket only
        (hubd/wire/fields.py `refusal`); the Router never sees the frame. The
        socket stays open, unless it has not authenticated yet: a secured
        hub's first frame must be a well-formed one carrying the token."""
        metrics = self.hub.metrics
        metrics.count_in("invalid")
        metrics.count_refused(code)
        answer = refusal(self.hub.hub_id, frame, text, code, time.time(), field)
        self.send(text_frame(codec.encode(answer)))
        if not self.authenticated:
            self.close(CLOSE_AUTH, "auth required")

    async def run(self) -> None:
        hub = self.hub
        inbox = hub.router.inbox
        endpoint = self.id
        deadline = asyncio.get_running_loop().call_later(
            hub.config.timing.auth_timeout, self._registration_timeout)
        hub.endpoints.add(self)
        if self.authenticated:
            await inbox.put(self._opened())
        try:
            # aiohttp's receive() itself, not `async for` over the socket: one
            # coroutine layer fewer per frame on the hot path
            receive = self.ws.receive
            while True:
                msg = await receive()
                kind = msg.type
                if kind is WSMsgType.TEXT or kind is WSMsgType.BINARY:
                    data = msg.data
                    hub.metrics.frames_in_bytes += len(data)
                    frame = codec.decode_frame(data)
                    if type(frame) is not dict:
                        self._refuse(frame.frame, frame.text, frame.code)
                        continue
                    bad = check_fields(frame)
                    if bad is not None:
                        self._refuse(frame, bad.text, bad.code, bad.field)
                        continue
                    hub.metrics.count_in(frame.get("type") or "chat")
                    if not self.authenticated:
                        if not self._authenticate(frame):
                            continue
                        # On a secured hub the welcome comes only now.
                        await inbox.put(self._opened())
                    elif not self._registered and "token" in frame \
                            and not hub.identity.table.open:
                        # welcomed at connect; the first frame's token names
                        # the principal the registration speaks as
                        if not self._authenticate(frame):
                            continue
                        await inbox.put(Credit(endpoint, self.principal, self.credential))
                    if not self._registered:
                        self._registered = True
                        deadline.cancel()
                    command = Inbound(endpoint, frame, len(data))
                    try:
                        inbox.put_nowait(command)
                    except asyncio.QueueFull:
                        await inbox.put(command)  # the Router is behind: stop reading

                elif kind is WSMsgType.CLOSE:
                    # aiohttp has already sent the hub's close frame back: the
                    # closing handshake is complete (HubWebSocket.finish)
                    self.ws.peer_closed = True
                    break
                elif kind is WSMsgType.ERROR:
                    log.info("socket error", conn=self.id, error=repr(self.ws.exception()))
                    break
                elif kind is WSMsgType.CLOSING or kind is WSMsgType.CLOSED:
                    break
        except ConnectionResetError as exc:
            # aiohttp answers a ping inside receive(); when the transport is
            # already closing, that pong raises. The socket is gone either way.
            log.info("socket reset while answering a ping", conn=self.id, error=repr(exc))
        finally:
            deadline.cancel()
            self.closed = True
            self._fail_waiters()
            try:
                if self.authenticated and hub.ready:
                    # The name is freed as soon as the socket's close is read:
                    # a client that reconnects under the same name must find
                    # it free.
                    await inbox.put(Closed(endpoint))
            finally:
                hub.endpoints.remove(self)

    def _opened(self) -> Opened:
        return Opened(self.id, self.principal, self.peer_host, self.peer_cert, self.credential)

    def _authenticate(self, frame: dict) -> bool:
        """The first frame on a secured hub must carry a token (the shared
        --token or a principal's); nothing is sent to the socket before it
        does. Which seats the token may speak for the Router decides."""
        token = frame.get("token")
        target = frame.get("sender") or "unknown"
        hub = self.hub
        credential = (hub.identity.table.authenticate(token) if isinstance(token, str)
                      else None)
        if token is None and self.peer_cert is not None:
            # A peer hub may prove itself by its TLS client certificate alone
            # (the serving policy pins it): only a peer claim admits this
            # endpoint, as an agent it would still need a token (Router).
            self.authenticated = True
            return True
        if token is None:
            reason = "Authentication token required."
        elif credential is None:
            reason = "Invalid authentication token."
        else:
            self.authenticated = True
            self.principal = credential.principal.name
            self.credential = credential.digest
            return True
        hub.metrics.auth_denied += 1
        hub.auth_denials.denied(HUB_WIRE, reason, peer=self.peer_host, seat=target)
        self.send(text_frame(codec.encode(
            hub_frame(hub.hub_id, "auth_denied", target, reason, time.time()))))
        self.close(CLOSE_AUTH, "auth denied")
        return False

    def _registration_timeout(self) -> None:
        if not self._registered and not self.closed:
            log.info("no first frame before the deadline", conn=self.id)
            self.close(CLOSE_REGISTRATION_TIMEOUT,
                       "auth timeout" if not self.authenticated else "registration timeout")


def make_handler(hub):
    """The aiohttp handler for every path that is not a probe: upgrade, then
    serve the socket as one Connection until it closes."""
    config = hub.config
    timing = config.timing

    async def websocket(request: web.Request) -> web.StreamResponse:
        refused = guard(hub, request)
        if refused is not None:
            return refused
        ws = HubWebSocket(linger=timing.close_linger, close_reply=timing.close_reply,
                          max_msg_size=config.max_msg_bytes, compress=False, autoping=True)
        if not ws.can_prepare(request).ok:
            return web.Response(status=426, text="This port speaks WebSocket (and serves "
                                                 "/health, /readyz, /metrics).\n")
        if not hub.ready:
            return web.Response(status=503, text="Hub is starting (journal replay).\n")
        stream = await ws.prepare(request)
        peer = request.remote or "unknown"
        conn = Connection(ws, stream, peer, hub)
        ssl_object = request.transport.get_extra_info("ssl_object") if request.transport else None
        if ssl_object is not None:
            conn.peer_cert = ssl_object.getpeercert(binary_form=True)
        await conn.run()
        # The TCP connection ends at once after a complete closing handshake;
        # after the hub's close frame alone, once the client has read it and
        # closed too, or the linger is over (hubd/http/closing.py).
        await ws.finish()
        return ws

    return websocket

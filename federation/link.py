"""PeerLink: one persistent, pinned (m)TLS WebSocket to one peer hub.

The link registers under this hub's id, then carries many requests at once:
forwards are correlated by forward_id, roster requests in order. Nothing is
sent before the peer's certificate has matched one of its pins. Connecting and
the welcome are bounded by timeouts, so a peer that accepts TCP and then hangs
costs this hub one idle task, never a blocked sender. A lost link is retried
with jittered backoff; whoever uses the link is told at once when it is up.

Dead links are found by the link itself (federation/liveness.py): it pings
every timing.link_ping, counts anything the peer sends as life, and closes a
link silent past timing.link_silence, then redials. A sign of life from the peer
elsewhere (wake()) skips the remaining reconnect backoff.
"""

from __future__ import annotations

import asyncio
import random
from collections import deque
import ssl
import time
from typing import Callable

import aiohttp
import structlog

from federation import liveness
from federation.config import PeerRoute
from federation.pins import peer_certificate_der
from hubd.timing import Timing
from hubd.wire import codec
from hubd.wire.envelope import PROTOCOL_VERSION, strict_int

log = structlog.get_logger("hubd.federation.link")

# The dial's bounds (timing.link_dial for TCP, timing.link_connect for the
# whole dial with TLS, the upgrade and the welcome) and the reconnect backoff
# are timing's. Reconnect attempts are cheap against a peer that refuses, and
# a hung peer is bounded by the timeouts anyway; a low backoff cap means a
# returning peer is found within a second, not after the reference's 10-300 s.
LOG_REPEAT = 60.0  # a link failing the same way is logged once a minute

# causes reported in /health and logs
TLS = "tls"
PIN_MISMATCH = "pin_mismatch"
REFUSED = "refused"
TIMEOUT = "timeout"
SILENT = "silent"  # up, but nothing heard from the peer within the deadline
CLOSED = "closed"
AUTH = "auth_denied"
PROTOCOL = "protocol"


class LinkError(Exception):
    def __init__(self, cause: str, detail: str):
        super().__init__(f"{cause}: {detail}")
        self.cause = cause
        self.detail = detail


class Answers:
    """Where a peer's answers go: a waiting request (matched by the id it
    echoes, or in order when the answer echoes none) or, for forward
    results nobody waits for, the subscriber. One home for both link kinds
    (PeerLink here, the in-memory link of the actor tests)."""

    def __init__(self, peer: str, on_result: Callable[[str, dict], None],
                 on_rejected: Callable[[str, str], None]):
        self.peer = peer
        self.on_result, self.on_rejected = on_result, on_rejected
        self._by_key: dict[str, asyncio.Future] = {}  # answers that echo an id
        self._in_order: dict[str, deque] = {}  # reply type -> waiters, for answers without one
        # reply type -> keyed waiters that also take an answer echoing no id
        self._keyed_in_order: dict[str, deque] = {}

    def expect(self, key: str | None, reply_type: str | None) -> asyncio.Future:
        """A waiter for the answer echoing `key`, or with no key the next
        answer of `reply_type`. With both, an answer of that type that echoes
        no id at all (the reference hub's multihub_claim_result) is matched in
        order among such waiters."""
        future = asyncio.get_running_loop().create_future()
        if key is None:
            self._in_order.setdefault(reply_type, deque()).append(future)
            return future
        self._by_key[key] = future
        if reply_type is not None:
            self._keyed_in_order.setdefault(reply_type, deque()).append(future)
        return future

    def forget(self, future: asyncio.Future, key: str | None, reply_type: str | None) -> None:
        if key is not None:
            self._by_key.pop(key, None)
        table = self._in_order if key is None else self._keyed_in_order
        waiting = table.get(reply_type)
        if waiting and future in waiting:
            waiting.remove(future)

    def route(self, frame: dict) -> None:
        kind = frame.get("type")
        if kind == "multihub_message_result_batch":
            results = frame.get("results")
            if isinstance(results, list):
                for result in results:
                    if isinstance(result, dict):
                        self.on_result(self.peer, result)
        elif kind == "multihub_message_result":
            waiter = self._by_key.pop(frame.get("forward_id"), None)
            if waiter is None:
                self.on_result(self.peer, frame)
            elif not waiter.done():
                waiter.set_result(frame)
        elif kind in ("multihub_log_snapshot", "multihub_claim_result"):
            waiter = None
            keyed = self._keyed_in_order.get(kind)
            rid = frame.get("request_id")
            if isinstance(rid, str):
                # only the request it names (never another keyed one: a late
                # answer to a request that gave up must not answer the next)
                waiter = self._by_key.pop(rid, None)
                if waiter is not None and keyed and waiter in keyed:
                    keyed.remove(waiter)
            elif keyed:
                waiter = keyed.popleft()
            waiting = self._in_order.get(kind)
            if waiter is None and waiting:
                waiter = waiting.popleft()
            if waiter is not None and not waiter.done():
                waiter.set_result(frame)
        elif kind == "error":
            text = str(frame.get("payload", ""))
            if "'multihub_message_forward'" in text:
                # A hub older than wire v5 does not know the verb at all.
                self.on_rejected(self.peer, text)
            else:
                log.warning("peer sent an error", peer=self.peer, error=text)

    def fail_all(self) -> None:
        """The link went down: every waiting request hears it."""
        waiters = list(self._by_key.values())
        for waiting in self._in_order.values():
            waiters.extend(waiting)
            waiting.clear()
        for waiting in self._keyed_in_order.values():
            waiting.clear()
        self._by_key.clear()
        for waiter in waiters:
            if not waiter.done():
                waiter.set_exception(LinkError(CLOSED, "link went down"))


class PeerLink:
    def __init__(self, route: PeerRoute, hub_id: str, ssl_context, timing: Timing, *,
                 on_up: Callable[[str], None] = lambda peer: None,
                 on_down: Callable[[str, str], None] = lambda peer, cause: None,
                 on_result: Callable[[str, dict], None] = lambda peer, frame: None,
                 on_rejected: Callable[[str, str], None] = lambda peer, text: None):
        self.route = route
        self.peer = route.hub_id
        self.hub_id = hub_id
        self._ssl = ssl_context
        self.timing = timing
        self._on_up, self._on_down = on_up, on_down
        self.answers = Answers(self.peer, on_result, on_rejected)
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self.up = False
        self.up_since: float | None = None
        self.last_error: dict | None = None
        self.peer_protocol_version: int | None = None
        self.batching = False  # the peer is a hubd that takes batched forwards
        # the hubd extensions the peer's welcome listed; None: the peer is not
        # a hubd (it listed none), so only its protocol_version speaks for it
        self.features: frozenset | None = None
        self.clock_skew: float | None = None
        self.connects = 0
        self.connecting = False
        self.silence_closes = 0  # links closed because the peer fell silent
        self.up_at: float | None = None  # wall time the link last came up
        self.last_inbound: float | None = None  # wall time anything last came from the peer
        self._last_heard = 0.0  # monotonic, on this link
        self._wake = asyncio.Event()
        self._logged_at = 0.0
        self._stop = False
        self._silent_for: float | None = None
        self._pings: set[asyncio.Task] = set()

    # -- requests

    async def send(self, frame: dict) -> bool:
        """Write one frame; False if the link is not up (the caller retries later)."""
        ws = self._ws
        if ws is None or not self.up or ws.closed:
            return False
        try:
            await ws.send_frame(codec.encode(frame), aiohttp.WSMsgType.TEXT)
        except (ConnectionError, aiohttp.ClientError, RuntimeError):
            return False
        return True

    async def request(self, frame: dict, timeout: float, *, key: str | None = None,
                      reply_type: str | None = None) -> dict:
        """Send a request and wait for its answer; LinkError when the peer cannot
        answer in time. Answers are matched by `key` (a forward_id or
        request_id the peer echoes) or, for `reply_type`s that carry no id (log
        snapshots), in order."""
        if not self.up:
            raise LinkError(CLOSED, self.last_error["detail"] if self.last_error else "link down")
        future = self.answers.expect(key, reply_type)
        try:
            if not await self.send(frame):
                raise LinkError(CLOSED, "link went down")
            return await asyncio.wait_for(future, timeout)
        except TimeoutError as exc:
            raise LinkError(TIMEOUT, f"no answer from {self.peer} within {timeout:g}s") from exc
        finally:
            self.answers.forget(future, key, reply_type)

    # -- lifetime

    @property
    def state(self) -> str:
        if self.up:
            return liveness.UP
        return liveness.CONNECTING if self.connecting else liveness.DOWN

    def wake(self) -> None:
        """The peer showed life elsewhere (its inbound link, a forward, a log
        pull): skip what is left of the reconnect backoff; if the link is up,
        ping now, so a link that died unnoticed is found sooner."""
        self.last_inbound = time.time()
        self._wake.set()
        ws = self._ws
        if self.up and ws is not None and not ws.closed and \
                time.monotonic() - self._last_heard > self.timing.link_ping:
            task = asyncio.get_running_loop().create_task(self._ping(ws))
            self._pings.add(task)
            task.add_done_callback(self._pings.discard)

    async def run(self) -> None:
        timing = self.timing
        backoff = timing.link_backoff_first
        timeout = aiohttp.ClientTimeout(sock_connect=timing.link_dial)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while not self._stop:
                self._wake.clear()
                try:
                    await self._connect_and_serve(session)
                except LinkError as exc:
                    self._record_error(exc.cause, exc.detail)
                except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
                    self._record_error(*_classify(exc))
                finally:
                    up_for = time.monotonic() - self.up_since if self.up_since else None
                    self._went_down()
                backoff = liveness.next_backoff(backoff, up_for, timing)
                if self._wake.is_set():
                    continue  # the peer is alive: redial now
                try:
                    await asyncio.wait_for(self._wake.wait(),
                                           liveness.jittered(backoff, random.random()))
                except TimeoutError:
                    pass

    def reroute(self, route: PeerRoute, ssl_context) -> None:
        """Take new pins/URI/token; a live connection that fails the new pins is closed."""
        self.route = route
        self._ssl = ssl_context
        ws = self._ws
        if ws is not None and route.pins is not None:
            der = peer_certificate_der(ws)
            if der is None or not route.pins.matches(der):
                log.warning("peer certificate no longer matches its pins; closing the link",
                            peer=self.peer)
                self._record_error(PIN_MISMATCH, "certificate no longer matches the reloaded pins")
                asyncio.get_running_loop().create_task(ws.close())

    def stop(self) -> None:
        self._stop = True
        if self._ws is not None:
            asyncio.get_running_loop().create_task(self._ws.close())

    async def _connect_and_serve(self, session: aiohttp.ClientSession) -> None:
        route = self.route
        timing = self.timing
        self.connecting = True
        try:
            async with asyncio.timeout(timing.link_connect):
                ssl_context = self._ssl.for_route(route) if route.secure else False
                # autoping off: pongs are this link's evidence of life (see _read)
                ws = await session.ws_connect(
                    route.uri, ssl=ssl_context, max_msg_size=16 * 1024 * 1024, compress=0,
                    autoping=False,
                    timeout=aiohttp.ClientWSTimeout(ws_close=timing.link_close_wait))
        finally:
            self.connecting = False
        try:
            if route.pins is not None:
                der = peer_certificate_der(ws)
                if der is None or not route.pins.matches(der):
                    raise LinkError(PIN_MISMATCH, f"{self.peer} presented a certificate that "
                                                  "matches none of its pins")
            register = {"sender": self.hub_id, "target": "System", "type": "heartbeat",
                        "payload": "online", "protocol_version": PROTOCOL_VERSION}
            if route.token:
                register["token"] = route.token
            await ws.send_frame(codec.encode(register), aiohttp.WSMsgType.TEXT)
            async with asyncio.timeout(timing.link_connect):
                welcome = await self._await_welcome(ws)
            self.peer_protocol_version = strict_int(welcome.get("protocol_version"))
            features = welcome.get("hubd_features")
            self.features = frozenset(f for f in features if isinstance(f, str)) \
                if isinstance(features, list) else None
            self.batching = self.features is not None and "forward_batch" in self.features
            ts = welcome.get("timestamp")
            if isinstance(ts, (int, float)) and not isinstance(ts, bool):
                self.clock_skew = time.time() - ts
            self._ws = ws
            self.up = True
            self.up_since = time.monotonic()
            self.up_at = time.time()
            self._heard()
            self.connects += 1
            log.info("peer link up", peer=self.peer, uri=route.uri,
                     peer_protocol_version=self.peer_protocol_version)
            self._on_up(self.peer)
            watchdog = asyncio.get_running_loop().create_task(self._watch(ws))
            try:
                await self._read(ws)
            finally:
                watchdog.cancel()
        finally:
            await ws.close()

    def _heard(self) -> None:
        self._last_heard = time.monotonic()
        self.last_inbound = time.time()

    async def _ping(self, ws) -> None:
        try:
            await ws.ping()
        except (ConnectionError, aiohttp.ClientError, RuntimeError):
            pass  # the read loop sees the link end

    async def _watch(self, ws) -> None:
        """Ping every timing.link_ping; close the link once the peer has been
        silent past the deadline (a black-holed connection sends no error)."""
        self._silent_for = None
        timing = self.timing
        while not ws.closed:
            await asyncio.sleep(timing.link_ping)
            now = time.monotonic()
            if liveness.is_dead(now, self._last_heard, timing):
                self._silent_for = liveness.silent_for(now, self._last_heard)
                self.silence_closes += 1
                # Bounded by link_close_wait: the peer cannot answer a close either.
                await ws.close(code=1001, message=b"no sign of life")
                return
            await self._ping(ws)

    async def _await_welcome(self, ws) -> dict:
        async for msg in ws:
            if msg.type != aiohttp.WSMsgType.TEXT and msg.type != aiohttp.WSMsgType.BINARY:
                break
            frame = codec.decode_frame(msg.data)
            if not isinstance(frame, dict):
                continue
            kind = frame.get("type")
            if kind == "welcome":
                return frame
            if kind in ("auth_denied", "name_conflict"):
                raise LinkError(AUTH if kind == "auth_denied" else REFUSED,
                                f"{self.peer} refused the link: {frame.get('payload')}")
        raise LinkError(CLOSED, f"{self.peer} closed the link before its welcome "
                                f"(close code {ws.close_code})")

    async def _read(self, ws) -> None:
        async for msg in ws:
            self._heard()
            if msg.type is aiohttp.WSMsgType.PING:
                await ws.pong(msg.data)
                continue
            if msg.type is aiohttp.WSMsgType.PONG:
                continue
            if msg.type != aiohttp.WSMsgType.TEXT and msg.type != aiohttp.WSMsgType.BINARY:
                break
            # The pinned peer's answers nest (batched results); nothing here
            # recurses on them, so orjson's own depth bound is enough.
            frame = codec.decode_frame(msg.data, max_depth=None)
            if not isinstance(frame, dict):
                continue
            self.answers.route(frame)
        if self._silent_for is not None:
            raise LinkError(SILENT, f"nothing heard from {self.peer} for "
                                    f"{self._silent_for:.1f}s (pings unanswered)")
        raise LinkError(CLOSED, f"{self.peer} closed the link (code {ws.close_code})")

    def _record_error(self, cause: str, detail: str) -> None:
        now = time.time()
        previous = self.last_error
        if previous is None or previous["cause"] != cause or self.up or \
                now - self._logged_at > LOG_REPEAT:
            log.warning("peer link failed", peer=self.peer, cause=cause, detail=detail)
            self._logged_at = now
        self.last_error = {"cause": cause, "detail": detail, "at": now}

    def _went_down(self) -> None:
        was_up = self.up
        self.up = False
        self._ws = None
        self.up_since = None
        self.answers.fail_all()
        if was_up:
            cause = self.last_error["cause"] if self.last_error else CLOSED
            self._on_down(self.peer, cause)

    def health(self) -> dict:
        return {"link": "up" if self.up else "down", "state": self.state,
                "connects": self.connects, "silence_closes": self.silence_closes,
                "up_since": self.up_at if self.up else None,
                "last_inbound": self.last_inbound,
                "batching": self.batching,
                "peer_features": sorted(self.features) if self.features is not None else None,
                "last_error": self.last_error, "peer_protocol_version": self.peer_protocol_version,
                "clock_skew_seconds": round(self.clock_skew, 3) if self.clock_skew is not None
                else None}


def _classify(exc: BaseException) -> tuple[str, str]:
    text = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError)):
        return TIMEOUT, "connect or welcome timed out"
    if isinstance(exc, (aiohttp.ClientSSLError, ssl.SSLError)):
        return TLS, text
    if isinstance(exc, aiohttp.WSServerHandshakeError):
        return REFUSED, text
    if isinstance(exc, (aiohttp.ClientConnectorError, ConnectionRefusedError)):
        return REFUSED, text
    return CLOSED, text

"""PeerLink: one persistent, pinned (m)TLS WebSocket to one peer hub.

The link registers under this hub's id, then carries many requests at once:
forwards are correlated by forward_id, roster requests in order. Nothing is
sent before the peer's certificate has matched one of its pins. Connecting and
the welcome are bounded by timeouts, so a peer that accepts TCP and then hangs
costs this hub one idle task, never a blocked sender. A lost link is retried
with jittered backoff; whoever uses the link is told at once when it is up.
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

from federation.config import PeerRoute
from federation.pins import peer_certificate_der
from hubd.wire import codec
from hubd.wire.envelope import PROTOCOL_VERSION, strict_int

log = structlog.get_logger("hubd.federation.link")

CONNECT_TIMEOUT = 5.0
# Reconnect attempts are cheap against a peer that refuses, and a hung peer
# is bounded by CONNECT_TIMEOUT anyway; a low cap means a returning peer is
# found within a second, not after the reference's 10-300 s backoff.
BACKOFF_START = 0.1
BACKOFF_MAX = 0.8
LOG_REPEAT = 60.0  # a link failing the same way is logged once a minute
STABLE_AFTER = 10.0  # a link up this long resets the reconnect backoff
HEARTBEAT = 15.0

# causes reported in /health and logs
TLS = "tls"
PIN_MISMATCH = "pin_mismatch"
REFUSED = "refused"
TIMEOUT = "timeout"
CLOSED = "closed"
AUTH = "auth_denied"
PROTOCOL = "protocol"


class LinkError(Exception):
    def __init__(self, cause: str, detail: str):
        super().__init__(f"{cause}: {detail}")
        self.cause = cause
        self.detail = detail


class PeerLink:
    def __init__(self, route: PeerRoute, hub_id: str, ssl_context, *,
                 on_up: Callable[[str], None] = lambda peer: None,
                 on_down: Callable[[str, str], None] = lambda peer, cause: None,
                 on_result: Callable[[str, dict], None] = lambda peer, frame: None,
                 on_rejected: Callable[[str, str], None] = lambda peer, text: None):
        self.route = route
        self.peer = route.hub_id
        self.hub_id = hub_id
        self._ssl = ssl_context
        self._on_up, self._on_down = on_up, on_down
        self._on_result, self._on_rejected = on_result, on_rejected
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self.up = False
        self.up_since: float | None = None
        self.last_error: dict | None = None
        self.peer_protocol_version: int | None = None
        self.batching = False  # the peer is a hubd that takes batched forwards
        self.clock_skew: float | None = None
        self.connects = 0
        self._requests: dict[str, asyncio.Future] = {}  # answers that echo an id
        self._in_order: dict[str, deque] = {}  # reply type -> waiters, for answers without one
        self._logged_at = 0.0
        self._stop = False

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
        future = asyncio.get_running_loop().create_future()
        if key is not None:
            self._requests[key] = future
        else:
            self._in_order.setdefault(reply_type, deque()).append(future)
        try:
            if not await self.send(frame):
                raise LinkError(CLOSED, "link went down")
            return await asyncio.wait_for(future, timeout)
        except TimeoutError as exc:
            raise LinkError(TIMEOUT, f"no answer from {self.peer} within {timeout:g}s") from exc
        finally:
            if key is not None:
                self._requests.pop(key, None)
            else:
                waiting = self._in_order.get(reply_type)
                if waiting and future in waiting:
                    waiting.remove(future)

    # -- lifetime

    async def run(self) -> None:
        backoff = BACKOFF_START
        async with aiohttp.ClientSession() as session:
            while not self._stop:
                started = time.monotonic()
                try:
                    await self._connect_and_serve(session)
                except LinkError as exc:
                    self._record_error(exc.cause, exc.detail)
                except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
                    self._record_error(*_classify(exc))
                finally:
                    self._went_down()
                if time.monotonic() - started > STABLE_AFTER:
                    backoff = BACKOFF_START
                delay = backoff * (0.5 + random.random() / 2)
                backoff = min(backoff * 2, BACKOFF_MAX)
                await asyncio.sleep(delay)

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
        async with asyncio.timeout(CONNECT_TIMEOUT):
            ssl_context = self._ssl.for_route(route) if route.secure else False
            ws = await session.ws_connect(route.uri, ssl=ssl_context,
                                          heartbeat=HEARTBEAT, max_msg_size=16 * 1024 * 1024,
                                          compress=0, autoping=True)
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
            async with asyncio.timeout(CONNECT_TIMEOUT):
                welcome = await self._await_welcome(ws)
            self.peer_protocol_version = strict_int(welcome.get("protocol_version"))
            features = welcome.get("hubd_features")
            self.batching = isinstance(features, list) and "forward_batch" in features
            ts = welcome.get("timestamp")
            if isinstance(ts, (int, float)) and not isinstance(ts, bool):
                self.clock_skew = time.time() - ts
            self._ws = ws
            self.up = True
            self.up_since = time.monotonic()
            self.connects += 1
            log.info("peer link up", peer=self.peer, uri=route.uri,
                     peer_protocol_version=self.peer_protocol_version)
            self._on_up(self.peer)
            await self._read(ws)
        finally:
            await ws.close()

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
            if msg.type != aiohttp.WSMsgType.TEXT and msg.type != aiohttp.WSMsgType.BINARY:
                break
            # The pinned peer's answers nest (batched results); nothing here
            # recurses on them, so orjson's own depth bound is enough.
            frame = codec.decode_frame(msg.data, max_depth=None)
            if not isinstance(frame, dict):
                continue
            kind = frame.get("type")
            if kind == "multihub_message_result_batch":
                results = frame.get("results")
                if isinstance(results, list):
                    for result in results:
                        if isinstance(result, dict):
                            self._on_result(self.peer, result)
            elif kind == "multihub_message_result":
                waiter = self._requests.pop(frame.get("forward_id"), None)
                if waiter is None:
                    self._on_result(self.peer, frame)
                elif not waiter.done():
                    waiter.set_result(frame)
            elif kind in ("multihub_log_snapshot", "multihub_claim_result"):
                waiter = self._requests.pop(frame.get("request_id"), None) \
                    if isinstance(frame.get("request_id"), str) else None
                waiting = self._in_order.get(kind)
                if waiter is None and waiting:
                    waiter = waiting.popleft()
                if waiter is not None and not waiter.done():
                    waiter.set_result(frame)
            elif kind == "error":
                text = str(frame.get("payload", ""))
                if "'multihub_message_forward'" in text:
                    # A hub older than wire v5 does not know the verb at all.
                    self._on_rejected(self.peer, text)
                else:
                    log.warning("peer sent an error", peer=self.peer, error=text)
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
        waiters = list(self._requests.values())
        for waiting in self._in_order.values():
            waiters.extend(waiting)
            waiting.clear()
        for waiter in waiters:
            if not waiter.done():
                waiter.set_exception(LinkError(CLOSED, "link went down"))
        self._requests.clear()
        if was_up:
            cause = self.last_error["cause"] if self.last_error else CLOSED
            self._on_down(self.peer, cause)

    def health(self) -> dict:
        return {"link": "up" if self.up else "down", "connects": self.connects,
                "batching": self.batching,
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

"""DeliverySender: the actor that carries forwarded delivery intents to one peer hub.

One per message peer. The Router (federation/handlers/delivery_forward.py)
hands it a DeliveryAsk, never waiting: a delivery_request, a status request
or a cancel for an operation on that peer, already checked and counted
against the hub's bound on delivery forwards waiting for peers. The sender
knows its peer from the link's events (up or down, the protocol version and
hubd features its welcome said), so an intent the peer cannot take is
refused here without touching the link. Otherwise the ask goes on the link's
inbox with a future for its answer; the future's end (the answer, or the
link's failure) comes back on this actor's mailbox, so no task is started per
request. An answer that has not come within `timeout` (timing.forward_answer) of its clock is
given up (its future cancelled, which takes it out of the link's correlation
table). Every outcome goes to the Router as a DeliveryAnswered message.

Supervision: if the actor dies, every request it holds (waiting in its
mailbox or for the peer) is answered at once, `peer_unreachable` with words
saying the outcome is unknown, loudly in the log too, before the exception
stops the hub.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass
from functools import partial
from typing import Callable, NamedTuple

import structlog

from federation.actors.link import Ask
from federation.actors.link_socket import LinkError
from federation.clock import SYSTEM
from federation.delivery_forward_rules import (MAX_IN_FLIGHT, PEER_REJECTED,
                                               PEER_UNREACHABLE, peer_serves_delivery)

log = structlog.get_logger("hubd.federation.delivery")

SWEEP = 0.5  # seconds between looks for answers past their time


@dataclass(frozen=True, slots=True)
class DeliveryAsk:
    """One forwarded delivery verb for the peer, and whom to answer."""

    forward_id: str
    kind: str  # delivery_request, delivery_status or delivery_cancel
    frame: dict  # the multihub_message_forward
    reply_to: int  # the requesting session's endpoint
    sender: str  # its seat
    request_id: str | None  # a new request's id
    routed_key: str | None  # a follow-up's operation key


@dataclass(frozen=True, slots=True)
class DeliveryAnswered:
    """What became of a DeliveryAsk: the peer's answer frame, or this hub's
    own refusal (`code`, `text`) when the peer could not be asked or did not answer."""

    ask: DeliveryAsk
    peer: str
    answer: dict | None
    code: str = ""
    text: str = ""


# -- what others tell the actor


class _LinkUp(NamedTuple):
    protocol_version: int | None
    features: frozenset | None


class _LinkDown(NamedTuple):
    pass


class _Answered(NamedTuple):
    forward_id: str
    reply: asyncio.Future


class _Tick(NamedTuple):
    pass


class DeliverySender:
    def __init__(self, peer: str, link, subscribe: Callable[..., None],
                 tell: Callable[[DeliveryAnswered], None], *, timeout: float,
                 clock=SYSTEM, bound: int = MAX_IN_FLIGHT):
        self.peer = peer
        self.link = link
        self.tell = tell
        self.clock = clock
        self.timeout = timeout
        self.bound = bound
        self._asks: deque[DeliveryAsk] = deque()  # from the Router, not taken yet
        self._events: deque = deque()  # the link's, the futures', the ticks
        self._ready = asyncio.Event()
        self.waiting: dict[str, tuple[DeliveryAsk, asyncio.Future, float]] = {}
        self._up = False
        self._protocol_version: int | None = None
        self._features: frozenset | None = None
        self._tick_queued = False
        # the link calls these in its own task; what it says of itself travels in the event
        subscribe(on_up=lambda peer: self._post(_LinkUp(link.peer_protocol_version,
                                                         link.features)),
                  on_down=lambda peer, cause: self._post(_LinkDown()))

    # -- messages in (other tasks on this loop; never block)

    def submit(self, ask: DeliveryAsk) -> bool:
        """From the Router: False at the bound (the Router bounds what it hands
        out over all peers, so this is a defect's last line, still answered)."""
        if len(self._asks) + len(self.waiting) >= self.bound:
            return False
        self._asks.append(ask)
        self._ready.set()
        return True

    def _post(self, event) -> None:
        self._events.append(event)
        self._ready.set()

    def held(self) -> int:
        return len(self._asks) + len(self.waiting)

    # -- the actor

    async def run(self) -> None:
        ticker = asyncio.ensure_future(self._tick())
        try:
            while True:
                await self._ready.wait()
                self._ready.clear()
                self._take()
        except BaseException as exc:
            self._fail_pending(exc)
            raise
        finally:
            ticker.cancel()

    async def _tick(self) -> None:
        while True:
            await self.clock.sleep(SWEEP)
            if self.waiting and not self._tick_queued:
                self._tick_queued = True
                self._post(_Tick())

    def _take(self) -> None:
        events, self._events = self._events, deque()
        for event in events:
            kind = type(event)
            if kind is _Answered:
                self._answered(event.forward_id, event.reply)
            elif kind is _Tick:
                self._tick_queued = False
                self._sweep()
            elif kind is _LinkUp:
                self._up = True
                self._protocol_version, self._features = event.protocol_version, event.features
            elif kind is _LinkDown:
                self._up = False
            else:
                raise TypeError(f"delivery sender got an unknown event {event!r}")
        asks, self._asks = self._asks, deque()
        for ask in asks:
            self._ask(ask)

    def _ask(self, ask: DeliveryAsk) -> None:
        if not self._up:
            self._refuse(ask, PEER_UNREACHABLE, f"the link to hub '{self.peer}' is down")
            return
        if not peer_serves_delivery(self._protocol_version, self._features):
            self._refuse(ask, PEER_REJECTED, f"hub '{self.peer}' does not serve forwarded "
                                             "delivery intents (wire v5)")
            return
        reply = asyncio.get_running_loop().create_future()
        self.waiting[ask.forward_id] = (ask, reply, self.clock.monotonic() + self.timeout)
        reply.add_done_callback(partial(self._reply_done, ask.forward_id))
        self.link.post(Ask(ask.frame, ask.forward_id, None, reply))  # refused: reply fails

    def _reply_done(self, forward_id: str, reply: asyncio.Future) -> None:
        if not reply.cancelled():
            reply.exception()  # looked at here; read when the mailbox is taken
        self._post(_Answered(forward_id, reply))

    def _answered(self, forward_id: str, reply: asyncio.Future) -> None:
        entry = self.waiting.pop(forward_id, None)
        if entry is None or reply.cancelled():
            return  # given up at its timeout: answered then
        ask = entry[0]
        error = reply.exception()
        if isinstance(error, LinkError):
            self._refuse(ask, PEER_UNREACHABLE, f"hub '{self.peer}' did not answer: "
                                                f"{error.detail}")
        elif error is not None:
            raise error
        else:
            self.tell(DeliveryAnswered(ask, self.peer, reply.result()))

    def _sweep(self) -> None:
        now = self.clock.monotonic()
        late = [fid for fid, (_, _, due) in self.waiting.items() if due <= now]
        for forward_id in late:
            ask, reply, _ = self.waiting.pop(forward_id)
            reply.cancel()  # out of the link's correlation table
            self._refuse(ask, PEER_UNREACHABLE, f"hub '{self.peer}' did not answer: no answer "
                                                f"from {self.peer} within {self.timeout:g}s")

    def _refuse(self, ask: DeliveryAsk, code: str, text: str) -> None:
        self.tell(DeliveryAnswered(ask, self.peer, None, code, text))

    def _fail_pending(self, exc: BaseException) -> None:
        stopping = isinstance(exc, asyncio.CancelledError)
        pending = [ask for ask, reply, _ in self.waiting.values()] + list(self._asks)
        for _, reply, _ in self.waiting.values():
            reply.cancel()
        self.waiting.clear()
        self._asks.clear()
        if not pending and stopping:
            return
        (log.warning if stopping else log.error)(
            "delivery sender stopped; answering its pending requests", peer=self.peer,
            pending=len(pending), error=None if stopping else repr(exc))
        why = "shutting down" if stopping else "internal error"
        for ask in pending:
            self._refuse(ask, PEER_UNREACHABLE, (
                f"this hub stopped forwarding it ({why}); whether hub '{self.peer}' decided "
                "it is unknown. Check its status, then retry."))

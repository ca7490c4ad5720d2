"""The local broker's live bookkeeping on the Router, and the messages its
endpoints get.

Which endpoint serves which handle, which one listens for its pushes, and a
CLI's native socket are presence's (door "broker": hubd/state/presence.py);
what is the broker's own is here: the pending waits (each timed out by a
Router timer, `WaitExpired`), the notification batches, the transcript
watcher's endpoint and which handles the broker may speak for. `BrokerLive`
is the broker's live home on the Router (`router.live_of(BrokerLive)`),
touched only by Router commands.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from hubd.actors.router import Router
from hubd.core.message import Message
from hubd.state import broker_views as views
from hubd.state.broker_rules import Limits, Refusal
from hubd.state.broker_seats import BrokerSeats
from hubd.wire import broker as wire

DOOR = wire.DOOR  # its connections' dialect
# listening connections: a share of the door's 256 connections, so listeners
# can never crowd out the connections of one-shot CLI commands
MAX_LISTENERS = 128
HOOK_MESSAGES = 20
ANSWER = "broker_answer"
PUSH = "broker_push"
NOTIFICATION = "broker_notification"
PROOF = "broker_proof"


@dataclass
class Waiter:
    endpoint: int
    request_id: int
    thread_id: int
    until: str
    timer: int | None = None  # the Router timer (key) that ends the wait


class WaitExpired(NamedTuple):
    """A Router timer: this wait's timeout is over."""

    waiter: Waiter


class BrokerLive:
    def __init__(self, router: Router):
        config = router.config.broker
        self.namespace: str = config.namespace if config else "local"
        self.limits: Limits = Limits() if config is None or config.rate_limit else \
            Limits(rate_sends=None)
        # the principal the door's token maps to: its name is what every event
        # a broker request causes records (docs/identity.md)
        self.principal: str = config.principal if config else "broker"
        self.waiters: dict[int, list[Waiter]] = {}  # thread id -> its waits
        self.batcher = views.NotificationBatcher()
        self.request_id = 0  # the request being handled (a wait answers it later)
        # the door's transcript watcher (hubd/doors/broker/proof.py), once it serves
        self.proofs: int | None = None
        self.seats = BrokerSeats(self.principal, self.namespace)  # handles it may speak for


def live_of(router: Router) -> BrokerLive:
    return router.live_of(BrokerLive)


def listening(router: Router):
    """The handles a connection listens for (a container)."""
    return router.presence.identities_listening(DOOR)


def listener(router: Router, handle: str) -> int | None:
    return router.presence.listener(DOOR, handle)


def seat_refusal(router: Router, live: BrokerLive, handle: str) -> str | None:
    """Why the broker may not speak for this handle's seat (hubd/state/broker_seats.py)."""
    return live.seats.refusal(router.hub.identity.table, handle)


def speaks_for(router: Router, live: BrokerLive, handle: str) -> None:
    """Refuse (`forbidden`, before anything is journaled) a handle whose seat
    <namespace>/<handle> the broker may not speak for."""
    refusal = seat_refusal(router, live, handle)
    if refusal is not None:
        raise Refusal(wire.FORBIDDEN, refusal)


# -- the messages a broker endpoint gets (its door writes each as one line)

def answer_message(request_id: int, result: dict) -> Message:
    return Message({"v": wire.PROTOCOL_VERSION, "id": request_id, "ok": True, "result": result})


def error_message(request_id: int | None, code: str, text: str, **extra) -> Message:
    error = {"code": code, "message": text, **extra}
    return Message({"v": wire.PROTOCOL_VERSION, "id": request_id, "ok": False, "error": error})


def event_message(event: str, payload) -> Message:
    return Message({"v": wire.PROTOCOL_VERSION, "type": "event", "event": event,
                    "payload": payload})

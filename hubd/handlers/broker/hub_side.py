"""The broker and the hub's seats (docs/broker.md, "The hub side: local/H").

A chat from the hub side to local/<handle> lands in that handle's inbox: the
broker's boxes are a mailbox of the routing service (hubd/handlers/routing.py),
which asks `BrokerMailbox.plan` before the chat is journaled and records the
broker messages it decides in the chat's route; the broker's projection
applies them from there (hubd/state/broker.py), and `delivered` pushes them
(`mailbox(namespace)` declares them).
A broker message to a hub seat goes the other way (outputs.to_hub).
"""

from __future__ import annotations

import structlog

from hubd.actors.router import Router
from hubd.core.plugin import Mailbox
from hubd.state import broker as bs
from hubd.state import broker_rules as rules
from hubd.state.broker_rules import Refusal
from hubd.state.chat import Planned
from hubd.wire import broker as wire
from hubd.wire import codec
from hubd.wire.targets import RemoteTargetError

from .. import routing
from .live import listening, live_of, seat_refusal
from .outputs import after_message

log = structlog.get_logger("hubd.broker")


def hub_target_check(router: Router, sender: str):
    """For a broker send from `sender`: None for a hub target it may name,
    else why not (a full forward backlog refuses the whole send, before
    anything is journaled)."""
    def check(target: str) -> str | None:
        remote = routing.remote_target(target)
        if remote is None:
            return None  # a seat on this hub: delivered, mailboxed or dead-lettered as a chat
        if isinstance(remote, RemoteTargetError):
            return remote.text
        if not routing.knows_hub(router, remote.hub):
            return routing.no_route(router, remote.hub, sender)
        refused = routing.hub_refusal(router, remote.hub, sender)
        if refused is not None:  # the forward backlog is full: nothing is journaled
            raise Refusal(wire.RATE_LIMITED, refused)
        return None
    return check


def broker_seat(router: Router, item: str) -> str | None:
    """The handle a hub target item names, when it is <ns>/<handle> of a peer
    the broker may speak for (a seat a principal holds is that principal's)."""
    live = live_of(router)
    head, sep, rest = item.partition("/")
    if sep and head == live.namespace and rest in bs.of(router.state).peers \
            and seat_refusal(router, live, rest) is None:
        return rest
    return None


def _text(payload) -> str:
    return payload if isinstance(payload, str) and payload.strip() else \
        codec.encode(payload).decode()


def plan(router: Router, state: bs.BrokerState, frame: dict, sender: str, target,
         route_extra: dict | None) -> Planned | None:
    """Chats from the hub side to local/<handle>: a reply when the chat names a
    message of a thread the handle takes part in, else a new thread in the
    handle's inbox. A handle that refuses it (its inbox is full) is not
    reached. Each entry is one broker message: {"message", "states"}."""
    handles = [h for item, glob in zip(target.items, target.globs)
               if not glob and (h := broker_seat(router, item)) is not None]
    if not handles:
        return None
    live = live_of(router)
    body = _text(frame.get("payload"))
    reply = rules.parse_hub_reply(frame, body)
    if reply is not None and reply.message_id in state.messages:
        fields = {"messageId": reply.message_id, "body": reply.body}
        if reply.verdict:
            fields["verdict"] = reply.verdict
        try:
            decision = rules.decide_reply(state, sender, None, fields, router.now,
                                          listening(router), live.limits, from_hub=True)
        except Refusal as refusal:
            log.info("hub reply to a broker thread refused", sender=sender,
                     code=refusal.code, reason=refusal.message)
        else:
            reached = set(decision.events[0][1]["to"])
            seats = tuple(f"{live.namespace}/{h}" for h in handles if h in reached)
            if seats:
                return Planned(_entries(decision), seats)
    entries, seats, earlier = [], [], {}
    for handle in handles:
        try:
            decision = rules.decide_hub_chat(state, sender, handle, body, router.now,
                                             listening(router), live.limits, earlier)
        except Refusal as refusal:
            log.info("hub chat to a broker handle refused", handle=handle, sender=sender,
                     code=refusal.code, reason=refusal.message)
            continue
        earlier[handle] = earlier.get(handle, 0) + 1
        entries.extend(_entries(decision))
        seats.append(f"{live.namespace}/{handle}")
    return Planned(entries, tuple(seats)) if entries else None


def delivered(router: Router, event, entries: list) -> None:
    live = live_of(router)
    for entry in entries:
        after_message(router, live, entry["message"]["id"], entry["states"])


def _entries(decision: rules.Decision) -> list[dict]:
    return [{"message": payload, "states": route["states"]}
            for kind, payload, route in decision.events if kind == bs.MESSAGE]


def mailbox(namespace: str) -> Mailbox:
    """The broker's handles as a mailbox: asked only for chats naming <namespace>/..."""
    return Mailbox("broker", "broker", plan, delivered, namespace=namespace)

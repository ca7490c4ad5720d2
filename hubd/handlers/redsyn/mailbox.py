"""The REDSYN boxes on the Router's side: chats that land in them (a mailbox
of the routing service), waking whoever waits on them, and the sweep.

Wake-ups are door-neutral messages to the REDSYN door's endpoint, released
after the commit like any other output: the door wakes its long polls and its
webhook pusher; the Router never calls into the door.
"""

from __future__ import annotations

from collections import OrderedDict
from functools import partial

import structlog

from hubd.actors.router import Router
from hubd.core.message import Message
from hubd.core.plugin import Mailbox
from hubd.state import redsyn as mb
from hubd.state.chat import Planned
from hubd.state.redsyn import links
from hubd.wire.redsyn.envelope import DOOR

from .. import routing

log = structlog.get_logger("hubd.redsyn")

WAKE = "redsyn_wake"
MAX_WEBHOOK_SEEN = 100_000


class RedsynLive:
    """The REDSYN door's live bookkeeping on the Router (not journaled)."""

    def __init__(self, router: Router):
        self.door: int | None = None  # the door's endpoint: where wake-ups go
        # agent -> when its webhook last took a delivery (GET agent's last_seen)
        self.webhook_seen: OrderedDict = OrderedDict()

    def webhook_took(self, agent: str, now: float) -> None:
        seen = self.webhook_seen
        seen.pop(agent, None)
        seen[agent] = now
        while len(seen) > MAX_WEBHOOK_SEEN:
            seen.popitem(last=False)


def state_of(router: Router) -> mb.RedsynState:
    return router.state.extensions["redsyn"]


def wake(router: Router, agents) -> None:
    """After the commit: the door wakes what waits on these agents' boxes
    (their long polls; the webhook pusher if one of them has a webhook)."""
    door = router.live_of(RedsynLive).door
    if door is None or not agents:
        return
    records = state_of(router).agents
    webhook = any((record := records.get(agent)) is not None and record.webhook is not None
                  for agent in agents)
    router.send(door, Message({"type": WAKE, "agents": sorted(agents), "webhook": webhook}),
                WAKE)


def journal(router: Router, events: list) -> None:
    """Journal REDSYN events and wake the agents a message reached."""
    woken = set()
    for kind, payload in events:
        router.event(kind, payload)
        if kind == mb.MESSAGE:
            woken.update(d["agent"] for d in payload["deliveries"])
    wake(router, woken)


def delivered(router: Router, event, entries: list) -> None:
    """Chats landed in these REDSYN boxes: wake who waits on them. A peer's
    REDSYN message this hub's link refused is answered to its sender with the
    seed's error reply, forwarded back (nothing is dropped in silence)."""
    frame = event.payload
    for entry in entries:
        if "refused" in entry:
            chat = links.error_chat(entry["agent"], frame["sender"], entry["remote"]["id"],
                                    entry["refused"])
            log.info("peer REDSYN message refused by a link", sender=frame["sender"],
                     agent=entry["agent"], reason=entry["refused"])
            routing.send_chat(router, chat["frame"], chat["sender"], REDSYN_ROUTE)
    wake(router, {entry["agent"] for entry in entries
                  if "link" not in entry and "refused" not in entry})


def owner_of(router: Router):
    """The peer hub that owns an organization (its namespace), or None."""
    def owner(org: str) -> str | None:
        seat = routing.owner_seat(router, f"{org}/{links.LINKS_SEAT}")
        return seat.rpartition("@")[2] if seat is not None else None
    return owner


def peer_link(router: Router, state: mb.RedsynState, change, route_extra: dict | None):
    """A link change a peer hub forwarded (a chat to ORG/redsyn-links):
    recorded in the chat's route when this hub takes it
    (links.peer_change_refusal), so the one apply applies it live and at
    replay; mb.plan_chat asks this only for such a chat."""
    # only what a peer hub forwarded (the receiver's route says from which)
    origin = ((route_extra or {}).get("forwarded") or {}).get("origin")
    if origin is None:
        return None
    refused = links.peer_change_refusal(state, change, origin, owner_of(router),
                                        router.hub.identity.table.orgs)
    if refused is not None:
        log.warning("link change from a peer hub refused", origin=origin, reason=refused)
        return None
    return Planned([{"link": change}])


# a chat to a REDSYN agent lands in its box (mb.plan_chat decides where; the
# chat's route records it)
MAILBOX = Mailbox(DOOR, "redsyn", partial(mb.plan_chat, peer_link=peer_link), delivered)

# a REDSYN message to a seat, routed as a chat: the REDSYN boxes do not take it back
REDSYN_ROUTE = {"redsyn": 1}


def sweep(router: Router) -> None:
    """Once a second: give up what expired or was taken ten times untouched,
    and tell the senders."""
    if router.mutations_refused():
        return
    journal(router, mb.sweep(state_of(router), router.now))

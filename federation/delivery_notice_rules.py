"""Stage changes of a forwarded delivery operation, carried back to the origin
(issue 24 item 9): the model and the pure decisions.

The recipient's hub (west) journals every transition of an operation a peer
forwarded with the notification it owes the requester `seat@ORIGIN`, as it
does for a local requester. When the origin (east) has said, in its link's
registering heartbeat, that it takes these back (`hubd_features` lists
FEATURE: journaled with each operation it forwards from then on, in the
admission's row; or a replayed transition was relayed to it before), west
queues that notification in its durable, bounded delivery
outbox under the audience `seat@ORIGIN` (the event carries `relay_to`, so a
replay queues the same) and pushes it over east's inbound link as
`multihub_delivery_notices`. East checks each notice against its journaled
route (the operation was routed by this hub, to that peer, for that seat),
journals the new ones (`multihub_delivery_notice`, deduplicated by
notification id), queues them in its own delivery outbox for the seat, sends
them if the seat is online, and answers `multihub_delivery_notices_ack`
after the commit; west settles the acknowledged ones (`delivery_notified`,
the local settlement event). What is not acknowledged is pushed again when
east's link registers again. At least once across the link, once per
notification id to the sender's outbox.

Unit tests: tests/unit/test_delivery_notice_rules.py. The handlers:
federation/handlers/delivery_notices.py. Decisions: docs/delivery.md,
"Stage changes across hubs".
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from federation.delivery_forward_rules import STAGES, routes_of
from hubd.state import delivery_rules as rules
from hubd.state.delivery_intents import CANCEL_REQUESTED, STAGE, delivery_of
from hubd.state.events import Event
from hubd.state.hub import Appliers, HubState
from hubd.wire.envelope import HUB_SENDER

FEATURE = "delivery_notices"  # what an origin's registering heartbeat lists
PUSH = "multihub_delivery_notices"  # recipient hub -> origin, over the origin's link
ACK = "multihub_delivery_notices_ack"  # origin -> recipient hub

RELAYED = "multihub_delivery_notice"  # {peer, audience, notification}: at the origin

EXTENSION = "delivery_notices"

MAX_PER_FRAME = 256  # notices in one push, acks in one ack
MAX_RECEIVED = 100_000  # notification ids an origin remembers for deduplication
MAX_ID_BYTES = 200

# the facts of a notification the origin relays, with their types
NOTICE_FIELDS = {"notification_id": str, "operation_key": str, "request_id": str,
                 "task_id": str, "stage": str, "source": str, "target": str,
                 "target_incarnation": str, "cancel_requested": bool, "event_seq": int}
SOURCES = frozenset({rules.SOURCE_HUB, "sender", "recipient"})


@dataclass
class NoticeState:
    # origins a journaled transition was relayed to (`relay_to`): they take
    # notices across a restart, before their link registers again
    takers: set = field(default_factory=set)
    received: OrderedDict = field(default_factory=OrderedDict)  # notification id -> None
    evicted: int = 0

    def remember(self, nid: str) -> None:
        self.received[nid] = None
        while len(self.received) > MAX_RECEIVED:
            self.received.popitem(last=False)
            self.evicted += 1


PROJECTIONS = {EXTENSION: NoticeState}
appliers = Appliers()


def notices_of(state: HubState) -> NoticeState:
    return state.extensions[EXTENSION]


@appliers.applies(STAGE, CANCEL_REQUESTED)
def _apply_relayed_transition(state: HubState, event: Event) -> None:
    relay = event.payload.get("relay_to")
    if relay:
        notices_of(state).takers.add(relay)


@appliers.applies(RELAYED)
def _apply_relayed(state: HubState, event: Event) -> None:
    p = event.payload
    note = p["notification"]
    notices_of(state).remember(note["notification_id"])
    delivery_of(state).queue_notification(p["audience"], note)


# -- pure decisions


def relay_to(audience: str, origin_hub: str, taker_at_admission: bool, *takers) -> str | None:
    """The peer a notification for `audience` goes back to: a forwarded
    requester (`seat@ORIGIN`) whose origin takes notices: it said so when
    the operation was admitted (journaled with it), or its link says so now,
    or a transition was relayed to it before (journaled). Each of `takers` is
    a collection of peer ids."""
    if not audience.endswith(f"@{origin_hub}"):
        return None
    if taker_at_admission or any(origin_hub in known for known in takers):
        return origin_hub
    return None


def pending_for_peer(outbox: dict, peer: str) -> list[dict]:
    """Every queued notification whose audience is a requester on `peer`,
    oldest first per audience."""
    suffix = f"@{peer}"
    return [note for audience, box in outbox.items() if audience.endswith(suffix)
            for note in box.values()]


def chunks(items: list, size: int = MAX_PER_FRAME) -> list[list]:
    return [items[i:i + size] for i in range(0, len(items), size)]


def read_notice(raw, peer: str, hub_id: str, routes) -> tuple[str, dict] | str:
    """A notice pushed by `peer`, checked against this hub's routes: (the
    local seat it is for, the delivery_status frame that seat gets), or why
    it is not taken (the peer is acknowledged all the same)."""
    if not isinstance(raw, dict):
        return "not an object"
    facts = {}
    for name, kind in NOTICE_FIELDS.items():
        value = raw.get(name)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            return f"the field {name} is missing or malformed"
        if kind is str and len(value.encode()) > MAX_ID_BYTES:
            return f"the field {name} is too long"
        facts[name] = value
    audience = raw.get("audience")
    if not isinstance(audience, str) or not audience.endswith(f"@{hub_id}"):
        return "the audience is not a seat of this hub"
    seat = audience[:-len(hub_id) - 1]
    if facts["stage"] not in STAGES or facts["source"] not in SOURCES:
        return "the stage or source is unknown"
    route = routes.by_key.get(facts["operation_key"])
    if route is None or route.peer != peer or route.sender != seat:
        return "the operation is not routed to this peer for this seat"
    if facts["request_id"] != route.request_id:
        return "the notice names another request"
    frame = {**facts, "audience": seat, "target": f"{facts['target']}@{peer}",
             "remote_hub": peer, "protocol_version": rules.WIRE_VERSION,
             "sender": HUB_SENDER, "type": "delivery_status"}
    return seat, frame


def read_acks(raw, peer: str) -> dict[str, list[str]] | None:
    """An origin's acknowledgements: audience -> notification ids, only for
    audiences on that origin (a peer settles its own requesters' notices and
    nobody else's); None when the frame is malformed."""
    if not isinstance(raw, list) or len(raw) > MAX_PER_FRAME:
        return None
    out: dict[str, list[str]] = {}
    suffix = f"@{peer}"
    for ack in raw:
        if not isinstance(ack, dict):
            return None
        audience, nid = ack.get("audience"), ack.get("notification_id")
        if not isinstance(audience, str) or not isinstance(nid, str) or \
                len(nid.encode()) > MAX_ID_BYTES:
            return None
        if audience.endswith(suffix):
            out.setdefault(audience, []).append(nid)
    return out


def routes(state: HubState):
    return routes_of(state)

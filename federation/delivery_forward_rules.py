"""Forwarded delivery intents (wire v5): the model and the pure decisions.

The kinds a `multihub_message_forward` carries for them, the origin's own
refusal codes, the projection of routed operation keys (`delivery_routes`:
which peer an operation went to and for which seat, so its follow-ups go to
the same peer, after a restart too), and what the origin decides without IO:
may this peer be asked, what a target names, what a peer's answer and its
status facts are worth, whether a routed key would redirect another
operation, which relayed roster sessions to keep. Unit tests:
tests/unit/test_delivery_forward_rules.py. The Router's side is
federation/handlers/delivery_forward.py, the per-peer sender
federation/actors/delivery_sender.py.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import NamedTuple

from hubd.state import delivery_rules as rules
from hubd.state.events import Event
from hubd.state.hub import Appliers, HubState
from hubd.wire.targets import RemoteTargetError, parse_remote

# the kinds of multihub_message_forward this module serves
REQUEST, STATUS, CANCEL = "delivery_request", "delivery_status", "delivery_cancel"
KINDS = frozenset({REQUEST, STATUS, CANCEL})

# refusal codes the origin gives of its own (the seed's list)
UNKNOWN_HUB = rules.UNKNOWN_HUB
PEER_UNREACHABLE = "peer_unreachable"
PEER_REJECTED = "peer_rejected"
PEER_INVALID_ANSWER = "peer_invalid_answer"
INVALID_TARGET = "invalid_target"
JOURNAL_RECOVERY_REQUIRED = "journal_recovery_required"

FEATURE = "delivery_forward"  # what a hubd peer's welcome lists when it serves these kinds
FORWARDING_VERSION = 5  # a peer that is not hubd must say at least this

MAX_IN_FLIGHT = 256  # forwards waiting for a peer's answer, all peers together
MAX_ROUTES = 100_000  # routed operation keys remembered; the oldest goes first
MAX_DETAIL_BYTES = 512

ROUTED = "multihub_delivery_routed"
EXTENSION = "delivery_routes"

_CODE = re.compile(r"[a-z][a-z0-9_]{0,63}\Z")
# the facts of a delivery_status, with their types: all the origin relays
STATUS_FIELDS = {
    "operation_key": str, "request_id": str, "task_id": str, "selected_mode": str,
    "quality": str, "stage": str, "cancel_requested": bool, "receiver_reachable": bool,
    "active_session": bool, "boundary_delivered": bool, "explicitly_acknowledged": bool,
    "task_completed": bool, "latest_event_seq": int}
STAGES = frozenset({rules.QUEUED, rules.BOUNDARY_DELIVERED, rules.ACKNOWLEDGED}) | rules.TERMINAL


# -- the projection: which operation keys went to which peer, for which seat


class Route(NamedTuple):
    peer: str
    sender: str  # the requesting seat on this hub
    request_id: str


@dataclass
class DeliveryRoutes:
    by_key: OrderedDict = field(default_factory=OrderedDict)  # operation key -> Route
    by_request: dict = field(default_factory=dict)  # (sender, request_id) -> operation key
    evicted: int = 0

    def add(self, key: str, route: Route) -> None:
        self.by_key.pop(key, None)
        self.by_key[key] = route
        self.by_request[(route.sender, route.request_id)] = key
        while len(self.by_key) > MAX_ROUTES:
            old_key, old = self.by_key.popitem(last=False)
            if self.by_request.get((old.sender, old.request_id)) == old_key:
                del self.by_request[(old.sender, old.request_id)]
            self.evicted += 1


PROJECTIONS = {EXTENSION: DeliveryRoutes}
appliers = Appliers()


def routes_of(state: HubState) -> DeliveryRoutes:
    return state.extensions[EXTENSION]


@appliers.applies(ROUTED)
def _apply_routed(state: HubState, event: Event) -> None:
    p = event.payload
    routes_of(state).add(p["operation_key"], Route(p["peer"], p["sender"], p["request_id"]))


# -- pure decisions


def peer_serves_delivery(protocol_version: int | None, features: frozenset | None) -> bool:
    """May delivery intents be forwarded to this peer, by what its welcome said?

    A hubd peer lists its extensions (`hubd_features`); it serves forwarded
    intents when it lists FEATURE, whatever integer its welcome carries (hubd
    advertises the highest version whose verbs it implements in full, which
    may stay below 5 while it forwards). Any other peer must say wire v5 or
    later, as the seed asks."""
    if features is not None:
        return FEATURE in features
    return protocol_version is not None and protocol_version >= FORWARDING_VERSION


def read_target(raw) -> tuple[str, str] | rules.Refusal:
    """`PROJECT/seat@HUB` -> (seat, hub), or the refusal for its shape."""
    if not isinstance(raw, str) or "@" not in raw:
        return rules.Refusal(INVALID_TARGET, "a cross-hub target names PROJECT/seat@HUB")
    remote = parse_remote(raw)
    if isinstance(remote, RemoteTargetError):
        return rules.Refusal(INVALID_TARGET, remote.text)
    return remote.seat, remote.hub


def bounded_detail(detail) -> str:
    if not isinstance(detail, str):
        return ""
    return detail.encode("utf-8", "replace")[:MAX_DETAIL_BYTES].decode("utf-8", "ignore")


def read_status(result, expected_key: str | None, request_id: str | None) -> dict | str:
    """The delivery_status facts in a peer's accepted answer, or what is wrong
    with them. `expected_key`: the routed key (a follow-up); `request_id`: the
    request it answers (a new request)."""
    if not isinstance(result, dict) or not isinstance(result.get("status"), dict):
        return "the answer carries no delivery status"
    status = result["status"]
    fields = {}
    for name, kind in STATUS_FIELDS.items():
        value = status.get(name)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            return f"the delivery status field {name} is missing or malformed"
        fields[name] = value
    if not rules.is_digest(fields["operation_key"]):
        return "the operation key is not 64 lower-case hex digits"
    if fields["stage"] not in STAGES:
        return "the delivery stage is unknown"
    if expected_key is not None and fields["operation_key"] != expected_key:
        return "the status names another operation"
    if request_id is not None and fields["request_id"] != request_id:
        return "the status names another request"
    return fields


def route_problem(routes: DeliveryRoutes, local_keys, key: str, route: Route) -> str | None:
    """Why the operation key a peer chose for a new request cannot be routed:
    a key this hub already routes elsewhere (or for another request) or holds
    as a local operation would let the peer redirect another delivery's
    follow-ups. The same route again is a retry of the same request."""
    if key in local_keys:
        return "the operation key is already a local operation on this hub"
    known = routes.by_key.get(key)
    if known is not None and known != route:
        return "the operation key is already routed on this hub"
    return None


def relay_sessions(result: dict, peer: str) -> dict:
    """The delivery sessions in a peer's roster answer, named seat@PEER as a
    who_snapshot lists them; entries that are not a seat with a digest and
    known capabilities are left out."""
    sessions = result.get("delivery_sessions")
    if not isinstance(sessions, dict):
        return {}
    out = {}
    for seat, entry in sessions.items():
        if not isinstance(seat, str) or "@" in seat or not isinstance(entry, dict):
            continue
        incarnation, caps = entry.get("incarnation"), entry.get("capabilities")
        if not rules.is_digest(incarnation) or not isinstance(caps, dict) or not all(
                mode in rules.MODES and quality in ("native", "emulated")
                for mode, quality in caps.items()):
            continue
        out[f"{seat}@{peer}"] = {"incarnation": incarnation, "capabilities": dict(caps),
                                 "hub_id": peer}
    return out


class Answer(NamedTuple):
    status: dict | None  # the relayed facts, when accepted
    code: str  # a refusal code, when refused
    text: str


def read_answer(frame, forward_id: str, expected_key: str | None,
                request_id: str | None) -> Answer:
    """A peer's multihub_message_result for one delivery forward."""
    if not isinstance(frame, dict) or frame.get("type") != "multihub_message_result" or \
            frame.get("forward_id") != forward_id:
        return Answer(None, PEER_INVALID_ANSWER, "the peer's answer is not a forward result")
    disposition = frame.get("disposition")
    if disposition == "refused":
        code = frame.get("reason_code")
        if not isinstance(code, str) or not _CODE.match(code):
            return Answer(None, PEER_INVALID_ANSWER, "the peer refused with a malformed code")
        return Answer(None, code, bounded_detail(frame.get("detail")) or "refused by the peer")
    if disposition not in ("accepted", "duplicate"):
        return Answer(None, PEER_INVALID_ANSWER, "the peer's answer has no known disposition")
    status = read_status(frame.get("result"), expected_key, request_id)
    if isinstance(status, str):
        return Answer(None, PEER_INVALID_ANSWER, status)
    return Answer(status, "", "")

"""Forwarded delivery intents (wire v5): a delivery_request to PROJECT/seat@HUB.

Origin side (`DeliveryForwarder`, inside Router commands plus one task per
request): the request is checked as a local one would be, then sent over the
peer's link as `multihub_message_forward` of kind `delivery_request`, and the
sender hears the peer's answer: the peer's `delivery_status` relayed with
`remote_hub`, or `delivery_refused` with the peer's own code, or one of the
origin's (unknown_hub, peer_unreachable, peer_rejected, peer_invalid_answer,
invalid_target, invalid_shape). The operation key the peer chose is journaled
with the peer and the requesting seat (`multihub_delivery_routed`, projection
`delivery_routes`, replayed at start), so later `delivery_status_request` and
`delivery_cancel` for it go to the same peer, after a restart too, and only
from that seat.

Receiving side (`serve`, called by federation/receiver.py once the peer's
grant for the target's namespace holds): the request is admitted by the
ordinary delivery verbs (hubd/handlers/delivery.py) as from a requester named
`seat@ORIGIN`, the name made here from the authenticated link, never read from
the frame. That requester is marked forwarded (`Session.peer_hub`), so it
never gets interrupt or steer, and its operation key is the origin's
`sha256([origin, seat@origin, request_id])`, as the reference computes it.
The verb's private answer is taken out of this command's sends and returned
in `multihub_message_result`, released after the same commit.

Sender notifications (stage changes) are not pushed back across the link: the
reference does not either (observed, docs/delivery.md "Across hubs"); the
origin sender reads the stages with delivery_status_request.

Decisions are the pure functions at the top (tests/unit/test_delivery_forward_rules.py).
"""

from __future__ import annotations

import asyncio
import re
import secrets
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import NamedTuple

import structlog
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from federation.link import LinkError
from hubd.handlers import delivery as dh
from hubd.handlers.delivery import LIVE, refuse
from hubd.state import delivery_rules as rules
from hubd.state.delivery_intents import delivery_of
from hubd.state.events import Event
from hubd.state.hub import Appliers, HubState
from hubd.state.presence import Session
from hubd.wire.envelope import frame_type
from hubd.wire.targets import RemoteTargetError, parse_remote

log = structlog.get_logger("hubd.federation.delivery")

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


# -- the origin side


class DeliveryForwarder:
    """Delivery forwards in flight to message peers (at most MAX_IN_FLIGHT),
    and the figures about them."""

    def __init__(self, hub, forwarding, peers):
        self.hub = hub
        self.forwarding = forwarding  # federation.forwarding.Forwarding: who the peers are
        self.peers = peers  # federation.peers.PeerLinks
        self.in_flight = 0
        self.outcomes: dict[tuple[str, str, str], int] = {}  # (peer, kind, outcome) -> count
        self._group: asyncio.TaskGroup | None = None
        hub.metrics.registry.register(_Figures(self))

    def start(self, group: asyncio.TaskGroup) -> None:
        self._group = group

    def _count(self, peer: str, kind: str, outcome: str) -> None:
        key = (peer, kind, outcome)
        self.outcomes[key] = self.outcomes.get(key, 0) + 1

    # Router side

    def request(self, router, session: Session, frame: dict) -> None:
        """A delivery_request from a local session to PROJECT/seat@HUB."""
        rid = rules.bounded_text(frame.get("request_id"), "request_id")
        rid = rid if isinstance(rid, str) else ""
        target = read_target(frame.get("target"))
        if isinstance(target, rules.Refusal):
            refuse(router, session, rules.Refusal(target.reason_code, target.text, rid))
            return
        seat, peer = target
        if not self.forwarding.knows(peer):
            refuse(router, session, rules.Refusal(
                UNKNOWN_HUB, f"hub '{peer}' is not a configured message peer", rid))
            return
        # the request's own shape, checked here as the peer would (a malformed
        # request never crosses the link)
        request = rules.read_request({**frame, "target": seat}, router.now)
        if isinstance(request, rules.Refusal):
            refuse(router, session, request)
            return
        routes = routes_of(router.state)
        earlier = routes.by_request.get((session.name, request.request_id))
        if earlier is not None and routes.by_key[earlier].peer != peer:
            refuse(router, session, rules.Refusal(
                rules.ID_CONFLICT, "request identity was reused with new content",
                request.request_id))
            return
        body = {"payload": "", "protocol_version": rules.WIRE_VERSION,
                **request.content(), "request_id": request.request_id}
        body.pop("target")
        self._send(router, session, peer, REQUEST, seat, body, request.request_id, None)

    def follow_up(self, router, session: Session, frame: dict, key: str) -> bool:
        """A status request or cancel naming `key`: True if it is a routed
        operation (then it is forwarded or refused here)."""
        route = routes_of(router.state).by_key.get(key)
        if route is None:
            return False
        if session.name != route.sender:
            # the reference's words for a status and a cancel alike
            refuse(router, session, rules.Refusal(rules.UNAUTHORISED_REQUESTER,
                                                  "request is not visible to sender"))
            return True
        if not self.forwarding.knows(route.peer):
            refuse(router, session, rules.Refusal(
                UNKNOWN_HUB, f"hub '{route.peer}' is no longer a configured message peer"))
            return True
        kind = CANCEL if frame_type(frame) == "delivery_cancel" else STATUS
        body = {"operation_key": key, "protocol_version": rules.WIRE_VERSION}
        if kind == CANCEL:
            body["mutation_id"] = frame.get("mutation_id")  # checked by the caller
        self._send(router, session, route.peer, kind, "", body, None, key)
        return True

    def _send(self, router, session: Session, peer: str, kind: str, seat: str, body: dict,
              request_id: str | None, routed_key: str | None) -> None:
        rid = request_id or ""
        link = self.peers.link(peer)
        why = None
        if not link.up:
            why = rules.Refusal(PEER_UNREACHABLE, f"the link to hub '{peer}' is down", rid)
        elif not peer_serves_delivery(link.peer_protocol_version, link.features):
            why = rules.Refusal(PEER_REJECTED, f"hub '{peer}' does not serve forwarded "
                                               "delivery intents (wire v5)", rid)
        elif self.in_flight >= MAX_IN_FLIGHT or self._group is None:
            log.warning("delivery forward refused: too many waiting for peers",
                        peer=peer, in_flight=self.in_flight)
            why = rules.Refusal(PEER_UNREACHABLE, f"{MAX_IN_FLIGHT} delivery forwards are "
                                                  "already waiting for peers; retry", rid)
        if why is not None:
            self._count(peer, kind, why.reason_code)
            refuse(router, session, why)
            return
        forward_id = secrets.token_hex(16)
        frame = {"sender": self.hub.hub_id, "target": peer, "type": "multihub_message_forward",
                 "payload": "", "timestamp": router.now, "forward_id": forward_id,
                 "kind": kind, "sender_seat": session.name, "target_seat": seat, "body": body}
        self.in_flight += 1
        asking = _Asking(session, peer, kind, forward_id, request_id, routed_key)
        self._group.create_task(self._ask(link, frame, asking),
                                name=f"delivery-forward-{peer}")

    async def _ask(self, link, frame: dict, asking: "_Asking") -> None:
        try:
            # timing.forward_answer: the seed's bound on one forward's answer
            answer = await link.request(frame, self.hub.config.timing.forward_answer,
                                        key=asking.forward_id)
        except LinkError as exc:
            answer = exc
        finally:
            self.in_flight -= 1
        self.hub.router.post_control(lambda router: self._answered(router, asking, answer))

    def _answered(self, router, asking: "_Asking", answer) -> None:
        """The peer's answer (or the link's failure), in a Router command."""
        session = asking.session
        rid = asking.request_id or ""
        if isinstance(answer, LinkError):
            result = Answer(None, PEER_UNREACHABLE, f"hub '{asking.peer}' did not answer: "
                                                    f"{answer.detail}")
        else:
            result = read_answer(answer, asking.forward_id, asking.routed_key,
                                 asking.request_id)
        if result.status is not None and asking.kind == REQUEST:
            key = result.status["operation_key"]
            route = Route(asking.peer, session.name, asking.request_id)
            problem = route_problem(routes_of(router.state), delivery_of(router.state).ops,
                                    key, route)
            if problem is not None:
                result = Answer(None, PEER_INVALID_ANSWER, problem)
            elif routes_of(router.state).by_key.get(key) != route:
                if router.mutations_refused():
                    result = Answer(None, JOURNAL_RECOVERY_REQUIRED,
                                    "this hub cannot journal the route right now; retry")
                else:
                    router.event(ROUTED, {"operation_key": key, "peer": asking.peer,
                                          "sender": session.name,
                                          "request_id": asking.request_id})
                    # the status is released only after the route commits;
                    # if it cannot be, the sender hears why instead
                    router.send_on_failure(session.endpoint, "delivery_refused", lambda: (
                        router.frame("delivery_refused", session.name,
                                     "this hub could not journal the route; retry",
                                     request_id=rid, reason_code=JOURNAL_RECOVERY_REQUIRED,
                                     protocol_version=rules.WIRE_VERSION)))
        outcome = "accepted" if result.status is not None else result.code
        self._count(asking.peer, asking.kind, outcome)
        if result.code in (PEER_INVALID_ANSWER, PEER_UNREACHABLE):
            log.warning("delivery forward failed", peer=asking.peer, kind=asking.kind,
                        reason=result.code, detail=result.text)
        if router.presence.sessions.get(session.endpoint) is not session:
            return  # the sender left; the route (if any) is journaled for its next status
        if result.status is not None:
            router.reply(session, "delivery_status", "Delivery state.", **result.status,
                         protocol_version=rules.WIRE_VERSION, remote_hub=asking.peer)
        else:
            refuse(router, session, rules.Refusal(result.code, result.text, rid))


class _Asking(NamedTuple):
    session: Session
    peer: str
    kind: str
    forward_id: str
    request_id: str | None  # a new request's id
    routed_key: str | None  # a follow-up's operation key


class _Figures:
    def __init__(self, forwarder: DeliveryForwarder):
        self.forwarder = forwarder

    def describe(self):
        return []

    def collect(self):
        f = self.forwarder
        total = CounterMetricFamily(
            "hubd_delivery_forward", "Delivery forwards by peer, kind and outcome "
            "(accepted, or the refusal code the sender got).",
            labels=["peer", "kind", "outcome"])
        for (peer, kind, outcome), n in sorted(f.outcomes.items()):
            total.add_metric([peer, kind, outcome], n)
        yield total
        yield GaugeMetricFamily("hubd_delivery_forward_in_flight",
                                f"Delivery forwards waiting for a peer's answer "
                                f"(bound {MAX_IN_FLIGHT}).", value=f.in_flight)
        router = f.hub.router
        if router is not None:
            routes = routes_of(router.state)
            yield GaugeMetricFamily("hubd_delivery_routes",
                                    f"Operation keys routed to peers (bound {MAX_ROUTES}).",
                                    value=len(routes.by_key))
            yield GaugeMetricFamily("hubd_delivery_routes_evicted",
                                    "Routed operation keys evicted past the bound (since "
                                    "this process replayed its journal).", value=routes.evicted)


# -- the receiving side


def roster_sessions(router, seats) -> dict:
    """The live delivery sessions of `seats` (a peer's roster answer)."""
    live = router.live.get(LIVE) or {}
    return {seat: {"incarnation": live[seat].incarnation,
                   "capabilities": dict(live[seat].capabilities)}
            for seat in seats if seat in live}


VIRTUAL_ENDPOINT = -1  # the forwarded requester's answers are taken back before release


def serve(router, link_session: Session, origin: str, forward: dict, size: int) -> tuple:
    """One delivery forward from a granted peer (receiver.py checked the
    grant, origin, seats and body). Returns (disposition, reason_code, detail,
    result) for its multihub_message_result."""
    kind = forward["kind"]
    seat, body = forward["sender_seat"], forward["body"]
    if kind in (REQUEST, CANCEL) and router.mutations_refused():
        return ("refused", JOURNAL_RECOVERY_REQUIRED,
                f"this hub cannot write its journal right now ({router.refusing_mutations})", {})
    requester = Session(VIRTUAL_ENDPOINT, principal=f"federation-peer:{origin}",
                        peer_host=link_session.peer_host, name=f"{seat}@{origin}",
                        protocol_version=rules.WIRE_VERSION, peer_hub=origin)
    frame = {k: v for k, v in body.items() if k not in ("sender", "type")}
    frame.update(sender=requester.name, type=kind if kind != STATUS else
                 "delivery_status_request")
    if kind == REQUEST:
        frame["target"] = forward["target_seat"]
    mark = len(router.out.sends)
    handler = {REQUEST: dh.delivery_request, STATUS: dh.delivery_status_request,
               CANCEL: dh.delivery_cancel}[kind]
    handler(router, requester, frame, size)
    answer = _take_answer(router, mark)
    if answer is None:
        log.error("a forwarded delivery verb gave no answer", kind=kind, origin=origin)
        return ("refused", rules.INVALID_SHAPE, "the delivery verb gave no answer", {})
    if answer.get("type") == "delivery_refused":
        return ("refused", answer.get("reason_code") or rules.INVALID_SHAPE,
                str(answer.get("payload", "")), {})
    return ("accepted", "", "", {"status": answer})


def _take_answer(router, mark: int) -> dict | None:
    """Take the forwarded requester's private answer out of this command's
    sends (it goes back in the forward's result instead)."""
    sends = router.out.sends
    answer = None
    for i in range(len(sends) - 1, mark - 1, -1):
        dest, message, _ = sends[i]
        if dest == VIRTUAL_ENDPOINT:
            del sends[i]
            if answer is None:
                answer = message.frame
    return answer

"""Forwarded delivery intents (wire v5): a delivery_request to PROJECT/seat@HUB.

Origin side (`DeliveryForwarder`, inside Router commands): the request is
checked as a local one would be, then handed to the peer's DeliverySender
actor (federation/actors/delivery_sender.py), which sends it over the peer's
link as `multihub_message_forward` of kind `delivery_request`; its answer
comes back as a DeliveryAnswered command, and the sender hears the peer's
answer: the peer's `delivery_status` relayed with `remote_hub`, or
`delivery_refused` with the peer's own code, or one of the origin's
(unknown_hub, peer_unreachable, peer_rejected, peer_invalid_answer,
invalid_target, invalid_shape). The operation key the peer chose is journaled
with the peer and the requesting seat (`multihub_delivery_routed`, projection
`delivery_routes`, replayed at start), so later `delivery_status_request` and
`delivery_cancel` for it go to the same peer, after a restart too, and only
from that seat.

Receiving side (`serve`, called by federation/handlers/receiver.py once the
peer's grant for the target's namespace holds): the request is admitted by the
ordinary delivery verbs (hubd/handlers/delivery.py) as from a requester named
`seat@ORIGIN`, the name made here from the authenticated link, never read from
the frame. That requester is marked forwarded (`Session.peer_hub`), so it
never gets interrupt or steer, and its operation key is the origin's
`sha256([origin, seat@origin, request_id])`, as the reference computes it.
The verb's private answer is taken out of this command's sends and returned
in `multihub_message_result`, released after the same commit.

Sender notifications (stage changes) are pushed back across the link to an
origin that takes them (federation/handlers/delivery_notices.py; the reference
does not, docs/delivery.md "Stage changes across hubs"); delivery_status_request
still reads them.

The model and the pure decisions are federation/delivery_forward_rules.py
(tests/unit/test_delivery_forward_rules.py).
"""

from __future__ import annotations

import asyncio
import secrets

import structlog
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from federation.handlers.delivery_notices import NoticesArrived
from federation.actors.delivery_sender import DeliveryAnswered, DeliveryAsk, DeliverySender
from federation.delivery_forward_rules import (CANCEL, JOURNAL_RECOVERY_REQUIRED, MAX_IN_FLIGHT,
                                               MAX_ROUTES, PEER_INVALID_ANSWER,
                                               PEER_UNREACHABLE, REQUEST, ROUTED, STATUS,
                                               UNKNOWN_HUB, Answer, Route, read_answer,
                                               read_target, route_problem, routes_of)
from hubd.handlers import delivery as dh
from hubd.handlers.delivery import live_sessions, refuse
from hubd.state import delivery_rules as rules
from hubd.state.delivery_intents import delivery_of
from hubd.state.presence import Session
from hubd.wire.envelope import frame_type

log = structlog.get_logger("hubd.federation.delivery")


# -- the origin side


class DeliveryForwarder:
    """The Router's side of delivery forwards: what goes to which peer's
    DeliverySender, how many wait for peers (at most MAX_IN_FLIGHT, all peers
    together), the answers turned into journaled routes and replies, and the
    figures about them. Its counts change only in Router commands."""

    def __init__(self, hub, forwarding, peers):
        self.hub = hub
        self.forwarding = forwarding  # federation.handlers.forwarding.Forwarding: who the peers are
        self.peers = peers  # federation.actors.peers.PeerLinks
        self.senders: dict[str, DeliverySender] = {}
        self.in_flight = 0
        self.outcomes: dict[tuple[str, str, str], int] = {}  # (peer, kind, outcome) -> count
        self._group: asyncio.TaskGroup | None = None
        hub.metrics.registry.register(_Figures(self))

    def start(self, group: asyncio.TaskGroup) -> None:
        self._group = group
        for peer in self.forwarding.config.message_peers:
            self._add_sender(peer)

    def reconfigure(self) -> None:
        """After SIGHUP: a sender for each new message peer."""
        for peer in self.forwarding.config.message_peers:
            if peer not in self.senders:
                self._add_sender(peer)

    def _add_sender(self, peer: str) -> None:
        sender = DeliverySender(peer, self.peers.link(peer),
                                lambda **events: self.peers.subscribe(peer, **events),
                                self.hub.router.post_control,
                                timeout=self.hub.config.timing.forward_answer)
        self.senders[peer] = sender
        # the peer's pushed stage changes (federation/handlers/delivery_notices.py)
        post = self.hub.router.post_control
        self.peers.subscribe(peer, on_push=lambda peer_, frame: post(
            NoticesArrived(peer_, frame.get("notices"))))
        self._group.create_task(sender.run(), name=f"delivery-sender-{peer}")

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
        forward_id = secrets.token_hex(16)
        frame = {"sender": self.hub.hub_id, "target": peer, "type": "multihub_message_forward",
                 "payload": "", "timestamp": router.now, "forward_id": forward_id,
                 "kind": kind, "sender_seat": session.name, "target_seat": seat, "body": body}
        ask = DeliveryAsk(forward_id, kind, frame, session.endpoint, session.name, request_id,
                          routed_key)
        sender = self.senders.get(peer)
        if self.in_flight >= MAX_IN_FLIGHT or sender is None or not sender.submit(ask):
            log.warning("delivery forward refused: too many waiting for peers",
                        peer=peer, in_flight=self.in_flight)
            self._count(peer, kind, PEER_UNREACHABLE)
            refuse(router, session, rules.Refusal(
                PEER_UNREACHABLE, f"{MAX_IN_FLIGHT} delivery forwards are already waiting "
                                  "for peers; retry", request_id or ""))
            return
        self.in_flight += 1

    def answered(self, router, answered: DeliveryAnswered) -> None:
        """A Router command: the peer's answer (or the sender's refusal)
        journals the route of a new request and answers the requester."""
        self.in_flight -= 1
        ask, peer = answered.ask, answered.peer
        rid = ask.request_id or ""
        if answered.answer is None:
            result = Answer(None, answered.code, answered.text)
        else:
            result = read_answer(answered.answer, ask.forward_id, ask.routed_key,
                                 ask.request_id)
        if result.status is not None and ask.kind == REQUEST:
            key = result.status["operation_key"]
            route = Route(peer, ask.sender, ask.request_id)
            problem = route_problem(routes_of(router.state), delivery_of(router.state).ops,
                                    key, route)
            if problem is not None:
                result = Answer(None, PEER_INVALID_ANSWER, problem)
            elif routes_of(router.state).by_key.get(key) != route:
                if router.mutations_refused():
                    result = Answer(None, JOURNAL_RECOVERY_REQUIRED,
                                    "this hub cannot journal the route right now; retry")
                else:
                    router.event(ROUTED, {"operation_key": key, "peer": peer,
                                          "sender": ask.sender, "request_id": ask.request_id})
                    # the status is released only after the route commits;
                    # if it cannot be, the sender hears why instead
                    router.send_on_failure(ask.reply_to, "delivery_refused", lambda: (
                        router.frame("delivery_refused", ask.sender,
                                     "this hub could not journal the route; retry",
                                     request_id=rid, reason_code=JOURNAL_RECOVERY_REQUIRED,
                                     protocol_version=rules.WIRE_VERSION)))
        outcome = "accepted" if result.status is not None else result.code
        self._count(peer, ask.kind, outcome)
        if result.code in (PEER_INVALID_ANSWER, PEER_UNREACHABLE):
            log.warning("delivery forward failed", peer=peer, kind=ask.kind,
                        reason=result.code, detail=result.text)
        session = router.presence.sessions.get(ask.reply_to)
        if session is None or session.name != ask.sender:
            return  # the sender left; the route (if any) is journaled for its next status
        if result.status is not None:
            router.reply(session, "delivery_status", "Delivery state.", **result.status,
                         protocol_version=rules.WIRE_VERSION, remote_hub=peer)
        else:
            refuse(router, session, rules.Refusal(result.code, result.text, rid))


def on_answered(router, answered: DeliveryAnswered) -> None:
    """The DeliveryAnswered command (federation/plugin.py registers it)."""
    router.hub.federation.delivery.answered(router, answered)


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
    live = live_sessions(router)
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
    mark = router.sends_queued()
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
    taken = router.withdraw(VIRTUAL_ENDPOINT, mark)
    return taken[-1].frame if taken else None

"""Session-bound delivery verbs (wire v3) on one hub: delivery sessions,
delivery_request, delivery_status_request, delivery_cancel, delivery_boundary,
delivery_ack, delivery_outcome; the deadline sweep; who_snapshot's
delivery_sessions. Design: docs/delivery.md.

Decisions are hubd.state.delivery_rules (pure); the aggregate is
hubd.state.delivery_intents (projected from the journal). Here they become
events and frames, and every frame a transition owes is in the same Outcome
as its events, so nothing leaves the hub before the transition is durable.
"""

from __future__ import annotations

from typing import NamedTuple

import structlog

from hubd.actors.router import Router
from hubd.core.plugin import Verbs
from hubd.state import claims as cl
from hubd.state import delivery_intents as di
from hubd.state import delivery_rules as rules
from hubd.state import principals as pr
from hubd.state.presence import Session
from hubd.wire.envelope import HUB_SENDER, frame_type

from . import routing

log = structlog.get_logger("hubd.delivery")

verbs = Verbs()

CLOSE_DELIVERY_SESSION = 4020  # the reference's close code for a refused delivery session


class LiveSession:
    __slots__ = ("endpoint", "incarnation", "capabilities")

    def __init__(self, endpoint: int, incarnation: str, capabilities: dict):
        self.endpoint, self.incarnation, self.capabilities = endpoint, incarnation, capabilities


class DeliveryLive:
    """Live delivery bookkeeping (presence-like: rebuilt by reconnecting)."""

    def __init__(self, router: Router):
        self.sessions: dict[str, LiveSession] = {}  # name -> its delivery session
        # audience -> {notification_id: None}: released, not yet journaled (below)
        self.settle: dict[str, dict] = {}


def live_sessions(router: Router) -> dict:
    """name -> its live delivery session (LiveSession)."""
    return router.live_of(DeliveryLive).sessions


def _state(router: Router) -> di.DeliveryState:
    return di.delivery_of(router.state)


def _v3_session(router: Router, name: str) -> Session | None:
    session = router.presence.session_of(name)
    if session is not None and (session.protocol_version or 0) >= rules.WIRE_VERSION:
        return session
    return None


# -- frames


def refuse(router: Router, session: Session, refusal: rules.Refusal) -> None:
    """A typed refusal to the requester only. It names the request by an id
    that passed its own check, never the body, token or an invalid id."""
    router.reply(session, "delivery_refused", refusal.text, request_id=refusal.request_id,
                 reason_code=refusal.reason_code, protocol_version=rules.WIRE_VERSION)


def status_fields(router: Router, op: di.Operation) -> dict:
    live = live_sessions(router).get(op.target)
    current = live is not None and live.incarnation == op.target_incarnation
    online = router.presence.session_of(op.target)
    reachable = current and online is not None and online.endpoint == live.endpoint
    return {"operation_key": op.key, "request_id": op.request_id, "task_id": op.task_id,
            "selected_mode": op.selected_mode, "quality": op.quality, "stage": op.stage,
            "cancel_requested": op.cancel_requested, "receiver_reachable": reachable,
            "active_session": current, "boundary_delivered": op.boundary_delivered,
            "explicitly_acknowledged": op.acknowledged,
            "task_completed": op.stage == rules.COMPLETED,
            "latest_event_seq": op.latest_event_seq, "protocol_version": rules.WIRE_VERSION}


def reply_status(router: Router, session: Session, op: di.Operation) -> None:
    router.reply(session, "delivery_status", "Delivery state.", **status_fields(router, op))


def offer_frame(op: di.Operation) -> dict:
    return {"body": op.body, "deadline": op.deadline, "notification_id": op.offer_notification_id,
            "operation_key": op.key, "origin_hub": op.origin_hub,
            "protocol_version": rules.WIRE_VERSION, "quality": op.quality,
            "request_id": op.request_id, "requested_mode": op.requested_mode,
            "selected_mode": op.selected_mode, "sender": op.sender, "target": op.target,
            "target_incarnation": op.target_incarnation, "task_id": op.task_id,
            "type": "delivery_offer"}


def _notification(op: di.Operation, audience: str, source: str, stage: str, number: int,
                  seq: int, cancel_requested: bool) -> dict:
    return {"audience": audience, "cancel_requested": cancel_requested, "event_seq": seq,
            "notification_id": rules.notification_id(op.key, number), "operation_key": op.key,
            "protocol_version": rules.WIRE_VERSION, "request_id": op.request_id,
            "sender": HUB_SENDER, "source": source, "stage": stage, "target": op.target,
            "target_incarnation": op.target_incarnation, "task_id": op.task_id,
            "type": "delivery_status"}


def _send_offer(router: Router, endpoint: int, op: di.Operation) -> None:
    frame = offer_frame(op)
    router.send(endpoint, frame)


# -- notifications: journaled with their transition, released after it, settled
# once on the audience's socket queue (a crash in between sends them again).
#
# A settlement is not worth a commit of its own: journaled on its own, it took
# one more fsync after every stage, in front of the next stage's commit (seven
# serial commits per request -> completed round trip instead of four). Released
# ids are held in `DeliveryLive.settle` and journaled in the next delivery
# transaction that commits anyway (an admission, a transition), before a
# replay to their audience when it registers again, or by the once-a-second
# sweep. Until then they are still in the outbox, so a crash re-sends them
# with the same ids: at least once, as before, over a window of at most about
# a second rather than one commit.



class NotificationsReleased(NamedTuple):
    """These notifications are on their audience's endpoint: settle them
    with the next delivery commit."""

    audience: str
    ids: list


def deliver_pending(router: Router, audience: str, endpoint: int) -> None:
    _journal_settled(router, audience)  # released to an earlier socket: not again
    waiting = _state(router).pending_for(audience)
    if not waiting:
        return
    for _, frame in waiting:
        router.send(endpoint, frame)
    ids = [nid for nid, _ in waiting]
    _settle_once_released(router, audience, ids)


def _settle_once_released(router: Router, audience: str, ids: list[str]) -> None:
    released = NotificationsReleased(audience, ids)
    router.after_release(lambda: router.post_control(released))


def released(router: Router, command: NotificationsReleased) -> None:
    """A control command after the release: remember what to settle (no commit)."""
    box = router.live_of(DeliveryLive).settle.setdefault(command.audience, {})
    for nid in command.ids:
        box[nid] = None


def _journal_settled(router: Router, audience: str | None = None) -> None:
    """Journal the held settlements (of one audience, or all) in this command's
    outcome: one delivery_notified event per audience."""
    held = router.live_of(DeliveryLive).settle
    if not held or router.mutations_refused():
        return
    names = [audience] if audience is not None else list(held)
    outbox = _state(router).outbox
    for name in names:
        ids = held.pop(name, None)
        if not ids:
            continue
        box = outbox.get(name)
        still = [i for i in ids if box and i in box]
        if still:
            router.event(di.NOTIFIED, {"audience": name, "notification_ids": still})


def _transition(router: Router, op: di.Operation, kind: str, stage: str, source: str,
                audience: str, **payload) -> None:
    """Journal one transition with the notification it owes `audience`, and
    send that notification now if the audience is online (released after
    the commit, like everything in this command's outcome)."""
    _journal_settled(router)
    number = op.notifications + 1
    seq = router.next_seq()
    cancel = op.cancel_requested or kind == di.CANCEL_REQUESTED
    note = _notification(op, audience, source, stage, number, seq, cancel)
    # a forwarded requester (seat@ORIGIN): its origin may take the notice back
    # over the link (federation/delivery_notice_rules.py); the event says so,
    # so a replay queues it the same
    relay = routing.notice_peer(router, audience, op.origin_hub, op.origin_takes_notices)
    if relay is not None:
        payload = {**payload, "relay_to": relay}
    router.event(kind, {"operation_key": op.key, "stage": stage, "source": source,
                        "notification": note, "notification_number": number, **payload})
    if relay is not None:
        routing.push_notices(router, relay, [note])
        return
    online = _v3_session(router, audience)
    if online is not None:
        router.send(online.endpoint, note)
        _settle_once_released(router, audience, [note["notification_id"]])


# -- delivery sessions (the registering heartbeat)


def on_register(router: Router, session: Session, frame: dict) -> None:
    name = session.name
    advert = rules.read_session(frame, session.protocol_version) \
        if frame_type(frame) == "heartbeat" else None
    if isinstance(advert, rules.Refusal):
        router.send(session.endpoint, router.frame("error", name, advert.text,
                                                   reason_code=advert.reason_code))
        router.close(session.endpoint, CLOSE_DELIVERY_SESSION, "delivery session refused")
        return
    if advert is not None:
        _register_session(router, session, advert)
    else:
        held = live_sessions(router).get(name)
        if held is not None and held.endpoint != session.endpoint:
            del live_sessions(router)[name]  # taken over by a session without delivery
    if (session.protocol_version or 0) >= rules.WIRE_VERSION:
        deliver_pending(router, name, session.endpoint)


def _register_session(router: Router, session: Session, advert: rules.SessionAdvert) -> None:
    name = session.name
    incarnation = rules.incarnation_of(router.hub_id, name, advert.token)
    live_sessions(router)[name] = LiveSession(session.endpoint, incarnation, advert.capabilities)
    router.reply(session, "delivery_session", "Delivery session registered.",
                 incarnation=incarnation, capabilities=advert.capabilities,
                 protocol_version=rules.WIRE_VERSION)
    d = _state(router)
    if not router.mutations_refused():
        # a new process token: the old incarnation's unfinished work can never
        # reach its turn boundary, so it ends here, told to its senders
        stale = [op for op in d.unfinished_of(name) if op.target_incarnation != incarnation]
        for op in stale:
            _transition(router, op, di.STAGE, rules.SUPERSEDED, rules.SOURCE_HUB, op.sender)
        if stale:
            log.info("delivery work superseded by a new recipient incarnation", recipient=name,
                     operations=len(stale))
    # the same token again (a reconnect): its queued offers go out again, with
    # the notification ids they had
    for op in d.queued_for(incarnation):
        _send_offer(router, session.endpoint, op)


def on_unregister(router: Router, session: Session) -> None:
    live = live_sessions(router)
    if live:
        held = live.get(session.name)
        if held is not None and held.endpoint == session.endpoint:
            del live[session.name]


def who_sessions(router: Router, session: Session) -> dict | None:
    """who_snapshot's delivery_sessions, for v3 requesters only (older ones
    never see the field)."""
    if (session.protocol_version or 0) < rules.WIRE_VERSION:
        return None
    return {name: {"incarnation": s.incarnation, "capabilities": dict(s.capabilities),
                   "hub_id": router.hub_id}
            for name, s in sorted(live_sessions(router).items())}


# -- delivery_request


def _control_refusal(router: Router, session: Session, target: str, mode: str,
                     task_id: str) -> rules.Refusal | None:
    if mode not in rules.CONTROL_MODES:
        return None
    table = router.hub.identity.table
    requester = rules.Requester(session.name, session.principal,
                                authenticated_hub=not table.open,
                                forwarded=session.peer_hub is not None)
    lease = cl.claims_of(router.state).live(task_id, router.now)
    return rules.may_control(requester, mode,
                             granted=pr.control_granted(table, session.credential, target),
                             task_claimed=lease is not None and lease["owner"] == session.name)


@verbs.handles("delivery_request")
def delivery_request(router: Router, session: Session, frame: dict, size: int) -> None:
    if not rules.speaks_v3(session.protocol_version, frame):
        rid = rules.bounded_text(frame.get("request_id"), "request_id")
        refuse(router, session, rules.Refusal(
            rules.UNSUPPORTED_PROTOCOL, "peer did not negotiate delivery version 3",
            rid if isinstance(rid, str) else ""))
        return
    if routing.forward_delivery(router, session, frame):
        return  # PROJECT/seat@HUB: admitted by that hub (federation/handlers/delivery_forward.py)
    request = rules.read_request(frame, router.now)
    if isinstance(request, rules.Refusal):
        refuse(router, session, request)
        return
    d = _state(router)
    origin = session.peer_hub or router.hub_id  # a forwarded request keeps its origin
    key = rules.operation_key(origin, session.name, request.request_id)
    digest = request.digest()
    existing = d.ops.get(key)
    identity = rules.admission_identity(
        request.request_id, digest, existing.digest if existing is not None else None,
        d.by_idempotency.get((origin, session.name, request.idempotency_key)))
    if isinstance(identity, rules.Refusal):
        refuse(router, session, identity)
        return
    if identity == rules.RETRY:  # the original operation as it stands now
        reply_status(router, session, existing)
        return
    def no(code: str, text: str) -> None:
        refuse(router, session, rules.Refusal(code, text, request.request_id))
    live = live_sessions(router).get(request.target)
    if live is None or router.presence.session_of(request.target) is None:
        no(rules.UNAVAILABLE_RECIPIENT, "recipient has no active delivery session")
        return
    if live.incarnation != request.target_incarnation:
        no(rules.STALE_INCARNATION, "recipient session changed")
        return
    selection = rules.select_mode(request.mode, request.allowed_fallbacks, live.capabilities)
    if isinstance(selection, rules.Refusal):
        no(selection.reason_code, selection.text)
        return
    control = _control_refusal(router, session, request.target, selection.mode,
                               request.task_id)
    if control is not None:
        no(control.reason_code, control.text)
        return
    expire_due(router)  # lapsed work must not hold places in the queue
    caps = rules.admission_caps(len(d.by_incarnation.get(live.incarnation, ())),
                                d.from_sender(live.incarnation, session.name),
                                d.unfinished, di.UNFINISHED_TOTAL)
    if caps is not None:
        log.warning("delivery admission refused: queue full", recipient=request.target,
                    sender=session.name)
        no(caps.reason_code, caps.text)
        return
    _journal_settled(router)
    accepted = {
        "operation_key": key, "origin_hub": origin, "sender": session.name,
        "target": request.target, "target_incarnation": request.target_incarnation,
        "request_id": request.request_id, "idempotency_key": request.idempotency_key,
        "task_id": request.task_id, "requested_mode": request.mode,
        "allowed_fallbacks": list(request.allowed_fallbacks),
        "selected_mode": selection.mode, "quality": selection.quality, "body": request.body,
        "deadline": request.deadline, "request_digest": digest}
    if session.peer_hub is not None and routing.takes_notices(router, origin):
        # the origin takes stage changes back: a fact of the operation, so a
        # restart of this hub before the origin's link registers again still
        # queues them for it (federation/delivery_notice_rules.py)
        accepted["origin_takes_notices"] = True
    router.event(di.ACCEPTED, accepted)
    router.event(di.QUEUED, {"operation_key": key, "stage": rules.QUEUED,
                             "notification_id": rules.notification_id(key, 1),
                             "notification_number": 1})
    op = d.ops[key]
    reply_status(router, session, op)
    _send_offer(router, live.endpoint, op)


# -- status and cancel (the sender's side)


def _lookup(router: Router, session: Session, frame: dict) -> di.Operation | None:
    """The operation a status or cancel frame names, or None after refusing."""
    if not rules.speaks_v3(session.protocol_version, frame):
        refuse(router, session, rules.Refusal(rules.UNSUPPORTED_PROTOCOL,
                                              "peer did not negotiate delivery version 3"))
        return None
    key = frame.get("operation_key")
    if not rules.is_digest(key):
        refuse(router, session, rules.Refusal(rules.INVALID_SHAPE, "operation key is malformed"))
        return None
    if routing.routed_delivery(router, session, frame, key):
        return None  # an operation on a peer hub: asked there
    op = _state(router).ops.get(key)
    if op is None:
        refuse(router, session, rules.Refusal(rules.UNKNOWN_REQUEST,
                                              "delivery request does not exist"))
    return op


@verbs.handles("delivery_status_request")
def delivery_status_request(router: Router, session: Session, frame: dict, size: int) -> None:
    op = _lookup(router, session, frame)
    if op is None:
        return
    if session.name not in (op.sender, op.target):
        refuse(router, session, rules.Refusal(rules.UNAUTHORISED_REQUESTER,
                                              "request is not visible to sender"))
        return
    reply_status(router, session, op)


@verbs.handles("delivery_cancel")
def delivery_cancel(router: Router, session: Session, frame: dict, size: int) -> None:
    if not rules.speaks_v3(session.protocol_version, frame):
        refuse(router, session, rules.Refusal(rules.UNSUPPORTED_PROTOCOL,
                                              "peer did not negotiate delivery version 3"))
        return
    mutation_id = rules.read_mutation_id(frame.get("mutation_id"))
    if isinstance(mutation_id, rules.Refusal):
        refuse(router, session, mutation_id)
        return
    op = _lookup(router, session, frame)
    if op is None:
        return
    if session.name != op.sender:
        refuse(router, session, rules.Refusal(rules.UNAUTHORISED_REQUESTER,
                                              "only sender can request cancellation"))
        return
    expire_due(router)
    decision = rules.cancel_decision(op.stage, op.cancel_requested)
    if isinstance(decision, rules.Refusal):
        refuse(router, session, decision)
        return
    if decision == "request":
        _transition(router, op, di.CANCEL_REQUESTED, op.stage, rules.SOURCE_SENDER, op.target,
                    mutation_id=mutation_id)
    reply_status(router, session, op)


# -- the recipient's reports


@verbs.handles("delivery_boundary", "delivery_ack", "delivery_outcome")
def delivery_report(router: Router, session: Session, frame: dict, size: int) -> None:
    if not rules.speaks_v3(session.protocol_version, frame):
        refuse(router, session, rules.Refusal(rules.UNSUPPORTED_PROTOCOL,
                                              "peer did not negotiate delivery version 3"))
        return
    report = rules.read_report(frame_type(frame), frame)
    if isinstance(report, rules.Refusal):
        refuse(router, session, report)
        return
    def no(code: str, text: str) -> None:
        refuse(router, session, rules.Refusal(code, text, report.request_id))
    op = _state(router).ops.get(report.operation_key)
    if op is None:
        no(rules.UNKNOWN_REQUEST, "delivery request does not exist")
        return
    if session.name != op.target:
        no(rules.UNAUTHORISED_REQUESTER, "sender is not the recipient")
        return
    if (report.request_id, report.task_id) != (op.request_id, op.task_id):
        no(rules.INVALID_SHAPE, "stage correlation does not match request")
        return
    digest = report.digest()
    seen = op.mutations.get(report.mutation_id)
    if seen is not None:
        if seen == digest:
            reply_status(router, session, op)  # a retry: nothing appended
        else:
            no(rules.ID_CONFLICT, "mutation identity was reused with new content")
        return
    live = live_sessions(router).get(session.name)
    if op.unfinished and (live is None or live.endpoint != session.endpoint
                          or live.incarnation != op.target_incarnation):
        no(rules.STALE_INCARNATION, "recipient session changed")
        return
    expire_due(router)
    step = rules.report_transition(op.stage, report.stage, op.cancel_requested)
    if step is not None:
        no(step.reason_code, step.text)
        return
    _transition(router, op, di.STAGE, report.stage, rules.SOURCE_RECIPIENT, op.sender,
                mutation_id=report.mutation_id, report_digest=digest, evidence=report.evidence)
    reply_status(router, session, op)


# -- the deadline sweep (the hub's once-a-second periodic hook)


def expire_due(router: Router) -> None:
    d = _state(router)
    heap = d.deadlines
    if not heap or heap[0][0] > router.now:
        return
    due = d.due(router.now)
    for op in due:
        _transition(router, op, di.STAGE, rules.EXPIRED, rules.SOURCE_HUB, op.sender)
    if due:
        log.info("delivery work expired at its deadline", operations=len(due))


def sweep(router: Router) -> None:
    if "hubd_delivery_unfinished" not in router.metrics.gauges:
        register_gauges(router)
    if router.mutations_refused():
        return
    _journal_settled(router)
    expire_due(router)


def register_gauges(router: Router) -> None:
    def gauge(name, text, read):
        router.metrics.gauge(name, text, read)
    d = lambda: _state(router)  # noqa: E731 - the state object is replaced on a rebuild
    gauge("hubd_delivery_unfinished", f"Unfinished delivery operations (bound "
          f"{di.UNFINISHED_TOTAL}; {rules.PER_INCARNATION} per recipient incarnation, "
          f"{rules.PER_SENDER} per sender within it).", lambda: d().unfinished)
    gauge("hubd_delivery_retained", f"Delivery operations kept for status and retries "
          f"(finished ones bound {di.RETAINED}).", lambda: len(d().ops))
    gauge("hubd_delivery_evicted", "Finished delivery operations evicted past the bound "
          "(since this process replayed its journal).", lambda: d().evicted_operations)
    gauge("hubd_delivery_outbox", f"Delivery notifications waiting for their audience "
          f"(bound {di.OUTBOX_TOTAL}, {di.OUTBOX_PER_AUDIENCE} per audience).",
          lambda: d().outbox_size)
    gauge("hubd_delivery_outbox_dropped", "Delivery notifications dropped past the outbox "
          "bound (since this process replayed its journal).", lambda: d().dropped_notifications)
    gauge("hubd_delivery_sessions", "Live delivery sessions.", lambda: len(live_sessions(router)))
    gauge("hubd_delivery_settlements_held", "Released delivery notifications whose settlement "
          "waits for the next delivery commit or the once-a-second sweep.",
          lambda: sum(len(ids) for ids in router.live_of(DeliveryLive).settle.values()))

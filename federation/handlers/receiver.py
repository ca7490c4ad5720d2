"""Receiving forwards: who may hand this hub a chat for one of its seats.

An endpoint becomes a peer link at its first frame when it presented a client
certificate on this TLS connection and the serving policy grants the name it
registers under with that certificate's pin. Its identity then comes from the
certificate, not from the name space local agents register in: a local agent
called like a peer hub blocks nothing.

Each `multihub_message_forward` is checked again on its own (grant for the
target's namespace, one seat, size, identity already used), routed through the
normal chat path as `seat@ORIGIN`, and answered with `multihub_message_result`
once the chat is committed and its verdict is known: the local receipts'
consume-live partition and completed-write tracking (hubd/handlers/receipts.py
await_writes) decide `delivered`, so the origin's receipt says what a local
one would (docs/receipts.md, "Forwarded chats").

A chat with no consume-live match is decided at routing, and its answer
leaves ahead of the chat's local deliveries (both go out only after the
commit): the origin settles the forward when it hears it, so it should not
wait behind this hub's fan-out (bench_forward a, docs/architecture.md). One
with live matches is answered once their writes have reported (at most the
WebSocket door's 5 s drain deadline and 1 s close, inside the origin's 10 s
answer bound); a batch is answered once every forward in it is decided.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

import structlog

from federation import delivery_forward_rules
from federation.handlers import delivery_forward, delivery_notices, peer_versions
from federation.policy import NAMESPACE_NOT_GRANTED
from federation.state import (FORWARDED_FIELDS, INBOX_IDS, forward_digest, inbox_of,
                              verdict_result)
from hubd.actors.router import Router
from hubd.core.message import CLOSE_AUTH
from hubd.core.plugin import Verbs
from hubd.handlers import receipts
from hubd.handlers.routing import dead_letter_unwritten, route_chat
from hubd.state.presence import Session
from hubd.wire import codec
from hubd.wire.envelope import HUB_ID_RE, strict_int
from hubd.wire.targets import is_glob, project_of

log = structlog.get_logger("hubd.federation.receiver")

# this module's verbs (its plugin installs them)
verbs = Verbs()

MAX_FORWARD_ID_BYTES = 128
MAX_BODY_BYTES = 262_144
MAX_BATCH = 1024  # forwards in one multihub_message_forward_batch
MAX_DETAIL_BYTES = 512
BODY_FIELDS = FORWARDED_FIELDS

# refusal codes (the seed's list)
INVALID_ORIGIN = "invalid_origin"
PEER_NOT_AUTHORISED = "peer_not_authorised"
INVALID_TARGET = "invalid_target"
INVALID_SHAPE = "invalid_shape"
CHAT_REFUSED = "chat_refused"
UNKNOWN_REQUEST = "unknown_request"
JOURNAL_RECOVERY_REQUIRED = "journal_recovery_required"
FORWARD_ID_CONFLICT = "forward_id_conflict"


def _policy(router: Router):
    return router.hub.federation.serving_policy


AUTHORISED_FOR = 1.0  # seconds a decision is reused for forwards on one connection


def authorise_peer(router: Router, session: Session, sender, namespace: str | None):
    """The serving policy's decision for a peer speaking on this connection
    (`namespace` None: may it be served at all), or None without a policy or
    a usable sender. Every hub-to-hub verb asks this before serving anything."""
    policy = _policy(router)
    if policy is None or not isinstance(sender, str):
        return None
    return _authorise(router, session, policy, sender, namespace)


def _authorise(router: Router, session: Session, policy, origin: str, namespace: str | None):
    """The serving policy's decision for this connection, reused for a second:
    the certificate of a live TLS connection cannot change, a reload replaces
    the policy (so its decisions are not reused), and expiry is re-read within
    the second."""
    key = (id(policy), origin, namespace)
    cached = session.authorised.get(key)
    if cached is not None and cached[1] > router.now and cached[2] is policy:
        return cached[0]
    decision = policy.authorise(origin, session.peer_cert, namespace, router.now)
    if len(session.authorised) > 256:
        session.authorised.clear()
    session.authorised[key] = (decision, router.now + AUTHORISED_FOR, policy)
    return decision


def claim_peer_link(router: Router, session: Session, frame: dict) -> bool:
    """Is this socket's first frame a peer hub registering with its pinned certificate?"""
    policy = _policy(router)
    cert = session.peer_cert
    sender = frame.get("sender")
    if policy is None or not cert or not isinstance(sender, str) or not sender:
        return False
    decision = policy.authorise(sender, cert, None, router.now)
    if not decision.allowed:
        log.info("peer link refused", sender=sender, reason=decision.reason,
                 detail=decision.detail)
        return False
    router.presence.mark_peer(session, sender)
    # a peer's wire version gates what it may ask (cross-hub reads need 6)
    session.protocol_version = strict_int(frame.get("protocol_version"))
    peer_versions.registered(router, sender, frame.get("protocol_version"))
    log.info("peer link registered", peer=sender, domain=decision.domain_id)
    peer_alive(router, session)
    delivery_notices.peer_registered(router, session, frame)
    return True


@dataclass(frozen=True, slots=True)
class PeerPolicyReloaded:
    """SIGHUP replaced the serving policy: live peer links are checked against it."""

    policy: object  # federation.policy.ServingPolicy, or None: no peer is served


def recheck_peer_sessions(router, reloaded: PeerPolicyReloaded) -> None:
    """After a reload: a peer hub whose grant or pin no longer holds is cut off."""
    policy = reloaded.policy
    for session in list(router.presence.sessions.values()):
        if session.peer_hub is None:
            continue
        decision = policy.authorise(session.peer_hub, session.peer_cert, None,
                                    router.now) if policy is not None else None
        if decision is None or not decision.allowed:
            log.warning("peer link closed after reload", peer=session.peer_hub,
                        reason=decision.detail if decision else "no serving policy")
            router.endpoints.close(session.endpoint, CLOSE_AUTH, "peer no longer authorised")


def peer_alive(router: Router, session: Session) -> None:
    """Anything from a pinned peer's link is a sign of life: this hub's own
    link and sender for that peer stop waiting out their backoff."""
    forwarding = router.hub.federation.forwarding
    if forwarding is not None and session.peer_hub is not None:
        forwarding.peer_seen(session.peer_hub)


def seat_problem(seat, what: str) -> str | None:
    if not isinstance(seat, str) or not seat:
        return f"{what} must be a non-empty string"
    if "@" in seat or "," in seat or is_glob(seat) or seat == "all":
        return f"{what} {seat!r} must name exactly one seat, without a hub, list or glob"
    if project_of(seat) is None:
        return f"{what} {seat!r} must be PROJECT/seat"
    return None


def _entry(forward_id: str, disposition: str, reason_code: str = "", detail: str = "",
           result: dict | None = None) -> dict:
    return {"forward_id": forward_id, "disposition": disposition, "reason_code": reason_code,
            "detail": detail.encode()[:MAX_DETAIL_BYTES].decode(errors="ignore"),
            "result": result or {}}


def _result_frame(router: Router, session: Session, entry: dict) -> dict:
    return router.frame("multihub_message_result", session.name or session.peer_hub or "all",
                        "Multi-hub message result", answering_hub=router.hub_id, **entry)


def _refuse(router: Router, session: Session, forward_id: str, code: str, detail: str) -> None:
    router.send(session.endpoint, _result_frame(router, session,
                                            _entry(forward_id, "refused", code, detail)))


def _transient_on_failure(entries: list[dict]) -> list[dict]:
    """What the origin hears if the journal cannot take the accepted chats:
    a transient refusal, so it retries."""
    return [_entry(e["forward_id"], "refused", JOURNAL_RECOVERY_REQUIRED,
                   "the chat could not be journalled; retry")
            if e["disposition"] == "accepted" else e for e in entries]


def _valid_forward_id(forward_id) -> bool:
    return isinstance(forward_id, str) and bool(forward_id) and \
        len(forward_id.encode()) <= MAX_FORWARD_ID_BYTES


@verbs.handles("multihub_message_forward", peers=True)
def forward_in(router: Router, session: Session, frame: dict, size: int) -> None:
    peer_alive(router, session)
    forward_id = frame.get("forward_id")
    if not _valid_forward_id(forward_id):
        router.error(session, "Malformed multi-hub forward: forward_id must be a string of "
                              f"1-{MAX_FORWARD_ID_BYTES} bytes.")
        return
    origin = frame.get("sender")
    policy = _policy(router)
    if frame.get("kind") == "who" and policy is not None and isinstance(origin, str):
        _roster(router, session, forward_id, origin, policy)
        return
    if frame.get("kind") in delivery_forward_rules.KINDS:
        entry = admit_delivery(router, session, origin, frame, size)
        router.send(session.endpoint, _result_frame(router, session, entry))
        if entry["disposition"] == "accepted":
            # not committed: nothing happened here, and the origin hears so at
            # once (else it would wait out its timeout and say peer_unreachable)
            router.send_on_failure(session.endpoint, "multihub_message_result", lambda: (
                _result_frame(router, session, _entry(
                    forward_id, "refused", JOURNAL_RECOVERY_REQUIRED,
                    "the delivery change could not be journalled; retry"))))
        return
    fan_out = router.sends_queued()
    entry = admit(router, session, origin, frame, size)
    if undecided(entry):
        verdicts_of(router).wait(forward_id, lambda router, result: router.send(
            session.endpoint, _result_frame(router, session, {**entry, "result": result})))
    else:
        router.send(session.endpoint, _result_frame(router, session, entry), ahead_of=fan_out)
    if entry["disposition"] == "accepted":
        def failed() -> dict:
            # built only if the chat's commit failed: no verdict will come
            verdicts_of(router).forget([forward_id])
            return _result_frame(router, session, _transient_on_failure([entry])[0])
        router.send_on_failure(session.endpoint, "multihub_message_result", failed)


@verbs.handles("multihub_message_forward_batch", peers=True)
def forward_batch_in(router: Router, session: Session, frame: dict, size: int) -> None:
    """hubd-to-hubd: many forwards in one frame, one result frame back (each
    forward is still checked, deduplicated and journaled on its own), sent
    once every forward in it is decided."""
    peer_alive(router, session)
    forwards = frame.get("forwards")
    if not isinstance(forwards, list) or not forwards or len(forwards) > MAX_BATCH:
        router.error(session, f"Malformed multi-hub forward batch: forwards must be a list of "
                              f"1-{MAX_BATCH} forwards.")
        return
    origin = frame.get("sender")
    share = max(size // len(forwards), 1)
    entries = []
    fan_out = router.sends_queued()
    for forward in forwards:
        if not isinstance(forward, dict) or not _valid_forward_id(forward.get("forward_id")):
            continue  # nothing to answer by; the origin times it out and retries
        entries.append(admit(router, session, origin, forward, share))

    def answer() -> dict:
        return router.frame("multihub_message_result_batch",
                            session.peer_hub or session.name or "all",
                            "Multi-hub message results", answering_hub=router.hub_id,
                            results=entries)
    waiting = [e for e in entries if undecided(e)]
    if not waiting:
        router.send(session.endpoint, answer(), ahead_of=fan_out)
    else:
        left = [len(waiting)]

        def one_decided(router: Router, entry: dict, result: dict) -> None:
            entry["result"] = result
            left[0] -= 1
            if left[0] == 0:
                router.send(session.endpoint, answer())
        verdicts = verdicts_of(router)
        for entry in waiting:
            verdicts.wait(entry["forward_id"],
                          lambda router, result, entry=entry: one_decided(router, entry, result))
    if any(e["disposition"] == "accepted" for e in entries):
        def failed() -> dict:
            # built only if the chats' commit failed: no verdict will come
            verdicts_of(router).forget(
                [e["forward_id"] for e in entries if e["disposition"] == "accepted"])
            return router.frame("multihub_message_result_batch", session.peer_hub or "all",
                                "Multi-hub message results", answering_hub=router.hub_id,
                                results=_transient_on_failure(entries))
        router.send_on_failure(session.endpoint, "multihub_message_result_batch", failed)


def undecided(entry: dict) -> bool:
    """An accepted (or duplicate) forward whose verdict waits for writes."""
    return entry["disposition"] in ("accepted", "duplicate") and not entry["result"]


MAX_WAITING_ANSWERS = 65_536  # forwards whose answer waits for a verdict
MAX_ANSWERS_PER_FORWARD = 16  # the first answer and its duplicates' (resends)


class ForwardVerdicts:
    """The verdicts of forwarded chats this process accepted (live state, not
    journaled, like the receipt desk): a duplicate gets its first
    acceptance's verdict, or waits for it with the first answer. Bounded: the
    decided ones as the forward inbox (INBOX_IDS), the waiting answers by
    MAX_WAITING_ANSWERS (the oldest is dropped, logged: its origin, having no
    answer, resends and gets the duplicate's)."""

    def __init__(self, router: Router) -> None:
        self.decided: OrderedDict[str, dict] = OrderedDict()
        self.waiting: OrderedDict[str, list[Callable[[Router, dict], None]]] = OrderedDict()
        self.dropped = 0

    def wait(self, forward_id: str, answer: Callable[[Router, dict], None]) -> None:
        answers = self.waiting.setdefault(forward_id, [])
        answers.append(answer)
        if len(answers) > MAX_ANSWERS_PER_FORWARD:
            del answers[0]  # a resend's answer supersedes the oldest one
            self.dropped += 1
            log.warning("a forward was resent many times while its verdict waits; the oldest "
                        "answer was dropped", forward_id=forward_id)
        while len(self.waiting) > MAX_WAITING_ANSWERS:
            dropped, _ = self.waiting.popitem(last=False)
            self.dropped += 1
            log.warning("too many forwards await their verdict; an answer was dropped",
                        forward_id=dropped, limit=MAX_WAITING_ANSWERS)

    def decide(self, router: Router, forward_id: str, result: dict) -> None:
        self.decided[forward_id] = result
        while len(self.decided) > INBOX_IDS:
            self.decided.popitem(last=False)
        for answer in self.waiting.pop(forward_id, ()):
            answer(router, result)

    def forget(self, forward_ids: list[str]) -> None:
        """Accepted forwards whose commit failed: nothing will decide them."""
        for forward_id in forward_ids:
            self.waiting.pop(forward_id, None)

    def pending(self, forward_id: str) -> bool:
        """Accepted in this process, its verdict still waiting for writes."""
        return forward_id in self.waiting


def verdicts_of(router: Router) -> ForwardVerdicts:
    return router.live_of(ForwardVerdicts)


def _serving_refusal(router: Router, forward_id: str, origin) -> dict | None:
    """A forward's refusal when this hub serves no peer at all or the origin
    is not a hub id (checked first, for chats and delivery intents alike)."""
    if _policy(router) is None:
        return _entry(forward_id, "refused", PEER_NOT_AUTHORISED,
                      "this hub accepts no forwarded messages (no serving policy)")
    if not isinstance(origin, str) or not HUB_ID_RE.match(origin):
        return _entry(forward_id, "refused", INVALID_ORIGIN, f"origin {origin!r} is not a hub id")
    return None


def _grant_refusal(router: Router, session: Session, forward_id: str, origin: str,
                   namespace: str | None) -> dict | None:
    """A forward's refusal when the serving policy does not grant this
    connection's peer the namespace (None: this hub at all)."""
    decision = _authorise(router, session, _policy(router), origin, namespace)
    if decision.allowed:
        return None
    code = NAMESPACE_NOT_GRANTED if decision.reason == NAMESPACE_NOT_GRANTED else \
        PEER_NOT_AUTHORISED
    return _entry(forward_id, "refused", code,
                  f"peer may not address {namespace or 'this hub'}: "
                  f"{decision.reference_reason} ({decision.detail})")


def admit(router: Router, session: Session, origin, forward: dict, size: int) -> dict:
    """Check one forward and, if it passes, route it as a local chat from
    seat@ORIGIN. Returns its result entry (accepted, duplicate or refused)."""
    forward_id = forward["forward_id"]
    refused = _serving_refusal(router, forward_id, origin)
    if refused is not None:
        return refused
    kind = forward.get("kind")
    if kind != "chat":
        return _entry(forward_id, "refused", UNKNOWN_REQUEST,
                      f"this hub forwards chats and rosters, not {kind!r}")
    sender_seat, target_seat, body = forward.get("sender_seat"), forward.get("target_seat"), \
        forward.get("body")
    problem = seat_problem(sender_seat, "sender_seat")
    if problem is not None:
        return _entry(forward_id, "refused", INVALID_SHAPE, problem)
    problem = seat_problem(target_seat, "target_seat")
    if problem is not None:
        return _entry(forward_id, "refused", INVALID_TARGET, problem)
    if not isinstance(body, dict) or len(codec.encode(body)) > MAX_BODY_BYTES:
        return _entry(forward_id, "refused", INVALID_SHAPE,
                      f"body must be a JSON object of at most {MAX_BODY_BYTES} bytes")
    refused = _grant_refusal(router, session, forward_id, origin, project_of(target_seat))
    if refused is not None:
        return refused
    digest = forward_digest(sender_seat, target_seat, "chat", body)
    known = inbox_of(router.state).accepted.get(forward_id)
    if known is not None:
        if known.digest == digest and known.origin == origin:
            verdicts = verdicts_of(router)
            decided = verdicts.decided.get(forward_id)
            if decided is not None:
                return _entry(forward_id, "duplicate", result=decided)
            if verdicts.pending(forward_id):
                return _entry(forward_id, "duplicate")  # answered with the first's verdict
            return _entry(forward_id, "duplicate", result=known.unconfirmed_result)
        return _entry(forward_id, "refused", FORWARD_ID_CONFLICT,
                      "this forward_id was already accepted with different content")
    if router.mutations_refused():
        return _entry(forward_id, "refused", JOURNAL_RECOVERY_REQUIRED,
                      f"this hub cannot write its journal right now ({router.refusing_mutations})")
    refused = router.quota.admit(f"federation-peer:{origin}", size, router.now)
    if refused is not None:
        router.metrics.refuse_quota(refused)
        return _entry(forward_id, "refused", CHAT_REFUSED,
                      f"Durable ingress quota exceeded ({refused}).")

    chat = {"sender": sender_seat, "target": target_seat, "type": "chat",
            "payload": body.get("payload"), "forwarded_from": origin, "forward_id": forward_id}
    for name in BODY_FIELDS:
        if name in body:
            chat[name] = body[name]
    event, recipients, _ = route_chat(
        router, chat, f"{sender_seat}@{origin}",
        {"forwarded": {"forward_id": forward_id, "origin": origin, "digest": digest}})
    entry = _entry(forward_id, "accepted")
    served, live, stale = receipts.consume_live_partition(router, recipients)
    seq, msg_id = event.seq, event.payload.get("msg_id")
    verdicts = verdicts_of(router)

    def decided(router: Router, written: list[str]) -> None:
        # the caller waits on verdicts (forward_in, forward_batch_in) when
        # this is not called at once
        result = verdict_result(seq, msg_id, recipients, stale, written)
        entry["result"] = result
        verdicts.decide(router, forward_id, result)
        if live and not written:
            dead_letter_unwritten(router, target_seat, f"{sender_seat}@{origin}", seq)
    receipts.await_writes(router, seq, served, live, decided)
    return entry


def admit_delivery(router: Router, session: Session, origin, forward: dict, size: int) -> dict:
    """A forwarded delivery intent, status request or cancel: the same grant,
    origin and seat checks as a chat, then the delivery verbs decide it
    (federation/handlers/delivery_forward.py). Never batched, never deduplicated by
    forward_id: a delivery request is idempotent by its own request id."""
    forward_id = forward["forward_id"]
    refused = _serving_refusal(router, forward_id, origin)
    if refused is not None:
        return refused
    kind, body = forward["kind"], forward.get("body")
    problem = seat_problem(forward.get("sender_seat"), "sender_seat")
    if problem is not None:
        return _entry(forward_id, "refused", INVALID_SHAPE, problem)
    if not isinstance(body, dict) or len(codec.encode(body)) > MAX_BODY_BYTES:
        return _entry(forward_id, "refused", INVALID_SHAPE,
                      f"body must be a JSON object of at most {MAX_BODY_BYTES} bytes")
    namespace = None
    if kind == delivery_forward_rules.REQUEST:
        problem = seat_problem(forward.get("target_seat"), "target_seat")
        if problem is not None:
            return _entry(forward_id, "refused", INVALID_TARGET, problem)
        namespace = project_of(forward["target_seat"])
    refused = _grant_refusal(router, session, forward_id, origin, namespace)
    if refused is not None:
        return refused
    disposition, code, detail, result = delivery_forward.serve(router, session, origin,
                                                               forward, size)
    return _entry(forward_id, disposition, code, detail, result)


def _roster(router: Router, session: Session, forward_id: str, origin: str, policy) -> None:
    """A peer asks who is online: only seats in namespaces it may address."""
    granted = policy.granted_namespaces(origin, session.peer_cert, router.now)
    if not granted:
        decision = policy.authorise(origin, session.peer_cert, None, router.now)
        _refuse(router, session, forward_id, PEER_NOT_AUTHORISED, decision.detail)
        return
    seats = [n for n in router.presence.online() if project_of(n) in granted]
    router.send(session.endpoint, _result_frame(router, session, _entry(
        forward_id, "accepted", result={
            "online_agents": seats, "hub_id": router.hub_id,
            "delivery_sessions": delivery_forward.roster_sessions(router, seats)})))


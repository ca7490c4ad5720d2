"""Receiving forwards: who may hand this hub a chat for one of its seats.

A socket becomes a peer link at its first frame when it presented a client
certificate on this TLS connection and the serving policy grants the name it
registers under with that certificate's pin. Its identity then comes from the
certificate, not from the name space local agents register in: a local agent
called like a peer hub blocks nothing.

Each `multihub_message_forward` is checked again on its own (grant for the
target's namespace, one seat, size, identity already used), routed through the
normal chat path as `seat@ORIGIN`, and answered with `multihub_message_result`
once the chat is committed.
"""

from __future__ import annotations

import structlog

from federation.policy import NAMESPACE_NOT_GRANTED
from federation.state import Accepted, forward_digest, inbox_of, result_of
from hubd.actors.router import PEER_CLAIMS, Router, handles
from hubd.handlers.chat import route_chat
from hubd.state.presence import Session
from hubd.wire import codec
from hubd.wire.envelope import HUB_ID_RE
from hubd.wire.targets import is_glob, project_of
from hubd.wire.wsframe import text_frame

log = structlog.get_logger("hubd.federation.receiver")

MAX_FORWARD_ID_BYTES = 128
MAX_BODY_BYTES = 262_144
MAX_DETAIL_BYTES = 512
BODY_FIELDS = ("client_msg_id", "metadata", "priority", "reply_to")

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
    return router.hub.serving_policy


def claim_peer_link(router: Router, session: Session, frame: dict) -> bool:
    """Is this socket's first frame a peer hub registering with its pinned certificate?"""
    policy = _policy(router)
    cert = session.conn.peer_cert
    sender = frame.get("sender")
    if policy is None or not cert or not isinstance(sender, str) or not sender:
        return False
    decision = policy.authorise(sender, cert, None, router.now)
    if not decision.allowed:
        log.info("peer link refused", sender=sender, reason=decision.reason,
                 detail=decision.detail)
        return False
    router.presence.mark_peer(session, sender)
    log.info("peer link registered", peer=sender, domain=decision.domain_id)
    return True


PEER_CLAIMS.append(claim_peer_link)


def _seat_problem(seat, what: str) -> str | None:
    if not isinstance(seat, str) or not seat:
        return f"{what} must be a non-empty string"
    if "@" in seat or "," in seat or is_glob(seat) or seat == "all":
        return f"{what} {seat!r} must name exactly one seat, without a hub, list or glob"
    if project_of(seat) is None:
        return f"{what} {seat!r} must be PROJECT/seat"
    return None


def _result(router: Router, session: Session, forward_id: str, disposition: str,
            reason_code: str = "", detail: str = "", result: dict | None = None) -> dict:
    return router.frame("multihub_message_result", session.name or session.peer_hub or "all",
                        "Multi-hub message result", forward_id=forward_id,
                        disposition=disposition, answering_hub=router.hub_id,
                        reason_code=reason_code,
                        detail=detail.encode()[:MAX_DETAIL_BYTES].decode(errors="ignore"),
                        result=result or {})


def _refuse(router: Router, session: Session, forward_id: str, code: str, detail: str) -> None:
    router.send(session.conn, _result(router, session, forward_id, "refused", code, detail))


@handles("multihub_message_forward", peers=True)
def forward_in(router: Router, session: Session, frame: dict, size: int) -> None:
    forward_id = frame.get("forward_id")
    if not isinstance(forward_id, str) or not forward_id or \
            len(forward_id.encode()) > MAX_FORWARD_ID_BYTES:
        router.error(session, "Malformed multi-hub forward: forward_id must be a string of "
                              f"1-{MAX_FORWARD_ID_BYTES} bytes.")
        return
    policy = _policy(router)
    if policy is None:
        _refuse(router, session, forward_id, PEER_NOT_AUTHORISED,
                "this hub accepts no forwarded messages (no serving policy)")
        return
    origin = frame.get("sender")
    if not isinstance(origin, str) or not HUB_ID_RE.match(origin):
        _refuse(router, session, forward_id, INVALID_ORIGIN, f"origin {origin!r} is not a hub id")
        return
    kind = frame.get("kind")
    if kind == "who":
        _roster(router, session, forward_id, origin, policy)
        return
    if kind != "chat":
        _refuse(router, session, forward_id, UNKNOWN_REQUEST,
                f"this hub forwards chats and rosters, not {kind!r}")
        return
    sender_seat, target_seat, body = frame.get("sender_seat"), frame.get("target_seat"), \
        frame.get("body")
    problem = _seat_problem(sender_seat, "sender_seat")
    if problem is not None:
        _refuse(router, session, forward_id, INVALID_SHAPE, problem)
        return
    problem = _seat_problem(target_seat, "target_seat")
    if problem is not None:
        _refuse(router, session, forward_id, INVALID_TARGET, problem)
        return
    if not isinstance(body, dict) or len(codec.encode(body)) > MAX_BODY_BYTES:
        _refuse(router, session, forward_id, INVALID_SHAPE,
                f"body must be a JSON object of at most {MAX_BODY_BYTES} bytes")
        return
    namespace = project_of(target_seat)
    decision = policy.authorise(origin, session.conn.peer_cert, namespace, router.now)
    if not decision.allowed:
        code = NAMESPACE_NOT_GRANTED if decision.reason == NAMESPACE_NOT_GRANTED else \
            PEER_NOT_AUTHORISED
        _refuse(router, session, forward_id, code,
                f"peer may not address {namespace}: {decision.reference_reason} "
                f"({decision.detail})")
        return
    digest = forward_digest(sender_seat, target_seat, "chat", body)
    known = inbox_of(router.state).accepted.get(forward_id)
    if known is not None:
        if known.digest == digest and known.origin == origin:
            router.send(session.conn, _result(router, session, forward_id, "duplicate",
                                              result=known.result))
        else:
            _refuse(router, session, forward_id, FORWARD_ID_CONFLICT,
                    "this forward_id was already accepted with different content")
        return
    if router.mutations_refused():
        _refuse(router, session, forward_id, JOURNAL_RECOVERY_REQUIRED,
                f"this hub cannot write its journal right now ({router.refusing_mutations})")
        return
    refused = router.quota.admit(f"federation-peer:{origin}", size, router.now)
    if refused is not None:
        router.metrics.refuse_quota(refused)
        _refuse(router, session, forward_id, CHAT_REFUSED,
                f"Durable ingress quota exceeded ({refused}).")
        return

    chat = {"sender": sender_seat, "target": target_seat, "type": "chat",
            "payload": body.get("payload"), "forwarded_from": origin, "forward_id": forward_id}
    for name in BODY_FIELDS:
        if name in body:
            chat[name] = body[name]
    event, recipients, _ = route_chat(
        router, chat, f"{sender_seat}@{origin}",
        {"forwarded": {"forward_id": forward_id, "origin": origin, "digest": digest}})
    router.send(session.conn, _result(router, session, forward_id, "accepted",
                                      result=result_of(event, recipients)))
    # If the journal cannot take it, the origin must retry: a transient refusal.
    router.out.failure.append((session.conn, lambda: text_frame(codec.encode(_result(
        router, session, forward_id, "refused", JOURNAL_RECOVERY_REQUIRED,
        "the chat could not be journalled; retry"))), "multihub_message_result"))


def _roster(router: Router, session: Session, forward_id: str, origin: str, policy) -> None:
    """A peer asks who is online: only seats in namespaces it may address."""
    granted = policy.granted_namespaces(origin, session.conn.peer_cert, router.now)
    if not granted:
        decision = policy.authorise(origin, session.conn.peer_cert, None, router.now)
        _refuse(router, session, forward_id, PEER_NOT_AUTHORISED, decision.detail)
        return
    seats = [n for n in router.presence.online() if project_of(n) in granted]
    router.send(session.conn, _result(router, session, forward_id, "accepted",
                                      result={"online_agents": seats, "hub_id": router.hub_id}))


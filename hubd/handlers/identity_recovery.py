"""Governed identity recovery on the hub wire: the trust-on-first-use pin
gate, the operator's `identity_pin_reclaim`, and `identity_enroll` /
`identity_revoke` under --identity-enrollments (docs/identity.md, "Governed
identity recovery").

The decisions are pure (hubd/state/identity_recovery.py); here they are
asked with what the hub observes, and each verdict goes privately to the
requester. A change is three events of one command: the approval audit, the
state change, the applied audit; the answer (and the body-free system
notice) leaves only once all three are committed, and if the journal cannot
take them the requester hears the reference's persistence refusal and
nothing changed.
"""

from __future__ import annotations

import base64
import hashlib

import structlog

from hubd.actors.router import Router
from hubd.core.plugin import Plugin, Verbs
from hubd.core.refusals import REFUSALS
from hubd.handlers.signed import RegistrationNonces
from hubd.state import identity_recovery as ir
from hubd.state.presence import Session

log = structlog.get_logger("hubd.identity_recovery")

RECLAIM_RESULT = "identity_pin_reclaim_result"
ENROLL_RESULT = "identity_enroll_result"
REVOKE_RESULT = "identity_revoke_result"
CLOSE_BINDING = 4013
# registrations proved but not yet bound, at most this many before the
# entries of closed endpoints are dropped
MAX_PENDING = 1024

verbs = Verbs()


class PendingPins(dict):
    """endpoint -> the (key_id, public_key) its registration proved first;
    pinned by `pin_registered` once the registration binds (a registration
    refused after the gate, a name conflict, pins nothing)."""

    def __init__(self, router: Router):
        super().__init__()


class EnrolmentLive:
    """The per-operator rate window of enrolment changes (live, as the reference's)."""

    def __init__(self, router: Router):
        security = router.config.security
        self.rate = ir.EnrolmentRate(security.identity_enrollment_rate,
                                     security.identity_enrollment_window)


# -- trust on first use

def tofu_gate(router: Router, session: Session, frame: dict) -> bool:
    """A registration on a hub that does not require identity binding: a
    pinned name must prove its key (else error and close 4013, the
    reference's `identity pin mismatch`); a first valid proof is remembered
    to be pinned when the registration binds."""
    recovery = ir.recovery_of(router.state)
    nonces = router.live_of(RegistrationNonces)
    decided = ir.first_use(recovery.pins, frame, router.now, nonces)
    pending = router.live_of(PendingPins)
    pending.pop(session.endpoint, None)
    if decided.refusal is not None:
        reason = "identity pin mismatch" if frame.get("sender") in recovery.pins \
            else "identity binding failed"
        router.metrics.count_signed_refusal("identity_pin", decided.result)
        log.warning("registration refused: identity pin", endpoint=session.endpoint,
                    sender=frame.get("sender"), result=decided.result)
        router.send(session.endpoint, router.frame(
            "error", frame.get("sender") or "self", decided.refusal,
            verification_result=decided.result))
        router.close(session.endpoint, CLOSE_BINDING, reason)
        return True
    signature = frame.get("signature")
    if decided.pin is not None or frame.get("sender") in recovery.pins:
        # a proof verified (a pinned key's or a first use's): its nonce is spent
        nonces.add(signature["key_id"], signature["nonce"], float(signature["signed_at"]))
    if decided.pin is not None:
        if len(pending) >= MAX_PENDING:
            for endpoint in [e for e in pending if e not in router.presence.sessions]:
                del pending[endpoint]
        pending[session.endpoint] = decided.pin
    return False


def pin_registered(router: Router, session: Session, frame: dict) -> None:
    proved = router.live_of(PendingPins).pop(session.endpoint, None)
    if proved is None or session.name in ir.recovery_of(router.state).pins:
        return
    if len(ir.recovery_of(router.state).pins) >= ir.MAX_PINS:
        router.metrics.count_signed_refusal("identity_pin", "pin_table_full")
        log.warning("identity pin table full: name admitted without a pin",
                    name=session.name, capacity=ir.MAX_PINS)
        return
    key_id, public_key = proved
    try:
        router.event(ir.PINNED, {"name": session.name, "key_id": key_id,
                                 "public_key": public_key, "pinned_at": router.now})
    except REFUSALS as refused:  # raised before anything was applied
        # the journal cannot take the pin now: the registration proved its
        # key and stands; the name is pinned by its next signed registration
        log.warning("identity not pinned: the journal refused the pin", name=session.name,
                    key_id=key_id, reason=str(refused))
        return
    log.info("identity pinned", name=session.name, key_id=key_id)


# -- helpers

def _bound(router: Router, requester: str) -> bool:
    """A proven requester: every registration is bound under
    --require-identity-binding; else its name must be pinned (so the gate
    made it prove its key)."""
    return router.hub.identity.signed.binding_required or \
        requester in ir.recovery_of(router.state).pins


def _operator_key_id(router: Router, requester: str) -> str:
    pin = ir.recovery_of(router.state).pins.get(requester)
    return pin.key_id if pin is not None else "bundle"


def _evict(router: Router, name: str, requester: str, code: int, reason: str) -> bool:
    holder = router.presence.by_name.get(name)
    if holder is None or name == requester:
        return False
    router.close(holder.endpoint, code, reason)
    return True


# -- identity_pin_reclaim

@verbs.handles("identity_pin_reclaim")
def reclaim(router: Router, session: Session, frame: dict, size: int) -> None:
    request = ir.read_reclaim(frame)
    requester = session.name or ""
    signed = router.hub.identity.signed
    recovery = ir.recovery_of(router.state)
    pin = recovery.pins.get(request.pin_name)
    owner_online = request.pin_name in router.presence.by_name
    acl_allowed = ir.acl_grants(signed.acl, requester, ir.PIN_RECLAIM_PERMISSION,
                                request.pin_name)
    bound = _bound(router, requester)
    denial = ir.reclaim_denial(request, requester, pin, acl_allowed=acl_allowed,
                               requester_bound=bound, owner_online=owner_online)
    provenance = {"operator": requester, "operator_key_id": _operator_key_id(router, requester),
                  "pin_name": request.pin_name, "expected_key_id": request.expected_key_id,
                  "reason": request.reason, "break_glass": request.break_glass,
                  "owner_online": owner_online, "lease_live": False,
                  "stale_owner_reclaimable": False}

    def result(applied: bool, detail: str, audit_seq: int | None) -> dict:
        return router.frame(RECLAIM_RESULT, requester or "self", detail,
                            pin_name=request.pin_name, expected_key_id=request.expected_key_id,
                            applied=applied, break_glass=request.break_glass,
                            audit_seq=audit_seq)

    if denial:
        log.warning("identity pin reclaim denied", operator=requester,
                    pin_name=request.pin_name, break_glass=request.break_glass, detail=denial)
        router.metrics.count_signed_refusal("identity_pin_reclaim", "denied")
        if acl_allowed and bound:  # an unproven socket cannot fill the audit trail
            router.event(ir.RECLAIM_AUDIT, {**provenance, "status": "denied",
                                            "applied": False, "detail": denial})
        router.send(session.endpoint, result(False, denial, None))
        return
    router.send_on_failure(session.endpoint, RECLAIM_RESULT,
                           lambda: result(False, ir.PIN_PERSIST_FAILED, None))
    approved = router.event(ir.RECLAIM_AUDIT, {**provenance, "status": "approved",
                                               "applied": False})
    router.event(ir.PIN_REMOVED, {"name": request.pin_name, "key_id": pin.key_id})
    evicted = _evict(router, request.pin_name, requester, ir.CLOSE_PIN_RECLAIMED,
                     "identity pin reclaimed")
    applied = router.event(ir.RECLAIM_AUDIT, {
        **provenance, "status": "applied", "applied": True, "approved_seq": approved.seq,
        "evicted_live_socket": evicted})
    log.warning("identity pin reclaim applied", operator=requester, pin_name=request.pin_name,
                key_id=pin.key_id, break_glass=request.break_glass, audit_seq=applied.seq,
                reason=request.reason)
    router.broadcast(router.frame(
        "system", "all",
        f"Identity pin for {request.pin_name!r} was reclaimed by operator {requester!r}.",
        event_kind=ir.RECLAIM_AUDIT, operator=requester, pin_name=request.pin_name,
        previous_key_id=pin.key_id, break_glass=request.break_glass, audit_seq=applied.seq))
    router.send(session.endpoint, result(True, ir.RECLAIMED, applied.seq))


# -- identity_enroll / identity_revoke

def _authority(router: Router, requester: str, name: str) -> ir.Authority:
    security = router.config.security
    signed = router.hub.identity.signed
    enabled = security.identity_enrollments is not None and security.identity_trust is not None
    return ir.authority(
        enabled=enabled, requester=requester, requester_bound=_bound(router, requester),
        rules=signed.acl, roles=signed.role_grants,
        namespaces=security.identity_enrollment_namespaces, name=name,
        rate_allowed=router.live_of(EnrolmentLive).rate.allows(requester, router.now))


def _verdict(router: Router, session: Session, type_: str, name: str, key_id: str,
             authority: ir.Authority, provenance: dict, denial: str) -> None:
    log.warning("identity enrolment denied", action=provenance["action"],
                operator=provenance["operator"], name=name, key_id=key_id, detail=denial)
    router.metrics.count_signed_refusal("identity_enrollment", "denied")
    audit_seq = None
    if authority.authorised:  # only a proven operator's refusals are journaled
        audit_seq = router.event(ir.ENROLLMENT_AUDIT, {
            **provenance, "status": "denied", "applied": False, "detail": denial}).seq
    router.send(session.endpoint, router.frame(
        type_, session.name or "self", denial, name=name, key_id=key_id, applied=False,
        audit_seq=audit_seq))


def _apply(router: Router, session: Session, type_: str, name: str, key_id: str,
           provenance: dict, change: tuple[str, dict], evict: bool, detail: str) -> None:
    requester = session.name or ""
    router.send_on_failure(session.endpoint, type_, lambda: router.frame(
        type_, requester or "self", ir.ENROLLMENT_PERSIST_FAILED, name=name, key_id=key_id,
        applied=False, audit_seq=None))
    approved = router.event(ir.ENROLLMENT_AUDIT, {**provenance, "status": "approved",
                                                  "applied": False})
    router.event(*change)
    router.live_of(EnrolmentLive).rate.record(requester, router.now)
    evicted = evict and _evict(router, name, requester, ir.CLOSE_KEY_ROTATED,
                               "identity key rotated or revoked")
    applied = router.event(ir.ENROLLMENT_AUDIT, {
        **provenance, "status": "applied", "applied": True, "approved_seq": approved.seq,
        "evicted_live_socket": evicted})
    log.warning("identity enrolment applied", action=provenance["action"], operator=requester,
                name=name, key_id=key_id, audit_seq=applied.seq)
    router.send(session.endpoint, router.frame(
        type_, requester or "self", detail, name=name, key_id=key_id, applied=True,
        audit_seq=applied.seq))
    router.broadcast(router.frame(
        "system", "all",
        f"Identity key change ({provenance['action']}) for {name!r} by operator {requester!r}.",
        event_kind=ir.ENROLLMENT_AUDIT, action=provenance["action"], operator=requester,
        name=name, key_id=key_id, audit_seq=applied.seq))


@verbs.handles("identity_enroll")
def enroll(router: Router, session: Session, frame: dict, size: int) -> None:
    requester = session.name or ""
    request = ir.read_enrolment(frame, requester)
    authority = _authority(router, requester, request.name)
    static = router.hub.identity.signed.trusted_keys
    recovery = ir.recovery_of(router.state)
    denial = authority.denial() or ir.enrolment_denial(request, static, recovery, router.now)
    provenance = {
        "action": request.action, "operator": requester,
        "operator_key_id": _operator_key_id(router, requester), "name": request.name,
        "key_id": request.key_id,
        "public_key_sha256": hashlib.sha256(request.raw).hexdigest() if request.raw else "",
        "expected_key_id": request.expected_key_id, "reason": request.reason.strip()}
    if denial:
        _verdict(router, session, ENROLL_RESULT, request.name, request.key_id, authority,
                 provenance, denial)
        return
    expires = request.expires_at
    change = (ir.KEY_ENROLLED, {
        "key_id": request.key_id, "name": request.name,
        "public_key": base64.b64encode(request.raw).decode("ascii"),
        "expires_at": float(expires) if expires is not None else None,
        "replaces": request.expected_key_id or None})
    detail = (f"identity key for {request.name!r} rotated to {request.key_id!r}"
              if request.expected_key_id
              else f"identity key {request.key_id!r} enrolled for {request.name!r}")
    _apply(router, session, ENROLL_RESULT, request.name, request.key_id, provenance, change,
           bool(request.expected_key_id), detail)


@verbs.handles("identity_revoke")
def revoke(router: Router, session: Session, frame: dict, size: int) -> None:
    requester = session.name or ""

    def text(field: str) -> str:
        value = frame.get(field)
        return value.strip() if isinstance(value, str) else ""
    name, key_id = text("name"), text("key_id")
    reason = frame.get("reason") if isinstance(frame.get("reason"), str) else ""
    authority = _authority(router, requester, name)
    static = router.hub.identity.signed.trusted_keys
    denial = authority.denial() or ir.revocation_denial(
        name, key_id, reason, static, ir.recovery_of(router.state))
    provenance = {"action": "revoke", "operator": requester,
                  "operator_key_id": _operator_key_id(router, requester), "name": name,
                  "key_id": key_id, "reason": reason.strip()}
    if denial:
        _verdict(router, session, REVOKE_RESULT, name, key_id, authority, provenance, denial)
        return
    _apply(router, session, REVOKE_RESULT, name, key_id, provenance,
           (ir.KEY_REVOKED, {"key_id": key_id, "name": name}), True,
           f"identity key {key_id!r} for {name!r} revoked")


def health_identity_pins(hub) -> dict | None:
    """/health `identity_pins`: how many names are pinned and keys enrolled
    (counts against their bounds, never a key)."""
    router = hub.router
    if router is None:
        return None
    recovery = ir.recovery_of(router.state)
    security = hub.config.security
    return {"pins": len(recovery.pins), "pins_max": ir.MAX_PINS,
            "tofu": not security.require_identity_binding,
            "enrolment": security.identity_enrollments is not None,
            "enrolled_keys": len(recovery.enrolled), "enrolled_keys_max": ir.MAX_ENROLLED}


def identity_recovery_plugin(security) -> Plugin:
    """The verbs always (an older or unconfigured hub answers each with its
    refusal); the pin gate only where binding is not required (under
    --require-identity-binding the trust bundle decides, as the reference's)."""
    gates = () if security.require_identity_binding else (tofu_gate,)
    hooks = () if security.require_identity_binding else (pin_registered,)
    return Plugin("identity_recovery", verbs=verbs, appliers=ir.appliers,
                  projections=ir.PROJECTIONS, registration_gates=gates, on_register=hooks,
                  live=(PendingPins, EnrolmentLive),
                  health_sections={"identity_pins": health_identity_pins})

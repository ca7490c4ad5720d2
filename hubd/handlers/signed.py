"""The reference's identity runtime on the hub wire: a registration proves its
sender with an Ed25519 signature (`--require-identity-binding`), a mutating
frame carries a valid `auth` (`--require-message-auth`), and the ACL lets a
frame through before its verb sees it (`--require-acl`). Each check is a
pure decision (hubd/state/identity_binding.py, message_auth.py, acl.py) over
the snapshot the identity actor keeps (hubd/actors/signed_identity.py); a
refusal is the reference's plain `error` with its result field, private, and
nothing of the frame is applied (docs/identity.md).
"""

from __future__ import annotations

import structlog

from hubd.actors.router import Router
from hubd.core.message import CLOSE_IDENTITY_BINDING
from hubd.core.plugin import Plugin
from hubd.state import message_auth
from hubd.state.acl import acl_denial
from hubd.state.identity_binding import OK, verify_registration
from hubd.state.identity_recovery import effective_keys
from hubd.state.presence import Session

log = structlog.get_logger("hubd.signed")


class RegistrationNonces(message_auth.AuthNonces):
    """The signed registrations accepted within the window (live, not
    journaled: as the reference's, a restart forgets them; the window is 10 s)."""

    def __init__(self, router: Router):
        super().__init__()


def bind_identity(router: Router, session: Session, frame: dict) -> bool:
    """A registration under --require-identity-binding: refused (error, close
    4013) unless its signature is by a trusted key bound to its sender."""
    signed = router.hub.identity.signed
    if not signed.binding_required:
        return False
    nonces = router.live_of(RegistrationNonces)
    keys = effective_keys(signed.trusted_keys, router.state.extensions.get("identity_recovery"))
    result = verify_registration(keys, frame, router.now, nonces)
    if result == OK:
        signature = frame["signature"]
        nonces.add(signature["key_id"], signature["nonce"], float(signature["signed_at"]))
        return False
    router.metrics.count_signed_refusal("identity_binding", result)
    log.info("registration refused: identity binding failed", endpoint=session.endpoint,
             sender=frame.get("sender"), result=result)
    router.send(session.endpoint, router.frame(
        "error", frame.get("sender") or "self", f"identity binding failed: {result}", verification_result=result))
    router.close(session.endpoint, CLOSE_IDENTITY_BINDING, "identity binding failed")
    return True


def check_message_auth(router: Router, session: Session, frame: dict, type_: str) -> bool:
    """A signed verb under --require-message-auth: refused unless its `auth`
    verifies; an accepted nonce is journaled, so it is never accepted twice,
    across a restart too."""
    signed = router.hub.identity.signed
    if not signed.message_auth_required or type_ not in message_auth.SIGNED_VERBS:
        return False
    config = signed.config
    nonces = router.state.extensions["message_auth"]
    now = router.now
    verified = message_auth.verify(signed.mac_keys, frame, session.name, now,
                                   config.message_auth_window, nonces,
                                   config.message_auth_replay_capacity,
                                   config.message_auth_floor_mode, session.principal)
    if verified.result != message_auth.OK:
        router.metrics.count_signed_refusal("message_auth", verified.result)
        if verified.result == message_auth.REPLAY_LEDGER_FULL:
            log.warning("per-message auth refused: the replay ledger is full",
                        capacity=config.message_auth_replay_capacity, sender=session.name)
        router.error(session, f"per-message authentication failed: {verified.result}",
                     verification_result=verified.result)
        return True
    router.event(message_auth.NONCE_EVENT, {
        "kid": verified.kid, "nonce": verified.nonce, "timestamp": verified.timestamp,
        "sender": session.name, "sequence": verified.sequence,
        "at": now, "window": config.message_auth_window})
    return False


def check_acl(router: Router, session: Session, frame: dict, type_: str) -> bool:
    """Under --require-acl: a frame needing an access no rule grants is
    refused before its verb (the reference's generic gate)."""
    signed = router.hub.identity.signed
    if not signed.acl_enforced:
        return False
    denial = acl_denial(signed.acl, session.name, type_, frame)
    if denial is None:
        return False
    router.metrics.count_signed_refusal("acl", denial.permission)
    router.error(session, denial.text, acl_decision="would_deny", acl_reason=denial.reason)
    return True


def signed_plugin(security) -> Plugin:
    """The gates a hub's security flags ask for, and only those: every frame
    of every hub passes its frame gates, and a hub that requires nothing
    should not pay for them (the require-* flags change only with a restart).
    The nonce projection is always there: a journal may hold its events."""
    frame_gates = ((check_message_auth,) if security.require_message_auth else ()) + \
        ((check_acl,) if security.require_acl else ())
    registration_gates = (bind_identity,) if security.require_identity_binding else ()
    return Plugin("signed", appliers=message_auth.appliers,
                  projections=message_auth.PROJECTIONS,
                  registration_gates=registration_gates, live=(RegistrationNonces,),
                  frame_gates=frame_gates)

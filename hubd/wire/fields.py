"""Every verb's field rules, applied by the door before the Router sees a frame.

One table per verb the hub answers (the core's verbs, the delivery verbs, the
hub-to-hub verbs of federation/), plus the envelope's fields, which any frame
may carry (the routing fields, and the registration fields: the first frame
with a sender registers, whatever its type). Every field a handler hashes,
compares or stores is listed, with what it must be. A field a handler reads
as text or as a number must be one; one the seed or the reference defines a
lenient reading for (ignored, taken as absent, answered with the verb's own
typed refusal) is passed on as sent, and its rule says so. A frame that breaks
a rule gets a typed refusal (`refusal`) on the socket, which stays open; the
Router never sees it. docs/architecture.md ("The wire's refusals") has the
table in prose.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .envelope import MAX_CLIENT_MSG_ID_BYTES, MAX_NAME_BYTES, hub_frame
from .rules import (Rule, boolean, idem_key, integer, list_of_text, list_or_obj, number, obj,
                    passed_on, scalar_text, text, text_or_list_of_text)

CODE_INVALID_FIELD = "invalid_field"

MAX_ROLES = 64
MAX_LIST_ITEMS = 1024

_REFERENCE_PAYLOAD = "relayed as sent; the reference checks no payload"
_DELIVERY = ("hubd/state/delivery_rules.py: delivery_refused with the reference's reason "
             "codes, in its check order")
_ATTACHMENT = ("hubd/state/attachment_rules.py: attachment_result with the reference's "
               "error text (clients branch on it)")
_PEER = "federation/handlers/receiver.py: a refusal the origin hub reads (result or error)"

# Fields any frame may carry: the routing fields (the reference's rule) and the
# registration fields (read from the frame that registers, whatever its type).
ENVELOPE: dict[str, Rule] = {
    "sender": text(),
    "target": text(),
    "type": text(),
    "channel": text(),
    "payload": passed_on(_REFERENCE_PAYLOAD),
    "timestamp": passed_on("kept as client_timestamp only when a finite number (reference)"),
    "token": text(),
    "roles": list_of_text(MAX_ROLES, MAX_NAME_BYTES),
    "wake_capability": text(MAX_NAME_BYTES),
    "protocol_version": passed_on("anything but an integer is absent (reference); a delivery "
                                  "verb answers unsupported_protocol"),
    "takeover": boolean(),
    "mailbox": boolean(),
    "since_seq": passed_on("anything but a non-negative integer is 0 (reference)"),
    "mailbox_for": text(MAX_NAME_BYTES),
    "delivery_session_token": passed_on("hubd/state/delivery_rules.py read_session: a typed "
                                        "error and close 4020, as the reference"),
    "delivery_capabilities": passed_on("hubd/state/delivery_rules.py read_session"),
    # the reference's signatures (docs/identity.md): the registration's
    # Ed25519 `signature`, a mutating frame's HMAC `auth`; their insides are
    # the checks' (hubd/state/identity_binding.py, message_auth.py), which
    # answer with the reference's verification_result
    "signature": obj(),
    "auth": obj(),
}

# the governed identity verbs' bounds: a key id or base64 key; a reason (the
# verdict refuses one over 500 characters with the reference's text)
_KEY_TEXT = 1024
_REASON_BYTES = 8192
_TASK_ID = scalar_text()
_FREE_TEXT = scalar_text()
_EVIDENCE = text_or_list_of_text(MAX_LIST_ITEMS)

_DELIVERY_FIELDS = ("request_id", "idempotency_key", "target_incarnation", "mode",
                    "allowed_fallbacks", "task_id", "body", "deadline", "operation_key",
                    "mutation_id", "stage", "evidence")


VERB_FIELDS: dict[str, dict[str, Rule]] = {
    # private channels (hubd/handlers/channels.py); `channel` is the envelope's text
    "channel_create": {"label": text()},
    "channel_invite": {"invitee": text()},
    "channel_join": {},
    "channel_leave": {},
    "channel_list_request": {},
    "channel_history_request": {
        "limit": passed_on("a non-integer limit is 20, a negative one 0 (reference); hubd "
                           "caps it at the retained history"),
    },
    "chat": {
        "client_msg_id": text(MAX_CLIENT_MSG_ID_BYTES),
        "receipt_requested": boolean(),
        "metadata": passed_on(_REFERENCE_PAYLOAD),
        "priority": passed_on(_REFERENCE_PAYLOAD),
        "reply_to": passed_on(_REFERENCE_PAYLOAD),
    },
    "heartbeat": {},  # its fields are the envelope's registration and mailbox fields
    "ack": {
        "seq": passed_on("a non-integer ack is ignored without a reply (reference)"),
    },
    "who_request": {"hub": text(MAX_NAME_BYTES)},
    "state_request": {
        "request_id": passed_on("an invalid id stays absent from the reply (seed)"),
        "release_confirmation": passed_on("hubd/handlers/claims.py: a bare status unknown "
                                          "when not an object (reference)"),
    },
    "history_request": {
        "limit": integer(),
        "history_client_msg_id": text(),
        "history_target": text(),
        "inbox_query": passed_on("hubd/state/inbox.py read_query: available:false with a "
                                 "fixed refusal (seed)"),
        "request_id": passed_on("an invalid id stays absent from the reply (seed)"),
    },
    "resume_request": {"since": integer()},
    "claim": {
        "task_id": _TASK_ID,
        "note": _FREE_TEXT,
        "data_ref": _FREE_TEXT,
        "worktree": _FREE_TEXT,
        "ttl_seconds": number(),
        "paths": passed_on("hubd/state/claims.py read_claim: claim_denied "
                           "PATH_IDENTITY_INVALID"),
        "path_identity": passed_on("hubd/state/claims.py read_claim: claim_denied "
                                   "PATH_IDENTITY_INVALID"),
        "git": obj(),
        "idem_key": idem_key(),
    },
    "release": {
        "task_id": _TASK_ID,
        "epoch": integer(),
        "idem_key": idem_key(),
        **{name: _EVIDENCE for name in ("evidence", "artifacts", "known_failures",
                                        "changed_files", "generated_artifacts", "approvals")},
        "confidence": _FREE_TEXT,
        "freshness_seconds": number(),
    },
    "task_update": {
        "task_id": _TASK_ID,
        "id": _TASK_ID,
        "status": _FREE_TEXT,
        "note": _FREE_TEXT,
        "data_ref": _FREE_TEXT,
        "expected_version": integer(),
        "epoch": integer(),
        "idem_key": idem_key(),
    },
    "checkpoint": {
        "task_id": _TASK_ID,
        "id": _TASK_ID,
        "checkpoint": _FREE_TEXT,
        "epoch": integer(),
        "idem_key": idem_key(),
    },
    "handoff": {
        "task_id": _TASK_ID,
        "id": _TASK_ID,
        "to_agent": text(),
        "note": _FREE_TEXT,
        "ttl_seconds": number(),
        "epoch": integer(),
        "idem_key": idem_key(),
    },
    "wait_request": {"task_id": _TASK_ID, "id": _TASK_ID},
    "ledger_task": {
        "task_id": _TASK_ID,
        "title": _FREE_TEXT,
        "description": _FREE_TEXT,
        "project": _FREE_TEXT,
        "suggested_owner": _FREE_TEXT,
        "depends_on": list_of_text(MAX_LIST_ITEMS),
        "causal_parent": passed_on("hubd/state/board.py causal_parent: its own "
                                   "'Malformed frame: ...' sentences"),
        "expected_version": integer(),
        "idem_key": idem_key(),
    },
    "ledger_task_update": {
        "task_id": _TASK_ID,
        "status": _FREE_TEXT,
        "suggested_owner": _FREE_TEXT,
        "project": _FREE_TEXT,
        "causal_parent": passed_on("hubd/state/board.py causal_parent"),
        "expected_version": integer(),
        "idem_key": idem_key(),
    },
    "ledger_progress": {
        "task_id": _TASK_ID,
        "kind": _FREE_TEXT,
        "text": _FREE_TEXT,
        "idem_key": idem_key(),
    },
    "board_request": {},
    "manifest_request": {},
    # hubd/state/resources.py: an empty kind or name gets the reference's own
    # sentence there; capacity at least 1 and meta's size are checked there too
    **{verb: {"kind": text(256), "name": text(256), "capacity": integer(), "meta": obj()}
       for verb in ("resource", "resource_offer")},
    "advertise": {
        "agent": text(),
        "description": _FREE_TEXT,
        "model": _FREE_TEXT,
        "manifest_digest": _FREE_TEXT,
        "skills": list_of_text(MAX_LIST_ITEMS),
        "task_classes": list_of_text(MAX_LIST_ITEMS),
        "contracts": list_or_obj(),
        "persist": boolean(),
        "dispatchable": boolean(),
        "meta": obj(),
        "signature": obj(),
    },
    **{verb: {name: passed_on(_DELIVERY) for name in _DELIVERY_FIELDS}
       for verb in ("delivery_request", "delivery_status_request", "delivery_cancel",
                    "delivery_boundary", "delivery_ack", "delivery_outcome")},
    **{verb: {**{name: passed_on(_ATTACHMENT) for name in fields}, "idem_key": idem_key()}
       for verb, fields in {
           "attachment_begin": ("scope", "digest", "length", "media_type", "provenance",
                                "expires_at"),
           "attachment_chunk": ("scope", "upload_id", "offset", "body"),
           "attachment_commit": ("scope", "upload_id"),
           "attachment_abort": ("scope", "upload_id"),
           "attachment_info": ("scope", "digest"),
           "attachment_read": ("scope", "digest", "offset", "preview"),
           "attachment_ref": ("scope", "digest", "ref", "remove"),
           "attachment_gc": ("scope", "dry_run"),
       }.items()},
    # governed identity recovery (hubd/state/identity_recovery.py answers the
    # rest with the verb's own verdict, as the reference)
    "identity_pin_reclaim": {
        "pin_name": text(MAX_NAME_BYTES),
        "expected_key_id": text(_KEY_TEXT),
        "reason": text(_REASON_BYTES),
        "break_glass": boolean(),
    },
    "identity_enroll": {
        "name": text(MAX_NAME_BYTES),
        "key_id": text(_KEY_TEXT),
        "public_key": text(_KEY_TEXT),
        "reason": text(_REASON_BYTES),
        "expected_key_id": text(_KEY_TEXT),
        "expires_at": number(),
    },
    "identity_revoke": {
        "name": text(MAX_NAME_BYTES),
        "key_id": text(_KEY_TEXT),
        "reason": text(_REASON_BYTES),
    },
    "attachment_peer_request": {name: passed_on(
        "federation/handlers/attachment_reads.py: attachment unavailable, like every refusal")
        for name in ("action", "scope", "digest", "offset", "source_hub")},
    "multihub_message_forward": {
        "forward_id": passed_on(_PEER),
        "kind": text(),
        "sender_seat": passed_on(_PEER),
        "target_seat": passed_on(_PEER),
        "body": passed_on(_PEER),
    },
    "multihub_message_forward_batch": {"forwards": passed_on(_PEER)},
    "dead_letter_forwarding": {"forwarding": passed_on(
        "federation/handlers/dead_letter_pointer.py: a typed error, "
        "error_code dead_letter_forwarding_refused")},
    "multihub_delivery_notices_ack": {"acks": passed_on(
        "federation/handlers/delivery_notices.py: 'Malformed multihub_delivery_notices_ack'")},
    "multihub_log_request": {
        "after_seq": passed_on("federation/handlers/logpull.py: an empty snapshot"),
        "limit": passed_on("federation/handlers/logpull.py: an empty snapshot"),
    },
    "multihub_claim_request": {
        name: passed_on("federation/handlers/claims.py: 'Malformed multi-hub claim request'")
        for name in ("namespace", "claimant", "task_id", "claim", "request_id")},
    # hubd/handlers/evidence.py (docs/guard-evidence-and-spend.md)
    "guard_denial": {
        **{name: passed_on("hubd/state/guard_evidence.py read_denial: error_code "
                           "guard_evidence with the reference's text")
           for name in ("provider", "reason_code", "path_count", "actor_sha256",
                        "call_sha256", "scope_sha256")},
        "idem_key": idem_key(),
    },
    "entitlement_advert": {"advert": passed_on(
        "hubd/state/entitlements.py read_advert: entitlement_advert_result applied:false")},
    "spend_request": {name: passed_on("hubd/state/spend_ledger.py: 'Malformed spend request' "
                                      "or the uniform not-admitted spend_result")
                      for name in ("spend_action", "spend")} | {
                          "owner_hub": passed_on("hubd/handlers/evidence.py: 'Malformed spend "
                                                 "request' unless a peer hub's id")},
}

# the verbs whose refusals the reference client matches by request_id: the
# door refuses them as the verb would, with delivery_refused
DELIVERY_VERBS = frozenset(v for v in VERB_FIELDS if v.startswith("delivery_"))
DELIVERY_WIRE_VERSION = 3
DELIVERY_INVALID_SHAPE = "invalid_shape"

# verb -> the checks of its fields and the envelope's, merged once (a frame's
# keys are looked up here: a chat has a handful, the tables have dozens;
# fields passed on as sent have no check)
def _checks(rules: dict[str, Rule]) -> dict:
    """name -> the type its values must have exactly (Rule.exact), or the
    rule's accepts; fields passed on as sent are left out."""
    return {name: rule.exact or rule.accepts for name, rule in rules.items()
            if rule.accepts is not None}


_CHECKS: dict[str, dict] = {verb: _checks({**ENVELOPE, **fields})
                            for verb, fields in VERB_FIELDS.items()}
_ENVELOPE_CHECKS = _checks(ENVELOPE)


@dataclass(frozen=True, slots=True)
class FieldError:
    field: str
    text: str
    code: str = CODE_INVALID_FIELD


def check_fields(frame: dict) -> FieldError | None:
    """The first field of `frame` that breaks its rule, or None. A frame of
    a type no verb serves is held to the envelope's rules (the Router answers
    its type)."""
    type_ = frame.get("type")
    if type_ is not None and type(type_) is not str:
        return _broken("type", ENVELOPE["type"])
    checks = _CHECKS.get(type_ or "chat", _ENVELOPE_CHECKS)
    for name, value in frame.items():
        accepts = checks.get(name)
        if accepts is None or value is None:
            continue
        if type(accepts) is type:
            if type(value) is accepts:
                continue
        elif accepts(value):
            continue
        return _broken(name, rules_of(type_)[name])
    return None


def rules_of(type_: str | None) -> dict[str, Rule]:
    """The rules a frame of this type is held to (its verb's and the envelope's)."""
    return {**ENVELOPE, **VERB_FIELDS.get(type_ or "chat", {})}


def _broken(name: str, rule: Rule) -> FieldError:
    return FieldError(name, f"Malformed frame: '{name}' must be {rule.says}.")


# -- the refusal frame

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _encodable(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate (a refused frame may hold one)
        return False
    return True


def _echoable_id(value) -> str | None:
    """A request_id the refusal may echo: 1-128 UTF-8 bytes without control
    characters (the delivery verbs' own rule for the id they echo)."""
    if type(value) is not str or _CONTROL.search(value) or not _encodable(value):
        return None
    return value if 1 <= len(value.encode("utf-8")) <= 128 else None


def refusal(hub_id: str, frame: dict | None, text_: str, code: str, ts: float,
            field: str | None = None) -> dict:
    """The door's answer to a frame it refuses, private to its socket: an
    `error` addressed "all" like the reference's decode errors; for a
    delivery verb the delivery_refused the verb would send (reason_code
    invalid_shape, its request_id echoed when valid), which the reference
    client matches by request_id."""
    extra = {"error_code": code}
    if field is not None:
        extra["field"] = field
    type_ = frame.get("type") if frame is not None else None
    if type(type_) is str and type_ in DELIVERY_VERBS:
        sender = frame.get("sender")
        target = sender if type(sender) is str and _encodable(sender) else "all"
        return hub_frame(hub_id, "delivery_refused", target, text_, ts,
                         request_id=_echoable_id(frame.get("request_id")) or "",
                         reason_code=DELIVERY_INVALID_SHAPE,
                         protocol_version=DELIVERY_WIRE_VERSION, **extra)
    return hub_frame(hub_id, "error", "all", text_, ts, **extra)

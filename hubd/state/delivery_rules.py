"""Session-bound delivery (wire v3): the pure decisions.

Everything here takes values and returns values: the shape of a request, a
session registration or a stage report; which advertised capability a
request gets; which stage may follow which; the admission caps; and the one
authority decision for interrupt and steer (`may_control`). The Router-side
verbs (hubd/handlers/delivery.py) turn these verdicts into journal events and
frames; the projection (hubd/state/delivery_intents.py) replays them. Keeping
the decisions here means a unit test can cover every refusal without a hub,
and the integration tests only have to prove the wiring.

Field names, limits and reason codes follow what the reference hub
(synapse-channel 0.99.38) was observed to do on the wire
(docs/reference-observed.md, "Session-bound delivery"); docs/delivery.md says
where hubd chose differently and why.
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass

from hubd.wire.digests import canonical_json, canonical_sha256


WIRE_VERSION = 3

# modes, in the order the seed lists them; the first two act on a live turn
INTERRUPT, STEER, FOLLOW_UP, NEXT_TURN = "interrupt", "steer", "follow_up", "next_turn"
MODES = (INTERRUPT, STEER, FOLLOW_UP, NEXT_TURN)
CONTROL_MODES = frozenset({INTERRUPT, STEER})
QUALITIES = frozenset({"native", "emulated"})

MAX_BODY_BYTES = 8192
MAX_ID_BYTES = 128
MAX_FALLBACKS = 3
# an absolute deadline further out than this is refused (the reference's
# horizon, measured: one day is accepted, one day and a minute is not)
MAX_DEADLINE_AHEAD = 86_400.0

# admission caps: unfinished work per recipient incarnation, and per sender
# within it; past either the request is refused before anything is journaled
PER_INCARNATION = 128
PER_SENDER = 16

# stages
QUEUED = "queued"
BOUNDARY_DELIVERED = "boundary_delivered"
ACKNOWLEDGED = "acknowledged"
COMPLETED = "completed"
FAILED = "failed"
CANCELLED = "cancelled"  # the executor confirmed it stopped (never the sender's say-so)
EXPIRED = "expired"
SUPERSEDED = "superseded"
UNFINISHED = frozenset({QUEUED, BOUNDARY_DELIVERED, ACKNOWLEDGED})
TERMINAL = frozenset({COMPLETED, FAILED, CANCELLED, EXPIRED, SUPERSEDED})
OUTCOME_STAGES = frozenset({COMPLETED, FAILED, CANCELLED})

# who caused a transition (the notification's `source`)
SOURCE_RECIPIENT, SOURCE_SENDER, SOURCE_HUB = "recipient", "sender", "hub"

# reason codes (stable: clients branch on them; the text beside them is advisory)
UNSUPPORTED_PROTOCOL = "unsupported_protocol"
INVALID_SHAPE = "invalid_shape"
UNSUPPORTED_MODE = "unsupported_mode"
STALE_INCARNATION = "stale_incarnation"
UNAVAILABLE_RECIPIENT = "unavailable_recipient"
UNAUTHORISED_REQUESTER = "unauthorised_requester"
ID_CONFLICT = "id_conflict"
DEADLINE_EXPIRED = "deadline_expired"
RECIPIENT_QUEUE_FULL = "recipient_queue_full"
UNKNOWN_REQUEST = "unknown_request"
INVALID_TRANSITION = "invalid_transition"
UNKNOWN_HUB = "unknown_hub"

_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


@dataclass(frozen=True, slots=True)
class Refusal:
    reason_code: str
    text: str
    # the request id that may be echoed: only one that passed its own check
    request_id: str = ""


# -- ids and text


def bounded_text(value, name: str, *, min_bytes: int = 1, max_bytes: int = MAX_ID_BYTES,
                 control_ok: bool = False) -> str | Refusal:
    """A string within its byte bounds, encodable as UTF-8 (so no unpaired
    surrogate: one decoded from an escape cannot become a different id), and
    for ids without control characters."""
    if not isinstance(value, str):
        return Refusal(INVALID_SHAPE, f"{name} must be a string")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        return Refusal(INVALID_SHAPE, f"{name} must be valid UTF-8")
    if not min_bytes <= size <= max_bytes:
        return Refusal(INVALID_SHAPE, f"{name} length is outside its limit")
    if not control_ok and _CONTROL.search(value):
        return Refusal(INVALID_SHAPE, f"{name} contains a control character")
    return value


def is_digest(value) -> bool:
    return isinstance(value, str) and _HEX64.match(value) is not None


def incarnation_of(hub_id: str, name: str, token: str) -> str:
    """What the hub publishes instead of the recipient's process token: the
    token never leaves the hub, and the digest is bound to this hub and name."""
    return hashlib.sha256(f"{hub_id}\x00{name}\x00{token}".encode()).hexdigest()


def operation_key(origin_hub: str, sender: str, request_id: str) -> str:
    """The operation's durable identity, which the reference client computes
    on its own side before it sends (request_delivery returns it)."""
    return hashlib.sha256(canonical_json([origin_hub, sender, request_id])).hexdigest()


def notification_id(op_key: str, n: int) -> str:
    """Stable per operation: the offer is 1, each later notification the next."""
    return f"delivery:{op_key}:{n}"


# -- protocol gate


def speaks_v3(session_version: int | None, frame: dict) -> bool:
    """A delivery verb needs a session that registered as v3 or later (the
    reference client advertises its newest version on its heartbeats) and a
    frame that says it is a v3 delivery frame. Anything else, a string "3"
    included, keeps the old contract."""
    frame_version = frame.get("protocol_version")
    return (isinstance(session_version, int) and session_version >= WIRE_VERSION
            and type(frame_version) is int and frame_version == WIRE_VERSION)


# -- session registration


@dataclass(frozen=True, slots=True)
class SessionAdvert:
    token: str
    capabilities: dict  # mode -> quality


def read_session(frame: dict, session_version: int | None) -> SessionAdvert | Refusal | None:
    """The delivery session a registering heartbeat advertises: None when it
    advertises none (an ordinary client), else the advert or why it is refused.
    An unknown mode or quality refuses the whole registration rather than
    being dropped: a recipient must not believe it advertised something the
    hub ignored."""
    if "delivery_session_token" not in frame and "delivery_capabilities" not in frame:
        return None
    if not (isinstance(session_version, int) and session_version >= WIRE_VERSION):
        return Refusal(UNSUPPORTED_PROTOCOL, "delivery session requires wire version 3")
    token = frame.get("delivery_session_token")
    if not is_digest(token):
        return Refusal(INVALID_SHAPE, "delivery session token is malformed")
    caps = frame.get("delivery_capabilities")
    if not isinstance(caps, dict) or len(caps) > len(MODES):
        return Refusal(INVALID_SHAPE, "delivery capabilities are malformed")
    for mode, quality in caps.items():
        if mode not in MODES or not isinstance(quality, str) or quality not in QUALITIES:
            return Refusal(INVALID_SHAPE, "delivery capability is unsupported")
    return SessionAdvert(token, dict(caps))


# -- a delivery_request


@dataclass(frozen=True, slots=True)
class Request:
    request_id: str
    idempotency_key: str
    target: str
    target_incarnation: str
    mode: str
    allowed_fallbacks: tuple[str, ...]
    task_id: str
    body: str
    deadline: float

    def content(self) -> dict:
        """What a retry must repeat exactly (the key already binds sender and
        request id): the digest of this is the request's content identity."""
        return {"idempotency_key": self.idempotency_key, "target": self.target,
                "target_incarnation": self.target_incarnation, "mode": self.mode,
                "allowed_fallbacks": list(self.allowed_fallbacks), "task_id": self.task_id,
                "body": self.body, "deadline": self.deadline}

    def digest(self) -> str:
        return canonical_sha256(self.content())


RETRY, NEW = "retry", "new"


def admission_identity(request_id: str, digest: str, earlier_digest: str | None,
                       key_holder: str | None) -> str | Refusal:
    """How a delivery_request stands against the work this hub admitted.

    `earlier_digest` is the content digest of the operation with this request's
    key (origin, sender, request id), None if there is none; `key_holder` the
    key of the operation this sender's idempotency key was admitted under,
    None if unused. The same request id with the same content is a RETRY (the
    operation's status again); with other content, or an idempotency key the
    sender already spent on another request id, it is id_conflict (seed 001:
    a duplicate returns the original disposition, a reused id is refused).
    Otherwise it is NEW. The reference answers both conflicts with the same
    code and words (docs/reference-observed.md, 8.2)."""
    if earlier_digest is not None:
        if earlier_digest == digest:
            return RETRY
        return Refusal(ID_CONFLICT, "request identity was reused with new content", request_id)
    if key_holder is not None:
        return Refusal(ID_CONFLICT, "request identity was reused with new content", request_id)
    return NEW


def exact_target(target) -> str | Refusal:
    """One exact identity: not a broadcast, a list, a role glob or a project."""
    text = bounded_text(target, "target", max_bytes=256)
    if isinstance(text, Refusal):
        return text
    if text in ("all", "System") or any(c in text for c in ",*?[] ") or "/" not in text:
        return Refusal(INVALID_SHAPE, "target must be one exact identity")
    return text


def read_request(frame: dict, now: float) -> Request | Refusal:
    """Shape checks in the order the reference answers them; the first
    failure wins. The request id is echoed only once it passed its own check."""
    rid = bounded_text(frame.get("request_id"), "request_id")
    if isinstance(rid, Refusal):
        return rid
    def refuse(code: str, text: str) -> Refusal:
        return Refusal(code, text, rid)
    key = bounded_text(frame.get("idempotency_key"), "idempotency_key")
    if isinstance(key, Refusal):
        return refuse(key.reason_code, key.text)
    target = exact_target(frame.get("target"))
    if isinstance(target, Refusal):
        return refuse(target.reason_code, target.text)
    if "@" in target:
        # federation/handlers/delivery_forward.py takes PROJECT/seat@HUB before this
        return refuse(UNKNOWN_HUB, "this hub has no message peers")
    incarnation = frame.get("target_incarnation")
    if not is_digest(incarnation):
        return refuse(INVALID_SHAPE, "target_incarnation must be a SHA-256 digest")
    mode = frame.get("mode")
    if not isinstance(mode, str) or mode not in MODES:
        return refuse(UNSUPPORTED_MODE, "delivery mode is unsupported")
    fallbacks = frame.get("allowed_fallbacks", [])
    if not isinstance(fallbacks, list) or len(fallbacks) > MAX_FALLBACKS:
        return refuse(INVALID_SHAPE, "allowed_fallbacks must be a bounded list")
    for fallback in fallbacks:
        if not isinstance(fallback, str) or fallback not in MODES:
            return refuse(UNSUPPORTED_MODE, "delivery mode is unsupported")
    if len(set(fallbacks)) != len(fallbacks) or mode in fallbacks:
        return refuse(INVALID_SHAPE, "allowed_fallbacks must be distinct from mode")
    task_id = frame.get("task_id", "")
    task_id = bounded_text(task_id, "task_id", min_bytes=0)
    if isinstance(task_id, Refusal):
        return refuse(task_id.reason_code, task_id.text)
    body = bounded_text(frame.get("body"), "body", max_bytes=MAX_BODY_BYTES, control_ok=True)
    if isinstance(body, Refusal):
        return refuse(body.reason_code, body.text)
    deadline = frame.get("deadline")
    if isinstance(deadline, bool) or not isinstance(deadline, (int, float)) or \
            not math.isfinite(deadline):
        return refuse(INVALID_SHAPE, "deadline must be a finite number")
    deadline = float(deadline)
    if deadline <= now:
        return refuse(DEADLINE_EXPIRED, "delivery deadline has elapsed")
    if deadline > now + MAX_DEADLINE_AHEAD:
        return refuse(INVALID_SHAPE, "deadline exceeds the supported horizon")
    return Request(rid, key, target, incarnation, mode, tuple(fallbacks), task_id, body, deadline)


# -- mode selection and authority


@dataclass(frozen=True, slots=True)
class Selection:
    mode: str
    quality: str


def select_mode(request_mode: str, fallbacks, capabilities: dict) -> Selection | Refusal:
    """The first of the requested mode and the sender's fallbacks, in the
    sender's order, that the recipient advertises. Nothing is ever chosen
    that the sender did not list or the recipient did not advertise."""
    for mode in (request_mode, *fallbacks):
        quality = capabilities.get(mode)
        if quality in QUALITIES:
            return Selection(mode, quality)
    return Refusal(UNSUPPORTED_MODE, "recipient supports none of the allowed modes")


@dataclass(frozen=True, slots=True)
class Requester:
    """Who asks, as the hub knows it. `principal` is what the door
    authenticated (today a token fingerprint or open-host:<addr>)."""
    name: str
    principal: str
    authenticated_hub: bool
    forwarded: bool = False


def may_control(requester: Requester, mode: str, granted: bool = False,
                task_claimed: bool = False) -> Refusal | None:
    """May this requester act on the recipient's live turn (interrupt, steer)?

    The seed asks for an authenticated hub, an explicit DELIVERY_CONTROL grant
    for the target (`granted`: the requester's principal has a `control` grant
    covering the target, hubd.state.principals.control_granted) and a live
    exact-target claim (`task_claimed`: the requester itself holds the live
    lease of the request's task_id; docs/delivery.md, "Control"). A forwarded
    requester never gets control, grant or not. Other modes need none of it."""
    if mode not in CONTROL_MODES:
        return None
    if (requester.forwarded or not requester.authenticated_hub or not granted
            or not task_claimed):
        return Refusal(UNAUTHORISED_REQUESTER, "active task control is not granted")
    return None


def admission_caps(unfinished_for_incarnation: int, unfinished_from_sender: int,
                   unfinished_total: int, total_bound: int) -> Refusal | None:
    if (unfinished_for_incarnation >= PER_INCARNATION or unfinished_from_sender >= PER_SENDER
            or unfinished_total >= total_bound):
        return Refusal(RECIPIENT_QUEUE_FULL, "recipient delivery queue is full")
    return None


# -- stage reports


# verb -> the stages it may report -> the evidence shapes each takes (each an
# exact key set; the first is the one a refusal's text describes)
OUTCOME_EVIDENCE = ("executor_ref", "outcome_code")
# a cancellation the executor confirmed before it started anything: the
# reference bridge sends {"reason_code": "sender_cancelled"}; one that stopped
# a started turn may name the executor's own reference and outcome instead
CANCEL_EVIDENCE = (("reason_code",), OUTCOME_EVIDENCE)
REPORT_STAGES = {
    "delivery_boundary": {BOUNDARY_DELIVERED: (("boundary",),)},
    "delivery_ack": {ACKNOWLEDGED: (("receipt_id",),)},
    "delivery_outcome": {COMPLETED: (OUTCOME_EVIDENCE,),
                         FAILED: (OUTCOME_EVIDENCE,),
                         CANCELLED: CANCEL_EVIDENCE},
}
_EVIDENCE_TEXT = {BOUNDARY_DELIVERED: "boundary evidence is required",
                  ACKNOWLEDGED: "recipient acknowledgement evidence is required"}
# an evidence reason_code is a machine-readable code like the hub's own:
# lower-case letters, digits and underscores, starting with a letter
_REASON_CODE = re.compile(r"^[a-z][a-z0-9_]{0,127}$")

# which stage may follow which, for the recipient's reports. An executor's
# `cancelled` is not here: it may end any unfinished stage, but only as the
# confirmation of a cancellation the sender requested (report_transition).
_NEXT = {QUEUED: {BOUNDARY_DELIVERED},
         BOUNDARY_DELIVERED: {ACKNOWLEDGED},
         ACKNOWLEDGED: {COMPLETED, FAILED}}


@dataclass(frozen=True, slots=True)
class Report:
    operation_key: str
    request_id: str
    task_id: str
    mutation_id: str
    stage: str
    evidence: dict

    def digest(self) -> str:
        return canonical_sha256({"stage": self.stage, "evidence": self.evidence,
                                 "request_id": self.request_id, "task_id": self.task_id})


def read_mutation_id(value) -> str | Refusal:
    mid = bounded_text(value, "mutation_id")
    if isinstance(mid, Refusal):
        return Refusal(INVALID_SHAPE, "mutation_id is malformed")
    return mid


def read_report(verb: str, frame: dict) -> Report | Refusal:
    op_key = frame.get("operation_key")
    if not is_digest(op_key):
        return Refusal(INVALID_SHAPE, "operation key is malformed")
    rid = bounded_text(frame.get("request_id"), "request_id")
    if isinstance(rid, Refusal):
        return rid
    task_id = bounded_text(frame.get("task_id", ""), "task_id", min_bytes=0)
    if isinstance(task_id, Refusal):
        return Refusal(task_id.reason_code, task_id.text, rid)
    mid = read_mutation_id(frame.get("mutation_id"))
    if isinstance(mid, Refusal):
        return Refusal(mid.reason_code, mid.text, rid)
    stages = REPORT_STAGES[verb]
    stage = frame.get("stage")
    if len(stages) == 1 and stage is None:
        stage = next(iter(stages))
    # a stage the verb cannot report is refused, never reinterpreted
    if not isinstance(stage, str) or stage not in stages:
        return Refusal(INVALID_SHAPE, "delivery stage is unsupported for this frame", rid)
    evidence = frame.get("evidence")
    shapes = stages[stage]
    required = _EVIDENCE_TEXT.get(stage, "executor outcome evidence is required")
    if not isinstance(evidence, dict):
        return Refusal(INVALID_SHAPE, required, rid)
    given = set(evidence)
    keys = next((k for k in shapes if given == set(k)), None)
    if keys is None:
        # fields missing from a shape: what is required; anything else (an
        # unknown key, two shapes mixed) is not a shape this stage takes
        if any(given < set(k) for k in shapes):
            return Refusal(INVALID_SHAPE, required, rid)
        return Refusal(INVALID_SHAPE, "delivery evidence shape is unsupported", rid)
    for key in keys:
        text = bounded_text(evidence.get(key), key)
        if isinstance(text, Refusal):
            if isinstance(evidence.get(key), str) and "UTF-8" in text.text:
                return Refusal(INVALID_SHAPE, f"{key} must be valid UTF-8", rid)
            return Refusal(INVALID_SHAPE, required, rid)
        if key == "reason_code" and not _REASON_CODE.match(text):
            return Refusal(INVALID_SHAPE, "delivery evidence field is malformed", rid)
    return Report(op_key, rid, task_id, mid, stage, {k: evidence[k] for k in keys})


def report_transition(current: str, reported: str, cancel_requested: bool = False
                      ) -> Refusal | None:
    """May the recipient move an operation from `current` to `reported`?
    Terminal stages take nothing; a report cannot skip a stage, except the
    executor's confirmed cancellation: `cancelled` ends any unfinished stage
    (queued included: the executor never started the turn), but only once the
    sender's cancel request is on record. A cancel is a request until the
    executor confirms it, and an executor that stops work nobody asked it to
    stop has failed it, not cancelled it."""
    if reported == CANCELLED and current in UNFINISHED:
        if cancel_requested:
            return None
        return Refusal(INVALID_TRANSITION, "delivery cancellation was not requested")
    if reported in _NEXT.get(current, ()):
        return None
    return Refusal(INVALID_TRANSITION, "delivery stage transition is invalid")


def cancel_decision(stage: str, cancel_requested: bool) -> Refusal | str:
    """'request' to journal a new cancellation request, 'repeat' to answer the
    current status unchanged, or why it is refused. A cancellation is only a
    request: the stage does not change until the executor reports."""
    if stage in TERMINAL:
        return Refusal(INVALID_TRANSITION, "terminal delivery cannot be cancelled")
    return "repeat" if cancel_requested else "request"

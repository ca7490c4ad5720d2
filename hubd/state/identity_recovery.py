"""Governed identity recovery, pure: trust-on-first-use identity pins, the
operator's `identity_pin_reclaim`, and online enrolment (`identity_enroll`,
`identity_revoke` under --identity-enrollments) (docs/identity.md,
"Governed identity recovery"; docs/reference-observed.md §19, §24).

The projection `identity_recovery` holds the pins (name -> the key that first
proved it) and the enrolled keys (key id -> key), built only from journal
events, so a restart keeps both and live state equals a replay. The decisions
are the reference's gates in its order, with its verdict texts (clients and
operators read them); the handler (hubd/handlers/identity_recovery.py)
gathers the observations and journals the audit.
"""

from __future__ import annotations

import base64
import binascii
import math
import re
from collections import deque
from dataclasses import dataclass, field

from hubd.state.acl import allowed, holds_role, project_of
from hubd.state.hub import Appliers
from hubd.state.identity_binding import OK, TrustedKey, verify_registration

# events: the state (pins, enrolled keys) and the audit rows (records only)
PINNED = "identity_pinned"
PIN_REMOVED = "identity_pin_removed"
KEY_ENROLLED = "identity_key_enrolled"
KEY_REVOKED = "identity_key_revoked"
RECLAIM_AUDIT = "identity_pin_reclaim"  # the reference's event kind
ENROLLMENT_AUDIT = "identity_enrollment"  # the reference's event kind

# the reference's ACL permissions and role
PIN_RECLAIM_PERMISSION = "identity-pin-reclaim"
ENROLL_PERMISSION = "identity-enroll"
ENROLLER_ROLE = "identity-enroller"

# the reference's bounds on a request
MAX_REASON = 500
KEY_ID_PATTERN = re.compile(r"[A-Za-z0-9._-]{1,64}")
# hubd's bounds on the projection (docs/identity.md): a full pin table admits
# a new name's proof without pinning it (logged, counted); a full enrolment
# store refuses a new enrolment with ENROLLMENT_FULL
MAX_PINS = 16384
MAX_ENROLLED = 4096
ENROLLMENT_FULL = f"the enrolment store is full ({MAX_ENROLLED} keys); revoke keys offline first"

# the reference's close codes
CLOSE_PIN_RECLAIMED = 4017
CLOSE_KEY_ROTATED = 4018

# verdict texts (the reference's)
RECLAIMED = "identity pin reclaimed; the next valid proof may pin the name"
PIN_PERSIST_FAILED = "could not persist the reclaimed pin table"
ENROLLMENT_PERSIST_FAILED = "could not persist the enrolment store"


@dataclass(frozen=True, slots=True)
class Pin:
    key_id: str
    public_key: str  # base64 of the 32 raw Ed25519 bytes
    pinned_at: float


@dataclass(frozen=True, slots=True)
class EnrolledKey:
    key_id: str
    name: str
    public_key: str  # base64 of the 32 raw Ed25519 bytes
    expires_at: float | None = None
    revoked: bool = False

    def trusted(self) -> TrustedKey:
        return TrustedKey(self.key_id, base64.b64decode(self.public_key), (self.name,),
                          self.expires_at, self.revoked)


@dataclass
class IdentityRecovery:
    """The projection: pins by name, enrolled keys by key id (revoked ones too)."""

    pins: dict[str, Pin] = field(default_factory=dict)
    enrolled: dict[str, EnrolledKey] = field(default_factory=dict)

    def live_key(self, name: str, now: float) -> EnrolledKey | None:
        """The enrolled key that proves `name` now, if any."""
        for key in self.enrolled.values():
            if key.name == name and not key.revoked and (
                    key.expires_at is None or key.expires_at > now):
                return key
        return None


PROJECTIONS = {"identity_recovery": IdentityRecovery}
appliers = Appliers()
appliers.records(RECLAIM_AUDIT, ENROLLMENT_AUDIT)


def recovery_of(state) -> IdentityRecovery:
    return state.extensions["identity_recovery"]


@appliers.applies(PINNED)
def _pinned(state, event) -> None:
    p = event.payload
    recovery_of(state).pins[p["name"]] = Pin(p["key_id"], p["public_key"], p["pinned_at"])


@appliers.applies(PIN_REMOVED)
def _pin_removed(state, event) -> None:
    pins = recovery_of(state).pins
    pin = pins.get(event.payload["name"])
    if pin is not None and pin.key_id == event.payload["key_id"]:  # compare-and-swap
        del pins[event.payload["name"]]


@appliers.applies(KEY_ENROLLED)
def _enrolled(state, event) -> None:
    p = event.payload
    enrolled = recovery_of(state).enrolled
    replaced = p.get("replaces")
    if replaced and replaced in enrolled:
        old = enrolled[replaced]
        enrolled[replaced] = EnrolledKey(old.key_id, old.name, old.public_key, old.expires_at,
                                         True)
    enrolled[p["key_id"]] = EnrolledKey(p["key_id"], p["name"], p["public_key"],
                                        p.get("expires_at"))


@appliers.applies(KEY_REVOKED)
def _revoked(state, event) -> None:
    enrolled = recovery_of(state).enrolled
    key = enrolled.get(event.payload["key_id"])
    if key is not None:
        enrolled[key.key_id] = EnrolledKey(key.key_id, key.name, key.public_key,
                                           key.expires_at, True)


def effective_keys(static: dict[str, TrustedKey],
                   recovery: IdentityRecovery | None) -> dict[str, TrustedKey]:
    """The keys a signed registration is verified against: the trust bundle's
    (authoritative for its names) and the enrolled ones (revoked ones kept,
    so a frame naming one is refused `revoked_key`)."""
    if recovery is None or not recovery.enrolled:
        return static
    merged = {key_id: key.trusted() for key_id, key in recovery.enrolled.items()
              if key_id not in static}
    merged.update(static)
    return merged


def raw_public_key(value) -> bytes | None:
    """32 raw Ed25519 bytes from base64 text, or None."""
    if not isinstance(value, str):
        return None
    try:
        raw = base64.b64decode(value.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None
    return raw if len(raw) == 32 else None


# -- trust on first use

@dataclass(frozen=True, slots=True)
class FirstUse:
    """What the TOFU gate decided about a registration (binding not required):
    `refusal` (None: admit), with the reference's verification result; `pin`
    the (key_id, public_key) a first valid proof pins."""

    refusal: str | None = None
    result: str = ""
    pin: tuple[str, str] | None = None


def first_use(pins: dict[str, Pin], frame: dict, now: float, nonces) -> FirstUse:
    """The reference's decision table, in its order: a pinned name must prove
    its pinned key (a missing signature included); an unpinned name with a
    complete proof (signature and `identity_public_key`) that verifies is
    pinned; a presented proof that fails is refused; no proof passes."""
    sender = frame.get("sender")
    signature = frame.get("signature")
    pin = pins.get(sender) if isinstance(sender, str) else None
    if pin is not None:
        if not isinstance(signature, dict):
            return FirstUse(pin_mismatch(sender, pin.key_id, "signature missing"),
                            "signature missing")
        result = _self_contained(frame, sender, pin.key_id, pin.public_key, now, nonces)
        if result == OK:
            return FirstUse()
        return FirstUse(pin_mismatch(sender, pin.key_id, result), result)
    presented = frame.get("identity_public_key")
    if not isinstance(signature, dict) or not isinstance(presented, str) or not presented:
        return FirstUse()
    key_id = signature.get("key_id")
    key_id = key_id if isinstance(key_id, str) else ""
    result = _self_contained(frame, sender, key_id, presented, now, nonces)
    if result != OK:
        return FirstUse(f"identity signature invalid: {result}", result)
    return FirstUse(pin=(key_id, presented))


def _self_contained(frame: dict, sender: str, key_id: str, public_key: str, now: float,
                    nonces) -> str:
    raw = raw_public_key(public_key)
    if raw is None or not key_id:
        return "unknown_key"
    return verify_registration({key_id: TrustedKey(key_id, raw, (sender,))}, frame, now,
                               nonces)


def pin_mismatch(name: str, key_id: str, detail: str) -> str:
    """The reference's actionable refusal of a claim on a pinned name (hubd
    names its own operator command and says where the pins are)."""
    return (f"identity pin: name {name!r} is pinned to key {key_id} ({detail}). Connect from "
            "the machine holding that key, or ask an identity-pin-reclaim ACL operator to run "
            f"hubd identity reclaim --operator OPERATOR_IDENTITY --expected-key-id {key_id} "
            f"--reason REASON -- {name}; the reclaim is audited in the hub's journal.")


# -- the operator's reclaim

@dataclass(frozen=True, slots=True)
class Reclaim:
    pin_name: str
    expected_key_id: str
    reason: str
    break_glass: bool


def read_reclaim(frame: dict) -> Reclaim:
    """The request as the reference reads it (fields stripped; the wire layer
    already refused a field of the wrong type)."""
    def text(name):
        value = frame.get(name)
        return value.strip() if isinstance(value, str) else ""
    return Reclaim(text("pin_name"), text("expected_key_id"), text("reason"),
                   frame.get("break_glass") is True)


def reclaim_denial(request: Reclaim, requester: str, pin: Pin | None, *, acl_allowed: bool,
                   requester_bound: bool, owner_online: bool, lease_live: bool = False) -> str:
    """The first gate the reclaim fails, or "" (the reference's order: the
    request's shape, then who asks, before anything about the target is told)."""
    if not request.pin_name:
        return "pin name is required"
    if not request.expected_key_id:
        return "expected key id is required"
    if not request.reason:
        return "a non-empty operator reason is required"
    if len(request.reason) > MAX_REASON:
        return f"operator reason exceeds {MAX_REASON} characters"
    if requester == request.pin_name:
        return "an operator cannot reclaim the identity used by its own live connection"
    if not acl_allowed:
        return "no identity-pin-reclaim ACL grant authorises this operator and target"
    if not requester_bound:
        return "the operator identity is not cryptographically bound"
    if pin is None:
        return "the target has no identity pin"
    if pin.key_id != request.expected_key_id:
        return "the current pin does not match the expected key id"
    if not request.break_glass and owner_online:
        return "the pinned identity is online; use explicit break-glass recovery to evict it"
    if not request.break_glass and lease_live:
        return "the ownership lease is still live; wait for its offline TTL or use break-glass"
    return ""


def acl_grants(rules, requester: str, permission: str, name: str) -> bool:
    """The always-on grant: checked by the verb even without --require-acl;
    no policy grants nothing."""
    return rules is not None and allowed(rules, requester, permission, "agent", name)


# -- online enrolment

@dataclass(frozen=True, slots=True)
class Authority:
    """What the hub observed about a requester, before any request field."""

    enabled: bool
    requester_bound: bool
    acl_allowed: bool
    role_granted: bool
    namespace_allowed: bool
    rate_allowed: bool

    @property
    def authorised(self) -> bool:
        """Passed every gate that proves who asks: its refusals are audited."""
        return self.enabled and self.requester_bound and self.acl_allowed and self.role_granted

    def denial(self) -> str:
        if not self.enabled:
            return "online enrolment is disabled on this hub"
        if not self.requester_bound:
            return "enrolment requires a cryptographically proven requester identity"
        if not self.acl_allowed:
            return "not authorised to enrol keys for this name"
        if not self.role_granted:
            return f"enrolment requires the {ENROLLER_ROLE!r} role grant"
        if not self.namespace_allowed:
            return "this hub does not allow enrolment in the name's namespace"
        if not self.rate_allowed:
            return "enrolment rate limit reached; try again later"
        return ""


def authority(*, enabled: bool, requester: str, requester_bound: bool, rules, roles,
              namespaces, name: str, rate_allowed: bool) -> Authority:
    return Authority(
        enabled, requester_bound, acl_grants(rules, requester, ENROLL_PERMISSION, name),
        holds_role(roles or {}, requester, f"{project_of(requester)}/{ENROLLER_ROLE}"),
        project_of(name) in namespaces, rate_allowed)


@dataclass(frozen=True, slots=True)
class Enrolment:
    requester: str
    name: str
    key_id: str
    public_key: str  # as sent (stripped); `raw` says whether it is a key
    raw: bytes | None
    reason: str
    expected_key_id: str
    expires_at: object

    @property
    def action(self) -> str:
        return "rotate" if self.expected_key_id else "enroll"


def read_enrolment(frame: dict, requester: str) -> Enrolment:
    def text(name):
        value = frame.get(name)
        return value.strip() if isinstance(value, str) else ""
    return Enrolment(requester, text("name"), text("key_id"), text("public_key"),
                     raw_public_key(frame.get("public_key")),
                     frame.get("reason") if isinstance(frame.get("reason"), str) else "",
                     text("expected_key_id"), frame.get("expires_at"))


def _name_shape(name: str) -> str:
    if "/" not in name or not name.split("/", 1)[1]:
        return "the name must be <project>/<id>"
    return ""


def _reason(reason: str) -> str:
    clean = reason.strip()
    if not clean:
        return "a non-empty operator reason is required"
    if len(clean) > MAX_REASON:
        return f"reason exceeds {MAX_REASON} characters"
    return ""


def _static_senders(static: dict[str, TrustedKey]) -> set[str]:
    return {sender for key in static.values() for sender in key.senders}


def enrolment_denial(request: Enrolment, static: dict[str, TrustedKey],
                     recovery: IdentityRecovery, now: float) -> str:
    """Why an authorised enrolment (or rotation) cannot run, or ""."""
    denial = _name_shape(request.name)
    if denial:
        return denial
    if KEY_ID_PATTERN.fullmatch(request.key_id) is None:
        return "key id must be 1-64 characters of letters, digits, '.', '_' or '-'"
    if request.raw is None:
        return "public key must be base64 of 32 raw Ed25519 bytes"
    denial = _reason(request.reason)
    if denial:
        return denial
    expires = request.expires_at
    if expires is not None and (isinstance(expires, bool) or not isinstance(expires, (int, float))
                                or not math.isfinite(expires) or expires <= now):
        return "expires_at must be a future time"
    if request.key_id in static or request.key_id in recovery.enrolled:
        return "key id is already in use"
    if request.name in _static_senders(static):
        return "the identity trust bundle already covers this name"
    current = recovery.live_key(request.name, now)
    if request.name == request.requester and not request.expected_key_id:
        return "an enroller may only rotate its own key, naming the current key id"
    if current is None:
        if request.expected_key_id:
            return "no current enrolled key to rotate for this name"
    elif request.expected_key_id != current.key_id:
        return "the name already has an enrolled key; rotate it by naming the current key id"
    if len(recovery.enrolled) >= MAX_ENROLLED:
        return ENROLLMENT_FULL
    return ""


def revocation_denial(name: str, key_id: str, reason: str, static: dict[str, TrustedKey],
                      recovery: IdentityRecovery) -> str:
    """Why an authorised revocation cannot run, or "" (only the enrolled keys
    are revocable online; the trust bundle's are the operator's file)."""
    denial = _name_shape(name) or _reason(reason)
    if denial:
        return denial
    if key_id in static:
        return "keys in the identity trust bundle are revoked by editing that file"
    key = recovery.enrolled.get(key_id)
    if key is None:
        return "no enrolled key has this id"
    if key.name != name:
        return "the enrolled key does not prove this name"
    if key.revoked:
        return "the enrolled key is already revoked"
    return ""


class EnrolmentRate:
    """Per-requester sliding window of applied changes (--identity-enrollment-rate
    per --identity-enrollment-window). Live, as the reference's: a restart
    starts the windows again. Bounded: a requester holds at most `limit`
    stamps, and only requesters that passed every authority gate are counted."""

    def __init__(self, limit: int, window: float):
        self.limit, self.window = limit, window
        self._stamps: dict[str, deque[float]] = {}

    def allows(self, requester: str, now: float) -> bool:
        stamps = self._stamps.get(requester)
        if stamps is None:
            return self.limit > 0
        while stamps and stamps[0] <= now - self.window:
            stamps.popleft()
        if not stamps:
            del self._stamps[requester]
            return self.limit > 0
        return len(stamps) < self.limit

    def record(self, requester: str, now: float) -> None:
        stamps = self._stamps.setdefault(requester, deque(maxlen=max(self.limit, 1)))
        stamps.append(now)

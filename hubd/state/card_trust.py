"""Signed capability cards: the trust bundle (`--capability-card-trust`)
and the verification projected on a card, as the reference does it
(docs/capabilities.md "Signed cards"; docs/reference-observed.md §22).

Still advisory: a card is advertised whatever its result; nothing is
authorised by it.

The signature is Ed25519 over a domain-separated canonical form of the
stable card (the projected card without `advertised_at` and `verification`,
its signature without `value`); the card's digest, carried in the signature,
is SHA-256 over another domain and the stable card without its signature.
The canonical form is json.dumps(sort_keys, compact, ensure_ascii=False),
strict (no NaN or infinity).

Checks, in the reference's order: signature present and an object; key
known, not revoked, not expired; the card's agent is the hub-resolved sender
and the key binds it; the card's project is the sender's namespace and the
key's scope; envelope version and algorithm; sequence; timestamps; validity
window (with clock skew); digest; signature; then the lifecycle history (a
sequence must increase per agent and key; a card that drops a route
capability it had is flagged `capability_downgrade`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import math
from collections import OrderedDict
from dataclasses import dataclass, field

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from .acl import PolicyError
from .events import Event
from .hub import Appliers, HubState

SIGNATURE_DOMAIN = b"SYNAPSE-CAPABILITY-CARD-SIGNATURE-V1\x00"
DIGEST_DOMAIN = b"SYNAPSE-CAPABILITY-CARD-DIGEST-V1\x00"
VERSION = 1
ALGORITHM = "ed25519"
CLOCK_SKEW = 30.0
MAX_KEYS = 4096
MAX_TEXT = 1024
HISTORY_CAPACITY = 4096
HISTORY_RETENTION = 3600.0

CARD_ACCEPTED = "capability_card_accepted"  # the journaled lifecycle history
EXTENSION = "capability_card_history"

_DETAILS = {
    "missing_signature": "card is unsigned and remains advisory discovery",
    "not_object": "card signature is not an object",
    "unknown_key": "signature key is absent from the capability-card trust bundle",
    "revoked_key": "signature key is revoked",
    "key_expired": "signature key has expired",
    "agent_mismatch": "card agent does not match the hub-resolved sender and key binding",
    "project_scope_mismatch": "card project does not match the required namespace and key scope",
    "envelope": "card signature names an unsupported version or algorithm",
    "sequence": "card signature sequence must be a positive integer",
    "timestamps": "card signature timestamps are missing or malformed",
    "malformed": "card signature digest or timestamps are malformed",
    "window": "card is outside its signed validity window",
    "not_strict": "card contains values outside the strict canonical JSON profile",
    "digest": "card digest does not match its stable advertisement fields",
    "signature": "Ed25519 signature does not verify over the canonical card",
    "replayed": "card sequence did not increase for this agent and key",
    "downgrade": "new signed card removed a route-relevant capability; review required",
    "history_full": "bounded card history is full; no replay-safe admission state was recorded",
    "valid": "signature, bindings, expiry, and lifecycle checks passed",
}
_RESULTS = {"not_object": "bad_signature", "key_expired": "expired", "envelope": "bad_signature",
            "sequence": "sequence_mismatch", "timestamps": "bad_signature",
            "malformed": "bad_signature", "window": "expired", "not_strict": "bad_signature",
            "digest": "bad_signature", "signature": "bad_signature",
            "replayed": "sequence_mismatch", "downgrade": "capability_downgrade"}


@dataclass(frozen=True)
class CardKey:
    key_id: str
    public_key: bytes
    agents: frozenset
    projects: frozenset
    revoked: bool = False
    expires_at: float | None = None


def _texts(value, key_id: str, name: str) -> frozenset:
    if not isinstance(value, list) or len(value) > MAX_KEYS or not all(
            isinstance(v, str) and 0 < len(v.strip()) <= MAX_TEXT for v in value):
        raise PolicyError(f"capability-card key '{key_id}' {name} must be a list of names")
    return frozenset(v.strip() for v in value)


def parse_card_trust(doc) -> dict[str, CardKey]:
    """`{"keys": [{key_id, public_key, agents, projects, revoked?, expires_at?}]}`."""
    if not isinstance(doc, dict) or not isinstance(doc.get("keys"), list):
        raise PolicyError("capability-card trust bundle must be an object with a 'keys' list")
    if len(doc["keys"]) > MAX_KEYS:
        raise PolicyError(f"capability-card trust bundle has more than {MAX_KEYS} keys")
    keys: dict[str, CardKey] = {}
    for index, entry in enumerate(doc["keys"]):
        if not isinstance(entry, dict):
            raise PolicyError(f"capability-card key {index} must be an object")
        key_id = entry.get("key_id")
        if not isinstance(key_id, str) or not 0 < len(key_id.strip()) <= MAX_TEXT:
            raise PolicyError(f"capability-card key {index} needs a key_id")
        key_id = key_id.strip()
        if key_id in keys:
            raise PolicyError(f"capability-card key '{key_id}' is given twice")
        try:
            raw = base64.b64decode(entry.get("public_key") or "", validate=True)
        except (TypeError, ValueError, binascii.Error):
            raw = b""
        if len(raw) != 32:
            raise PolicyError(f"capability-card key '{key_id}' public_key must be base64 "
                              "of 32 bytes")
        revoked = entry.get("revoked", False)
        if not isinstance(revoked, bool):
            raise PolicyError(f"capability-card key '{key_id}' revoked must be a boolean")
        expires = entry.get("expires_at")
        if expires is not None and (isinstance(expires, bool) or not isinstance(
                expires, (int, float)) or not math.isfinite(expires)):
            raise PolicyError(f"capability-card key '{key_id}' expires_at must be finite")
        keys[key_id] = CardKey(key_id, raw, _texts(entry.get("agents"), key_id, "agents"),
                               _texts(entry.get("projects"), key_id, "projects"), revoked,
                               float(expires) if expires is not None else None)
    return keys


# -- the canonical forms


def _strict(value) -> bytes | None:
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                          allow_nan=False).encode("utf-8")
    except (TypeError, ValueError):
        return None


def _stable(card: dict, keep_signature: bool) -> dict:
    stable = {k: v for k, v in card.items() if k not in ("advertised_at", "verification")}
    if not keep_signature:
        stable.pop("signature", None)
    elif isinstance(stable.get("signature"), dict):
        stable["signature"] = {k: v for k, v in stable["signature"].items() if k != "value"}
    return stable


def card_digest(card: dict) -> str | None:
    body = _strict(_stable(card, keep_signature=False))
    return None if body is None else hashlib.sha256(DIGEST_DOMAIN + body).hexdigest()


def signed_bytes(card: dict) -> bytes | None:
    body = _strict(_stable(card, keep_signature=True))
    return None if body is None else SIGNATURE_DOMAIN + body


def route_capabilities(card: dict) -> frozenset:
    """What a downgrade is judged on: skills, task classes, contracts."""
    found = set()
    for name in ("skills", "task_classes"):
        for item in card.get(name) or ():
            if str(item).strip():
                found.add(f"{name}:{str(item).strip()}")
    for contract in card.get("contracts") or ():
        if isinstance(contract, dict):
            text = _strict(contract)
            if text is not None:
                found.add("contract:" + text.decode("utf-8"))
    return frozenset(found)


# -- the lifecycle history: journaled, so a restart does not forget a sequence


@dataclass
class CardHistory:
    # (agent, key_id) -> (sequence, capabilities, expires_at); oldest first
    entries: OrderedDict = field(default_factory=OrderedDict)

    def evict(self, now: float) -> None:
        for binding in [b for b, e in self.entries.items() if e[2] + HISTORY_RETENTION < now]:
            del self.entries[binding]


PROJECTIONS = {EXTENSION: CardHistory}
appliers = Appliers()


def history_of(state: HubState) -> CardHistory:
    return state.extensions[EXTENSION]


@appliers.applies(CARD_ACCEPTED)
def _apply_accepted(state: HubState, event: Event) -> None:
    p = event.payload
    history = history_of(state)
    history.evict(p.get("at", event.ts))
    binding = (p["agent"], p["key_id"])
    history.entries.pop(binding, None)
    history.entries[binding] = (p["sequence"], frozenset(p["capabilities"]), p["expires_at"])


@dataclass(frozen=True)
class Verdict:
    """What a card shows (`verification`), and the history entry to journal
    (None: nothing to remember)."""
    verification: dict
    remember: dict | None = None


def _verdict(reason: str, context: dict, remember: dict | None = None) -> Verdict:
    shown = {"detail": _DETAILS[reason], "result": _RESULTS.get(reason, reason)}
    shown.update({k: v for k, v in context.items() if v not in (None, "")})
    return Verdict(shown, remember)


def verify_card(card: dict, keys: dict[str, CardKey], history: CardHistory, now: float,
                agent: str, project: str) -> Verdict:
    """The card's verification (the reference's results and details, in its order)."""
    signature = card.get("signature")
    if not signature:  # hubd projects an unsigned card's signature as {}
        return _verdict("missing_signature", {})
    if not isinstance(signature, dict):
        return _verdict("not_object", {})
    key_id = str(signature.get("key_id") or "").strip()
    sequence = signature.get("sequence")
    context = {"key_id": key_id,
               "sequence": sequence if type(sequence) is int else None}
    key = keys.get(key_id)
    if key is None:
        return _verdict("unknown_key", context)
    if key.revoked:
        return _verdict("revoked_key", context)
    if key.expires_at is not None and key.expires_at < now:
        return _verdict("key_expired", context)
    if str(card.get("agent") or "").strip() != agent or agent not in key.agents:
        return _verdict("agent_mismatch", context)
    if str(card.get("project") or "").strip() != project or project not in key.projects:
        return _verdict("project_scope_mismatch", context)
    if signature.get("version") != VERSION or signature.get("algorithm") != ALGORITHM:
        return _verdict("envelope", context)
    if type(sequence) is not int or sequence < 1:
        return _verdict("sequence", context)
    signed_at, expires_at = signature.get("signed_at"), signature.get("expires_at")
    if type(signed_at) not in (int, float) or type(expires_at) not in (int, float):
        return _verdict("timestamps", context)
    claimed = str(signature.get("card_digest") or "").strip()
    if not claimed or not math.isfinite(signed_at) or not math.isfinite(expires_at):
        return _verdict("malformed", context)
    signed_at, expires_at = float(signed_at), float(expires_at)
    context.update(card_digest=claimed, signed_at=signed_at, expires_at=expires_at)
    if signed_at > now + CLOCK_SKEW or expires_at < now - CLOCK_SKEW or expires_at <= signed_at:
        return _verdict("window", context)
    digest = card_digest(card)
    if digest is None:
        return _verdict("not_strict", context)
    context["card_digest"] = digest
    if digest != claimed:
        return _verdict("digest", context)
    try:
        value = base64.b64decode(str(signature.get("value") or ""), validate=True)
        Ed25519PublicKey.from_public_bytes(key.public_key).verify(value, signed_bytes(card))
    except (InvalidSignature, TypeError, ValueError, binascii.Error):
        return _verdict("signature", context)
    return _lifecycle(history, agent, key_id, sequence, route_capabilities(card), expires_at,
                      now, context)


def _lifecycle(history: CardHistory, agent: str, key_id: str, sequence: int, caps: frozenset,
               expires_at: float, now: float, context: dict) -> Verdict:
    live = {b: e for b, e in history.entries.items() if e[2] + HISTORY_RETENTION >= now}
    previous = live.get((agent, key_id))
    if previous is not None and sequence <= previous[0]:
        return _verdict("replayed", context)
    if previous is None and len(live) >= HISTORY_CAPACITY:
        return _verdict("history_full", context)
    reason, kept, expiry = "valid", caps, expires_at
    if previous is not None and not previous[1] <= caps:
        # flagged, and the capabilities it had are what the next card is judged on
        reason, kept, expiry = "downgrade", previous[1], max(previous[2], expires_at)
    return _verdict(reason, context, {"agent": agent, "key_id": key_id, "sequence": sequence,
                                      "capabilities": sorted(kept), "expires_at": expiry,
                                      "at": now})

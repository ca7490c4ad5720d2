"""Identity binding: the reference's trust bundle (`--identity-trust`) and the
Ed25519 `signature` on a registration (`--require-identity-binding`); pure
(docs/identity.md, "The reference's identity files"; docs/reference-observed.md
§11.1, §11.2).

The signature covers the UTF-8 JSON of the whole registering frame, its
`signature` object included but without `signature.value`, keys sorted,
separators `,`/`:`, non-ASCII kept as it is.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from hubd.state.acl import PolicyError
from hubd.wire.digests import signed_json

MAX_KEYS = 4096
MAX_TEXT = 1024

OK = "ok"
MISSING_SIGNATURE = "missing_signature"
UNKNOWN_KEY = "unknown_key"
EXPIRED = "expired"
BAD_SIGNATURE = "bad_signature"
SENDER_MISMATCH = "sender_mismatch"
REVOKED_KEY = "revoked_key"
SEQUENCE_MISMATCH = "sequence_mismatch"
REPLAYED = "replayed"
# hubd's, as for per-message auth: the memory of fresh nonces is full
REPLAY_LEDGER_FULL = "replay_ledger_full"

# the reference's: a registration signed more than 10 s ago, or more than 1 s
# ahead of the hub's clock, is expired; a nonce is accepted once in that window
WINDOW = 10.0
FUTURE_SKEW = 1.0
REPLAY_CAPACITY = 4096


@dataclass(frozen=True, slots=True)
class TrustedKey:
    key_id: str
    public_key: bytes  # the 32 raw Ed25519 bytes
    senders: tuple[str, ...]
    expires_at: float | None = None
    # an enrolled key an operator revoked (hubd/state/identity_recovery.py)
    revoked: bool = False


def parse_trust_bundle(doc) -> dict[str, TrustedKey]:
    """`{"keys": [{key_id, public_key (base64 of 32 bytes), senders, expires_at?}]}`
    as key id -> TrustedKey, or PolicyError."""
    if not isinstance(doc, dict) or not isinstance(doc.get("keys"), list):
        raise PolicyError("identity trust bundle must be an object with a 'keys' list")
    if len(doc["keys"]) > MAX_KEYS:
        raise PolicyError(f"identity trust bundle holds more than {MAX_KEYS} keys")
    keys: dict[str, TrustedKey] = {}
    for index, entry in enumerate(doc["keys"]):
        if not isinstance(entry, dict):
            raise PolicyError(f"identity key {index} must be an object")
        key_id, senders = entry.get("key_id"), entry.get("senders")
        if not isinstance(key_id, str) or not 0 < len(key_id) <= MAX_TEXT:
            raise PolicyError(f"identity key {index} needs a key_id")
        if key_id in keys:
            raise PolicyError(f"identity key id '{key_id}' appears twice")
        try:
            raw = base64.b64decode(entry.get("public_key"), validate=True)
        except (TypeError, ValueError, binascii.Error):
            raw = b""
        if len(raw) != 32:
            raise PolicyError(f"identity key '{key_id}' public_key must be base64 of 32 bytes")
        if not isinstance(senders, list) or not senders or len(senders) > MAX_KEYS or \
                not all(isinstance(s, str) and 0 < len(s) <= MAX_TEXT for s in senders):
            raise PolicyError(f"identity key '{key_id}' must list its senders")
        expires = entry.get("expires_at")
        if expires is not None and (isinstance(expires, bool)
                                    or not isinstance(expires, (int, float))):
            raise PolicyError(f"identity key '{key_id}' expires_at must be a number")
        keys[key_id] = TrustedKey(key_id, raw, tuple(senders),
                                  float(expires) if expires is not None else None)
    return keys


def signed_bytes(frame: dict, value_key: str, container: str) -> bytes:
    """The bytes a signature covers: the frame with `frame[container][value_key]`
    left out, as sorted compact JSON (shared with per-message authentication)."""
    inner = {k: v for k, v in frame[container].items() if k != value_key}
    return signed_json({**frame, container: inner})


def verify_registration(keys: dict[str, TrustedKey], frame: dict, now: float,
                        nonces=None, capacity: int = REPLAY_CAPACITY) -> str:
    """OK, or the reference's verification result naming why the registering
    frame does not prove its sender, in the reference's order. `nonces`
    (hubd/state/message_auth.py AuthNonces: the registrations accepted
    lately) refuses a replayed frame; the caller remembers an accepted one."""
    signature = frame.get("signature")
    sender = frame.get("sender")
    if not isinstance(signature, dict) or not isinstance(sender, str):
        return MISSING_SIGNATURE
    key = keys.get(signature.get("key_id")) if isinstance(signature.get("key_id"), str) else None
    if key is None:
        return UNKNOWN_KEY
    if key.revoked:
        return REVOKED_KEY
    if sender not in key.senders:
        return SENDER_MISMATCH
    if key.expires_at is not None and key.expires_at <= now:
        return EXPIRED
    signed_at, sequence = signature.get("signed_at"), signature.get("sequence")
    if signature.get("algorithm") != "ed25519" or type(signed_at) not in (int, float):
        return BAD_SIGNATURE
    if type(sequence) is not int or sequence < 1:
        return SEQUENCE_MISMATCH
    if not now - WINDOW <= signed_at <= now + FUTURE_SKEW:
        return EXPIRED
    nonce = signature.get("nonce")
    if not isinstance(signature.get("value"), str) or not isinstance(nonce, str) or not nonce:
        return BAD_SIGNATURE
    try:
        value = base64.b64decode(signature["value"], validate=True)
        Ed25519PublicKey.from_public_bytes(key.public_key).verify(
            value, signed_bytes(frame, "value", "signature"))
    except (ValueError, binascii.Error, InvalidSignature, UnicodeEncodeError):
        return BAD_SIGNATURE
    if nonces is not None:
        if nonces.seen(key.key_id, nonce):
            return REPLAYED
        if nonces.fresh_count(now, WINDOW) >= capacity:
            return REPLAY_LEDGER_FULL
    return OK

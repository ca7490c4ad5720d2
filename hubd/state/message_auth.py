"""Per-message authentication: the reference's sender-bound HMAC keys
(`--message-auth-key KID:SECRET:SENDER[,SENDER...]`), the `auth` object on
the mutating verbs, the replay window and the durable sequence floor; pure (docs/identity.md,
"Per-message authentication"; docs/reference-observed.md §12).

`auth.value` is the lowercase hex HMAC-SHA256 of the whole frame, `auth`
included but without `auth.value`, as sorted compact UTF-8 JSON; the key is
the secret's UTF-8 bytes. A nonce is accepted once while its frame is fresh
(`auth.timestamp` within the window behind the hub's clock, at most a second
ahead); the nonces seen are journaled (`message_auth_nonce`: kid, nonce and
time, never a secret), so a restart remembers them (`AuthNonces`). The
highest sequence accepted per key and sender (the floor) is kept from the
same events; `--message-auth-sequence-floor-mode strict` refuses a sequence
at or below it.

A key may also be bound to hubd principals (`@NAME` among its senders): it
then proves any seat a session of that principal speaks for
(docs/identity.md, "Keys of a principal").
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections import OrderedDict
from dataclasses import dataclass

from hubd.state.hub import Appliers
from hubd.state.identity_binding import signed_bytes

OK = "ok"
MISSING = "missing"
EXPIRED = "expired"
UNKNOWN_KEY = "unknown_key"
BAD_AUTHENTICATION = "bad_authentication"
SENDER_MISMATCH = "sender_mismatch"
SEQUENCE_MISMATCH = "sequence_mismatch"
REPLAYED = "replayed"
# hubd's: the replay ledger holds `capacity` fresh nonces already; a new one
# cannot be remembered, so it is refused rather than risk accepting it twice
REPLAY_LEDGER_FULL = "replay_ledger_full"

# --message-auth-sequence-floor-mode: the reference's values; hubd records
# the floor in every mode (it is in the nonce event anyway), only strict refuses
FLOOR_MODES = ("off", "compat", "strict")
FLOOR_STRICT = "strict"
PRINCIPAL_MARK = "@"

DEFAULT_WINDOW = 10.0
DEFAULT_CAPACITY = 4096
MAX_FUTURE_SKEW = 1.0
MAX_NONCE_BYTES = 256

# The verbs whose frames must carry a valid `auth` under --require-message-auth
# (the reference's signed set).
SIGNED_VERBS = frozenset((
    "claim", "release", "task_update", "handoff", "checkpoint",
    "delivery_request", "delivery_boundary", "delivery_ack", "delivery_outcome",
    "delivery_cancel", "resource", "resource_offer", "offer_resource",
    "attachment_begin", "attachment_chunk", "attachment_commit", "attachment_abort",
    "attachment_info", "attachment_read", "attachment_ref", "attachment_gc",
    # hubd's: an agent's read through its hub from a source hub (a peer
    # hub's own request comes over its pinned link and is not signed)
    "attachment_peer_request"))

KEY_FORMAT = ("--message-auth-key / --message-auth-key-file entries must use "
              "KEY_ID:SECRET:SENDER[,SENDER...]")
_KEY_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}\Z")
_PRINCIPAL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,255}\Z")


class KeyFormatError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class MacKey:
    key_id: str
    secret: bytes
    senders: frozenset[str]
    # hubd principals whose sessions may sign with it (`@NAME` senders)
    principals: frozenset[str] = frozenset()

    def __repr__(self) -> str:  # a secret is never printed, logged or journaled
        return (f"MacKey({self.key_id!r}, senders={sorted(self.senders)!r}, "
                f"principals={sorted(self.principals)!r})")

    def proves(self, sender: str, principal: str | None) -> bool:
        """May a frame from `sender`, on a session of `principal`, be signed with it?"""
        return sender in self.senders or (principal is not None and principal in self.principals)


def parse_key(entry: str) -> MacKey:
    """One `KEY_ID:SECRET:SENDER[,SENDER...]`; the secret may not hold ':'
    (the key id may not either), senders are the rest after the second ':'.
    A sender `@NAME` binds the key to the hubd principal NAME."""
    key_id, sep1, rest = entry.strip().partition(":")
    secret, sep2, senders = rest.partition(":")
    names = frozenset(s.strip() for s in senders.split(",") if s.strip())
    if not (sep1 and sep2 and key_id and secret and names) or not _KEY_ID.match(key_id):
        raise KeyFormatError(KEY_FORMAT)
    principals = frozenset(n[1:] for n in names if n.startswith(PRINCIPAL_MARK))
    if not all(_PRINCIPAL.match(name) for name in principals):
        raise KeyFormatError(f"message-auth key '{key_id}': a principal is @NAME, NAME "
                             "a principal's name")
    return MacKey(key_id, secret.encode("utf-8"),
                  frozenset(n for n in names if not n.startswith(PRINCIPAL_MARK)), principals)


def parse_key_file(text: str) -> list[MacKey]:
    """One entry a line; blank lines and `#` comments skipped."""
    return [parse_key(line) for line in text.splitlines()
            if line.strip() and not line.strip().startswith("#")]


def keyring(keys: list[MacKey]) -> dict[str, MacKey]:
    """Key id -> key; a key id given twice is refused (which secret holds?)."""
    ring: dict[str, MacKey] = {}
    for key in keys:
        if key.key_id in ring:
            raise KeyFormatError(f"message-auth key id '{key.key_id}' is given twice")
        ring[key.key_id] = key
    return ring


def mac_of(frame: dict, secret: bytes) -> str:
    return hmac.new(secret, signed_bytes(frame, "value", "auth"), hashlib.sha256).hexdigest()


def _int(value) -> bool:
    return type(value) is int


def _number(value) -> bool:
    return type(value) in (int, float)


@dataclass(frozen=True, slots=True)
class Verified:
    result: str
    kid: str = ""
    nonce: str = ""
    timestamp: float = 0.0
    sequence: int = 0


def verify(ring: dict[str, MacKey], frame: dict, sender: str, now: float, window: float,
           nonces: "AuthNonces", capacity: int, floor_mode: str = "off",
           principal: str | None = None) -> Verified:
    """The verification of a frame's `auth` (Verified.result OK, or the
    reference's result naming why not), in the reference's order: missing,
    key, sender (or the session's principal), sequence, freshness, value,
    replay, then (strict) the sequence floor of this key and sender."""
    auth = frame.get("auth")
    if not isinstance(auth, dict):
        return Verified(MISSING)
    kid = auth.get("kid")
    key = ring.get(kid) if isinstance(kid, str) else None
    if key is None:
        return Verified(UNKNOWN_KEY)
    if not key.proves(sender, principal):
        return Verified(SENDER_MISMATCH)
    sequence = auth.get("sequence")
    if not _int(sequence) or sequence <= 0:
        return Verified(SEQUENCE_MISMATCH)
    stamp = auth.get("timestamp")
    if not _number(stamp) or not now - window <= stamp <= now + MAX_FUTURE_SKEW:
        return Verified(EXPIRED)
    nonce, value = auth.get("nonce"), auth.get("value")
    if auth.get("alg") != "hmac-sha256" or not isinstance(value, str) or \
            not isinstance(nonce, str) or not 0 < len(nonce) <= MAX_NONCE_BYTES:
        return Verified(BAD_AUTHENTICATION)
    try:
        expected = mac_of(frame, key.secret)
    except (UnicodeEncodeError, ValueError):
        return Verified(BAD_AUTHENTICATION)
    if not hmac.compare_digest(expected, value):
        return Verified(BAD_AUTHENTICATION)
    if nonces.seen(kid, nonce):
        return Verified(REPLAYED)
    if floor_mode == FLOOR_STRICT and sequence <= nonces.floor(kid, sender):
        return Verified(SEQUENCE_MISMATCH)
    if nonces.fresh_count(now, window) >= capacity:
        return Verified(REPLAY_LEDGER_FULL)
    return Verified(OK, kid, nonce, float(stamp), sequence)


class AuthNonces:
    """The nonces accepted while they could still be replayed (the projection
    `message_auth`): (kid, nonce) -> the auth timestamp, oldest first; and
    the floors: (kid, sender) -> the highest sequence accepted (one entry a
    key and sender a key was bound to: bounded by the keys configured)."""

    def __init__(self):
        self._seen: OrderedDict[tuple[str, str], float] = OrderedDict()
        self._floors: dict[tuple[str, str], int] = {}

    def floor(self, kid: str, sender: str) -> int:
        return self._floors.get((kid, sender), 0)

    def raise_floor(self, kid: str, sender: str, sequence: int) -> None:
        if sequence > self._floors.get((kid, sender), 0):
            self._floors[(kid, sender)] = sequence

    def seen(self, kid: str, nonce: str) -> bool:
        return (kid, nonce) in self._seen

    def fresh_count(self, now: float, window: float) -> int:
        self.forget_before(now - window - MAX_FUTURE_SKEW)
        return len(self._seen)

    def forget_before(self, cutoff: float) -> None:
        """Nonces whose frames are too old to pass the freshness check cannot
        be replayed: they need no memory. (Insertion order is nearly time
        order; an entry out of order waits for the ones before it.)"""
        seen = self._seen
        while seen:
            key, stamp = next(iter(seen.items()))
            if stamp >= cutoff:
                return
            del seen[key]

    def add(self, kid: str, nonce: str, stamp: float) -> None:
        self._seen[(kid, nonce)] = stamp

    def __len__(self) -> int:
        return len(self._seen)

    def __eq__(self, other) -> bool:  # a replayed projection equals the live one
        return isinstance(other, AuthNonces) and list(self._seen.items()) == \
            list(other._seen.items()) and self._floors == other._floors


NONCE_EVENT = "message_auth_nonce"
PROJECTIONS = {"message_auth": AuthNonces}
appliers = Appliers()


@appliers.applies(NONCE_EVENT)
def _nonce(state, event) -> None:
    payload = event.payload
    nonces: AuthNonces = state.extensions["message_auth"]
    nonces.add(payload["kid"], payload["nonce"], payload["timestamp"])
    if "sequence" in payload:  # a journal from before the floor has none
        nonces.raise_floor(payload["kid"], payload["sender"], payload["sequence"])
    # bounded on replay too: a long journal's old nonces are dropped as it is read
    nonces.forget_before(payload["at"] - payload["window"] - MAX_FUTURE_SKEW)

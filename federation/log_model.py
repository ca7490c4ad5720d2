"""The events of a hubs' log union, their fingerprint and what can go wrong (no IO).

A LogEvent is one journal event tagged with the hub that authored it; its
identity is ``(hub_id, seq)`` and its content is bound to that identity by a
fingerprint. The union itself is federation/merge.py; every error it (or the
decoding of a pulled page, federation/log_snapshot.py) raises is a MergeError
defined here, and each leaves the union unchanged.

Event fingerprint (wire-visible: a task write names its parent by it, and
operators compare it across observers). Lowercase hex SHA-256 over the bytes

    DOMAIN || F("h", hub_id) || F("q", seq) || F("t", ts) || F("k", kind) || F("p", V(payload))

where ``DOMAIN`` is ``b"synapse-channel:multihub-event-fingerprint:v1\\x00"``,
``F(tag, body) = tag (1 ASCII byte) || len(body) as 8-byte big-endian || body``,
``hub_id`` and ``kind`` are UTF-8, ``seq`` is its decimal ASCII digits and
``ts`` is the IEEE-754 binary64 big-endian encoding of ``float(ts)`` (the exact
timestamp, so 1 and 1.0 are the same instant). ``V`` tags every JSON value with
its type, so 1, 1.0, "1" and true never collide:

    null  -> b"n"            true -> b"b1"          false -> b"b0"
    int   -> F("i", decimal ASCII digits, "-" for negatives)
    float -> F("f", binary64 big-endian)   (finite only)
    str   -> F("s", UTF-8)
    list  -> F("l", concat of F("v", V(item)) in list order)
    object-> F("o", concat of F("k", UTF-8 key) || F("v", V(value)) with the
             members sorted by the UTF-8 bytes of their keys)

Sorting object members makes the digest independent of mapping insertion order;
list order is content. This is byte-for-byte the reference hub's encoding
(checked against fingerprints its ``multihub observe --json`` prints; see
tests/unit/test_multihub_merge.py), so hubd and reference observers name the
same event by the same value. Strings that are not valid UTF-8 (lone
surrogates), non-finite floats and non-JSON types cannot be fingerprinted and
raise ``Unfingerprintable``.
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

FINGERPRINT_DOMAIN = b"synapse-channel:multihub-event-fingerprint:v1\x00"


# -- errors (all subclasses of MergeError; each leaves the MergedLog unchanged)

class MergeError(Exception):
    """A pulled batch that cannot be published."""


class Unfingerprintable(MergeError, ValueError):
    """An event whose content has no canonical form (not JSON-shaped)."""


class Equivocation(MergeError):
    """One identity (hub_id, seq) presented with two different contents.
    (federation/log_chain.py adds the chain's kinds: a broken chain, two
    signed heads for one seq; each quarantines the peer alike.)"""

    reason = "conflicting_offer"
    proof: list | None = None  # signed evidence a third party can check, if any

    def __init__(self, hub_id: str, seq: int, accepted_fingerprint: str,
                 offered_fingerprint: str):
        super().__init__(f"hub {hub_id!r} equivocated at seq {seq}: accepted "
                         f"{accepted_fingerprint}, offered {offered_fingerprint}")
        self.hub_id = hub_id
        self.seq = seq
        self.accepted_fingerprint = accepted_fingerprint
        self.offered_fingerprint = offered_fingerprint


class LogGap(MergeError):
    """A batch that would skip sequence numbers (never published: a gap is
    never skipped, the follower re-asks from its cursor)."""

    def __init__(self, hub_id: str, expected_seq: int, observed_seq: int | None, detail: str):
        super().__init__(f"hub {hub_id!r}: {detail}")
        self.hub_id = hub_id
        self.expected_seq = expected_seq
        self.observed_seq = observed_seq


class CursorRollback(MergeError):
    """The peer answers as if its log were shorter than what was accepted, or
    re-sends a sequence behind the cursor this observer never saw."""

    def __init__(self, hub_id: str, detail: str):
        super().__init__(f"hub {hub_id!r}: {detail}")
        self.hub_id = hub_id


class CursorMismatch(MergeError):
    """next_cursor / log_end_seq inconsistent with the events of the batch."""

    def __init__(self, hub_id: str, detail: str):
        super().__init__(f"hub {hub_id!r}: {detail}")
        self.hub_id = hub_id


class SnapshotInvalid(MergeError, ValueError):
    """A multihub_log_snapshot frame that does not decode strictly."""


# -- canonical form

def _frame(tag: bytes, body: bytes) -> bytes:
    return tag + len(body).to_bytes(8, "big") + body


def _utf8(text: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:  # a lone surrogate has no UTF-8 form
        raise Unfingerprintable("text is not valid UTF-8") from exc


def _float(value: float) -> bytes:
    if not math.isfinite(value):
        raise Unfingerprintable("non-finite number")
    return struct.pack(">d", value)


def canonical_value(value: Any) -> bytes:
    """V(value): the type-tagged encoding of one JSON value (see the module
    docstring). A recursive encoder does the common shallow case (about twice
    as fast); a value nested deeper than the Python stack allows falls back to
    the iterative one, so depth alone can never fail a fingerprint."""
    try:
        return _encode(value)
    except RecursionError:
        return _canonical_iterative(value)


def _encode(v: Any) -> bytes:
    t = type(v)
    if t is str:
        b = _utf8(v)
        return b"s" + len(b).to_bytes(8, "big") + b
    if v is None:
        return b"n"
    if v is True:
        return b"b1"
    if v is False:
        return b"b0"
    if t is int:
        b = str(v).encode("ascii")
        return b"i" + len(b).to_bytes(8, "big") + b
    if t is float:
        return _frame(b"f", _float(v))
    if t is dict or (t is not list and isinstance(v, Mapping)):
        parts = []
        for key in v:
            if not isinstance(key, str):
                raise Unfingerprintable("object keys must be strings")
        # code-point order of valid text is the UTF-8 byte order (lone
        # surrogates are refused by _utf8 below)
        for key in sorted(v):
            kb, vb = _utf8(key), _encode(v[key])
            parts.append(b"k" + len(kb).to_bytes(8, "big") + kb
                         + b"v" + len(vb).to_bytes(8, "big") + vb)
        body = b"".join(parts)
        return b"o" + len(body).to_bytes(8, "big") + body
    if t is list or t is tuple:
        parts = []
        for item in v:
            vb = _encode(item)
            parts.append(b"v" + len(vb).to_bytes(8, "big") + vb)
        body = b"".join(parts)
        return b"l" + len(body).to_bytes(8, "big") + body
    if isinstance(v, int):
        return _frame(b"i", str(int(v)).encode("ascii"))
    if isinstance(v, float):
        return _frame(b"f", _float(v))
    if isinstance(v, str):
        return _frame(b"s", _utf8(v))
    raise Unfingerprintable(f"unsupported payload type {type(v).__name__}")


def _canonical_iterative(value: Any) -> bytes:
    """The same encoding without recursion (for very deep values)."""
    out: list[bytes] = []
    # A work stack of either values to encode or ("close", tag, start) marks:
    # a container's body is everything emitted after `start`, framed on close.
    stack: list[Any] = [("value", value)]
    while stack:
        item = stack.pop()
        if item[0] == "close":
            _, tag, start = item
            body = b"".join(out[start:])
            del out[start:]
            out.append(_frame(tag, body))
            continue
        if item[0] == "raw":
            out.append(item[1])
            continue
        if item[0] == "wrap":  # F("v", V(x)): V(x) first, then framed as "v"
            _, inner = item
            stack.append(("close", b"v", len(out)))
            stack.append(("value", inner))
            continue
        v = item[1]
        if v is None:
            out.append(b"n")
        elif v is True:
            out.append(b"b1")
        elif v is False:
            out.append(b"b0")
        elif isinstance(v, int):
            out.append(_frame(b"i", str(int(v)).encode("ascii")))
        elif isinstance(v, float):
            out.append(_frame(b"f", _float(v)))
        elif isinstance(v, str):
            out.append(_frame(b"s", _utf8(v)))
        elif isinstance(v, (list, tuple)):
            stack.append(("close", b"l", len(out)))
            for child in reversed(v):
                stack.append(("wrap", child))
        elif isinstance(v, Mapping):
            members = []
            for key, child in v.items():
                if not isinstance(key, str):
                    raise Unfingerprintable("object keys must be strings")
                members.append((_utf8(key), child))
            members.sort(key=lambda m: m[0])
            stack.append(("close", b"o", len(out)))
            for key, child in reversed(members):
                stack.append(("wrap", child))
                stack.append(("raw", _frame(b"k", key)))
        else:
            raise Unfingerprintable(f"unsupported payload type {type(v).__name__}")
    return out[0]


def event_fingerprint(hub_id: str, seq: int, ts: float, kind: str, payload: Mapping) -> str:
    """The fingerprint of one complete event (see the module docstring)."""
    if not isinstance(hub_id, str) or not hub_id:
        raise Unfingerprintable("hub_id must be a non-empty string")
    if isinstance(seq, bool) or not isinstance(seq, int) or seq < 0:
        raise Unfingerprintable("seq must be a non-negative integer")
    if isinstance(ts, bool) or not isinstance(ts, (int, float)):
        raise Unfingerprintable("ts must be a number")
    if not isinstance(kind, str):
        raise Unfingerprintable("kind must be a string")
    if not isinstance(payload, Mapping):
        raise Unfingerprintable("payload must be an object")
    digest = hashlib.sha256(FINGERPRINT_DOMAIN)
    digest.update(_frame(b"h", _utf8(hub_id)))
    digest.update(_frame(b"q", str(seq).encode("ascii")))
    digest.update(_frame(b"t", _float(float(ts))))
    digest.update(_frame(b"k", _utf8(kind)))
    digest.update(_frame(b"p", canonical_value(payload)))
    return digest.hexdigest()


@dataclass(frozen=True)
class LogEvent:
    """One journal event tagged with the hub that authored it. `payload` is
    owned by the event: MergedLog deep-copies what it accepts, so a caller
    mutating its own dict later cannot rewrite an accepted identity."""

    hub_id: str
    seq: int
    ts: float
    kind: str
    payload: Mapping = field(default_factory=dict)

    @property
    def identity(self) -> tuple[str, int]:
        return (self.hub_id, self.seq)

    @property
    def order_key(self) -> tuple[float, str, int]:
        return (self.ts, self.hub_id, self.seq)

    @cached_property
    def fingerprint(self) -> str:
        return event_fingerprint(self.hub_id, self.seq, self.ts, self.kind, self.payload)

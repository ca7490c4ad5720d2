"""The journal's hash chain: each event row's link binds its content to the
link of the row before it (pure; no IO). One home for the chain's digests:
the writer (hubd/journal/store.py), the upgrade of an old journal, `hubd
journal verify`, the log-pull server and a peer's follower all call these.

    E(row)   = SHA-256("e" || seq as 8-byte signed big-endian || ts as
                       binary64 big-endian || len(kind) as 4 bytes || kind
                       (UTF-8) || payload (the stored JSON text, UTF-8))
    S(row)   = SHA-256("s" || O(route) || O(principal))   O(None) = 0x00,
               O(text) = 0x01 || len as 4 bytes || UTF-8 text
    link(n)  = SHA-256(DOMAIN || link(n-1) || E(n) || S(n)),  link(0) = 32 zero bytes

Why not the event fingerprint of federation/log_model.py: that encodes the
decoded payload value by value in Python (tens of microseconds for a chat),
on the writer's thread for every row; the stored text is the content the
journal holds, and hashing it is one C call. A follower recomputes E from
the payload it received by re-encoding it with orjson, which gives back
hubd's stored text byte for byte (hubd writes every payload with orjson);
where it would not (an older journal's text), the server sends E itself.

E and S are separate so a log pull can show a peer E for an event it
withholds (federation/logscope.py) and S for what it never shows (route,
principal): the peer still checks every link.
"""

from __future__ import annotations

import hashlib
import struct

DOMAIN = b"hubd:journal-chain:v1\x00"
GENESIS = bytes(32)

_sha256 = hashlib.sha256
_HEAD = struct.Struct(">qdI")


def event_digest(seq: int, ts: float, kind: str, payload: str | bytes) -> bytes:
    kind_bytes = kind.encode()
    if type(payload) is str:
        payload = payload.encode()
    return _sha256(b"e" + _HEAD.pack(seq, ts, len(kind_bytes)) + kind_bytes + payload).digest()


def _optional(text: str | None) -> bytes:
    if text is None:
        return b"\x00"
    data = text.encode()
    return b"\x01" + len(data).to_bytes(4, "big") + data


def sealed_digest(route: str | None, principal: str | None) -> bytes:
    if route is None and principal is None:
        return _NOTHING_SEALED
    key = (route, principal)
    digest = _sealed_seen.get(key)
    if digest is None:
        # most rows repeat a few (route, principal) pairs: one hash fewer per
        # row on the writer's thread; bounded, emptied when full
        if len(_sealed_seen) >= SEALED_CACHE:
            _sealed_seen.clear()
        digest = _sealed_seen[key] = _sha256(
            b"s" + _optional(route) + _optional(principal)).digest()
    return digest


SEALED_CACHE = 256
_sealed_seen: dict[tuple, bytes] = {}
_NOTHING_SEALED = _sha256(b"s\x00\x00").digest()


def link(prev: bytes, event: bytes, sealed: bytes) -> bytes:
    return _sha256(DOMAIN + prev + event + sealed).digest()


def row_link(prev: bytes, row) -> bytes:
    """The link of a stored row (seq, ts, kind, payload, route, principal)."""
    seq, ts, kind, payload, route, principal = row[:6]
    return _sha256(DOMAIN + prev + event_digest(seq, float(ts), kind, payload)
                   + sealed_digest(route, principal)).digest()


def chained(prev: bytes, rows) -> tuple[list[tuple], bytes]:
    """The rows with their link appended, and the new head."""
    out = []
    for row in rows:
        prev = row_link(prev, row)
        out.append((*row, prev))
    return out, prev


class ChainBreak(ValueError):
    """A stored or served row whose link is not the chain's: its content, or a
    row before it, is not what was linked when it was written."""

    def __init__(self, seq: int, detail: str):
        super().__init__(f"seq {seq}: {detail}")
        self.seq = seq
        self.detail = detail


def first_break(prev: bytes, rows) -> tuple[int | None, bytes]:
    """Walk stored rows (..., link) in seq order from the link `prev`: the
    seq of the first row whose stored link is missing or not the one its
    content and the row before it make (None if every link holds), and the
    head computed (the stored head when all hold)."""
    for row in rows:
        stored = row[6]
        expected = row_link(prev, row)
        if stored is None or bytes(stored) != expected:
            return row[0], expected
        prev = expected
    return None, prev

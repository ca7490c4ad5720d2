"""Canonical JSON and its SHA-256, one home: sorted keys, compact separators,
ASCII with escapes, i.e. `json.dumps(value, sort_keys=True, separators=(",", ":"))`
byte for byte; and the same text unescaped in UTF-8, the form signatures and
per-message MACs cover (`signed_json`).

The digests the journal keeps are made of this text (an idempotent verdict's
response_sha256, a delivery request's and report's digests, a refused claim's
scope), and so is the delivery operation key, which the reference client
computes on its own side: it never changes. (What REDSYN signs is another
form, RFC 8785: hubd/wire/redsyn/canonical.py.)
"""

from __future__ import annotations

import hashlib
import json

import orjson


def canonical_sha256(value) -> str:
    return hashlib.sha256(canonical_json(value)).hexdigest()


def canonical_json(value) -> bytes:
    """`json.dumps(value, sort_keys=True, separators=(",", ":"))` (ASCII, escaped),
    the text the digests and operation keys are made of, byte for byte: they
    are journaled and the reference client computes operation keys itself.

    orjson's text is taken when it is plain ASCII without a backslash (no
    escape, whose spelling could differ) or a DEL (json.dumps escapes it,
    orjson does not) and every float in the value prints
    as its repr does; anything else takes json.dumps itself. json.dumps was
    ~9% of the event loop's time at 1,000 round trips/s; this, float check
    included, makes a request's digest about twice as fast."""
    try:
        text = orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except TypeError:  # an unpaired surrogate, an integer past 64 bits
        text = None
    if text is None or not text.isascii() or b"\\" in text or b"\x7f" in text \
            or not _floats_as_repr(value):
        text = json.dumps(value, sort_keys=True, separators=(",", ":")).encode("ascii")
    return text


def signed_json(value) -> bytes:
    """`json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)`
    in UTF-8, byte for byte: what a registration's signature and a frame's
    MAC cover, computed the same way by the reference client.

    orjson's text is taken when it holds no backslash (no escape, whose
    spelling could differ; both leave DEL and every non-ASCII character
    as they are) and every float prints as its repr does; anything else
    takes json.dumps itself (an unpaired surrogate then raises
    UnicodeEncodeError, as it always did). An attachment chunk's ~44 KB
    frame: ~105 us with json.dumps, ~5 us this way."""
    try:
        text = orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except TypeError:  # an unpaired surrogate, an integer past 64 bits
        text = None
    if text is None or b"\\" in text or not _floats_as_repr(value):
        text = json.dumps(value, sort_keys=True, separators=(",", ":"),
                          ensure_ascii=False).encode("utf-8")
    return text


_PLAIN = frozenset({str, int, bool, type(None)})


def _floats_as_repr(value) -> bool:
    t = type(value)
    if t in _PLAIN:
        return True
    if t is float:
        return orjson.dumps(value) == repr(value).encode()
    for item in (value.values() if t is dict else value):
        if type(item) not in _PLAIN and not _floats_as_repr(item):
            return False
    return True

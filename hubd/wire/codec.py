"""Bounded JSON decoding and compact encoding of wire frames.

Sans-IO: these functions take text and return values; they never raise on bad
input. A bad frame yields a `DecodeError` whose `text` is the exact sentence the
hub sends back in its error frame.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import orjson

MAX_DEPTH = 64

MALFORMED_JSON = "Malformed JSON."
NOT_AN_OBJECT = "Malformed frame: expected a JSON object."


@dataclass(frozen=True, slots=True)
class DecodeError:
    text: str


def _depth_exceeds(value, limit: int) -> bool:
    """True when containers nest deeper than limit (iterative: no recursion)."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        if isinstance(node, dict):
            children = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        for child in children:
            if isinstance(child, (dict, list)):
                stack.append((child, depth + 1))
    return False


def decode_frame(data: str | bytes, max_depth: int | None = MAX_DEPTH) -> dict | DecodeError:
    """Parse one inbound frame into a dict, or say why it is refused.

    orjson refuses NaN/Infinity, invalid UTF-8, lone surrogates and nesting
    beyond 1024 levels; the walk below enforces the tighter wire depth.
    Integer literals wider than 64 bits come back as floats, which every
    field that needs an integer then refuses.
    """
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError:
        value = _delivery_with_surrogates(data)
        if value is None:
            return DecodeError(MALFORMED_JSON)
    if not isinstance(value, dict):
        return DecodeError(NOT_AN_OBJECT)
    if max_depth is None:
        return value  # a trusted peer's frame: orjson's own 1024-level bound applies
    if nests_deeper(data, value, max_depth):
        return DecodeError(MALFORMED_JSON)
    return value


# v3 delivery frames whose text holds an escaped unpaired surrogate still
# reach their verb, so the refusal is typed (invalid_shape) and correlated to
# the request; the delivery rules check every string they keep or echo
# (hubd/state/delivery_rules.py). Every other frame stays refused here.
DELIVERY_TYPES = frozenset({"delivery_request", "delivery_status_request", "delivery_cancel",
                            "delivery_boundary", "delivery_ack", "delivery_outcome"})


def _refuse_constant(name: str):
    raise ValueError(name)


def _delivery_with_surrogates(data: str | bytes) -> dict | None:
    try:
        value = json.loads(data, parse_constant=_refuse_constant)
    except (ValueError, RecursionError):
        return None
    if not isinstance(value, dict) or value.get("type") not in DELIVERY_TYPES:
        return None
    for name in ("sender", "target"):  # routing fields must stay encodable
        field = value.get(name)
        if field is not None:
            if not isinstance(field, str):
                return None
            try:
                field.encode("utf-8")
            except UnicodeEncodeError:
                return None
    return value


def nests_deeper(data: str | bytes, value, limit: int) -> bool:
    """True when `value` (parsed from `data`) nests containers deeper than limit.

    Nesting needs an opening bracket per level, so a text with few of them
    (nearly all) cannot be too deep; only the rest are walked."""
    if isinstance(data, str):
        brackets = data.count("{") + data.count("[")
    else:
        brackets = data.count(b"{") + data.count(b"[")
    return brackets > limit and _depth_exceeds(value, limit)


def encode(frame: dict) -> bytes:
    """Compact JSON as UTF-8 bytes, ready for a text frame or a journal row."""
    return orjson.dumps(frame)


def loads_stored(text: str | bytes):
    """Decode JSON the hub wrote itself (journal rows)."""
    return orjson.loads(text)

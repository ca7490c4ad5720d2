"""Bounded JSON decoding and compact encoding of wire frames.

Sans-IO: these functions take text and return values; they never raise on bad
input. A bad frame yields a `DecodeError` whose `text` is the exact sentence the
hub sends back in its error frame.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

MAX_DEPTH = 64
# Longest integer literal accepted. Python parses arbitrarily long integers,
# which costs quadratic time for huge literals; nothing on the wire needs more
# than a signed 64-bit value.
MAX_INT_DIGITS = 20

MALFORMED_JSON = "Malformed JSON."
NOT_AN_OBJECT = "Malformed frame: expected a JSON object."


@dataclass(frozen=True, slots=True)
class DecodeError:
    text: str


class _Refused(ValueError):
    pass


def _refuse_constant(name: str):
    raise _Refused(f"non-finite number {name}")


def _bounded_int(literal: str) -> int:
    if len(literal.lstrip("-")) > MAX_INT_DIGITS:
        raise _Refused("integer literal too long")
    return int(literal)


_decoder = json.JSONDecoder(parse_constant=_refuse_constant, parse_int=_bounded_int)


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


def decode_frame(data: str | bytes, max_depth: int = MAX_DEPTH) -> dict | DecodeError:
    """Parse one inbound frame into a dict, or say why it is refused."""
    if isinstance(data, (bytes, bytearray)):
        try:
            data = bytes(data).decode("utf-8")
        except UnicodeDecodeError:
            return DecodeError(MALFORMED_JSON)
    try:
        value = _decoder.decode(data)
    except (ValueError, RecursionError):
        # ValueError covers JSONDecodeError and our own refusals (NaN,
        # Infinity, over-long integers); RecursionError is nesting deep
        # enough to exhaust the C scanner before our depth check runs.
        return DecodeError(MALFORMED_JSON)
    if not isinstance(value, dict):
        return DecodeError(NOT_AN_OBJECT)
    # Most frames are flat; only walk the tree when something is nested.
    if any(isinstance(child, (dict, list)) for child in value.values()):
        if _depth_exceeds(value, max_depth):
            return DecodeError(MALFORMED_JSON)
    return value


def encode(frame: dict) -> str:
    """Compact JSON; ASCII escapes keep lone surrogates from breaking UTF-8 sends."""
    return json.dumps(frame, separators=(",", ":"), allow_nan=False)


def loads_stored(text: str):
    """Decode JSON the hub wrote itself (journal rows)."""
    return json.loads(text)

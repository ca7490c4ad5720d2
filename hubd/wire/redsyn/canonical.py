"""RFC 8785 (JSON Canonicalization Scheme) encoding.

Written here rather than taken from a package: what REDSYN signs is a small
fixed object of strings, integers and booleans plus the sender's body and
refs, and the whole scheme is the few rules below (UTF-16 key order,
minimal string escaping, ECMAScript number form).
"""

from __future__ import annotations

import math
from decimal import Decimal

MAX_SAFE_INTEGER = 2**53 - 1
MAX_DEPTH = 64


class NotCanonicalizable(ValueError):
    """The value has no RFC 8785 form (NaN, infinity, an integer beyond IEEE
    double precision, a non-JSON type, or nesting beyond MAX_DEPTH)."""


_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r",
            "\t": "\\t"}


def _string(text: str) -> str:
    out = ['"']
    for ch in text:
        escaped = _ESCAPES.get(ch)
        if escaped is not None:
            out.append(escaped)
        elif ch < " ":
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _utf16_key(key: str) -> bytes:
    return key.encode("utf-16-be", "surrogatepass")


def number(value: float | int) -> str:
    """ECMAScript Number::toString of an IEEE double (RFC 8785 section 3.2.2.3)."""
    if isinstance(value, int):
        if abs(value) > MAX_SAFE_INTEGER:
            raise NotCanonicalizable(f"integer {value} is beyond IEEE double precision")
        return str(value)
    if math.isnan(value) or math.isinf(value):
        raise NotCanonicalizable(f"{value!r} has no JSON form")
    if value == 0:
        return "0"  # also -0
    sign = "-" if value < 0 else ""
    # repr() is the shortest decimal that round-trips, as ECMAScript requires.
    digits_tuple, exponent = Decimal(repr(abs(value))).normalize().as_tuple()[1:]
    digits = "".join(map(str, digits_tuple))
    k = len(digits)
    n = exponent + k  # value = 0.digits * 10**n
    if k <= n <= 21:
        text = digits + "0" * (n - k)
    elif 0 < n <= 21:
        text = digits[:n] + "." + digits[n:]
    elif -6 < n <= 0:
        text = "0." + "0" * (-n) + digits
    else:
        e = n - 1
        mantissa = digits if k == 1 else digits[0] + "." + digits[1:]
        text = f"{mantissa}e{'+' if e >= 0 else '-'}{abs(e)}"
    return sign + text


def _encode(value, out: list, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise NotCanonicalizable(f"nested deeper than {MAX_DEPTH}")
    if value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, str):
        out.append(_string(value))
    elif isinstance(value, (int, float)):
        out.append(number(value))
    elif isinstance(value, (list, tuple)):
        out.append("[")
        for i, item in enumerate(value):
            if i:
                out.append(",")
            _encode(item, out, depth + 1)
        out.append("]")
    elif isinstance(value, dict):
        out.append("{")
        for i, key in enumerate(sorted(value, key=_check_key)):
            if i:
                out.append(",")
            out.append(_string(key))
            out.append(":")
            _encode(value[key], out, depth + 1)
        out.append("}")
    else:
        raise NotCanonicalizable(f"{type(value).__name__} is not a JSON value")


def _check_key(key) -> bytes:
    if not isinstance(key, str):
        raise NotCanonicalizable("object keys must be strings")
    return _utf16_key(key)


def canonical_json(value) -> str:
    """The RFC 8785 text of a JSON value."""
    out: list[str] = []
    _encode(value, out, 0)
    return "".join(out)


def canonical_bytes(value) -> bytes:
    return canonical_json(value).encode("utf-8", "surrogatepass")

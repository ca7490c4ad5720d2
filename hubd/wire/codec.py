"""Bounded JSON decoding and compact encoding of wire frames.

Sans-IO: these functions take text and return values; they never raise on bad
input. A bad frame yields a `DecodeError` whose `text` is the exact sentence the
hub sends back in its error frame and whose `code` is that frame's
`error_code` (docs/architecture.md, "The wire's refusals").

What a frame must be, beyond JSON: an object; nested at most 64 levels; every
string (keys included) valid Unicode that UTF-8 can carry (no lone surrogate
from a `\\ud800` escape: the journal could not store it); and no object with
the same key twice (a parser that picks one of two `sender`s or `token`s is
where authority leaks, seed 001). orjson does the parsing and refuses
NaN/Infinity, numbers past a double, invalid UTF-8 and lone surrogates;
the duplicate-key check is below (`_has_duplicate_key`), cheap unless a
frame could hold a duplicate.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import orjson

MAX_DEPTH = 64

MALFORMED_JSON = "Malformed JSON."
NOT_AN_OBJECT = "Malformed frame: expected a JSON object."
NOT_UTF8 = ("Malformed frame: text must be valid UTF-8; a lone surrogate "
            "(an unpaired \\ud800-\\udfff escape) is not.")

# error_code of each refusal (stable: clients may branch on them)
CODE_MALFORMED_JSON = "malformed_json"
CODE_NOT_AN_OBJECT = "not_an_object"
CODE_INVALID_UTF8 = "invalid_utf8"
CODE_DUPLICATE_KEY = "duplicate_key"


@dataclass(frozen=True, slots=True)
class DecodeError:
    text: str
    code: str
    # the object the text held, when it parsed but is refused (a lone
    # surrogate): only for correlating the refusal, never to act on
    frame: dict | None = field(default=None, compare=False)


_MALFORMED = DecodeError(MALFORMED_JSON, CODE_MALFORMED_JSON)
_NOT_AN_OBJECT = DecodeError(NOT_AN_OBJECT, CODE_NOT_AN_OBJECT)


def decode_frame(data: str | bytes, max_depth: int | None = MAX_DEPTH) -> dict | DecodeError:
    """Parse one inbound frame into a dict, or say why it is refused.

    `max_depth` None is for a trusted peer's answers (orjson's own 1024-level
    bound applies). Integer literals wider than 64 bits come back as floats,
    which every field that needs an integer then refuses.
    """
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError:
        return _refusal_of_unparsed(data)
    if type(value) is not dict:
        return _NOT_AN_OBJECT
    if max_depth is not None and nests_deeper(data, value, max_depth):
        return _MALFORMED
    try:
        duplicate = _has_duplicate_key(data, value)
    except RecursionError:  # a trusted peer's answer nested past the exact check's reach
        return _MALFORMED
    if duplicate is not None:
        return DecodeError(f"Malformed frame: the key '{_shown(duplicate)}' appears twice in "
                           "one object.", CODE_DUPLICATE_KEY)
    return value


# -- duplicate keys
#
# orjson keeps the last of two equal keys and cannot say it saw two. The
# exact check (the standard library's parser with a pairs hook) costs several
# times orjson's parse, so it runs only when two cheap counts cannot rule a
# duplicate out. Every key in a JSON text is followed by exactly one
# structural colon, and no other token holds a colon outside a string, so
#     colons in the text = keys in the text + colons inside its strings.
# Re-encoding the parsed value (orjson writes ':' unescaped) gives the same
# sum over what was kept: keys parsed + colons inside the parsed strings.
# A duplicate's second key and its dropped value are in the text but not in
# the parse; an escaped colon (\u003a) is a colon in the parse but not in
# the text. Without escaped colons each term of the first sum is at least its
# counterpart in the second, so the sums are equal exactly when no key was
# dropped: no duplicate. (Cheaper still, when the colons number the top
# level's keys, there is nothing else to count.) Otherwise: the exact check.


class _Duplicate(Exception):
    pass


def _refuse_duplicates(pairs: list) -> dict:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen = set()
        for key, _ in pairs:
            if key in seen:
                raise _Duplicate(key)
            seen.add(key)
    return obj


def _has_duplicate_key(data: str | bytes, value: dict) -> str | None:
    """The first key found twice in one object of `data` (parsed as `value`), or None."""
    colons = data.count(":" if isinstance(data, str) else b":")
    if colons == len(value):
        return None
    if not _may_escape_a_colon(data):
        try:
            reencoded = orjson.dumps(value)
        except TypeError:  # nested past orjson's encoder (255 levels): a peer's answer
            reencoded = None
        if reencoded is not None and colons == reencoded.count(b":"):
            return None
    try:
        json.loads(data, object_pairs_hook=_refuse_duplicates)
    except _Duplicate as duplicate:
        return duplicate.args[0]
    return None


def _may_escape_a_colon(data: str | bytes) -> bool:
    # without a backslash (one memchr) there is no escape at all: a chunk's
    # 44 KB frame is spared two substring searches (~45 us)
    if isinstance(data, str):
        return "\\" in data and ("\\u003a" in data or "\\u003A" in data)
    return b"\\" in data and (b"\\u003a" in data or b"\\u003A" in data)


def _shown(key: str) -> str:
    return key if len(key) <= 64 else key[:64] + "..."


# -- text orjson refused: say whether it is JSON carrying text UTF-8 cannot


def _refuse_number(text: str):
    raise ValueError(text)


def _finite(text: str) -> float:
    number = float(text)
    if number in (float("inf"), float("-inf")):
        raise ValueError(text)
    return number


def _refusal_of_unparsed(data: str | bytes) -> DecodeError:
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError:
            # the reference's sentence for bad bytes, with its own code
            return DecodeError(MALFORMED_JSON, CODE_INVALID_UTF8)
    try:
        # the standard library lets lone surrogates through (orjson does not)
        value = json.loads(data, parse_constant=_refuse_number, parse_float=_finite)
    except (ValueError, RecursionError):
        return _MALFORMED
    if _holds_lone_surrogate(value):
        return DecodeError(NOT_UTF8, CODE_INVALID_UTF8, value if type(value) is dict else None)
    return _MALFORMED


def _holds_lone_surrogate(value) -> bool:
    stack = [value]
    while stack:
        node = stack.pop()
        if type(node) is str:
            if not node.isascii():
                try:
                    node.encode("utf-8")
                except UnicodeEncodeError:
                    return True
        elif type(node) is dict:
            stack.extend(node.keys())
            stack.extend(node.values())
        elif type(node) is list:
            stack.extend(node)
    return False


# -- depth


# a text this long is first walked (up to WALK_BUDGET children) rather than
# scanned twice for brackets: a chunk's 44 KB frame holds a dozen values,
# and two counts over its text cost ~35 us
WALK_FIRST_BYTES = 8192
WALK_BUDGET = 512


def _depth_exceeds(value, limit: int, budget: int | None = None) -> bool | None:
    """True when containers nest deeper than limit (iterative: no recursion);
    None when more than `budget` children would have to be looked at."""
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
        if budget is not None:
            budget -= len(children)
            if budget < 0:
                return None
        for child in children:
            if isinstance(child, (dict, list)):
                stack.append((child, depth + 1))
    return False


def nests_deeper(data: str | bytes, value, limit: int) -> bool:
    """True when `value` (parsed from `data`) nests containers deeper than limit.

    Nesting needs an opening bracket per level, so a text with few of them
    (nearly all) cannot be too deep; only the rest are walked. A long text
    with few values (an attachment chunk) is walked at once."""
    if len(data) >= WALK_FIRST_BYTES:
        walked = _depth_exceeds(value, limit, WALK_BUDGET)
        if walked is not None:
            return walked
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

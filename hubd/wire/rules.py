"""The vocabulary of field rules: what a frame's field may hold.

A rule says, in words, what the field must be (the refusal sentence is
"Malformed frame: '<field>' must be <says>.") and accepts or refuses a value.
JSON null is the field's absence for every rule: each handler reads a null
field as a missing one. A rule that accepts everything names who reads the
field instead (`by`): the verb checks it itself and answers with its own typed
refusal (the seed's or the reference's, which clients branch on).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

INT64_MIN, INT64_MAX = -(2 ** 63), 2 ** 63 - 1


@dataclass(frozen=True, slots=True)
class Rule:
    says: str  # what the field must be, for the refusal sentence
    accepts: Callable[[object], bool] | None  # None: passed on as sent (see `by`)
    by: str = ""  # why a field is passed on as sent: who reads it, or what the reference does
    # every value of exactly this type passes and no other does: the check
    # of a frame's fields compares types instead of calling `accepts` (the
    # hot path checks every field of every frame)
    exact: type | None = None


def _utf8_len(value: str) -> int:
    # (the decoder refuses lone surrogates; surrogatepass keeps this total anyway)
    return len(value) if value.isascii() else len(value.encode("utf-8", "surrogatepass"))


def text(max_bytes: int | None = None) -> Rule:
    if max_bytes is None:
        return Rule("a string", lambda v: type(v) is str, exact=str)

    def accepts(v) -> bool:  # _utf8_len inlined: a chat's content passes here
        return type(v) is str and (len(v) if v.isascii() else _utf8_len(v)) <= max_bytes
    return Rule(f"a string of at most {max_bytes} bytes", accepts)


def _is_int(value) -> bool:
    return type(value) is int and INT64_MIN <= value <= INT64_MAX


def integer() -> Rule:
    """An integer (JSON true is not 1 on this wire), within SQLite's 64 bits."""
    return Rule("an integer", _is_int)


def _is_number(value) -> bool:
    return type(value) is float or _is_int(value)


def number() -> Rule:
    return Rule("a number", _is_number)


def boolean() -> Rule:
    return Rule("a boolean", lambda v: type(v) is bool, exact=bool)


def obj() -> Rule:
    return Rule("an object", lambda v: type(v) is dict, exact=dict)


def _is_scalar_text(value) -> bool:
    return type(value) is str or _is_number(value)


def scalar_text() -> Rule:
    """Free text and ids the verbs read as text: a number is taken as its
    decimal text, as the reference does; a list or an object is no text."""
    return Rule("a string or a number", _is_scalar_text)


def list_of_text(max_items: int, max_bytes: int | None = None) -> Rule:
    if max_bytes is None:
        def accepts(v) -> bool:
            return type(v) is list and len(v) <= max_items and all(map(_is_scalar_text, v))
        return Rule(f"a list of at most {max_items} strings or numbers", accepts)

    def accepts_bounded(v) -> bool:
        return type(v) is list and len(v) <= max_items and all(
            type(item) is str and _utf8_len(item) <= max_bytes for item in v)
    return Rule(f"a list of at most {max_items} strings of at most {max_bytes} bytes",
                accepts_bounded)


def text_or_list_of_text(max_items: int) -> Rule:
    """Evidence lists: one string is one item."""
    listed = list_of_text(max_items)
    return Rule(f"a string or {listed.says}",
                lambda v: _is_scalar_text(v) or listed.accepts(v))


def list_or_obj() -> Rule:
    return Rule("a list or an object", lambda v: type(v) is list or type(v) is dict)


def idem_key() -> Rule:
    """idem_key: a string, or an integer taken as its decimal text."""
    return Rule("a string or an integer", lambda v: type(v) is str or _is_int(v))


def passed_on(by: str) -> Rule:
    """A field the door passes on as sent (any JSON value): `by` says why."""
    return Rule("any JSON value", None, by)

"""A REDSYN request body as JSON text: strict UTF-8, standard JSON, no lone
surrogates. Pure: bytes in, a value or a typed 400 out.

The standard library's parser is lenient where the journal is not. Given
bytes it decodes them with `surrogatepass`, so the bytes ED A0 80 (an encoded
UTF-16 surrogate, not UTF-8) become the lone surrogate U+D800; and the escape
`"\\ud800"` makes one from plain ASCII. Such a string cannot be encoded as
UTF-8: stored, it failed the journal's commit and, with it, every other write
in the batch. It also reads `NaN` and `Infinity`, which JSON does not have.
So a body is decoded strictly here, at the door, before anything else looks
at it.
"""

from __future__ import annotations

import json
import re

from .envelope import RedsynError

# A \u escape in the surrogate range (D800-DFFF): the only way a JSON text
# that is valid UTF-8 can produce a lone surrogate. A valid pair matches too;
# the parser joins it into one character, which the walk below then accepts.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
MAX_PATH_SHOWN = 120


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def decode_body(data: bytes):
    """The JSON value of a request body (an empty body is {}), or
    RedsynError(400) naming what is wrong with it."""
    if not data:
        return {}
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RedsynError(400, f"the request body is not valid UTF-8 (byte {exc.start}: "
                               f"{exc.reason})") from None
    try:
        value = json.loads(text, parse_constant=_no_constant)
    except (ValueError, RecursionError):
        raise RedsynError(400, "the request body is not JSON") from None
    if _SURROGATE_ESCAPE.search(text):
        bad = lone_surrogate(value)
        if bad is not None:
            raise RedsynError(400, f"the request body has text that is not valid UTF-8: "
                                   f"a lone UTF-16 surrogate in {bad[:MAX_PATH_SHOWN]}")
    return value


def lone_surrogate(value) -> str | None:
    """Where in a decoded JSON value a string (or key) holds a lone
    surrogate, as a path (`body.text`, `refs[0].note`), or None."""
    stack = [(value, "the body")]
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            if not _encodable(item):
                return path
        elif isinstance(item, dict):
            for key, child in item.items():
                if not _encodable(key):
                    return f"a key of {path}"
                stack.append((child, key if path == "the body" else f"{path}.{key}"))
        elif isinstance(item, list):
            stack.extend((child, f"{path}[{i}]") for i, child in enumerate(item))
    return None


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True

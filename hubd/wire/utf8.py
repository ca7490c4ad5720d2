"""Why a JSON text is not valid UTF-8, for a door to say so (sans-IO).

orjson refuses text that is not valid UTF-8, in both of its forms: raw bytes
that do not decode (including the encoded surrogates ED A0 80 that Python's
own JSON parser lets through), and `\\ud800`-style escapes that decode to a
lone surrogate. It refuses them as malformed JSON, though, without saying
which. A door that has seen orjson refuse a line asks `utf8_problem` what was
wrong; when the only fault was the text's encoding the answer names the first
offending spot and gives the line with each fault replaced by U+FFFD, so the
door can still read the line's id to answer the request it belongs to.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# one JSON escape: a backslash and the character after it, or \uXXXX whole
# (matching escapes left to right keeps an escaped backslash from starting one)
_ESCAPE = re.compile(r"\\(u[0-9a-fA-F]{4}|.)", re.DOTALL)
_REPLACEMENT = "\\ufffd"


@dataclass(frozen=True, slots=True)
class Utf8Problem:
    what: str  # the first fault, as a phrase: "byte 0xFF at byte 12 is not valid UTF-8"
    repaired: str  # the text with every fault replaced by U+FFFD


def utf8_problem(data: bytes | str) -> Utf8Problem | None:
    """The first encoding fault of a JSON text and the text repaired, or None
    when it has none (any fault it has then is of JSON itself)."""
    if isinstance(data, bytes):
        try:
            text = data.decode("utf-8")
            first = None
        except UnicodeDecodeError as exc:
            text = data.decode("utf-8", "replace")
            first = f"byte 0x{data[exc.start]:02X} at byte {exc.start} is not valid UTF-8"
    else:
        text, first = data, None
    lone = _lone_surrogate_escapes(text)
    if lone:
        if first is None:
            start, end = lone[0]
            first = (f"the escape {text[start:end]} at character {start} is a lone "
                     "surrogate, which is not text")
        text = _replace(text, lone)
    if first is None:
        return None
    return Utf8Problem(first, text)


def _lone_surrogate_escapes(text: str) -> list[tuple[int, int]]:
    """(start, end) of every \\uD800-\\uDFFF escape that is not one half of a
    high-low pair."""
    if "\\u" not in text:
        return []
    lone: list[tuple[int, int]] = []
    pending_high: tuple[int, int] | None = None
    for match in _ESCAPE.finditer(text):
        unit = _surrogate(match.group(1))
        if unit == "low" and pending_high is not None and pending_high[1] == match.start():
            pending_high = None  # a pair: one character outside the BMP
            continue
        if pending_high is not None:
            lone.append(pending_high)
            pending_high = None
        if unit == "high":
            pending_high = match.span()
        elif unit == "low":
            lone.append(match.span())
    if pending_high is not None:
        lone.append(pending_high)
    return lone


def _surrogate(escape: str) -> str | None:
    if len(escape) != 5:
        return None
    code = int(escape[1:], 16)
    if 0xD800 <= code <= 0xDBFF:
        return "high"
    if 0xDC00 <= code <= 0xDFFF:
        return "low"
    return None


def _replace(text: str, spans: list[tuple[int, int]]) -> str:
    parts, last = [], 0
    for start, end in spans:
        parts.append(text[last:start])
        parts.append(_REPLACEMENT)
        last = end
    parts.append(text[last:])
    return "".join(parts)

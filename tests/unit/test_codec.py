"""The decoder never raises, refuses what the wire forbids (a lone surrogate,
a duplicate key at any depth, nesting past 64), and round-trips the rest."""

import json

import pytest

from hypothesis import example, given, settings
from hypothesis import strategies as st

from hubd.wire import codec
from hubd.wire.codec import MALFORMED_JSON, NOT_AN_OBJECT, DecodeError, decode_frame
from hubd.wire.envelope import finite_number, strict_int
from hubd.wire.wsframe import text_frame

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**63 - 1) |
    st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(), children, max_size=4),
    max_leaves=20)


@settings(max_examples=500)
@given(st.binary(max_size=300))
@example(b"\xff\xfe\x00")
@example(b"{\"a\": NaN}")
@example(b"[" * 5000)
def test_arbitrary_bytes_never_raise(data):
    result = decode_frame(data)
    assert isinstance(result, (dict, DecodeError))


@settings(max_examples=300)
@given(st.text(max_size=300))
def test_arbitrary_text_never_raises(text):
    assert isinstance(decode_frame(text), (dict, DecodeError))


@given(st.dictionaries(st.text(), json_values, max_size=6))
def test_objects_round_trip(obj):
    assert decode_frame(codec.encode(obj)) == obj


def test_refusals_carry_the_wire_sentences_and_codes():
    malformed = DecodeError(MALFORMED_JSON, codec.CODE_MALFORMED_JSON)
    not_object = DecodeError(NOT_AN_OBJECT, codec.CODE_NOT_AN_OBJECT)
    assert decode_frame("{not json") == malformed
    assert decode_frame("[1,2,3]") == not_object
    assert decode_frame('"text"') == not_object
    assert decode_frame('{"a": NaN}') == malformed
    assert decode_frame('{"a": Infinity}') == malformed
    assert decode_frame('{"a": -Infinity}') == malformed
    assert decode_frame('{"a": 1e400}') == malformed
    # bad bytes keep the reference's sentence, with their own code
    assert decode_frame(b"\xff\xfe") == DecodeError(MALFORMED_JSON, codec.CODE_INVALID_UTF8)


def test_depth_bound():
    nested_64 = {"a": json.loads("[" * 63 + "]" * 63)}
    assert isinstance(decode_frame(json.dumps(nested_64)), dict)
    too_deep = '{"a":' + "[" * 64 + "]" * 64 + "}"
    assert decode_frame(too_deep) == DecodeError(MALFORMED_JSON, codec.CODE_MALFORMED_JSON)
    very_deep = '{"a":' + "[" * 100000 + "]" * 100000 + "}"
    assert decode_frame(very_deep) == DecodeError(MALFORMED_JSON, codec.CODE_MALFORMED_JSON)


@pytest.mark.parametrize("wide", [0, codec.WALK_BUDGET + 1])
def test_depth_bound_in_a_long_text_walked_or_counted(wide):
    # long enough to be walked first; `wide` values past the walk's budget
    # send it back to counting brackets
    pad = "x" * codec.WALK_FIRST_BYTES
    for depth, refused in ((63, False), (64, True)):
        text = json.dumps({"body": pad, "wide": [[0]] * wide,
                           "z": json.loads("[" * depth + "]" * depth)})
        got = decode_frame(text)
        if refused:
            assert got == DecodeError(MALFORMED_JSON, codec.CODE_MALFORMED_JSON)
        else:
            assert isinstance(got, dict) and got["body"] == pad


def test_huge_integers_are_never_integers():
    frame = decode_frame('{"seq": 123456789012345678901234567890}')
    assert isinstance(frame, dict) and strict_int(frame["seq"]) is None


def test_numbers():
    assert strict_int(True) is None and strict_int(3) == 3 and strict_int(3.0) is None
    assert finite_number(True) is None and finite_number(1.5) == 1.5
    assert finite_number(float("inf")) is None and finite_number("12") is None


@given(st.binary(max_size=70000))
def test_text_frame_header_encodes_length(payload):
    framed = text_frame(payload)
    assert framed[0] == 0x81
    n = framed[1]
    if n < 126:
        assert n == len(payload) and framed[2:] == payload
    elif n == 126:
        assert int.from_bytes(framed[2:4], "big") == len(payload) and framed[4:] == payload
    else:
        assert int.from_bytes(framed[2:10], "big") == len(payload) and framed[10:] == payload


# -- text UTF-8 cannot carry (issue 30 item 1)

@given(st.sampled_from(["\\ud800", "\\udbff", "\\udc00", "\\udfff", "\\ud83dx"]))
def test_a_lone_surrogate_escape_is_refused_anywhere(escape):
    for text in (f'{{"a": "{escape}"}}', f'{{"{escape}": 1}}', f'{{"a": [{{"b": "{escape}"}}]}}'):
        refused = decode_frame(text)
        assert isinstance(refused, DecodeError), text
        assert (refused.text, refused.code) == (codec.NOT_UTF8, codec.CODE_INVALID_UTF8)
    # a paired escape is a character like any other
    assert decode_frame('{"a": "\\ud83d\\ude00"}') == {"a": "\U0001F600"}


def test_a_refused_surrogate_frame_is_kept_for_correlation_only():
    refused = decode_frame('{"type": "delivery_request", "request_id": "r1", "body": "\\ud800"}')
    assert refused.code == codec.CODE_INVALID_UTF8
    assert refused.frame == {"type": "delivery_request", "request_id": "r1", "body": "\ud800"}
    assert decode_frame('["\\ud800"]').frame is None  # not an object: nothing to correlate


def test_surrogates_spelled_as_bytes_are_not_utf8():
    # ED A0 80 is U+D800 written as if it were a character (CESU-8): not UTF-8
    assert decode_frame(b'{"a": "\xed\xa0\x80"}') == DecodeError(MALFORMED_JSON,
                                                                  codec.CODE_INVALID_UTF8)
    assert decode_frame('{"a": "caf\u00e9 \U0001F600"}'.encode()) == {"a": "caf\u00e9 \U0001F600"}


# -- duplicate keys (issue 22 item 8)

def _duplicate(text: str) -> str | None:
    refused = decode_frame(text)
    if isinstance(refused, dict):
        return None
    assert refused.code == codec.CODE_DUPLICATE_KEY, refused
    return refused.text


@pytest.mark.parametrize("text", [
    '{"sender": "p/a", "sender": "p/b"}',
    '{"token": "t1", "type": "heartbeat", "token": "t2"}',
    '{"a": {"b": 1, "b": 1}}',  # equal values too: no honest client sends one
    '{"a": [1, {"x": {"y": 2, "y": 3}}]}',
    '{"a:b": "c:d", "a:b": "e"}',
    '{"a": "1", "\\u0061": "2"}',  # the same key, spelled with an escape
    '{"a": "x:y", "a": "z", "b": "\\u003a"}',  # colons that would balance the count
    '{"k": 1, "k": "with: a colon", "m": {"n": "o:p"}}',
    '{"a" : 1 , "a" : 2}',
])
def test_a_duplicate_key_is_refused_at_any_depth(text):
    assert "appears twice in one object" in _duplicate(text)


@pytest.mark.parametrize("text", [
    '{"a": 1, "b": {"a": 2}}',  # the same key in two objects is no duplicate
    '{"a": "x:y:z", "b": ["c:d", {"e": "f:g"}], "h:i": 1}',
    '{"a": "\\u003a", "b": "caf\\u00e9"}',
    '{"url": "https://example.org:8443/x"}',
])
def test_equal_keys_in_different_objects_and_colons_in_strings_pass(text):
    assert isinstance(decode_frame(text), dict)
    assert isinstance(decode_frame(text.encode()), dict)


def test_the_refusal_names_the_key_and_bounds_it():
    assert _duplicate('{"sender": 1, "sender": 2}') == \
        "Malformed frame: the key 'sender' appears twice in one object."
    long_key = "k" * 500
    assert len(_duplicate(f'{{"{long_key}": 1, "{long_key}": 2}}')) < 200


class _Dup(Exception):
    pass


def _oracle_has_duplicate(text: str) -> bool:
    def hook(pairs):
        if len({k for k, _ in pairs}) != len(pairs):
            raise _Dup
        return dict(pairs)
    try:
        json.loads(text, object_pairs_hook=hook)
    except _Dup:
        return True
    return False


_keys = st.sampled_from(["a", "b", "a:b", ":", "\u00e9", "\u00e9:", "k\\", '"q"', "x" * 3])
_scalars = (st.none() | st.booleans() | st.integers(-2**63, 2**63 - 1)
            | st.floats(allow_nan=False, allow_infinity=False)
            | st.text(alphabet=st.sampled_from("ab:\u00e9\\\"{}[], "), max_size=6))


def _serialise(draw, depth: int, ascii_only: bool) -> str:
    """JSON text for a random value whose objects may repeat a key."""
    if depth >= 3 or draw(st.booleans()):
        return json.dumps(draw(_scalars), ensure_ascii=ascii_only)
    if draw(st.booleans()):
        items = draw(st.integers(0, 3))
        return "[" + ",".join(_serialise(draw, depth + 1, ascii_only) for _ in range(items)) + "]"
    keys = draw(st.lists(_keys, max_size=4))
    return "{" + ",".join(f"{json.dumps(k, ensure_ascii=ascii_only)}:"
                          f"{_serialise(draw, depth + 1, ascii_only)}" for k in keys) + "}"


@st.composite
def _object_texts(draw):
    ascii_only = draw(st.booleans())  # True writes every non-ASCII key as \u escapes
    keys = draw(st.lists(_keys, min_size=1, max_size=5))
    return "{" + ",".join(f"{json.dumps(k, ensure_ascii=ascii_only)}:"
                          f"{_serialise(draw, 1, ascii_only)}" for k in keys) + "}"


@settings(max_examples=1500)
@given(_object_texts())
@example('{"a":"x:y","a":"z","b":"\\u003a"}')
@example('{"\\u00e9":1,"\u00e9":2}')
def test_duplicates_are_found_exactly_as_a_pairs_parser_finds_them(text):
    """The cheap counts never let a duplicate through nor refuse a clean frame."""
    for data in (text, text.encode()):
        result = decode_frame(data)
        if _oracle_has_duplicate(text):
            assert isinstance(result, DecodeError) and result.code == codec.CODE_DUPLICATE_KEY
        else:
            assert result == json.loads(text)


def test_a_trusted_peers_deep_answer_is_checked_without_raising():
    """max_depth=None (a pinned peer's answers): orjson nests to 1024, deeper
    than the exact duplicate check can follow; refused, never raised."""
    deep = '{"a":"x:y","a":' + '{"b":' * 1000 + "1" + "}" * 1000 + "}"
    assert decode_frame(deep, max_depth=None) == DecodeError(MALFORMED_JSON,
                                                             codec.CODE_MALFORMED_JSON)
    shallow = '{"a":"x:y","b":' + '{"c":' * 100 + "1" + "}" * 100 + "}"
    assert isinstance(decode_frame(shallow, max_depth=None), dict)


# half the strings hold a lone surrogate (hypothesis draws none unless asked)
_any_text = st.text(max_size=4) | st.builds(
    lambda head, lone, tail: head + lone + tail, st.text(max_size=2),
    st.characters(categories=["Cs"]), st.text(max_size=2))
_values_with_surrogates = st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False) | _any_text,
    lambda children: st.lists(children, max_size=3)
    | st.dictionaries(_any_text, children, max_size=3), max_leaves=12)


def _has_surrogate(value) -> bool:
    if isinstance(value, str):
        return any(0xD800 <= ord(c) <= 0xDFFF for c in value)
    if isinstance(value, dict):
        return any(_has_surrogate(k) or _has_surrogate(v) for k, v in value.items())
    if isinstance(value, list):
        return any(map(_has_surrogate, value))
    return False


@settings(max_examples=600)
@given(st.dictionaries(_any_text, _values_with_surrogates, max_size=4), st.booleans())
def test_any_json_object_is_decoded_or_refused_for_its_surrogates_alone(obj, ascii_only):
    """json.dumps writes a lone surrogate as an escape (ensure_ascii, as the
    reference client does) or raw; either way it is refused, typed, and
    nothing else is."""
    try:
        text = json.dumps(obj, ensure_ascii=ascii_only)
        data = text if ascii_only else text.encode("utf-8")
    except UnicodeEncodeError:  # raw surrogates cannot even be written as UTF-8
        data = json.dumps(obj, ensure_ascii=False).encode("utf-8", "surrogatepass")
    result = decode_frame(data)
    if _has_surrogate(obj):
        assert isinstance(result, DecodeError) and result.code == codec.CODE_INVALID_UTF8
    else:
        assert result == obj

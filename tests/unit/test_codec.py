"""The decoder never raises, refuses what the wire forbids, and round-trips."""

import json

from hypothesis import example, given, settings
from hypothesis import strategies as st

from hubd.wire import codec
from hubd.wire.codec import MALFORMED_JSON, NOT_AN_OBJECT, DecodeError, decode_frame
from hubd.wire.envelope import check_routing_fields, finite_number, strict_int
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


def test_refusals_carry_the_wire_sentences():
    assert decode_frame("{not json") == DecodeError(MALFORMED_JSON)
    assert decode_frame("[1,2,3]") == DecodeError(NOT_AN_OBJECT)
    assert decode_frame('"text"') == DecodeError(NOT_AN_OBJECT)
    assert decode_frame('{"a": NaN}') == DecodeError(MALFORMED_JSON)
    assert decode_frame('{"a": Infinity}') == DecodeError(MALFORMED_JSON)
    assert decode_frame('{"a": -Infinity}') == DecodeError(MALFORMED_JSON)
    assert decode_frame(b"\xff\xfe") == DecodeError(MALFORMED_JSON)
    assert decode_frame('{"a": "\\ud800"}') == DecodeError(MALFORMED_JSON)


def test_depth_bound():
    nested_64 = {"a": json.loads("[" * 63 + "]" * 63)}
    assert isinstance(decode_frame(json.dumps(nested_64)), dict)
    too_deep = '{"a":' + "[" * 64 + "]" * 64 + "}"
    assert decode_frame(too_deep) == DecodeError(MALFORMED_JSON)
    very_deep = '{"a":' + "[" * 100000 + "]" * 100000 + "}"
    assert decode_frame(very_deep) == DecodeError(MALFORMED_JSON)


def test_huge_integers_are_never_integers():
    frame = decode_frame('{"seq": 123456789012345678901234567890}')
    assert isinstance(frame, dict) and strict_int(frame["seq"]) is None


def test_routing_fields_must_be_strings():
    assert check_routing_fields({"target": ["x"]}).text == \
        "Malformed frame: 'target' must be a string."
    assert check_routing_fields({"type": 3}).text == "Malformed frame: 'type' must be a string."
    assert check_routing_fields({"sender": "a", "payload": 7}) is None


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

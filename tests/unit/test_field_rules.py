"""Every verb's field rules (hubd/wire/fields.py), held against arbitrary JSON
values: a rule never raises, accepts exactly what it says, and a frame it
refuses gets a typed answer that can always be sent (issue 22 item 2)."""

import math
from pathlib import Path

import orjson
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from hubd.composition import plugins_for
from hubd.config import BrokerConfig, HubConfig
from hubd.core.plugin import Installed
from hubd.wire import codec, fields
from hubd.wire.fields import ENVELOPE, VERB_FIELDS, check_fields, refusal, rules_of

# what each rule's words promise, written out independently of rules.py
_SCALAR = (str, int, float)


def _int64(v) -> bool:
    return type(v) is int and -2**63 <= v < 2**63


def _number(v) -> bool:
    return type(v) is float or _int64(v)


def _scalar_text(v) -> bool:
    return type(v) is str or _number(v)


def _utf8(v) -> int:
    return len(v.encode("utf-8"))


PROMISES = {
    "a string": lambda v: type(v) is str,
    "a string of at most 256 bytes": lambda v: type(v) is str and _utf8(v) <= 256,
    "a string of at most 1024 bytes": lambda v: type(v) is str and _utf8(v) <= 1024,
    "a string of at most 8192 bytes": lambda v: type(v) is str and _utf8(v) <= 8192,
    "an integer": _int64,
    "a number": _number,
    "a boolean": lambda v: type(v) is bool,
    "an object": lambda v: type(v) is dict,
    "a list or an object": lambda v: type(v) in (list, dict),
    "a string or a number": _scalar_text,
    "a string or an integer": lambda v: type(v) is str or _int64(v),
    "a list of at most 1024 strings or numbers":
        lambda v: type(v) is list and len(v) <= 1024 and all(map(_scalar_text, v)),
    "a list of at most 64 strings of at most 256 bytes":
        lambda v: type(v) is list and len(v) <= 64 and all(
            type(i) is str and _utf8(i) <= 256 for i in v),
    "a string or a list of at most 1024 strings or numbers":
        lambda v: _scalar_text(v) or (type(v) is list and len(v) <= 1024
                                      and all(map(_scalar_text, v))),
}


def _all_rules():
    for verb, table in VERB_FIELDS.items():
        for name, rule in {**ENVELOPE, **table}.items():
            yield verb, name, rule


def test_every_verb_the_hub_answers_has_a_table(tmp_path):
    """The core's, the delivery verbs, federation's hub-to-hub verbs: every
    handler a composed hub installs, and no table for a verb nobody serves."""
    config = HubConfig(db=Path(tmp_path / "hubd.db"), broker=BrokerConfig(
        socket_path=tmp_path / "bus.sock", token_file=tmp_path / "bus.token"))
    served = set(Installed(plugins_for(config)).handlers)
    assert served == set(VERB_FIELDS)


def test_every_rule_promises_something_this_test_can_check():
    for verb, name, rule in _all_rules():
        if rule.accepts is None:
            assert rule.by, f"{verb}.{name} is passed on without saying why"
        else:
            assert rule.says in PROMISES, f"{verb}.{name}: {rule.says!r}"


json_scalars = (st.none() | st.booleans() | st.integers(-2**70, 2**70)
                | st.floats(allow_nan=False, allow_infinity=False)
                | st.text(max_size=300) | st.text(alphabet="ab", min_size=250, max_size=300))
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=70) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=4),
    max_leaves=80)
small_values = st.recursive(
    json_scalars, lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(st.text(max_size=4), inner, max_size=3), max_leaves=6)


@settings(max_examples=500, deadline=None)
@given(verb=st.sampled_from(sorted(VERB_FIELDS)), data=st.data())
def test_a_field_is_refused_exactly_when_its_value_breaks_the_promise(verb, data):
    table = rules_of(verb)
    name = data.draw(st.sampled_from(sorted(table)))
    value = data.draw(json_values)
    frame = {"type": verb, name: value} if name != "type" else {"type": value}
    error = check_fields(frame)
    rule = table[name]
    if value is None or rule.accepts is None:
        assert error is None  # null is absence; a passed-on field goes to its verb
    elif PROMISES[rule.says](value):
        assert error is None, (verb, name, value)
    else:
        assert error == fields.FieldError(name, f"Malformed frame: '{name}' must be "
                                                f"{rule.says}.")


@settings(max_examples=400, deadline=None)
@given(verb=st.sampled_from(sorted(VERB_FIELDS) + ["frobnicate", ""]),
       extra=st.dictionaries(st.sampled_from(sorted({n for _, n, _ in _all_rules()}))
                             | st.text(max_size=6), small_values, max_size=8))
@example(verb="chat", extra={"target": "p/b", "receipt_requested": True,
                             "client_msg_id": ["x"]})
def test_whole_frames_are_refused_by_their_first_broken_field_or_pass(verb, extra):
    frame = {"type": verb, **{k: v for k, v in extra.items() if k != "type"}}
    error = check_fields(frame)
    table = rules_of(verb)
    broken = [name for name, value in frame.items()
              if value is not None and name in table and table[name].accepts is not None
              and not PROMISES[table[name].says](value)]
    if error is None:
        assert broken == []
    else:
        assert error.field == broken[0] and error.code == fields.CODE_INVALID_FIELD


@pytest.mark.parametrize("frame, field", [
    # issue 22 item 2's crash: a list client_msg_id on a receipt-requested chat
    ({"type": "chat", "target": "p/b", "receipt_requested": True, "client_msg_id": ["x"]},
     "client_msg_id"),
    ({"target": "p/b", "client_msg_id": {"a": 1}}, "client_msg_id"),  # no type: a chat
    ({"type": {"k": 1}}, "type"),  # unhashable: no table lookup with it
    ({"type": ["chat"]}, "type"),
    ({"type": "multihub_message_forward", "kind": ["chat"]}, "kind"),
    ({"type": "heartbeat", "roles": [["r"]]}, "roles"),
    ({"type": "heartbeat", "mailbox": "yes"}, "mailbox"),
    ({"type": "claim", "task_id": ["t"]}, "task_id"),
    ({"type": "release", "epoch": True}, "epoch"),
    ({"type": "release", "epoch": 2**63}, "epoch"),
    ({"type": "claim", "ttl_seconds": "60"}, "ttl_seconds"),
    ({"type": "chat", "client_msg_id": "c" * 257}, "client_msg_id"),
])
def test_what_no_handler_can_use_is_refused(frame, field):
    assert check_fields(frame).field == field


@pytest.mark.parametrize("frame", [
    {"type": "chat", "payload": {"any": ["thing"]}, "metadata": [1], "timestamp": "noon"},
    {"type": "ack", "seq": "abc"},  # the reference ignores it, silently: so does hubd
    {"type": "state_request", "request_id": ["x"]},  # seed: an invalid id stays absent
    {"type": "heartbeat", "protocol_version": "7", "since_seq": "5"},  # reference: absent, 0
    {"type": "claim", "task_id": 17, "note": 3.5, "paths": "not a list"},  # claim_denied
    {"type": "delivery_request", "body": ["x"], "request_id": 5},  # delivery_refused
    {"type": "frobnicate", "anything": []},  # the Router answers the unknown type
    {"type": "chat", "client_msg_id": "c" * 256, "receipt_requested": None},
])
def test_what_the_reference_or_a_verb_reads_leniently_passes(frame):
    assert check_fields(frame) is None


def test_sentences_match_the_ones_clients_already_see():
    """The routing rule's sentence (the reference's) and the verbs' own
    sentences for fields the door now checks first are unchanged."""
    assert check_fields({"target": ["x"]}).text == "Malformed frame: 'target' must be a string."
    assert check_fields({"type": 3}).text == "Malformed frame: 'type' must be a string."
    assert check_fields({"type": "advertise", "persist": "yes"}).text == \
        "Malformed frame: 'persist' must be a boolean."
    assert check_fields({"type": "ledger_task", "expected_version": True}).text == \
        "Malformed frame: 'expected_version' must be an integer."


# -- the refusal frame

@settings(max_examples=300, deadline=None)
@given(frame=st.none() | st.dictionaries(
    st.sampled_from(["type", "sender", "request_id", "body"]) | st.text(max_size=4),
    small_values | st.sampled_from(["delivery_request", "delivery_ack", "\ud800", "p/\udfff"]),
    max_size=5))
def test_a_refusal_can_always_be_sent(frame):
    """Even for a frame holding lone surrogates (kept from a refused decode)."""
    answer = refusal("hub-1", frame, "Malformed frame: x.", "invalid_field", 1.0, "x")
    assert isinstance(orjson.loads(codec.encode(answer)), dict)
    assert answer["error_code"] == "invalid_field" and answer["field"] == "x"


def test_an_error_is_addressed_all_like_the_reference_decode_errors():
    answer = refusal("h", {"type": "chat", "sender": "p/a"}, "Malformed frame: y.",
                     "invalid_field", 2.0, "client_msg_id")
    assert {k: answer[k] for k in ("type", "target", "payload", "error_code", "field",
                                   "sender", "hub_id")} == {
        "type": "error", "target": "all", "payload": "Malformed frame: y.",
        "error_code": "invalid_field", "field": "client_msg_id", "sender": "SynapseHub",
        "hub_id": "h"}


@pytest.mark.parametrize("request_id, echoed", [
    ("r-1", "r-1"), ("r" * 128, "r" * 128), ("r" * 129, ""), ("", ""), (5, ""),
    ("a\nb", ""), ("\udc00", ""), (None, ""),
])
def test_a_delivery_verb_is_refused_as_its_verb_refuses(request_id, echoed):
    frame = {"type": "delivery_request", "sender": "p/a", "request_id": request_id,
             "body": "\ud800"}
    answer = refusal("h", frame, codec.NOT_UTF8, codec.CODE_INVALID_UTF8, 3.0)
    assert (answer["type"], answer["target"], answer["request_id"], answer["reason_code"],
            answer["protocol_version"], answer["error_code"]) == (
        "delivery_refused", "p/a", echoed, "invalid_shape", 3, "invalid_utf8")
    assert "field" not in answer
    codec.encode(answer)


def test_decoded_values_the_rules_accept_are_storable():
    """What passes the decoder and the rules encodes (the journal's row)."""
    frame = codec.decode_frame('{"type":"chat","client_msg_id":"c\\u00e9","payload":1e308}')
    assert check_fields(frame) is None and math.isfinite(frame["payload"])
    assert orjson.loads(codec.encode(frame)) == frame

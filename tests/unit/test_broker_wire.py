"""The broker's line codec (seed 004, v2): splitting, the 1 MiB bound, envelope
and field checks, encoding."""

import orjson
import pytest

from hubd.wire import broker as wire
from hubd.wire.broker import LineSplitter, LineTooLong, Request, WireError, parse_line


def line(**fields) -> bytes:
    return orjson.dumps({"v": 2, "id": 1, **fields})


def test_splitter_joins_partial_lines_and_skips_blank_ones():
    s = LineSplitter()
    assert s.feed(b'{"a":') == []
    assert s.feed(b'1}\n\n  \n{"b":2}\n{"c"') == [b'{"a":1}', b'{"b":2}']
    assert s.pending_bytes == 4
    assert s.feed(b":3}\n") == [b'{"c":3}']


def test_splitter_reports_an_over_long_line_once_and_recovers():
    s = LineSplitter(limit=10)
    out = s.feed(b"x" * 8)
    out += s.feed(b"y" * 8)  # now past the bound: discarded, not held
    assert s.pending_bytes == 0
    out += s.feed(b"z" * 100 + b"\nok\n")
    assert len(out) == 2 and isinstance(out[0], LineTooLong) and out[0].size == 116
    assert out[1] == b"ok"


def test_splitter_bound_is_exactly_one_mebibyte():
    s = LineSplitter()
    exact = b"a" * wire.MAX_LINE_BYTES
    assert s.feed(exact + b"\n") == [exact]
    out = s.feed(exact + b"b\n")
    assert len(out) == 1 and isinstance(out[0], LineTooLong)


def test_parse_accepts_every_verb_with_its_required_fields():
    examples = {
        "auth": {"token": "t"},
        "register": {"clientKind": "cli"},
        "session": {"event": "session-start", "client": "claude", "cliSessionId": "abc",
                    "host": {"hostPid": 10, "hostStart": 5}},
        "delivered": {"ids": [1]},
        "send": {"threadId": None, "to": "bob", "body": "hi"},
        "reply": {"messageId": 1, "body": "ok"},
        "ack": {"ids": [1, 2]},
        "read": {"ids": [1]},
        "inbox": {"unreadOnly": True},
        "thread": {"threadId": 1, "sinceSeq": None, "full": False},
        "collect": {"threadId": 1},
        "wait": {"threadId": 1, "until": "all_replied"},
        "groups": {"action": "list"},
        "status": {},
        "prune": {},
        "hook": {"event": "prompt"},
        "native-register": {"handle": "bob", "socketPath": "/tmp/x", "token": "t"},
        "fetch-push": {"handle": "bob", "limit": 5},
    }
    assert set(examples) == set(wire.VERBS)
    for verb, fields in examples.items():
        parsed = parse_line(line(type=verb, **fields))
        assert isinstance(parsed, Request), (verb, parsed)
        assert parsed.type == verb and parsed.id == 1
        assert parsed.fields == fields


@pytest.mark.parametrize("raw, fragment, has_id", [
    (b"{not json", "Malformed JSON", False),
    (b"[1,2]", "JSON object", False),
    (b'{"v":2,"type":"status"}', "carries id", False),
    (b'{"v":2,"id":0,"type":"status"}', "carries id", False),
    (b'{"v":2,"id":true,"type":"status"}', "carries id", False),
    (b'{"v":2,"id":1.5,"type":"status"}', "carries id", False),
    (b'{"v":1,"id":3,"type":"status"}', "Protocol version 2", True),
    (b'{"id":3,"type":"status"}', "Protocol version 2", True),
    (b'{"v":2.0,"id":3,"type":"status"}', "Protocol version 2", True),
    (b'{"v":2,"id":3,"type":"frobnicate"}', "Unknown message type", True),
    (b'{"v":2,"id":3}', "Unknown message type", True),
    (b'{"v":2,"id":3,"type":"send","to":"bob","body":"x"}', "'threadId' is required", True),
    (b'{"v":2,"id":3,"type":"send","threadId":null,"to":"bob","body":"  "}', "body", True),
    (b'{"v":2,"id":3,"type":"send","threadId":0,"to":"bob","body":"x"}', "threadId", True),
    (b'{"v":2,"id":3,"type":"send","threadId":null,"to":[],"body":"x"}', "to must", True),
    (b'{"v":2,"id":3,"type":"send","threadId":null,"to":"b","body":"x","mode":"loud"}',
     "mode must be one of push, notify, silent", True),
    (b'{"v":2,"id":3,"type":"reply","messageId":1,"body":"x","verdict":"maybe"}',
     "verdict must be one of agree, disagree, info", True),
    (b'{"v":2,"id":3,"type":"register","clientKind":"bot"}', "clientKind", True),
    (b'{"v":2,"id":3,"type":"register","clientKind":"cli","handle":"Bob"}', "handle", True),
    (b'{"v":2,"id":3,"type":"register","clientKind":"cli","handle":"b"}', "handle", True),
    (b'{"v":2,"id":3,"type":"session","event":"start","client":"claude","cliSessionId":"a",'
     b'"host":{"hostPid":1,"hostStart":1}}', "event", True),
    (b'{"v":2,"id":3,"type":"session","event":"prompt","client":"vim","cliSessionId":"a",'
     b'"host":{"hostPid":1,"hostStart":1}}', "client", True),
    (b'{"v":2,"id":3,"type":"session","event":"prompt","client":"claude","cliSessionId":"a",'
     b'"host":{"hostPid":-1,"hostStart":1}}', "hostPid", True),
    (b'{"v":2,"id":3,"type":"wait","threadId":1,"until":"all_replied","timeoutMs":300001}',
     "timeoutMs", True),
    (b'{"v":2,"id":3,"type":"ack","ids":[]}', "ids", True),
    (b'{"v":2,"id":3,"type":"ack","ids":["m1"]}', "ids", True),
    (b'{"v":2,"id":3,"type":"fetch-push","handle":"bob","limit":0}', "limit", True),
    (b'{"v":2,"id":3,"type":"inbox","unreadOnly":"yes"}', "unreadOnly", True),
])
def test_parse_refuses_with_bad_request(raw, fragment, has_id):
    parsed = parse_line(raw)
    assert isinstance(parsed, WireError)
    assert parsed.code == wire.BAD_REQUEST
    assert fragment in parsed.message
    assert parsed.id == (3 if has_id else None)


@pytest.mark.parametrize("raw, fault", [
    (b'{"v":2,"id":3,"type":"send","threadId":null,"to":"bob","body":"\xed\xa0\x80"}',
     "byte 0xED"),
    (b'{"v":2,"id":3,"type":"send","threadId":null,"to":"bob","body":"ok \xff"}', "byte 0xFF"),
    (b'{"v":2,"id":3,"type":"send","threadId":null,"to":"bob","body":"\\ud800"}',
     "escape \\ud800"),
    (b'{"v":2,"id":3,"type":"send","threadId":null,"to":"b\\udfff","body":"x"}',
     "escape \\udfff"),
    (b'{"v":2,"id":3,"type":"register","clientKind":"cli","display":"\\udbff!"}',
     "escape \\udbff"),
    (b'{"v":2,"id":3,"type":"auth","token":"\\ud800"}', "escape \\ud800"),
    (b'{"v":2,"id":3,"type":"status","ignored":{"deep":["\\udc00"]}}', "escape \\udc00"),
])
def test_parse_refuses_text_that_is_not_utf8_naming_the_fault(raw, fault):
    parsed = parse_line(raw)
    assert isinstance(parsed, WireError) and parsed.code == wire.BAD_REQUEST
    assert parsed.message.startswith("The line is not valid UTF-8 text: ")
    assert fault in parsed.message and parsed.id == 3


def test_a_pair_of_surrogate_escapes_is_one_character():
    parsed = parse_line(line(type="send", threadId=None, to="bob", body="x")
                        .replace(b'"x"', b'"\\ud83d\\ude00"'))
    assert isinstance(parsed, Request) and parsed.fields["body"] == "\U0001F600"


def test_parse_refuses_deep_nesting():
    deep = b'{"v":2,"id":4,"type":"status","x":' + b"[" * 40 + b"]" * 40 + b"}"
    parsed = parse_line(deep)
    assert isinstance(parsed, WireError) and parsed.id == 4 and "nests" in parsed.message


def test_optional_null_is_absent_and_unknown_fields_are_ignored():
    parsed = parse_line(line(type="register", clientKind="cli", handle=None, future="x"))
    assert isinstance(parsed, Request) and parsed.fields == {"clientKind": "cli"}


def test_encoding_shapes():
    assert orjson.loads(wire.encode_ok(5, {"a": 1})) == {"v": 2, "id": 5, "ok": True,
                                                        "result": {"a": 1}}
    assert orjson.loads(wire.encode_error(6, "duplicate", "no", messageId=3)) == {
        "v": 2, "id": 6, "ok": False,
        "error": {"code": "duplicate", "message": "no", "messageId": 3}}
    event = wire.encode_event("notification", [{"kind": "peer_offline"}])
    assert event.endswith(b"\n")
    assert orjson.loads(event) == {"v": 2, "type": "event", "event": "notification",
                                   "payload": [{"kind": "peer_offline"}]}


def test_error_codes_are_the_seeds():
    assert wire.ERROR_CODES == (
        "auth_required", "bad_token", "broker_closed", "broker_down", "unknown_handle",
        "unknown_group", "unknown_thread", "unknown_message", "duplicate", "rate_limited",
        "cap_thread", "cap_inbox", "bad_request", "timeout", "native_failed", "internal")

"""The pure delivery decisions (hubd/state/delivery_rules.py): shapes, mode
selection, authority, caps, stage transitions, and the two digests the
reference client computes on its side."""

import hashlib
import json

import pytest

from hubd.state import delivery_rules as r
from hubd.wire import digests

NOW = 1_000_000.0
INC = "a" * 64


def frame(**kw):
    base = {"type": "delivery_request", "sender": "p/alice", "target": "p/bob",
            "protocol_version": 3, "request_id": "r1", "idempotency_key": "k1",
            "target_incarnation": INC, "mode": "next_turn", "allowed_fallbacks": [],
            "task_id": "t1", "body": "hello", "deadline": NOW + 60}
    base.update(kw)
    return {k: v for k, v in base.items() if v is not ...}


def refused(result, code, request_id=None):
    assert isinstance(result, r.Refusal), result
    assert result.reason_code == code, result
    if request_id is not None:
        assert result.request_id == request_id
    return result


def test_a_good_request_reads_whole():
    req = r.read_request(frame(allowed_fallbacks=["follow_up"]), NOW)
    assert req == r.Request("r1", "k1", "p/bob", INC, "next_turn", ("follow_up",), "t1",
                            "hello", NOW + 60)
    assert r.read_request(frame(task_id=...), NOW).task_id == ""


@pytest.mark.parametrize("field,value,code", [
    ("idempotency_key", ..., r.INVALID_SHAPE),
    ("idempotency_key", "k" * 129, r.INVALID_SHAPE),
    ("target", "all", r.INVALID_SHAPE),
    ("target", "p/*", r.INVALID_SHAPE),
    ("target", "p/a,p/b", r.INVALID_SHAPE),
    ("target", "p/bob@east", r.UNKNOWN_HUB),
    ("target_incarnation", "A" * 64, r.INVALID_SHAPE),
    ("target_incarnation", "x", r.INVALID_SHAPE),
    ("mode", "shout", r.UNSUPPORTED_MODE),
    ("mode", None, r.UNSUPPORTED_MODE),
    ("mode", ["next_turn"], r.UNSUPPORTED_MODE),
    ("allowed_fallbacks", "follow_up", r.INVALID_SHAPE),
    ("allowed_fallbacks", ["steer", "interrupt", "follow_up", "next_turn"], r.INVALID_SHAPE),
    ("allowed_fallbacks", ["follow_up", "follow_up"], r.INVALID_SHAPE),
    ("allowed_fallbacks", ["next_turn"], r.INVALID_SHAPE),
    ("allowed_fallbacks", ["bogus"], r.UNSUPPORTED_MODE),
    ("allowed_fallbacks", [None], r.UNSUPPORTED_MODE),
    ("task_id", "t" * 129, r.INVALID_SHAPE),
    ("task_id", 7, r.INVALID_SHAPE),
    ("body", ..., r.INVALID_SHAPE),
    ("body", "", r.INVALID_SHAPE),
    ("body", "x" * 8193, r.INVALID_SHAPE),
    ("body", "é" * 4097, r.INVALID_SHAPE),  # 8,194 UTF-8 bytes
    ("body", "\ud800x", r.INVALID_SHAPE),
    ("deadline", "soon", r.INVALID_SHAPE),
    ("deadline", True, r.INVALID_SHAPE),
    ("deadline", float("nan"), r.INVALID_SHAPE),
    ("deadline", NOW + 86_401, r.INVALID_SHAPE),
    ("deadline", NOW, r.DEADLINE_EXPIRED),
])
def test_each_bad_field_is_refused_with_its_code_and_the_request_id(field, value, code):
    refused(r.read_request(frame(**{field: value}), NOW), code, "r1")


def test_body_limits_are_utf8_bytes_inclusive():
    assert isinstance(r.read_request(frame(body="x" * 8192), NOW), r.Request)
    assert isinstance(r.read_request(frame(body="é" * 4096), NOW), r.Request)
    assert isinstance(r.read_request(frame(deadline=NOW + 86_400), NOW), r.Request)


@pytest.mark.parametrize("rid", [..., 5, "", "r" * 129, "\udc00r", "a\nb", None])
def test_an_invalid_request_id_is_never_echoed(rid):
    refused(r.read_request(frame(request_id=rid), NOW), r.INVALID_SHAPE, "")


def test_the_first_failure_wins_in_order():
    # a bad idempotency key is reported before a bad body or mode
    result = r.read_request(frame(idempotency_key=1, body="", mode="x"), NOW)
    assert result.text == "idempotency_key must be a string"


def test_selection_takes_the_first_advertised_of_mode_then_fallbacks():
    caps = {"next_turn": "native", "follow_up": "emulated"}
    assert r.select_mode("follow_up", (), caps) == r.Selection("follow_up", "emulated")
    assert r.select_mode("steer", ("next_turn", "follow_up"), caps) == \
        r.Selection("next_turn", "native")
    assert r.select_mode("interrupt", ("follow_up",), caps) == \
        r.Selection("follow_up", "emulated")
    refused(r.select_mode("interrupt", ("steer",), caps), r.UNSUPPORTED_MODE)
    # an advertised quality the hub does not know never selects anything
    refused(r.select_mode("next_turn", (), {"next_turn": "super"}), r.UNSUPPORTED_MODE)


def test_control_needs_an_authenticated_hub_a_grant_and_the_task_claim():
    open_hub = r.Requester("p/alice", "open-host:127.0.0.1", authenticated_hub=False)
    token_hub = r.Requester("p/alice", "alice", authenticated_hub=True)
    forwarded = r.Requester("p/alice@west", "alice", authenticated_hub=True, forwarded=True)
    for mode in ("interrupt", "steer"):
        assert r.may_control(token_hub, mode, granted=True, task_claimed=True) is None
        for requester, granted, claimed in ((open_hub, True, True), (forwarded, True, True),
                                            (token_hub, False, True), (token_hub, True, False),
                                            (token_hub, False, False)):
            refused(r.may_control(requester, mode, granted, claimed), r.UNAUTHORISED_REQUESTER)
    for mode in ("follow_up", "next_turn"):
        for requester in (open_hub, token_hub, forwarded):
            assert r.may_control(requester, mode) is None


def test_caps():
    assert r.admission_caps(127, 15, 5, 100) is None
    refused(r.admission_caps(128, 0, 5, 100), r.RECIPIENT_QUEUE_FULL)
    refused(r.admission_caps(20, 16, 5, 100), r.RECIPIENT_QUEUE_FULL)
    refused(r.admission_caps(0, 0, 100, 100), r.RECIPIENT_QUEUE_FULL)


def test_session_adverts():
    token = "0f" * 32
    assert r.read_session({"type": "heartbeat"}, 3) is None
    advert = r.read_session({"delivery_session_token": token,
                             "delivery_capabilities": {"follow_up": "native"}}, 7)
    assert advert == r.SessionAdvert(token, {"follow_up": "native"})
    assert r.read_session({"delivery_session_token": token, "delivery_capabilities": {}},
                          3).capabilities == {}
    cases = [
        ({"delivery_session_token": token, "delivery_capabilities": {}}, 2,
         r.UNSUPPORTED_PROTOCOL),
        ({"delivery_session_token": token, "delivery_capabilities": {}}, None,
         r.UNSUPPORTED_PROTOCOL),
        ({"delivery_session_token": "AB" * 32, "delivery_capabilities": {}}, 3, r.INVALID_SHAPE),
        ({"delivery_session_token": "ab" * 10, "delivery_capabilities": {}}, 3, r.INVALID_SHAPE),
        ({"delivery_capabilities": {}}, 3, r.INVALID_SHAPE),
        ({"delivery_session_token": token}, 3, r.INVALID_SHAPE),
        ({"delivery_session_token": token, "delivery_capabilities": {"shout": "native"}}, 3,
         r.INVALID_SHAPE),
        ({"delivery_session_token": token, "delivery_capabilities": {"steer": "super"}}, 3,
         r.INVALID_SHAPE),
    ]
    for advert_frame, version, code in cases:
        refused(r.read_session(advert_frame, version), code)


def test_protocol_gate():
    assert r.speaks_v3(7, {"protocol_version": 3})
    assert not r.speaks_v3(2, {"protocol_version": 3})
    assert not r.speaks_v3(None, {"protocol_version": 3})
    assert not r.speaks_v3(7, {})
    assert not r.speaks_v3(7, {"protocol_version": "3"})
    assert not r.speaks_v3(7, {"protocol_version": 4})
    assert not r.speaks_v3(7, {"protocol_version": True})


def report(verb="delivery_boundary", **kw):
    base = {"operation_key": "b" * 64, "request_id": "r1", "task_id": "t1",
            "mutation_id": "m1", "stage": "boundary_delivered",
            "evidence": {"boundary": "turn-3"}}
    base.update(kw)
    return r.read_report(verb, {k: v for k, v in base.items() if v is not ...})


def test_reports():
    assert report().stage == r.BOUNDARY_DELIVERED
    assert report(stage=...).stage == r.BOUNDARY_DELIVERED
    ack = report("delivery_ack", stage="acknowledged", evidence={"receipt_id": "x"})
    assert ack.stage == r.ACKNOWLEDGED
    done = report("delivery_outcome", stage="completed",
                  evidence={"executor_ref": "e", "outcome_code": "ok"})
    assert done.evidence == {"executor_ref": "e", "outcome_code": "ok"}
    refused(report(operation_key="x"), r.INVALID_SHAPE, "")
    refused(report(mutation_id=...), r.INVALID_SHAPE, "r1")
    refused(report(mutation_id="m" * 129), r.INVALID_SHAPE, "r1")
    refused(report(mutation_id="\ud800"), r.INVALID_SHAPE, "r1")
    refused(report(stage="acknowledged"), r.INVALID_SHAPE, "r1")  # never reinterpreted
    refused(report("delivery_outcome", stage=...), r.INVALID_SHAPE, "r1")
    refused(report("delivery_outcome", stage="superseded",
                   evidence={"executor_ref": "e", "outcome_code": "ok"}), r.INVALID_SHAPE)
    refused(report(evidence={}), r.INVALID_SHAPE)
    refused(report(evidence={"boundary": ""}), r.INVALID_SHAPE)
    refused(report(evidence={"boundary": "x", "extra": "y"}), r.INVALID_SHAPE)
    refused(report(evidence={"boundary": "\udc00"}), r.INVALID_SHAPE)
    refused(report("delivery_outcome", stage="completed", evidence={"executor_ref": "e"}),
            r.INVALID_SHAPE)


def test_transitions():
    order = [r.QUEUED, r.BOUNDARY_DELIVERED, r.ACKNOWLEDGED]
    for current, nxt in zip(order, order[1:]):
        assert r.report_transition(current, nxt) is None
    for outcome in (r.COMPLETED, r.FAILED):
        assert r.report_transition(r.ACKNOWLEDGED, outcome) is None
        refused(r.report_transition(r.QUEUED, outcome), r.INVALID_TRANSITION)
        refused(r.report_transition(r.BOUNDARY_DELIVERED, outcome), r.INVALID_TRANSITION)
        # a cancel request does not open a shortcut to a completion
        refused(r.report_transition(r.QUEUED, outcome, True), r.INVALID_TRANSITION)
    refused(r.report_transition(r.QUEUED, r.ACKNOWLEDGED), r.INVALID_TRANSITION)
    for terminal in r.TERMINAL:
        for stage in (r.BOUNDARY_DELIVERED, r.ACKNOWLEDGED, r.COMPLETED, r.CANCELLED):
            refused(r.report_transition(terminal, stage), r.INVALID_TRANSITION)
            refused(r.report_transition(terminal, stage, True), r.INVALID_TRANSITION)


def test_the_executor_confirms_a_requested_cancel_from_any_unfinished_stage():
    for current in (r.QUEUED, r.BOUNDARY_DELIVERED, r.ACKNOWLEDGED):
        assert r.report_transition(current, r.CANCELLED, True) is None
        # nobody asked: the executor cannot end the work as "cancelled"
        no = r.report_transition(current, r.CANCELLED, False)
        refused(no, r.INVALID_TRANSITION)
        assert no.text == "delivery cancellation was not requested"
    assert r.report_transition(r.ACKNOWLEDGED, r.CANCELLED) is not None  # default: not requested
    assert r.CANCELLED in r.TERMINAL and r.CANCELLED not in r.UNFINISHED


def cancelled(evidence):
    return report("delivery_outcome", stage="cancelled", evidence=evidence)


def test_cancelled_evidence_takes_exactly_one_of_two_shapes():
    # the reference bridge's confirmation before it started the turn
    before = cancelled({"reason_code": "sender_cancelled"})
    assert (before.stage, before.evidence) == (r.CANCELLED, {"reason_code": "sender_cancelled"})
    # an executor that stopped a started turn
    stopped = cancelled({"executor_ref": "e", "outcome_code": "stopped"})
    assert stopped.evidence == {"executor_ref": "e", "outcome_code": "stopped"}
    assert before.digest() != stopped.digest()
    for evidence in ({}, {"executor_ref": "e"}, {"outcome_code": "x"}, None, ["reason_code"]):
        refused(cancelled(evidence), r.INVALID_SHAPE, "r1")
    assert cancelled({}).text == "executor outcome evidence is required"
    for evidence in ({"reason_code": "sender_cancelled", "executor_ref": "e"},
                     {"foo": "bar"}, {"reason_code": "x", "extra": "y"}):
        no = cancelled(evidence)
        refused(no, r.INVALID_SHAPE, "r1")
        assert no.text == "delivery evidence shape is unsupported"
    for code in ("", "a" * 129, 5, None, "Sender_Cancelled", "sender cancelled", "1st",
                 "sender\ncancelled", "\ud800"):
        refused(cancelled({"reason_code": code}), r.INVALID_SHAPE, "r1")
    assert cancelled({"reason_code": "a" * 128}).evidence == {"reason_code": "a" * 128}
    # reason_code is cancellation evidence only: a completion still needs the executor's
    refused(report("delivery_outcome", stage="completed", evidence={"reason_code": "x"}),
            r.INVALID_SHAPE, "r1")
    refused(report("delivery_outcome", stage="failed", evidence={"reason_code": "x"}),
            r.INVALID_SHAPE, "r1")


def test_cancel_is_a_request_never_terminal():
    assert r.cancel_decision(r.QUEUED, False) == "request"
    assert r.cancel_decision(r.ACKNOWLEDGED, True) == "repeat"
    for terminal in r.TERMINAL:
        refused(r.cancel_decision(terminal, True), r.INVALID_TRANSITION)


def test_the_digests_the_reference_client_computes():
    # observed on the wire against the reference hub (docs/reference-observed.md)
    assert r.operation_key("ref-hub", "p/alice", "r1") == \
        "fb9195073b9779135fd06f233dd5bfc82213125b6f2cd16f27ab0e9c1093d48b"
    token = "94088e2b1f76c63b04d1b73e05e4ba892e56eb39930e4feda0463f56e9a8e3ad"
    assert r.incarnation_of("ref-hub", "p/bob", token) == \
        "62a7aa4ff3a6d1440288d3b40118d6a9327365b83050f8e2808db5e1599e0faf"
    assert r.notification_id("ab", 2) == "delivery:ab:2"


def test_content_identity_covers_every_semantic_field():
    req = r.read_request(frame(), NOW)
    digest = req.digest()
    for field, value in [("body", "other"), ("deadline", NOW + 61), ("mode", "follow_up"),
                         ("task_id", "t2"), ("idempotency_key", "k2"),
                         ("allowed_fallbacks", ["follow_up"]), ("target_incarnation", "c" * 64)]:
        assert r.read_request(frame(**{field: value}), NOW).digest() != digest, field
    expected = hashlib.sha256(json.dumps(req.content(), sort_keys=True, separators=(",", ":"))
                              .encode()).hexdigest()
    assert digest == expected


def test_a_request_id_and_an_idempotency_key_each_name_one_request():
    # the answers the reference hub gave (docs/reference-observed.md, 8.2)
    assert r.admission_identity("r1", "d1", None, None) == r.NEW
    assert r.admission_identity("r1", "d1", "d1", "op1") == r.RETRY
    conflict = refused(r.admission_identity("r1", "d2", "d1", "op1"), r.ID_CONFLICT, "r1")
    assert conflict.text == "request identity was reused with new content"
    # the sender's key, spent under another request id: refused whatever the content
    assert refused(r.admission_identity("r2", "d1", None, "op1"), r.ID_CONFLICT, "r2") == \
        r.Refusal(r.ID_CONFLICT, conflict.text, "r2")


def test_no_frame_gets_past_the_door_with_an_escaped_lone_surrogate():
    """The decoder refuses every one (issue 30 item 1); a delivery frame keeps
    its parse only so the door can refuse it as the verb would (invalid_shape,
    tests/unit/test_field_rules.py). The rules refuse one too, if it came."""
    from hubd.wire import codec
    decoded = codec.decode_frame('{"type":"delivery_request","sender":"p/a","body":"\\ud800"}')
    assert decoded.code == codec.CODE_INVALID_UTF8 and decoded.frame["body"] == "\ud800"
    refused(r.read_request({**decoded.frame, "request_id": "r", "idempotency_key": "k",
                            "target": "p/b", "target_incarnation": INC, "mode": "next_turn",
                            "deadline": NOW + 5}, NOW), r.INVALID_SHAPE, "r")
    for text in ('{"type":"chat","payload":"\\ud800"}',
                 '{"type":"delivery_request","sender":"\\ud800"}',
                 '{"type":"delivery_request","target":["x"],"body":"\\ud800"}',
                 '["delivery_request","\\ud800"]'):
        assert codec.decode_frame(text).code == codec.CODE_INVALID_UTF8, text


# -- the canonical JSON behind digests and operation keys (journaled, and the
# reference client computes operation keys itself): byte for byte json.dumps

from hypothesis import example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_scalars = (st.none() | st.booleans() | st.integers(min_value=-(2 ** 70), max_value=2 ** 70)
            | st.floats(allow_nan=True, allow_infinity=True) | st.text())
_values = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=4)
                       | st.dictionaries(st.text(), inner, max_size=4), max_leaves=12)


@settings(max_examples=400, deadline=None)
@given(_values)
@example({"body": "caf\u00e9", "deadline": 1e16})
@example({"evidence": {"boundary": "line\nbreak"}, "stage": "x", "n": -0.0})
@example(["hub", "p/s\ud800", "r1"])
@example({"deadline": 1764633600.123456, "target": "p/\x7f", "big": 2 ** 64})
def test_canonical_json_is_json_dumps_sorted_compact_ascii(value):
    want = json.dumps(value, sort_keys=True, separators=(",", ":")).encode("ascii")
    assert digests.canonical_json(value) == want


@settings(max_examples=400, deadline=None)
@given(_values)
@example({"body": "caf\u00e9 \u2028", "timestamp": 1764752000.123456, "n": 1e16})
@example({"auth": {"nonce": "a\\b"}, "x": "tab\there", "y": "\x7f\x1f"})
@example({"body": "p/s\ud800"})
@example({"big": 2 ** 64, "small": -0.0, "inf": float("inf")})
def test_signed_json_is_json_dumps_sorted_compact_utf8(value):
    try:
        want = json.dumps(value, sort_keys=True, separators=(",", ":"),
                          ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:  # an unpaired surrogate: refused the same way
        with pytest.raises(UnicodeEncodeError):
            digests.signed_json(value)
        return
    assert digests.signed_json(value) == want


def test_operation_key_and_digest_are_sha256_of_that_text():
    assert r.operation_key("h", "p/s", "r\u00e91") == hashlib.sha256(
        json.dumps(["h", "p/s", "r\u00e91"], separators=(",", ":")).encode()).hexdigest()
    content = {"target": "p/r", "deadline": 1764633600.5, "allowed_fallbacks": []}
    assert digests.canonical_sha256(content) == hashlib.sha256(json.dumps(
        content, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()).hexdigest()

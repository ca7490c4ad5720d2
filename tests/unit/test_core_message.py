"""The door-neutral core's messages and their release after commit: one encoding per message and
wire however many endpoints get it; ids whose endpoint has gone are skipped."""

from hubd.actors.journal_writer import release
from hubd.actors.journal_writer import Outcome
from hubd.core.endpoints import Endpoints
from hubd.core.message import CloseEndpoint, Message
from hubd.wire import codec


class Recorder:
    """An endpoint that keeps what it is given, framed by its door's wire."""

    def __init__(self, endpoint_id, wire):
        self.id = endpoint_id
        self.wire = wire
        self.got = []
        self.closed = None

    def deliver(self, message):
        self.got.append(message.encoded(self.wire))

    def close(self, code, reason):
        self.closed = (code, reason)


def test_a_message_is_encoded_once_per_wire_for_every_recipient():
    calls = {"a": 0, "b": 0}

    def wire_a(message):
        calls["a"] += 1
        return b"A" + message.json

    def wire_b(message):
        calls["b"] += 1
        return b"B" + message.json

    endpoints = Endpoints()
    door_a = [Recorder(i, wire_a) for i in (1, 2, 3)]
    door_b = [Recorder(i, wire_b) for i in (4, 5)]
    for endpoint in door_a + door_b:
        endpoints.add(endpoint)
    frame = {"type": "chat", "payload": "hi"}
    message = Message(frame)
    frames_out = {}
    release([Outcome(sends=[((1, 2, 3, 4, 5, 99), message, "chat")])], False, endpoints,
            frames_out)
    assert calls == {"a": 1, "b": 1}
    assert [e.got for e in door_a] == [[b"A" + codec.encode(frame)]] * 3
    assert [e.got for e in door_b] == [[b"B" + codec.encode(frame)]] * 2
    assert frames_out == {"chat": 6}


def test_json_given_is_the_json_sent():
    # a chat's text is made once: the journal payload and what recipients get
    text = b'{"type":"chat","payload":"exact bytes"}'
    message = Message({"type": "chat", "payload": "other"}, text)
    assert message.json is text
    assert message.encoded(lambda m: m.json) is text


def test_failure_items_are_built_only_when_released_and_closes_follow_messages():
    # a failed commit sends the failure entries instead: built only then
    endpoints = Endpoints()
    endpoint = Recorder(7, lambda m: m.json)
    endpoints.add(endpoint)
    built = []

    def lazily():
        built.append(1)
        return Message({"type": "error", "payload": "late"})

    failure = [(7, lazily, "error"), (7, CloseEndpoint(4010, "auth"), "close")]
    outcome = Outcome(events=["an event"], sends=[(7, Message({"type": "ok"}), "ok")],
                      failure=failure)
    release([outcome], False, endpoints, {})
    assert built == [] and endpoint.got == [codec.encode({"type": "ok"})]
    endpoint.got.clear()
    release([outcome], True, endpoints, {})
    assert built == [1]
    assert endpoint.got == [codec.encode({"type": "error", "payload": "late"})]
    assert endpoint.closed == (4010, "auth")


def test_a_removed_endpoint_gets_nothing():
    endpoints = Endpoints()
    endpoint = Recorder(3, lambda m: m.json)
    endpoints.add(endpoint)
    endpoints.remove(endpoint)
    release([Outcome(sends=[(3, Message({"type": "x"}), "x")])], False, endpoints, {})
    assert endpoint.got == [] and len(endpoints) == 0

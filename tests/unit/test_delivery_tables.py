"""The forward and receipt state tables, the one receipt builder, and the retry
schedule as a pure function of its inputs."""

import pytest

from federation.clock import next_retry, retry_delay
from hubd.timing import Timing
from hubd.state import delivery as dl


def test_every_forward_path_through_the_table():
    # the common life: queued, sent, accepted
    assert dl.forward_step(dl.QUEUED, dl.SEND) == dl.IN_FLIGHT
    assert dl.forward_step(dl.IN_FLIGHT, dl.ANSWER_ACCEPTED) == dl.ACCEPTED
    # a link that drops returns the forward to the queue; a "not now" waits
    assert dl.forward_step(dl.IN_FLIGHT, dl.LINK_DOWN) == dl.QUEUED
    assert dl.forward_step(dl.IN_FLIGHT, dl.ANSWER_TRANSIENT) == dl.HELD
    assert dl.forward_step(dl.IN_FLIGHT, dl.ANSWER_TIMEOUT) == dl.WAITING
    for state in (dl.WAITING, dl.HELD):
        assert dl.forward_step(state, dl.LINK_UP) == dl.QUEUED
        assert dl.forward_step(state, dl.RETRY_DUE) == dl.QUEUED
    # a sign of life resends what got no answer, not what the peer refused for now
    assert dl.forward_step(dl.WAITING, dl.PEER_ALIVE) == dl.QUEUED
    assert dl.forward_step(dl.HELD, dl.PEER_ALIVE) == dl.HELD
    for state in (dl.QUEUED, dl.IN_FLIGHT, dl.WAITING, dl.HELD):
        assert dl.forward_step(state, dl.TTL) == dl.EXPIRED
        assert dl.forward_step(state, dl.PEER_REJECTED) == dl.REFUSED
    # every target of the table is a state, and settled states go nowhere
    states = {dl.QUEUED, dl.IN_FLIGHT, dl.WAITING, dl.HELD} | dl.SETTLED
    assert set(dl.FORWARD_TRANSITIONS.values()) <= states
    assert not [key for key in dl.FORWARD_TRANSITIONS if key[0] in dl.SETTLED]


@pytest.mark.parametrize("state,event", [
    (dl.ACCEPTED, dl.ANSWER_ACCEPTED),  # a late duplicate answer after settling
    (dl.QUEUED, dl.ANSWER_ACCEPTED),  # an answer to a forward never sent
    (dl.WAITING, dl.SEND),  # sending a forward in its back-off
    (dl.HELD, dl.SEND),
    (dl.QUEUED, dl.PEER_ALIVE),  # only a backing-off forward is released by a sign of life
    (dl.EXPIRED, dl.TTL),
])
def test_a_move_the_table_lacks_is_an_error(state, event):
    with pytest.raises(dl.InvalidTransition, match=state):
        dl.forward_step(state, event)


def test_answers_map_to_events():
    assert dl.answer_event("accepted", "") == dl.ANSWER_ACCEPTED
    assert dl.answer_event("duplicate", "") == dl.ANSWER_DUPLICATE
    assert dl.answer_event("refused", "quota_exceeded") == dl.ANSWER_TRANSIENT
    assert dl.answer_event("refused", "namespace_not_granted") == dl.ANSWER_REFUSED
    assert dl.answer_event("maybe", "") == dl.ANSWER_INVALID
    assert dl.answer_event(None, "") == dl.ANSWER_INVALID


CHAT = dl.ChatRef("PROJ/alice", 41, 7, "PROJ/bob@west", "c-1")


def test_local_receipts():
    text, fields = dl.receipt(dl.IMMEDIATE_DELIVERED, CHAT, ["PROJ/bob"],
                              wake={"PROJ/bob": "unknown"})
    assert text == "delivered to PROJ/bob"
    assert fields["delivered"] is True and fields["dead_lettered"] is False
    assert fields["receipt_notification_id"] == "delivery-receipt:41:immediate_delivered"
    assert fields["recipient_wake_capabilities"] == {"PROJ/bob": "unknown"}
    text, fields = dl.receipt(dl.DEAD_LETTERED, CHAT)
    assert text.startswith("delivery failed: no online recipient matched")
    assert fields["dead_lettered"] is True and fields["reason"] == "no_online_recipient"
    assert fields["receipt_notification_id"].endswith(":pending")
    text, fields = dl.receipt(dl.DEFERRED, CHAT, ["PROJ/bob"])
    assert text == "delivered to PROJ/bob on reconnect"
    assert fields["deferred"] is True and "recipient_wake_capabilities" not in fields
    assert "forward_state" not in fields


def test_forward_receipts():
    facts = dl.ForwardFacts("west", "f" * 32, "PROJ/bob",
                            result={"recipients": ["PROJ/bob"], "delivered": True,
                                    "dead_lettered": False, "reason": ""}, told_pending=True)
    text, fields = dl.receipt(dl.FORWARD_ACCEPTED, CHAT, forward=facts)
    assert text == "delivered to PROJ/bob@west (forwarded to west)"
    assert fields["recipients"] == ["PROJ/bob@west"] and fields["deferred"] is True
    assert fields["forward_state"] == "accepted" and fields["refusal_code"] == ""
    offline = dl.ForwardFacts("west", "f" * 32, "PROJ/bob",
                              result={"recipients": [], "delivered": False,
                                      "dead_lettered": True, "reason": "no_online_recipient"})
    text, fields = dl.receipt(dl.FORWARD_DUPLICATE, CHAT, forward=offline)
    assert "waits in that hub's mailbox" in text
    assert fields["delivered"] is False and fields["dead_lettered"] is True
    assert fields["deferred"] is False and fields["reason"] == "no_online_recipient"
    refused = dl.ForwardFacts("west", "f" * 32, "PROJ/bob", "namespace_not_granted", "no grant")
    text, fields = dl.receipt(dl.FORWARD_REFUSED, CHAT, forward=refused)
    assert text == "forward to west refused (namespace_not_granted: no grant)"
    assert fields["refusal_code"] == "namespace_not_granted"
    assert fields["reason"] == "forward_refused"
    assert fields["receipt_notification_id"] == "delivery-receipt:41:forward-refused"
    pending = dl.ForwardFacts("west", "f" * 32, "PROJ/bob", detail="no answer yet")
    text, fields = dl.receipt(dl.FORWARD_PENDING, CHAT, forward=pending)
    assert text == "forward to west pending (no answer yet); retrying"
    assert fields["forward_state"] == "pending" and fields["deferred"] is True
    _, fields = dl.receipt(dl.FORWARD_EXPIRED, CHAT, forward=pending)
    assert fields["reason"] == "forward_expired" and fields["refusal_code"] == ""


def test_retry_schedule():
    T = Timing()  # the production profile
    RETRY_MAX = T.forward_retry_max
    assert [retry_delay(n, 0.5, T) for n in range(10)] == \
        [1, 2, 4, 8, 16, 32, 64, 128, 256, RETRY_MAX]
    assert retry_delay(0, 0.0, T) == 0.75
    assert retry_delay(3, 0.999, T) == pytest.approx(8 * 1.2495)
    with pytest.raises(ValueError):
        retry_delay(0, 1.0, T)
    # the due time moves with the injected clock, not with the machine's
    assert next_retry(0, 500.0, None, 0.5, T) == (501.0, 1)
    assert next_retry(2, 10.0, 5.0, 0.5, T) == (14.0, 3)
    # a flapping link keeps its count; a steady one that says "not now" starts over
    assert next_retry(9, 0.0, 5.0, 0.5, T) == (RETRY_MAX, 10)
    assert next_retry(8, 0.0, 31.0, 0.5, T) == (1.0, 1)
    assert next_retry(5, 0.0, 31.0, 0.5, T) == (32.0, 6)


def test_a_receiving_hubs_verdict_as_its_result():
    from federation.state import verdict_result

    # a completed write to a live match
    assert verdict_result(7, 3, ["PROJ/bob"], [], ["PROJ/bob"]) == {
        "seq": 7, "msg_id": 3, "delivered": True, "recipients": ["PROJ/bob"],
        "matched_recipients": ["PROJ/bob"], "stale_recipients": [], "reason": "",
        "dead_lettered": False}
    # matched, every match stale; live but no write completed; nothing matched
    stale = verdict_result(7, 3, ["PROJ/bob"], ["PROJ/bob"], [])
    assert stale["delivered"] is False and stale["reason"] == "no_live_recipient"
    assert stale["recipients"] == [] and stale["dead_lettered"] is True
    unwritten = verdict_result(7, 3, ["PROJ/bob"], [], [])
    assert unwritten["reason"] == "recipient_transport_unavailable"
    assert verdict_result(7, 3, [], [], [])["reason"] == "no_online_recipient"


def test_a_forward_receipt_qualifies_the_peers_evidence():
    facts = dl.ForwardFacts("west", "f" * 32, "PROJ/bob", result={
        "recipients": [], "delivered": False, "dead_lettered": True,
        "reason": "no_live_recipient", "matched_recipients": ["PROJ/bob"],
        "stale_recipients": ["PROJ/bob"]})
    text, fields = dl.receipt(dl.FORWARD_ACCEPTED, CHAT, forward=facts)
    assert text == ("accepted by west; no live recipient matched PROJ/bob there, it waits in "
                    "that hub's mailbox")
    assert fields["matched_recipients"] == ["PROJ/bob@west"]
    assert fields["stale_recipients"] == ["PROJ/bob@west"] and fields["recipients"] == []
    # a peer whose result has no matched_recipients (an older hub): the recipients
    older = dl.ForwardFacts("west", "f" * 32, "PROJ/bob", result={
        "recipients": ["PROJ/bob"], "delivered": True, "dead_lettered": False, "reason": ""})
    _, fields = dl.receipt(dl.FORWARD_ACCEPTED, CHAT, forward=older)
    assert fields["matched_recipients"] == ["PROJ/bob@west"] and fields["stale_recipients"] == []

"""The receipts a sender can be told (hubd/state/receipt_table.py): the one
receipt builder, for local and forwarded chats, and a receiving hub's verdict
as its forward result."""

from hubd.state import receipt_table as dl


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

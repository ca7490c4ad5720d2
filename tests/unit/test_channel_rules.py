"""The pure channel decisions and appliers (hubd/state/channels.py): texts,
owner-only invites, one-join invites, bounds, the last member out."""

from __future__ import annotations

import pytest

from hubd.state import channels as ch
from hubd.state.acl import required_accesses
from hubd.state.events import CHAT, Event
from hubd.state.hub import HubState, apply


def fresh() -> HubState:
    return HubState.fresh(dict(ch.appliers), ch.PROJECTIONS)


def granted(state: HubState, decision: ch.Decision) -> None:
    assert decision.ok, decision
    kind, payload = decision.event
    apply(state, Event(state.last_seq + 1, 0.0, kind, payload))
    state.last_seq += 1


def book(state: HubState) -> ch.ChannelBook:
    return ch.channels_of(state)


def test_create_invite_join_leave_and_the_reference_texts():
    s = fresh()
    d = ch.decide_create(book(s), "  ops ", "p/a", "")
    assert (d.text, d.event) == ("created channel 'ops'", (ch.CHANNEL_CREATED, {
        "channel": "ops", "owner": "p/a", "label": "ops"}))
    granted(s, d)
    assert ch.decide_create(book(s), "ops", "p/b", "x").text == "channel 'ops' already exists"
    for bad in ("", "   ", "x" * 201, None, 5):
        assert ch.decide_create(book(s), bad, "p/a", "").text == "invalid channel id"
    assert ch.decide_create(book(s), "y" * 200, "p/a", "").ok
    assert not ch.decide_create(book(s), "z", "p/a", "l" * 201).ok

    no_owner = "cannot invite to 'ops': no such channel or you are not its owner"
    assert ch.decide_invite(book(s), "ops", "p/b", "p/c").text == no_owner
    assert ch.decide_invite(book(s), "nope", "p/a", "p/c").text == \
        "cannot invite to 'nope': no such channel or you are not its owner"
    assert ch.decide_invite(book(s), "ops", "p/a", " ").text == "invalid invitee"
    assert ch.decide_invite(book(s), "ops", "p/a", "p/a").text == \
        "'p/a' is already a member of 'ops'"
    granted(s, ch.decide_invite(book(s), "ops", "p/a", " p/b "))
    assert ch.decide_invite(book(s), "ops", "p/a", "p/b").text == \
        "'p/b' is already invited to 'ops'"

    assert ch.decide_join(book(s), "ops", "p/c").text == \
        "cannot join 'ops': no such channel or you were not invited"
    granted(s, ch.decide_join(book(s), "ops", "p/b"))
    assert book(s).members("ops") == {"p/a", "p/b"}
    assert ch.decide_join(book(s), "ops", "p/b").text == "already a member of 'ops'"

    # leave consumes membership; the invite was consumed by the join
    granted(s, ch.decide_leave(book(s), "ops", "p/b"))
    assert ch.decide_leave(book(s), "ops", "p/b").text == "not a member of 'ops'"
    assert not ch.decide_join(book(s), "ops", "p/b").ok
    # the owner leaves and may come back without an invite
    granted(s, ch.decide_leave(book(s), "ops", "p/a"))
    assert book(s).get("ops") is None  # the last member out: gone
    assert ch.decide_leave(book(s), "ops", "p/a").text == "channel 'ops' does not exist"


def test_owner_rejoins_while_the_channel_lives():
    s = fresh()
    granted(s, ch.decide_create(book(s), "ops", "p/a", "Ops"))
    granted(s, ch.decide_invite(book(s), "ops", "p/a", "p/b"))
    granted(s, ch.decide_join(book(s), "ops", "p/b"))
    granted(s, ch.decide_leave(book(s), "ops", "p/a"))
    assert ch.decide_join(book(s), "ops", "p/a").ok
    assert book(s).get("ops").label == "Ops"


def test_bounds(monkeypatch):
    s = fresh()
    monkeypatch.setattr(ch, "MAX_CHANNELS", 2)
    monkeypatch.setattr(ch, "MAX_INVITES", 1)
    monkeypatch.setattr(ch, "MAX_MEMBERS", 2)
    granted(s, ch.decide_create(book(s), "a", "p/a", ""))
    granted(s, ch.decide_create(book(s), "b", "p/a", ""))
    assert ch.decide_create(book(s), "c", "p/a", "").text == "channel registry is full"
    granted(s, ch.decide_invite(book(s), "a", "p/a", "p/b"))
    assert "outstanding invites" in ch.decide_invite(book(s), "a", "p/a", "p/c").text
    granted(s, ch.decide_join(book(s), "a", "p/b"))
    granted(s, ch.decide_invite(book(s), "a", "p/a", "p/c"))
    assert "members (the limit)" in ch.decide_join(book(s), "a", "p/c").text


def test_history_is_projected_from_channel_chats_and_bounded():
    s = fresh()
    granted(s, ch.decide_create(book(s), "ops", "p/a", ""))
    for i in range(ch.HISTORY_LIMIT + 5):
        apply(s, Event(100 + i, 0.0, CHAT, {"sender": "p/a", "target": "all", "payload": str(i),
                                            "channel": " ops", "msg_id": i + 1}))
    apply(s, Event(999, 0.0, CHAT, {"sender": "p/a", "target": "all", "payload": "plain",
                                    "msg_id": 999}))
    hist = book(s).history_for("ops", "p/a", 3)
    assert [m["payload"] for m in hist] == [str(ch.HISTORY_LIMIT + i) for i in (2, 3, 4)]
    assert len(book(s).get("ops").history) == ch.HISTORY_LIMIT
    assert book(s).history_for("ops", "p/b", 3) == []


@pytest.mark.parametrize("value,expected", [(None, 20), ("5", 20), (True, 20), (-3, 0), (7, 7),
                                            (10**9, ch.HISTORY_LIMIT)])
def test_history_limit(value, expected):
    assert ch.history_limit(value) == expected


def test_chat_channel_and_acl_access():
    assert ch.chat_channel({"channel": " ops "}) == "ops"
    assert ch.chat_channel({"channel": "  "}) == ""
    assert ch.chat_channel({}) == ""
    assert required_accesses("channel_join", {"channel": " ops"}, "p/a") == \
        [("message", "channel", "ops")]
    assert required_accesses("channel_list_request", {}, "p/a") == []

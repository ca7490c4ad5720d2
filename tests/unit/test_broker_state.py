"""The broker's state and decisions (seed 004), without IO: every decision is
applied the way the hub applies journal events, and a replay of those events
must give the same state."""

import copy

import orjson
import pytest

from hubd.state import broker as bs
from hubd.state import broker_rules as rules
from hubd.state import broker_views as views
from hubd.state.broker import BrokerState
from hubd.state.broker_rules import Limits, Refusal


class Driver:
    """Applies decisions like the Router does (each event applied as made) and
    keeps the events as the journal would (JSON round trip)."""

    def __init__(self):
        self.state = BrokerState()
        self.now = 1000.0
        self.log = []
        self.listening = set()

    def run(self, decision):
        for kind, payload, route in decision.events:
            stored = orjson.loads(orjson.dumps(payload)), (
                orjson.loads(orjson.dumps(route)) if route is not None else None)
            self.log.append((kind, stored[0], stored[1], self.now))
            self.state.apply(kind, payload, route, self.now)
        return decision.result

    def replayed(self):
        state = BrokerState()
        for kind, payload, route, ts in self.log:
            state.apply(kind, payload, route, ts)
        return state

    def register(self, handle, **extra):
        return self.run(rules.decide_register(self.state, {"clientKind": "cli", "handle": handle,
                                                           **extra}, self.now))

    def session(self, cli_id, event="session-start", pid=100, **extra):
        fields = {"event": event, "client": "claude", "cliSessionId": cli_id,
                  "host": {"hostPid": pid, "hostStart": 1}, **extra}
        return self.run(rules.decide_session(self.state, fields, self.now))

    def send(self, sender, to, body="hello", thread=None, via=None, limits=rules.DEFAULT_LIMITS,
             **extra):
        return self.run(rules.decide_send(self.state, sender, via,
                                          {"threadId": thread, "to": to, "body": body, **extra},
                                          self.now, self.listening, limits=limits,
                                          hub_target=lambda t: None if t.startswith("proj/")
                                          else f"no hub target {t}"))

    def reply(self, sender, message_id, body="ok", verdict=None, via=None):
        fields = {"messageId": message_id, "body": body}
        if verdict:
            fields["verdict"] = verdict
        return self.run(rules.decide_reply(self.state, sender, via, fields, self.now,
                                           self.listening))


@pytest.fixture
def d():
    driver = Driver()
    for handle in ("alice", "bob", "carol"):
        driver.register(handle)
    yield driver
    assert driver.replayed() == driver.state, "projection differs from replay"


def test_slug_rules():
    assert rules.slug("Fix the Parser!") == "fix-the-parser"
    assert rules.slug("  --Über  cool__thing--  ") == "ber-cool-thing"
    assert rules.slug("a" * 60) == "a" * 48
    assert rules.slug("x" * 47 + " yz") == "x" * 47  # no trailing hyphen after the cut
    assert rules.slug("!!!") == ""


def test_send_to_two_handles_makes_a_thread_with_deliveries(d):
    d.listening = {"bob"}
    result = d.send("alice", ["bob", "carol"], "Question?\nsecond line")
    assert result == {"messageId": 1, "threadId": 1, "seq": 1, "via": None,
                      "deliveries": [{"to": "bob", "state": "sent"},
                                     {"to": "carol", "state": "queued"}]}
    assert d.state.threads[1].subject == "Question?"
    assert d.state.unread_of("bob") == 1 and d.state.unread_of("carol") == 1


def test_reply_goes_to_every_sender_recipient_and_via_minus_the_replier(d):
    d.register("dave")
    d.send("alice", ["bob", "carol"], via="dave")
    r = d.reply("bob", 1, verdict="agree")
    assert r == {"messageId": 2, "threadId": 1, "seq": 2}
    assert d.state.messages[2].to == ("alice", "carol", "dave")
    assert d.state.delivery_state("bob", 1) == "replied"
    assert d.state.unread_of("bob") == 0
    d.reply("carol", 2, verdict="disagree")
    assert d.state.messages[3].to == ("alice", "bob", "dave")
    tally = views.collect_view(d.state, 1)
    assert tally["askMessageId"] == 1
    assert tally["verdictTally"] == {"agree": 1, "disagree": 1, "info": 0, "none": 0}
    assert [(r["handle"], r["state"], r["verdict"]) for r in tally["recipients"]] == [
        ("bob", "replied", "agree"), ("carol", "replied", "disagree")]


def test_wait_conditions(d):
    d.send("alice", ["bob", "carol"])
    assert views.wait_condition(d.state, 1, "any_replied")[0] is False
    d.reply("bob", 1)
    assert views.wait_condition(d.state, 1, "any_replied")[0] is True
    assert views.wait_condition(d.state, 1, "all_replied")[0] is False
    d.reply("carol", 1, verdict="info")
    met, matrix = views.wait_condition(d.state, 1, "all_replied")
    assert met and [row["state"] for row in matrix] == ["replied", "replied"]


def test_send_to_a_group_excludes_the_sender_and_groups_verbs(d):
    assert d.run(rules.decide_groups(d.state, {"action": "create", "name": "team",
                                              "members": ["alice", "bob"]})) == {
        "group": {"name": "team", "members": ["alice", "bob"]}}
    assert d.run(rules.decide_groups(d.state, {"action": "add", "name": "team",
                                              "members": ["carol", "bob"]})) == {
        "group": {"name": "team", "members": ["alice", "bob", "carol"]}}
    result = d.send("alice", "team")
    assert [x["to"] for x in result["deliveries"]] == ["bob", "carol"]
    d.run(rules.decide_groups(d.state, {"action": "remove", "name": "team",
                                        "members": ["bob"]}))
    assert d.run(rules.decide_groups(d.state, {"action": "list"})) == {
        "groups": [{"name": "team", "members": ["alice", "carol"]}]}
    assert d.run(rules.decide_groups(d.state, {"action": "delete", "name": "team"})) == {
        "deleted": "team"}
    for fields, code in [({"action": "delete", "name": "team"}, "unknown_group"),
                         ({"action": "add", "name": "nope", "members": ["bob"]}, "unknown_group"),
                         ({"action": "create", "name": "bob"}, "bad_request"),
                         ({"action": "create", "name": "x1", "members": ["zed"]},
                          "unknown_handle"),
                         ({"action": "create"}, "bad_request")]:
        with pytest.raises(Refusal) as refused:
            rules.decide_groups(d.state, fields)
        assert refused.value.code == code


def test_send_refusals_change_nothing(d):
    before = copy.deepcopy(d.state)
    cases = [
        (dict(to="zed"), "unknown_handle"),
        (dict(to="local/zed"), "unknown_handle"),
        (dict(to="other/x@west"), "unknown_handle"),
        (dict(to="alice"), "bad_request"),  # nobody besides the sender
        (dict(to="bob", thread=9), "unknown_thread"),
        (dict(to="bob", references=[77]), "unknown_message"),
    ]
    for kwargs, code in cases:
        with pytest.raises(Refusal) as refused:
            d.send("alice", **kwargs)
        assert refused.value.code == code, kwargs
    assert d.state == before and d.log[-1][0] == bs.PEER


def test_namespace_handles_and_hub_targets(d):
    result = d.send("alice", ["local/bob", "proj/seat", "bob"])
    assert [x["to"] for x in result["deliveries"]] == ["bob", "proj/seat"]
    assert result["deliveries"][1]["state"] == "sent"


def test_rate_limit_counts_sends_and_replies_per_handle(d):
    for i in range(19):
        d.send("alice", "bob", f"m{i}")
        d.now += 1
    d.reply("alice", 1, "a reply counts too")
    with pytest.raises(Refusal) as refused:
        d.send("alice", "bob", "one too many")
    assert refused.value.code == "rate_limited"
    d.send("bob", "alice", "bob has his own window")
    d.now = 1000.0 + 60.5  # the first send left the window
    d.send("alice", "bob", "fits again")
    lifted = Limits(rate_sends=None)
    for i in range(30):
        d.send("alice", "carol", f"x{i}", limits=lifted)


def test_duplicate_window(d):
    d.send("alice", "bob", "same")
    d.now += 59
    with pytest.raises(Refusal) as refused:
        d.send("alice", "bob", "same")
    assert refused.value.code == "duplicate" and refused.value.extra == {"messageId": 1}
    d.send("alice", "carol", "same")  # other recipients: another message
    d.send("alice", "bob", "same", thread=1)  # in the thread: another message
    d.now += 1.5
    d.send("alice", "bob", "same")  # the window has passed
    d.reply("bob", 1, "yes")
    with pytest.raises(Refusal):
        d.reply("bob", 1, "yes")


def test_thread_cap(d):
    lifted = Limits(rate_sends=None, thread_cap=5)
    d.send("alice", "bob", "0")
    for i in range(4):
        d.send("alice", "bob", f"n{i}", thread=1, limits=lifted)
    with pytest.raises(Refusal) as refused:
        d.send("alice", "bob", "full", thread=1, limits=lifted)
    assert refused.value.code == "cap_thread"
    d.send("alice", "bob", "a new thread is fine", limits=lifted)


def test_thread_cap_default_is_500(d):
    lifted = Limits(rate_sends=None)
    d.send("alice", "bob", "0")
    for i in range(499):
        d.send("alice", "carol", f"n{i}", thread=1, limits=lifted)
        if i % 150 == 0:
            d.run(rules.decide_advance(d.state, "carol", list(d.state.deliveries["carol"]),
                                       "acknowledged"))
    assert len(d.state.threads[1].messages) == 500
    with pytest.raises(Refusal) as refused:
        d.reply("bob", 1)
    assert refused.value.code == "cap_thread"


def test_unread_cap_and_ack_frees_room(d):
    lifted = Limits(rate_sends=None)
    for i in range(200):
        d.send("alice", "bob", f"m{i}", limits=lifted)
    assert d.state.unread_of("bob") == 200
    with pytest.raises(Refusal) as refused:
        d.send("carol", ["alice", "bob"], "no room")
    assert refused.value.code == "cap_inbox"
    assert d.state.unread_of("alice") == 0  # nothing half-applied
    # delivered is still unread; acknowledged is not
    d.run(rules.decide_advance(d.state, "bob", [1, 2], "delivered"))
    assert d.state.unread_of("bob") == 200
    d.run(rules.decide_advance(d.state, "bob", [1, 2], "acknowledged"))
    assert d.state.unread_of("bob") == 198
    d.send("carol", "bob", "room again")


def test_delivery_states_only_move_forward_and_need_a_delivery(d):
    d.send("alice", "bob")
    d.run(rules.decide_advance(d.state, "bob", [1], "acknowledged"))
    assert d.run(rules.decide_advance(d.state, "bob", [1], "delivered")) == {}
    assert d.state.delivery_state("bob", 1) == "acknowledged"
    assert len([e for e in d.log if e[0] == bs.DELIVERIES]) == 1  # the no-op made no event
    with pytest.raises(Refusal) as refused:
        rules.decide_advance(d.state, "carol", [1], "acknowledged")
    assert refused.value.code == "unknown_message"
    with pytest.raises(Refusal):
        rules.decide_advance(d.state, "bob", [1, 99], "delivered")
    d.run(rules.decide_read(d.state, "bob", [1]))
    assert d.state.delivery_state("bob", 1) == "acknowledged"


def test_read_marks_delivered(d):
    d.send("alice", "bob")
    d.run(rules.decide_read(d.state, "bob", [1]))
    assert d.state.delivery_state("bob", 1) == "delivered"
    with pytest.raises(Refusal) as refused:
        rules.decide_read(d.state, "bob", [5])
    assert refused.value.code == "unknown_message"


def test_body_is_cut_to_4000_characters(d):
    result = d.send("alice", "bob", "x" * 5000)
    message = d.state.messages[result["messageId"]]
    assert len(message.body) == 4000 and message.body_length == 5000
    text = views.push_text(message)
    assert "[cut to 4000 of 5000 characters]" in text
    view = views.message_view(message, True)
    assert view["truncated"] is True and len(view["body"]) == 4000


def test_session_handles_titles_resume_clear_and_pinning():
    d = Driver()
    assert d.session("s1") == {"handle": "claude-1"}
    assert d.session("s2", pid=200) == {"handle": "claude-2"}
    # resume: same id keeps the handle
    assert d.session("s1", event="prompt") == {"handle": "claude-1"}
    assert d.state.sessions[("claude", "s1")].state == "busy"
    # /clear: a new id from the same live host process keeps the handle
    assert d.session("s1-cleared", event="session-start") == {"handle": "claude-1"}
    assert ("claude", "s1") not in d.state.sessions
    # a title renames the automatic handle to its slug, and what it had follows
    d.register("alice")
    d.send("alice", "claude-1", "for you")
    assert d.session("s1-cleared", event="prompt", title="Parser Fixes!") == {
        "handle": "parser-fixes"}
    assert "claude-1" not in d.state.peers
    assert d.state.delivery_state("parser-fixes", 1) == "queued"
    assert d.state.threads[1].recipients == {"parser-fixes": None}
    assert d.state.sessions[("claude", "s1-cleared")].display == "Parser Fixes!"
    # a title whose slug is taken leaves the handle
    assert d.session("s2", pid=200, title="parser fixes") == {"handle": "claude-2"}
    # an explicit handle pins: titles no longer rename it
    assert d.session("s2", pid=200, handle="reviewer") == {"handle": "reviewer"}
    assert d.session("s2", pid=200, title="Something else") == {"handle": "reviewer"}
    with pytest.raises(Refusal):  # a live session holds it
        rules.decide_session(d.state, {"event": "prompt", "client": "codex",
                                       "cliSessionId": "z", "handle": "reviewer",
                                       "host": {"hostPid": 9, "hostStart": 1}}, d.now)
    assert d.replayed() == d.state


def test_via_resolves_the_nearest_live_session_among_ancestors():
    d = Driver()
    d.session("s1", pid=100)
    d.session("s2", pid=200)
    assert rules.resolve_via(d.state, [999, 200, 100]) == "claude-2"
    d.session("s2", pid=200, event="session-end")
    assert rules.resolve_via(d.state, [999, 200, 100]) == "claude-1"
    assert rules.resolve_via(d.state, [5]) is None
    result = d.register("renn", owner=True, ancestors=[100])
    assert result == {"handle": "renn", "owner": True}
    via = rules.resolve_via(d.state, [100])
    sent = d.send("renn", "claude-2", "from the owner", via=via)
    assert sent["via"] == "claude-1"
    message = d.state.messages[sent["messageId"]]
    assert views.tag_line(message) == "[murmur m1 from renn via claude-1 | thread 1 #1]"
    # the via is in the thread: a reply reaches it
    d.reply("claude-2", 1)
    assert d.state.messages[2].to == ("renn", "claude-1")


def test_owner_is_one_handle(d):
    assert d.register("renn", owner=True) == {"handle": "renn", "owner": True}
    assert rules.decide_register(d.state, {"clientKind": "cli", "owner": True},
                                 d.now).result == {"handle": "renn", "owner": True}
    with pytest.raises(Refusal):
        rules.decide_register(d.state, {"clientKind": "cli", "owner": True, "handle": "x1"},
                              d.now)
    # re-registering with the same facts journals nothing
    n = len(d.log)
    d.register("renn", owner=True)
    assert len(d.log) == n


def test_automatic_register_handles(d):
    assert rules.decide_register(d.state, {"clientKind": "hook"}, d.now).result["handle"] == \
        "hook-1"
    assert rules.decide_register(d.state, {"clientKind": "cli", "client": "codex"},
                                 d.now).result["handle"] == "codex-1"


def test_prune_deletes_only_what_the_seed_allows(d):
    d.register("idle-one")
    d.register("grouped")
    d.register("connected")
    d.register("renn", owner=True)
    d.session("s1")
    d.run(rules.decide_groups(d.state, {"action": "create", "name": "g1",
                                        "members": ["grouped"]}))
    d.send("alice", "bob")
    result = d.run(rules.decide_prune(d.state, connected={"connected"}))
    assert result == {"removed": ["carol", "idle-one"]}
    assert "carol" not in d.state.peers and "alice" in d.state.peers
    assert d.run(rules.decide_prune(d.state, connected=set())) == {"removed": ["connected"]}


def test_push_text_is_exact(d):
    d.send("alice", "bob", "Ship it?\nThe tests pass.")
    d.reply("bob", 1, "Yes.", verdict="agree")
    first, second = d.state.messages[1], d.state.messages[2]
    assert views.push_text(first) == (
        "[murmur m1 from alice | thread 1 #1]\n"
        "Ship it?\nThe tests pass.\n"
        "(reply with messageId 1, verdict agree, disagree or info; "
        "the reply goes to everyone in thread 1)")
    assert views.push_text(second) == (
        "[murmur m2 from bob | thread 1 #2 | reply to m1 | agree]\n"
        "Yes.\n"
        "(reply with messageId 2, verdict agree, disagree or info; "
        "the reply goes to everyone in thread 1)")
    assert views.push_text(first, "notify") == (
        "[murmur m1 from alice | thread 1 #1]\n"
        "Ship it?\n"
        "(notify: read m1 for the whole message)\n"
        "(reply with messageId 1, verdict agree, disagree or info; "
        "the reply goes to everyone in thread 1)")
    payload = views.push_payload(first)
    assert payload["mode"] == "push" and payload["text"] == views.push_text(first)
    assert payload["footer"] == views.footer(first) and payload["message"]["body"].startswith(
        "Ship")


def test_notification_items():
    assert views.notification("peer_offline", handle="bob", threadId=3, messageId=9) == {
        "kind": "peer_offline", "handle": "bob", "threadId": 3, "messageId": 9,
        "text": "bob is not listening; m9 (thread 3) is queued for it"}
    assert views.notification("reply_arrived", threadId=7, fromHandle="x", messageId=2)[
        "text"] == "reply m2 from x arrived in thread 7"
    assert views.notification("queued_delivered", handle="bob", threadId=3, messageId=9)[
        "text"] == "m9 (thread 3), queued for bob, was delivered"


def test_thread_views(d):
    d.send("alice", ["bob", "carol"], "ask\nmore")
    d.reply("bob", 1, "b1")
    d.reply("carol", 1, "c1")
    d.reply("alice", 2, "to b1")
    view = views.thread_view(d.state, 1, None, False)
    assert view["latestSeq"] == 4 and [m["seq"] for m in view["messages"]] == [1, 2, 3, 4]
    assert "body" not in view["messages"][0] and view["messages"][0]["firstLine"] == "ask"
    since = views.thread_view(d.state, 1, 2, True)
    assert [m["messageId"] for m in since["messages"]] == [3, 4]
    assert since["messages"][0]["body"] == "c1"
    only = views.thread_view(d.state, 1, None, False, message_id=2)
    assert [m["messageId"] for m in only["messages"]] == [2, 4]
    assert only["messages"][1]["body"] == "to b1"


def test_inbox_view(d):
    d.send("alice", "bob", "one")
    d.send("carol", "bob", "two")
    d.run(rules.decide_advance(d.state, "bob", [1], "acknowledged"))
    unread = views.inbox_view(d.state, "bob", True)
    assert unread["unreadTotal"] == 1
    assert [(t["threadId"], t["unread"]) for t in unread["threads"]] == [(2, 1)]
    everything = views.inbox_view(d.state, "bob", False)
    assert [t["threadId"] for t in everything["threads"]] == [2, 1]
    assert everything["threads"][1]["messages"][0]["state"] == "acknowledged"


def test_presence(d):
    assert views.presence(d.state, "alice", connected={"alice"}) == "online"
    assert views.presence(d.state, "alice", connected=set()) == "offline"
    d.session("s1")
    assert views.presence(d.state, "claude-1", set()) == "presumed-offline"
    assert views.presence(d.state, "claude-1", {"claude-1"}) == "online"
    d.session("s1", event="prompt")
    assert views.presence(d.state, "claude-1", {"claude-1"}) == "busy"
    d.session("s1", event="stop")
    assert views.presence(d.state, "claude-1", {"claude-1"}) == "idle"
    d.session("s1", event="session-end")
    assert views.presence(d.state, "claude-1", {"claude-1"}) == "offline"
    status = views.status_view(d.state, d.now, {"alice"}, {"alice"})
    assert [p["handle"] for p in status["peers"]] == ["alice", "bob", "carol", "claude-1"]
    assert status["peers"][0]["presence"] == "online" and status["peers"][0]["listening"]


def test_hub_chat_and_hub_reply(d):
    result = d.run(rules.decide_hub_chat(d.state, "proj/bob", "alice", "from the hub", d.now,
                                         listening={"alice"}))
    assert result == {"messageId": 1, "threadId": 1, "seq": 1}
    assert d.state.delivery_state("alice", 1) == "sent"
    d.send("alice", "proj/seat", "ask the seat")
    r = d.run(rules.decide_reply(d.state, "proj/seat", None, {"messageId": 2, "body": "done",
                                                              "verdict": "agree"},
                                 d.now, from_hub=True))
    assert r["threadId"] == 2
    assert d.state.messages[3].to == ("alice",)
    assert views.collect_view(d.state, 2)["recipients"][0] == {
        "handle": "proj/seat", "state": "replied", "verdict": "agree", "replyId": 3}
    with pytest.raises(Refusal):
        rules.decide_hub_chat(d.state, "proj/bob", "zed", "x", d.now)


def test_pending_pushes_skip_silent(d):
    d.send("alice", "bob", "loud")
    d.send("alice", "bob", "quiet", mode="silent")
    d.send("carol", "bob", "notify me", mode="notify")
    assert rules.pending_pushes(d.state, "bob", 10) == [1, 3]
    assert rules.pending_pushes(d.state, "bob", 1) == [1]


def test_notification_batches_first_at_once_then_held_for_the_window():
    b = views.NotificationBatcher(window=60)
    one, two, three = ({"kind": "peer_offline", "n": i} for i in range(3))
    assert b.add("bob", one, 100.0) == [one]
    assert b.add("bob", two, 110.0) is None
    assert b.add("bob", three, 150.0) is None
    assert b.add("carol", one, 150.0) == [one]  # per handle
    assert b.next_due() == 160.0
    assert b.due(159.9) == []
    assert b.due(160.0) == [("bob", [two, three])]
    assert b.add("bob", one, 170.0) is None  # the window restarts at each event
    assert b.due(220.0) == [("bob", [one])]
    assert b.add("bob", two, 290.0) == [two]


def test_notification_batches_are_bounded():
    b = views.NotificationBatcher(window=60)
    b.add("bob", {"n": -1}, 0.0)
    for i in range(b.MAX_HELD + 5):
        b.add("bob", {"n": i}, 1.0)
    assert b.dropped == 5
    (handle, batch), = b.due(61.0)
    assert len(batch) == b.MAX_HELD and batch[0] == {"n": 5}


@pytest.mark.parametrize("frame, body, expected", [
    ({"reply_to": "m12"}, "fine", (12, None, "fine")),
    ({"reply_to": 12, "metadata": {"verdict": "agree"}}, "fine", (12, "agree", "fine")),
    ({"metadata": {"verdict": "maybe"}, "reply_to": "12"}, "x", (12, None, "x")),
    ({}, "m7: looks good", (7, None, "looks good")),
    ({}, "m7 disagree: no\nbecause", (7, "disagree", "no\nbecause")),
    ({"reply_to": "m7"}, "m7 info:", (7, "info", "(empty reply)")),
    ({}, "m7 is slow", None),
    ({}, "hello", None),
    ({"reply_to": "x"}, "hello", None),
])
def test_parse_hub_reply(frame, body, expected):
    parsed = rules.parse_hub_reply(frame, body)
    if expected is None:
        assert parsed is None
    else:
        assert (parsed.message_id, parsed.verdict, parsed.body) == expected


def test_proof_tags_match_whole_ids():
    from hubd.doors.broker.proof import found_tags

    text = "x [murmur m12 from a] y [murmur m1234 from b]"
    assert found_tags(text, [12, 123, 1234, 5]) == {12, 1234}
    assert found_tags("", [1]) == set()


def test_events_from_before_via_and_pinned_replay_with_their_defaults():
    """messages.via and sessions.pinned are fields of the journaled events; an
    event written without them (an older journal) replays as via null and
    pinned false."""
    state = BrokerState()
    state.apply(bs.PEER, {"handle": "alice"}, None, 1.0)
    state.apply(bs.PEER, {"handle": "bob"}, None, 1.0)
    state.apply(bs.SESSION, {"client": "claude", "cliSessionId": "s", "handle": "bob",
                             "host": {"hostPid": 1, "hostStart": 1}, "state": "online"},
                None, 2.0)
    state.apply(bs.MESSAGE, {"id": 1, "threadId": 1, "seq": 1, "from": "alice", "to": ["bob"],
                             "body": "old", "bodyLength": 3, "mode": "push"},
                {"states": {"bob": "queued"}}, 3.0)
    assert state.messages[1].via is None
    assert state.session_of("bob").pinned is False
    assert views.message_view(state.messages[1], True)["via"] is None

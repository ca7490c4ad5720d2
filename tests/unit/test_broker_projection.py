"""Property: whatever the broker decides, its state is a projection of the
events it journaled (a replay of them, through JSON as the journal stores
them, gives the same state), and a refused request changes nothing."""

import copy

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hubd.state import broker_rules as rules
from hubd.state.broker_rules import Limits, Refusal

from tests.unit.test_broker_state import Driver

HANDLES = ["alice", "bob", "carol", "dave"]
TARGETS = HANDLES + ["team", "local/bob", "proj/seat", "ghost", ["alice", "bob"],
                     ["carol", "team"]]
BODIES = ["hi", "hi", "Title line\nbody", "x" * 4100]
SMALL = Limits(rate_sends=6, thread_cap=6, unread_cap=5)

who = st.sampled_from(HANDLES)
msg = st.integers(1, 12)
ops = st.one_of(
    st.tuples(st.just("register"), who, st.booleans()),
    st.tuples(st.just("session"), st.sampled_from(["s1", "s2", "s3"]),
              st.sampled_from(["session-start", "prompt", "stop", "session-end"]),
              st.sampled_from([None, "Parser work", "alice", "Review"]),
              st.sampled_from([None, None, "pinned-one"]), st.sampled_from([100, 200])),
    *[st.tuples(st.just("send"), who, st.sampled_from(TARGETS), st.sampled_from(BODIES),
                st.sampled_from([None, 1, 2, 3]), st.sampled_from(["push", "silent", "notify"]),
                st.sampled_from([None, "carol"]))] * 3,
    *[st.tuples(st.just("reply"), who, msg, st.sampled_from(BODIES),
                st.sampled_from([None, "agree", "disagree", "info"]))] * 2,
    st.tuples(st.just("advance"), who, st.lists(msg, min_size=1, max_size=3),
              st.sampled_from(["sent", "delivered", "acknowledged"])),
    st.tuples(st.just("read"), who, st.lists(msg, min_size=1, max_size=3)),
    st.tuples(st.just("group"), st.sampled_from(["create", "add", "remove", "delete"]),
              st.lists(who, max_size=3)),
    st.tuples(st.just("hub"), st.sampled_from(["proj/seat", "proj/x@west"]), who,
              st.sampled_from([None, 1, 2])),
    st.tuples(st.just("prune"), st.lists(who, max_size=2)),
    st.tuples(st.just("tick"), st.sampled_from([0.5, 5.0, 30.0, 61.0])),
)


def step(d: Driver, op) -> None:
    kind = op[0]
    state, now = d.state, d.now
    if kind == "register":
        decision = rules.decide_register(state, {"clientKind": "cli", "handle": op[1],
                                                 "owner": op[2]}, now)
    elif kind == "session":
        fields = {"event": op[2], "client": "claude", "cliSessionId": op[1],
                  "host": {"hostPid": op[5], "hostStart": 1}}
        if op[3]:
            fields["title"] = op[3]
        if op[4]:
            fields["handle"] = op[4]
        decision = rules.decide_session(state, fields, now)
    elif kind == "send":
        decision = rules.decide_send(state, op[1], op[6], {"threadId": op[4], "to": op[2],
                                                           "body": op[3], "mode": op[5]},
                                     now, d.listening, limits=SMALL,
                                     hub_target=lambda t: None if t.startswith("proj/") else "no")
    elif kind == "reply":
        fields = {"messageId": op[2], "body": op[3]}
        if op[4]:
            fields["verdict"] = op[4]
        decision = rules.decide_reply(state, op[1], None, fields, now, d.listening, SMALL)
    elif kind == "advance":
        decision = rules.decide_advance(state, op[1], op[2], op[3])
    elif kind == "read":
        decision = rules.decide_read(state, op[1], op[2])
    elif kind == "group":
        decision = rules.decide_groups(state, {"action": op[1], "name": "team",
                                               "members": op[2]})
    elif kind == "hub":
        if op[3] is None:
            decision = rules.decide_hub_chat(state, op[1], op[2], "from the hub", now,
                                             d.listening, SMALL)
        else:
            decision = rules.decide_reply(state, op[1], None, {"messageId": op[3],
                                                               "body": "hub reply"},
                                          now, d.listening, SMALL, from_hub=True)
    elif kind == "prune":
        decision = rules.decide_prune(state, set(op[1]))
    else:
        d.now += op[1]
        return
    d.run(decision)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(ops, min_size=1, max_size=60), st.sets(who))
def test_projection_equals_replay_and_refusals_change_nothing(steps, listening):
    d = Driver()
    d.listening = listening
    for op in steps:
        before = copy.deepcopy(d.state)
        logged = len(d.log)
        try:
            step(d, op)
        except Refusal:
            assert d.state == before, op
            assert len(d.log) == logged
    assert d.replayed() == d.state
    # invariants the views rely on
    for recipient, table in d.state.deliveries.items():
        unread = sum(1 for s in table.values() if s in ("queued", "sent", "delivered"))
        assert d.state.unread_of(recipient) == unread
    for thread in d.state.threads.values():
        assert [d.state.messages[i].seq for i in thread.messages] == list(
            range(1, len(thread.messages) + 1))
        assert len(thread.messages) <= SMALL.thread_cap

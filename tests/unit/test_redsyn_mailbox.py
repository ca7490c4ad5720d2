"""The REDSYN mailbox as a pure projection: decisions, apply, and the
property that the live state equals a replay of its events."""

import json
from itertools import count

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st

from hubd.state import redsyn as mb
from hubd.state.principals import make_principal
from hubd.state.redsyn import links
from hubd.wire.redsyn import e2e, signing
from hubd.wire.redsyn.envelope import RedsynError, b64url, validate

JOEL = mb.Node("acme/dev/joel:laptop", "acme/dev/joel")
JOEL_SERVER = mb.Node("acme/dev/joel:server", "acme/dev/joel")
ANA = mb.Node("acme/ops/ana:laptop", "acme/ops/ana")
BOB = mb.Node("globex/erp/bob:box", "globex/erp/bob")


class Hub:
    """Decisions applied as the Router applies them; every event is kept so
    the test can replay them."""

    def __init__(self, limits=mb.Limits()):
        self.state = mb.RedsynState()
        self.events = []
        self.now = 1_790_000_000.0
        self.limits = limits
        self.ids = count(1)

    def run(self, decision):
        for kind, payload in decision.events:
            # through JSON, as the journal stores it
            payload = json.loads(json.dumps(payload))
            self.events.append((kind, payload, self.now))
            mb.apply(self.state, kind, payload, self.now)
        return decision.answer

    def post(self, node, **fields):
        document = {"v": 1, "kind": "request", "body": {"type": "text/plain", "text": "hi"},
                    **fields}
        document = {k: v for k, v in document.items() if v is not None}
        incoming = validate(document, node.person, len(json.dumps(document)))
        return self.run(mb.decide_post(self.state, node, incoming, self.now, self.limits,
                                       new_id=lambda: f"auto{next(self.ids)}"))

    def take(self, node, agent, lease=900, limit=100):
        return self.run(mb.decide_take(self.state, node, agent, lease, limit, self.now))

    def ack(self, node, agent, ids):
        return self.run(mb.decide_ack(self.state, node, agent, {"ids": ids}))

    def sweep(self):
        return self.run(mb.Decision(mb.sweep(self.state, self.now)))

    def replayed(self):
        state = mb.RedsynState()
        for kind, payload, ts in self.events:
            mb.apply(state, kind, payload, ts)
        return state


SHOUT = "acme/dev/joel/shout"
CLI = "acme/dev/joel/cli"
ORGS = {"acme": {"redsyn_version": "2026-09-25"}, "globex": {"redsyn_version": "2026-09-25"}}
ACME_ADMIN = mb.Node("acme/it/ivan:laptop", "acme/it/ivan",
                     make_principal("acme/it/ivan", ["acme/it/ivan/*"], {"org_admin": ["acme"]}))
GLOBEX_ADMIN = mb.Node("globex/it/gus:laptop", "globex/it/gus",
                       make_principal("globex/it/gus", ["globex/it/gus/*"],
                                      {"org_admin": ["globex"]}))


def linked(hub, acme_terms=None, globex_terms=None) -> str:
    """An active link between acme and globex, proposed by acme's admin and
    accepted by globex's; its id."""
    proposal = {"org": "acme", "peer": "globex"}
    if acme_terms is not None:
        proposal["terms"] = acme_terms
    made = hub.run(links.decide_propose(hub.state, ACME_ADMIN, proposal, ORGS, hub.now,
                                        new_id=lambda: f"lnk-{next(hub.ids)}"))
    accept = {} if globex_terms is None else {"terms": globex_terms}
    hub.run(links.decide_change(hub.state, GLOBEX_ADMIN, made["id"], "accept", accept,
                                hub.now)[0])
    return made["id"]


def test_request_take_reply_ack_round_trip():
    hub = Hub()
    answer = hub.post(JOEL, id="q1", **{"from": "cli", "to": "shout"})
    assert answer["from"] == f"{CLI}#s1" and answer["to"] == f"{SHOUT}#s1"
    [item] = hub.take(JOEL, SHOUT)
    assert item["id"] == "q1" and item["attempts"] == 1 and item["to"] == f"{SHOUT}#s1"
    assert item["expires"] == item["ts"] + 86400 and item["signed"] is False
    reply = hub.post(JOEL, id="r1", kind="reply", reply_to="q1", **{"from": SHOUT})
    assert reply["to"] == f"{CLI}#s1" and reply["from"] == f"{SHOUT}#s1"
    # the reply closed the request: nothing is left in shout's box
    assert SHOUT not in hub.state.boxes
    assert hub.state.messages["q1"].closed
    [got] = hub.take(JOEL, CLI)
    assert got["kind"] == "reply" and got["reply_to"] == "q1" and got["thread"] == "q1"
    assert hub.ack(JOEL, CLI, ["r1"]) == {"acked": ["r1"], "unknown": []}
    assert hub.state.boxes == {} and hub.state.pending == {}
    with pytest.raises(RedsynError) as err:
        hub.post(JOEL, id="r2", kind="reply", reply_to="q1", **{"from": SHOUT})
    assert err.value.status == 409


def test_progress_does_not_close_and_only_the_asked_agent_answers():
    hub = Hub()
    hub.post(JOEL, id="q1", **{"from": "cli", "to": "shout"})
    hub.post(JOEL, id="p1", kind="progress", reply_to="q1", **{"from": SHOUT})
    assert not hub.state.messages["q1"].closed and "q1" in hub.state.boxes[SHOUT]
    with pytest.raises(RedsynError) as err:
        hub.post(JOEL, id="r1", kind="reply", reply_to="q1", **{"from": "other"})
    assert err.value.status == 403
    with pytest.raises(RedsynError) as err:
        hub.post(JOEL, id="r1", kind="reply", reply_to="nope", **{"from": SHOUT})
    assert err.value.status == 404


def test_a_lapsed_lease_redelivers_and_ten_takes_give_up_with_an_error_reply():
    hub = Hub()
    hub.post(JOEL, id="q1", **{"from": "cli", "to": "shout"})
    for attempt in range(1, 11):
        [item] = hub.take(JOEL, SHOUT, lease=30)
        assert item["attempts"] == attempt
        assert hub.take(JOEL, SHOUT, lease=30) == []  # still leased
        hub.now += 31
    assert hub.take(JOEL, SHOUT) == []
    [error] = hub.take(JOEL, CLI)
    assert error["error"] is True and error["reply_to"] == "q1" and error["kind"] == "reply"
    assert error["body"]["text"] == (f"not delivered: {SHOUT} took it 10 times and never "
                                     "confirmed it")
    assert error["to"] == f"{CLI}#s1"


def test_next_ready_is_when_the_earliest_lease_lapses():
    hub = Hub()
    assert mb.next_ready(hub.state, JOEL, SHOUT, hub.now) is None  # no box
    hub.post(JOEL, id="q1", **{"from": "cli", "to": "shout"})
    hub.post(JOEL, id="q2", session="s2", **{"from": "cli", "to": "shout"})
    assert mb.next_ready(hub.state, JOEL, SHOUT, hub.now) is None  # both ready now
    taken_at = hub.now
    [first] = hub.take(JOEL, SHOUT, lease=30, limit=1)
    hub.now += 10
    [second] = hub.take(JOEL, SHOUT, lease=30, limit=1)
    assert (first["id"], second["id"]) == ("q1", "q2")
    assert mb.next_ready(hub.state, JOEL, SHOUT, hub.now) == taken_at + 30
    hub.now = taken_at + 30  # q1's lease lapses at that instant: no longer "after now"
    assert mb.next_ready(hub.state, JOEL, SHOUT, hub.now) == taken_at + 40
    [again] = hub.take(JOEL, SHOUT, lease=30)
    assert again["id"] == "q1" and again["attempts"] == 2


def test_a_poll_answers_items_or_when_to_look_again():
    hub = Hub()
    hub.post(JOEL, id="q1", **{"from": "cli", "to": "shout"})
    items, ready_at = hub.run(mb.decide_poll(hub.state, JOEL, SHOUT, 30, 100, hub.now))
    assert [i["id"] for i in items] == ["q1"] and ready_at is None
    assert hub.run(mb.decide_poll(hub.state, JOEL, SHOUT, 30, 100, hub.now)) == \
        ([], hub.now + 30)


def test_next_ready_leaves_out_what_another_machine_holds_sealed():
    hub = Hub()
    hub.post(JOEL, id="q1", **{"from": "cli", "to": "shout"})
    hub.take(JOEL, SHOUT, lease=30)
    delivery = hub.state.boxes[SHOUT]["q1"]
    delivery.reserved_node = JOEL_SERVER.id
    assert mb.next_ready(hub.state, JOEL, SHOUT, hub.now) is None
    assert mb.next_ready(hub.state, JOEL_SERVER, SHOUT, hub.now) == delivery.lease_until


def test_the_sweeper_gives_up_without_a_take_too():
    hub = Hub()
    hub.post(JOEL, id="q1", ttl=60, **{"from": "cli", "to": "shout"})
    hub.now += 59
    assert hub.sweep() is None and hub.state.boxes[SHOUT]
    hub.now += 2
    hub.sweep()
    assert SHOUT not in hub.state.boxes
    [error] = hub.take(JOEL, CLI)
    assert error["body"]["text"] == f"not delivered: it expired before {SHOUT} took it"


def test_cancel_takes_back_only_an_untaken_request_of_ones_own():
    hub = Hub()
    hub.post(JOEL, id="q1", **{"from": "cli", "to": "shout"})
    hub.post(JOEL, id="q2", **{"from": "cli", "to": "shout"})
    with pytest.raises(RedsynError) as err:
        hub.run(mb.decide_cancel(hub.state, ANA, "q1"))
    assert err.value.status == 403
    assert hub.run(mb.decide_cancel(hub.state, JOEL, "q1")) == {"id": "q1", "cancelled": True}
    [item] = hub.take(JOEL, SHOUT)
    assert item["id"] == "q2"
    with pytest.raises(RedsynError) as err:
        hub.run(mb.decide_cancel(hub.state, JOEL, "q2"))
    assert err.value.status == 409
    with pytest.raises(RedsynError) as err:
        hub.run(mb.decide_cancel(hub.state, JOEL, "q1"))
    assert err.value.status == 404


def test_sessions_new_thread_new_session_and_new_forces_one():
    hub = Hub()
    a = hub.post(JOEL, id="q1", **{"from": "cli", "to": "shout"})
    b = hub.post(JOEL, id="q2", thread="q1", **{"from": "cli", "to": "shout"})
    c = hub.post(JOEL, id="q3", **{"from": "cli", "to": "shout"})
    d = hub.post(JOEL, id="q4", thread="q1", **{"from": "cli#new", "to": "shout"})
    assert a["from"] == b["from"] == f"{CLI}#s1"
    assert c["from"] == f"{CLI}#s2" and d["from"] == f"{CLI}#s3"
    assert a["to"] == b["to"] == d["to"] == f"{SHOUT}#s1" and c["to"] == f"{SHOUT}#s2"


def test_order_is_kept_per_session_not_globally():
    hub = Hub()
    hub.post(JOEL, id="a1", **{"from": "cli", "to": "shout"})
    hub.post(JOEL, id="b1", **{"from": "cli", "to": "shout"})
    hub.post(JOEL, id="a2", thread="a1", **{"from": "cli", "to": "shout"})
    assert [i["id"] for i in hub.take(JOEL, SHOUT, limit=1)] == ["a1"]
    # a1 is leased: its session waits; the other session goes on
    assert [i["id"] for i in hub.take(JOEL, SHOUT)] == ["b1"]
    hub.ack(JOEL, SHOUT, ["a1"])
    assert [i["id"] for i in hub.take(JOEL, SHOUT)] == ["a2"]


def test_policy_is_enforced_before_storing():
    hub = Hub()
    hub.run(mb.decide_announce(hub.state, ANA, "acme/ops/ana/deploy",
                               {"listening": True, "policy": {"requests_from": ["acme/ops"]}}))
    with pytest.raises(RedsynError) as err:
        hub.post(JOEL, id="q1", **{"from": "cli", "to": "acme/ops/ana/deploy"})
    assert err.value.status == 403 and "acme/ops" in err.value.error
    assert hub.state.messages == {}
    hub.post(ANA, id="q2", **{"from": "cli", "to": "deploy"})
    with pytest.raises(RedsynError) as err:  # other org, no policy naming it
        hub.post(BOB, id="q3", **{"from": "x", "to": "acme/dev/joel/shout"})
    assert err.value.status == 403
    hub.run(mb.decide_announce(hub.state, JOEL, SHOUT, {"listening": True, "policy": {
        "requests_from": ["globex/erp"], "encrypted_only": True}}))
    with pytest.raises(RedsynError) as err:  # requests_from admits no org without a link
        hub.post(BOB, id="q3", **{"from": "x", "to": "acme/dev/joel/shout"})
    assert "no active link" in err.value.error
    linked(hub, acme_terms={"expose": ["acme/dev"], "signed_only": False})
    with pytest.raises(RedsynError) as err:  # over the link, the agent's own policy
        hub.post(BOB, id="q3", **{"from": "x", "to": "acme/dev/joel/shout"})
    assert "encrypted" in err.value.error
    with pytest.raises(RedsynError) as err:  # a policy only with listening: true
        mb.decide_announce(hub.state, JOEL, SHOUT, {"listening": False, "policy": {}})
    assert err.value.status == 400
    with pytest.raises(RedsynError) as err:  # another person's agent
        mb.decide_announce(hub.state, ANA, SHOUT, {"listening": True})
    assert err.value.status == 403


def test_topics_give_each_subscriber_a_session_of_its_own():
    hub = Hub()
    for agent in ("shout", "cli"):
        hub.run(mb.decide_subscribe(hub.state, JOEL, "topic:acme/dev/news",
                                    {"agent": f"acme/dev/joel/{agent}"}))
    hub.post(JOEL, id="q0", **{"from": "shout", "to": "cli"})  # cli's s1 is taken
    hub.post(JOEL, id="e1", kind="event", **{"from": "shout", "to": "topic:acme/dev/news"})
    assert SHOUT not in hub.state.boxes or "e1" not in hub.state.boxes[SHOUT]
    [q0, e1] = hub.take(JOEL, CLI)
    assert e1["topic"] == "topic:acme/dev/news" and e1["to"] == f"{CLI}#s1"
    assert q0["to"] == f"{CLI}#s2"
    with pytest.raises(RedsynError) as err:
        hub.run(mb.decide_subscribe(hub.state, BOB, "topic:acme/dev/news",
                                    {"agent": "globex/erp/bob/x"}))
    assert err.value.status == 403


def test_quotas():
    hub = Hub(mb.Limits(messages_per_day=3, pending_messages=2, pending_bytes=10**9))
    hub.post(JOEL, id="q1", **{"from": "cli", "to": "shout"})
    hub.post(JOEL, id="q2", **{"from": "cli", "to": "shout"})
    with pytest.raises(RedsynError) as err:
        hub.post(JOEL, id="q3", **{"from": "cli", "to": "shout"})
    assert (err.value.status, err.value.document()["quota"]) == (403, True)
    hub.take(JOEL, SHOUT)
    hub.ack(JOEL, SHOUT, ["q1", "q2"])
    hub.post(JOEL, id="q3", **{"from": "cli", "to": "shout"})
    with pytest.raises(RedsynError) as err:
        hub.post(JOEL, id="q4", **{"from": "cli", "to": "shout"})
    assert (err.value.status, err.value.document()["quota"]) == (429, True)
    hub.now += 86400  # a new day
    hub.take(JOEL, SHOUT)
    hub.ack(JOEL, SHOUT, ["q3"])
    hub.post(JOEL, id="q4", **{"from": "cli", "to": "shout"})


def test_duplicate_ids():
    hub = Hub()
    first = hub.post(JOEL, id="q1", **{"from": "cli", "to": "shout"})
    again = hub.post(JOEL, id="q1", **{"from": "cli", "to": "shout"})
    assert again == {**first, "duplicate": True} and len(hub.events) == 1
    with pytest.raises(RedsynError) as err:
        hub.post(JOEL, id="q1", body={"type": "text/plain", "text": "other"},
                 **{"from": "cli", "to": "shout"})
    assert err.value.status == 409


def test_signed_messages_carry_their_payload_node_and_fingerprint():
    hub = Hub()
    private = Ed25519PrivateKey.generate()
    public = b64url(private.public_key().public_bytes_raw())
    hub.run(mb.decide_key(hub.state, JOEL, {"public_key": public}))
    document = {"v": 1, "id": "q1", "kind": "request", "from": "cli", "to": "shout",
                "ts": int(hub.now), "body": {"type": "text/plain", "text": "hi"}}
    document["sig"] = signing.sign(private, document)
    incoming = validate(document, JOEL.person, len(json.dumps(document)))
    hub.run(mb.decide_post(hub.state, JOEL, incoming, hub.now))
    [item] = hub.take(JOEL, SHOUT)
    assert item["signed"] is True and signing.signed_by(item) == public
    assert item["sig"]["node"] == JOEL.id and item["sig"]["fingerprint"].startswith("sha256:")
    with pytest.raises(RedsynError) as err:  # a second key needs rotate
        other = b64url(Ed25519PrivateKey.generate().public_key().public_bytes_raw())
        mb.decide_key(hub.state, JOEL, {"public_key": other})
    assert err.value.status == 409
    hub.run(mb.decide_key(hub.state, JOEL, {"public_key": other, "rotate": True}))
    document["id"] = "q2"
    incoming = validate(document, JOEL.person, len(json.dumps(document)))
    with pytest.raises(RedsynError) as err:  # signed with the old key now
        mb.decide_post(hub.state, JOEL, incoming, hub.now)
    assert err.value.status == 401


def test_an_encrypted_request_is_reserved_for_the_node_it_was_sealed_for():
    hub = Hub()
    server_sign = Ed25519PrivateKey.generate()
    server_public = b64url(server_sign.public_key().public_bytes_raw())
    server_enc, server_enc_key = e2e.new_enc_key()
    hub.run(mb.decide_key(hub.state, JOEL_SERVER, {
        "public_key": server_public, "enc_key": server_enc_key,
        "enc_sig": signing.sign_enc_key(server_sign, server_enc_key)}))
    hub.run(mb.decide_announce(hub.state, JOEL_SERVER, SHOUT, {"listening": True}))
    key = mb.key_of(hub.state, ANA, SHOUT)
    assert key["node"] == JOEL_SERVER.id and signing.verify_enc_sig(
        key["signing_key"], key["enc_key"], key["enc_sig"])
    body, _ = e2e.seal(key["enc_key"], "q1", "request", {"type": "text/plain", "text": "s"},
                       [], "replykey")
    hub.post(JOEL, id="q1", body=body, refs=[], **{"from": "cli", "to": "shout"})
    assert hub.take(JOEL, SHOUT) == []          # the laptop does not take it
    [item] = hub.take(JOEL_SERVER, SHOUT)
    assert e2e.open_envelope(item, server_enc)["body"]["text"] == "s"
    with pytest.raises(RedsynError) as err:
        mb.key_of(hub.state, ANA, CLI)
    assert err.value.status == 404
    with pytest.raises(RedsynError) as err:  # a bad enc_sig
        mb.decide_key(hub.state, JOEL_SERVER, {"public_key": server_public,
                                               "enc_key": server_enc_key, "enc_sig": "AAAA"})
    assert err.value.status == 401


def test_webhook_failures_back_off_then_tell_the_sender():
    hub = Hub()
    hub.post(JOEL, id="q1", **{"from": "cli", "to": "shout"})
    hook = mb.Node("hub:webhook", JOEL.person)
    delays = []
    for attempt in range(10):
        [item] = hub.take(hook, SHOUT, lease=60)
        start = hub.now
        hub.run(mb.Decision(mb.webhook_failed(hub.state, SHOUT, "q1", hub.now)))
        delivery = hub.state.boxes.get(SHOUT, {}).get("q1")
        delays.append(delivery.not_before - start)
        hub.now = delivery.not_before
    assert delays[:9] == [10, 20, 40, 80, 160, 320, 640, 1280, 2560]
    hub.sweep()
    [error] = hub.take(JOEL, CLI)
    assert "webhook did not take it" in error["body"]["text"]


def test_files_are_kept_until_delivered():
    hub = Hub()
    hub.post(JOEL, id="q1", files={"zip": b64url(b"PKDATA")}, **{"from": "cli", "to": "shout"})
    [item] = hub.take(JOEL, SHOUT)
    assert item["files"]["url"] == "/redsyn/v1/messages/q1/files"
    assert mb.files_of(hub.state, JOEL, "q1") == b"PKDATA"
    with pytest.raises(RedsynError) as err:
        mb.files_of(hub.state, BOB, "q1")
    assert err.value.status == 403
    hub.ack(JOEL, SHOUT, ["q1"])
    with pytest.raises(RedsynError) as err:
        mb.files_of(hub.state, JOEL, "q1")
    assert err.value.status == 410


# -- the projection property

AGENTS = ["cli", "shout", "b"]
op = st.one_of(
    st.tuples(st.just("post"), st.sampled_from(AGENTS), st.sampled_from(AGENTS),
              st.integers(0, 5), st.booleans()),
    st.tuples(st.just("reply"), st.sampled_from(AGENTS), st.integers(0, 20)),
    st.tuples(st.just("take"), st.sampled_from(AGENTS), st.integers(1, 3)),
    st.tuples(st.just("ack"), st.sampled_from(AGENTS), st.integers(0, 20)),
    st.tuples(st.just("cancel"), st.integers(0, 20)),
    st.tuples(st.just("wait"), st.integers(1, 4000)),
    st.tuples(st.just("sweep")),
    st.tuples(st.just("subscribe"), st.sampled_from(AGENTS)),
    st.tuples(st.just("event"), st.sampled_from(AGENTS)),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(op, max_size=60))
def test_projection_equals_replay(ops):
    hub = Hub(mb.Limits(messages_per_day=40, pending_messages=15))
    ids = []
    for o in ops:
        try:
            if o[0] == "post":
                _, frm, to, thread, ttl_short = o
                id_ = f"m{len(ids)}"
                thread_id = ids[thread] if thread < len(ids) else None
                hub.post(JOEL, id=id_, thread=thread_id, ttl=30 if ttl_short else None,
                         **{"from": frm, "to": to})
                ids.append(id_)
            elif o[0] == "reply":
                if o[2] < len(ids):
                    hub.post(JOEL, id=f"r{len(hub.events)}", kind="reply", reply_to=ids[o[2]],
                             **{"from": o[1]})
            elif o[0] == "take":
                hub.take(JOEL, f"acme/dev/joel/{o[1]}", lease=o[2] * 100)
            elif o[0] == "ack":
                agent = f"acme/dev/joel/{o[1]}"
                hub.ack(JOEL, agent, list(hub.state.boxes.get(agent, {}))[: o[2] % 3 + 1])
            elif o[0] == "cancel":
                if o[1] < len(ids):
                    hub.run(mb.decide_cancel(hub.state, JOEL, ids[o[1]]))
            elif o[0] == "wait":
                hub.now += o[1]
            elif o[0] == "sweep":
                hub.sweep()
            elif o[0] == "subscribe":
                hub.run(mb.decide_subscribe(hub.state, JOEL, "topic:acme/dev/t",
                                            {"agent": f"acme/dev/joel/{o[1]}"}))
            elif o[0] == "event":
                hub.post(JOEL, id=f"e{len(hub.events)}", kind="event",
                         **{"from": o[1], "to": "topic:acme/dev/t"})
        except RedsynError:
            pass
    assert hub.replayed().snapshot() == hub.state.snapshot()
    # usage counters agree with what is still owed
    for person, (messages, _) in hub.state.pending.items():
        assert messages == sum(1 for m in hub.state.messages.values()
                               if m.owed and m.person == person)


def test_the_websocket_bridge_in_the_projection():
    hub = Hub()
    seat = "acme/dev/wsbob/helper"

    def post_to_seat(**fields):
        document = {"v": 1, "kind": "request", "body": {"type": "text/plain", "text": "hi"},
                    **fields}
        incoming = validate(document, JOEL.person, len(json.dumps(document)))
        decision = mb.decide_post(hub.state, JOEL, incoming, hub.now,
                                  seat_of=lambda a, s: a if a == seat else None)
        hub.run(decision)
        return decision

    decision = post_to_seat(id="q1", **{"from": "cli", "to": seat})
    [chat] = decision.chats
    assert chat["sender"] == CLI and chat["frame"]["target"] == seat
    assert chat["frame"]["payload"] == "hi" and chat["frame"]["redsyn"]["id"] == "q1"
    assert SHOUT not in hub.state.boxes and hub.state.seat_requests == {(seat, CLI): ["q1"]}

    def chat_from_seat(text, seq):
        frame = {"type": "chat", "sender": seat, "target": CLI, "payload": text, "msg_id": seq}
        hub.events.append(("chat", frame, hub.now))
        mb.apply_chat(hub.state, frame, {"recipients": []}, seq, hub.now)

    chat_from_seat("HI", 100)
    [reply] = hub.take(JOEL, CLI)
    assert reply["kind"] == "reply" and reply["reply_to"] == "q1" and reply["from"] == seat
    assert reply["to"] == f"{CLI}#s1" and hub.state.messages["q1"].closed
    assert hub.state.seat_requests == {}
    chat_from_seat("and this?", 101)
    [request] = hub.take(JOEL, CLI)
    assert request["kind"] == "request" and request["to"] == f"{CLI}#s2"
    # a REDSYN reply to the chat-made request goes back as a chat
    document = {"v": 1, "id": "r9", "kind": "reply", "from": "cli", "reply_to": request["id"],
                "body": {"type": "text/plain", "text": "yes"}}
    incoming = validate(document, JOEL.person, len(json.dumps(document)))
    decision = mb.decide_post(hub.state, JOEL, incoming, hub.now)
    hub.run(decision)
    assert decision.chats[0]["frame"]["target"] == seat
    assert decision.chats[0]["frame"]["redsyn"]["reply_to"] == request["id"]
    # the bridge is part of the projection: a replay agrees
    state = mb.RedsynState()
    for kind, payload, ts in hub.events:
        if kind == "chat":
            mb.apply_chat(state, payload, {"recipients": []}, payload["msg_id"], ts)
        else:
            mb.apply(state, kind, payload, ts)
    assert state.snapshot() == hub.state.snapshot()


def test_a_node_speaks_only_for_its_principals_seats():
    """A principal acme/dev/kim with the one seat acme/dev/kim/laptop: its node
    announces, takes, acks, subscribes and sends as laptop only, though
    acme/dev/kim/other is an agent of the same person (issue 30 item 4)."""
    from hubd.state.principals import make_principal

    kim = mb.Node("acme/dev/kim:laptop", "acme/dev/kim",
                  make_principal("acme/dev/kim", ["acme/dev/kim/laptop"]))
    hub = Hub()
    mine, other = "acme/dev/kim/laptop", "acme/dev/kim/other"
    refusals = [
        lambda: mb.decide_announce(hub.state, kim, other, {"listening": True}),
        lambda: mb.decide_take(hub.state, kim, other, 900, 10, hub.now),
        lambda: mb.decide_ack(hub.state, kim, other, {"ids": []}),
        lambda: mb.decide_subscribe(hub.state, kim, "topic:acme/dev/news", {"agent": other}),
        lambda: hub.post(kim, id="k1", **{"from": "other", "to": "laptop"}),
    ]
    for refused in refusals:
        with pytest.raises(RedsynError) as err:
            refused()
        assert err.value.status == 403 and "acme/dev/kim/laptop" in err.value.error
    assert hub.run(mb.decide_announce(hub.state, kim, mine, {"listening": True}))["listening"]
    hub.post(kim, id="k2", files={"zip": b64url(b"PK")}, **{"from": "laptop", "to": mine})
    assert [i["id"] for i in hub.take(kim, mine)] == ["k2"]
    assert mb.files_of(hub.state, kim, "k2") == b"PK"
    # the same person's other seats are not this node's: their mail, files and
    # requests stay out of its reach
    hub.post(JOEL, id="k3", files={"zip": b64url(b"PK")}, **{"from": "cli", "to": other})
    for refused in (lambda: mb.files_of(hub.state, kim, "k3"),
                    lambda: mb.decide_cancel(hub.state, kim, "k3")):
        with pytest.raises(RedsynError) as err:
            refused()
        assert err.value.status == 403
    wider = mb.Node("acme/dev/kim:desk", "acme/dev/kim",
                    make_principal("acme/dev/kim", ["acme/dev/kim/*"]))
    hub.post(wider, id="k4", **{"from": "other", "to": "laptop"})
    with pytest.raises(RedsynError) as err:
        mb.decide_cancel(hub.state, kim, "k4")
    assert err.value.status == 403
    assert hub.run(mb.decide_cancel(hub.state, wider, "k4"))["cancelled"]

"""Hostile values in every REDSYN field: each decision either answers or
refuses with a typed RedsynError, and whatever it would journal can be
journaled (issue 30 items 1 and 2: a TypeError was a 500, a value the
journal cannot encode failed the whole commit).

Every document goes the way the door sends it: bytes through `decode_body`,
then the endpoint's validation and decision against a state that has a
message to answer, a registered key and an announced agent."""

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hubd.state import redsyn as mb
from hubd.wire import codec
from hubd.wire.redsyn import signing
from hubd.wire.redsyn.envelope import RedsynError, b64url, validate
from hubd.wire.redsyn.json_text import decode_body
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

JOEL = mb.Node("acme/dev/joel:laptop", "acme/dev/joel")
NOW = 1_790_000_000.0

# JSON as an attacker writes it: the standard library's reading of it
# (1e400 is inf), lone surrogates, integers beyond 2**53 and 2**64, nesting
scalars = (st.none() | st.booleans() | st.text(max_size=8)
           | st.sampled_from(["\ud800", "\udfff", "a\udc80b", "request", "acme/dev/joel/x",
                              "topic:acme/dev/t", "m1", ""])
           | st.integers(min_value=-2**70, max_value=2**70)
           | st.sampled_from([2**53, -2**53, 2**64, 1e400, -1e400, 0.5, 1e308]))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.text(max_size=4) | st.just("\ud800"), inner,
                                        max_size=3), max_leaves=12)

# every field, and the free-form places inside the body, refs and sig
FIELDS = ("v", "id", "kind", "from", "to", "thread", "reply_to", "ts", "ttl", "body", "refs",
          "files", "error", "sig", "body.text", "body.json", "refs.0.note", "refs.0.url",
          "files.zip", "sig.value", "sig.key")


def prepared_state() -> tuple[mb.RedsynState, Ed25519PrivateKey]:
    state = mb.RedsynState()
    key = Ed25519PrivateKey.generate()
    steps = [mb.decide_key(state, JOEL, {"public_key": b64url(
                 key.public_key().public_bytes_raw())}),
             mb.decide_announce(state, JOEL, "acme/dev/joel/shout", {"listening": True})]
    for decision in steps:
        journal(state, decision)
    document = {"v": 1, "id": "q1", "kind": "request", "from": "cli", "to": "shout",
                "body": {"type": "text/plain", "text": "hi"}}
    journal(state, mb.decide_post(state, JOEL, validate(document, JOEL.person, 100), NOW))
    return state, key


def journal(state: mb.RedsynState, decision: mb.Decision) -> None:
    """As the JournalWriter would: every event must encode, then applies."""
    for kind, payload in decision.events:
        codec.encode(payload)
        mb.apply(state, kind, payload, NOW)


def place(document: dict, path: str, value) -> None:
    *parents, last = path.split(".")
    for step in parents:
        document = document[int(step)] if step.isdigit() else document[step]
    document[int(last) if last.isdigit() else last] = value


def through_the_door(document) -> object:
    """What `_json` hands the endpoint: the document's bytes decoded strictly."""
    return decode_body(json.dumps(document).encode("utf-8", "surrogatepass"))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(field=st.sampled_from(FIELDS), value=values, signed=st.booleans())
def test_a_hostile_field_in_an_envelope_is_refused_or_journaled(field, value, signed):
    state, key = prepared_state()
    base = {"v": 1, "id": "r1", "kind": "reply", "from": "shout", "reply_to": "q1",
            "ts": int(NOW), "body": {"type": "text/plain", "text": "hi", "json": {}},
            "refs": [{"url": "https://git.acme.com/app", "note": "n"}]}
    if field == "files.zip":
        base["files"] = {"zip": "UEsD"}
    if signed or field.startswith("sig."):
        base["sig"] = signing.sign(key, base)
    place(base, field, value)
    try:
        document = through_the_door(base)
        incoming = validate(document, JOEL.person, len(json.dumps(base)))
        journal(state, mb.decide_post(state, JOEL, incoming, NOW, new_id=lambda: "auto"))
    except RedsynError as exc:
        assert 400 <= exc.status < 500, exc.document()


@settings(max_examples=300, deadline=None)
@given(doc=st.dictionaries(st.sampled_from(["listening", "description", "policy", "webhook",
                                            "ids", "agent", "subscribe", "public_key",
                                            "rotate", "enc_key", "enc_sig"]),
                           values, max_size=4) | values)
def test_a_hostile_body_on_every_other_endpoint_is_refused_or_journaled(doc):
    state, _ = prepared_state()
    decisions = (
        lambda d: mb.decide_announce(state, JOEL, "acme/dev/joel/shout", d),
        lambda d: mb.decide_ack(state, JOEL, "acme/dev/joel/shout", d),
        lambda d: mb.decide_key(state, JOEL, d),
        lambda d: mb.decide_subscribe(state, JOEL, "topic:acme/dev/news",
                                      {**d, "subscribe": True} if isinstance(d, dict) else d),
    )
    for decide in decisions:
        try:
            journal(state, decide(through_the_door(doc)))
        except RedsynError as exc:
            assert 400 <= exc.status < 500, exc.document()

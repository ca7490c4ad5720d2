"""REDSYN sans-IO pieces: canonical JSON, envelope validation, signatures,
end-to-end sealing, webhook signing and its retry schedule."""

import json
import struct
import time

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from hubd.timing import Timing
from hubd.wire.redsyn import e2e, signing, webhook
from hubd.wire.redsyn.canonical import NotCanonicalizable, canonical_json, number
from hubd.wire.redsyn.envelope import (MAX_ENVELOPE_BYTES, MAX_FILES_BYTES, Address, RedsynError,
                                  Topic, b64url, parse_address, validate)
from hubd.wire.redsyn.json_text import decode_body

SEED_FIRST_RETRY = Timing().redsyn_webhook_first_retry  # the production profile's: 10 s

# RFC 8785 appendix B: IEEE-754 bit patterns and their canonical text.
RFC8785_NUMBERS = [
    (0x0000000000000000, "0"), (0x8000000000000000, "0"), (0x0000000000000001, "5e-324"),
    (0x8000000000000001, "-5e-324"), (0x7fefffffffffffff, "1.7976931348623157e+308"),
    (0xffefffffffffffff, "-1.7976931348623157e+308"), (0x4340000000000000, "9007199254740992"),
    (0xc340000000000000, "-9007199254740992"), (0x4430000000000000, "295147905179352830000"),
    (0x44b52d02c7e14af5, "9.999999999999997e+22"), (0x44b52d02c7e14af6, "1e+23"),
    (0x44b52d02c7e14af7, "1.0000000000000001e+23"),
    (0x444b1ae4d6e2ef4e, "999999999999999700000"),
    (0x444b1ae4d6e2ef4f, "999999999999999900000"), (0x444b1ae4d6e2ef50, "1e+21"),
    (0x3eb0c6f7a0b5ed8c, "9.999999999999997e-7"), (0x3eb0c6f7a0b5ed8d, "0.000001"),
    (0x41b3de4355555553, "333333333.3333332"), (0x41b3de4355555554, "333333333.33333325"),
    (0x41b3de4355555555, "333333333.3333333"), (0x41b3de4355555556, "333333333.3333334"),
    (0x41b3de4355555557, "333333333.33333343"),
    (0xbecbf647612f3696, "-0.0000033333333333333333"),
    (0x43143ff3c1cb0959, "1424953923781206.2"),
]


@pytest.mark.parametrize("bits,text", RFC8785_NUMBERS)
def test_canonical_numbers_match_rfc8785_appendix_b(bits, text):
    assert number(struct.unpack(">d", struct.pack(">Q", bits))[0]) == text


def test_canonical_json_matches_the_rfc8785_example():
    value = json.loads('{"numbers": [333333333.33333329, 1E30, 4.50, 2e-3, '
                       '0.000000000000000000000000001], "string": '
                       '"\\u20ac$\\u000F\\u000aA\'\\u0042\\u0022\\u005c\\\\\\"\\/", '
                       '"literals": [null, true, false]}')
    assert canonical_json(value) == (
        '{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],'
        '"string":"€$\\u000f\\nA\'B\\"\\\\\\\\\\"/"}')


def test_canonical_keys_sort_by_utf16_code_units():
    # U+1F600 is a surrogate pair (D83D DE00) and so sorts before U+FB33.
    assert canonical_json({"\ufb33": 1, "\U0001f600": 2, "a": 3, "\u00e9": 4}) == \
        '{"a":3,"\u00e9":4,"\U0001f600":2,"\ufb33":1}'


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 2**53, {1: "x"}, b"x"])
def test_canonical_refuses_what_has_no_form(value):
    with pytest.raises(NotCanonicalizable):
        canonical_json(value)


# -- addresses and envelopes

ME = "acme/dev/joel"


def env(**fields):
    base = {"v": 1, "id": "m1", "kind": "request", "from": "acme/dev/joel/cli",
            "to": "acme/dev/joel/shout", "body": {"type": "text/plain", "text": "hi"}}
    base.update(fields)
    return {k: v for k, v in base.items() if v is not None}


def check(document):
    return validate(document, ME, len(json.dumps(document)))


def test_short_forms_resolve_from_the_sender():
    sender = Address("acme", "finance", "ana", "cli")
    assert str(parse_address("close", sender)) == "acme/finance/ana/close"
    assert str(parse_address("bob/close", sender)) == "acme/finance/bob/close"
    assert str(parse_address("ops/bob/close#s4", sender)) == "acme/ops/bob/close#s4"
    assert str(parse_address("globex/erp/bob/billing", sender)) == "globex/erp/bob/billing"


@pytest.mark.parametrize("text", ["", "Acme/dev/joel/x", "a/b/c/d/e", "a//c/d", "a/b/c/d#x",
                                  "a/b/c/d#s0"])
def test_bad_addresses_are_400(text):
    with pytest.raises(RedsynError) as err:
        parse_address(text, Address("a", "b", "c", "d"))
    assert err.value.status == 400


def test_a_valid_request_and_a_reply_without_to():
    incoming = check(env(**{"from": "cli", "to": "shout"}))
    assert str(incoming.sender) == "acme/dev/joel/cli" and str(incoming.to) == \
        "acme/dev/joel/shout"
    reply = check(env(kind="reply", to=None, reply_to="m0"))
    assert reply.to is None


def test_event_goes_to_a_topic_only():
    assert isinstance(check(env(kind="event", to="topic:acme/dev/news")).to, Topic)
    for document in (env(kind="request", to="topic:acme/dev/news"), env(kind="event")):
        with pytest.raises(RedsynError) as err:
            check(document)
        assert err.value.status == 400


@pytest.mark.parametrize("change,status", [
    ({"v": 2}, 400), ({"kind": "chat"}, 400), ({"from": "acme/dev/ana/cli"}, 403),
    ({"body": "hi"}, 400), ({"body": {"type": "text/plain"}}, 400), ({"ttl": 0}, 400),
    ({"ts": "now"}, 400), ({"refs": [{"note": "x"}]}, 400), ({"error": "no"}, 400),
    ({"kind": "reply", "reply_to": None}, 400), ({"files": {"zip": "!!!"}}, 400),
    ({"sig": {"alg": "rsa"}}, 400), ({"id": "a b"}, 400), ({"to": "x#new"}, 400),
    # a field of the wrong JSON type is a 400, never a TypeError (issue 30 item 2)
    ({"kind": ["request"]}, 400), ({"kind": {"request": 1}}, 400), ({"files": {"zip": 7}}, 400),
    ({"files": {"zip": None}}, 400),
    # numbers RFC 8785 has no form for, anywhere: nothing could sign or identify them
    ({"body": {"type": "application/json", "json": 9007199254740992}}, 400),
    ({"body": {"type": "application/json", "json": [float("inf")]}}, 400),
    ({"refs": [{"url": "u", "n": -9007199254740992}]}, 400),
    ({"ts": 2**64}, 400),
    ({"body": {"type": "x", "deep": json.loads("[" * 70 + "]" * 70)}}, 400),
])
def test_malformed_envelopes_are_refused_with_their_status(change, status):
    with pytest.raises(RedsynError) as err:
        check(env(**change))
    assert err.value.status == status
    assert err.value.document()["status"] == status and err.value.document()["error"]


def test_a_null_sig_is_an_unsigned_envelope():
    incoming = check(env(sig=None) | {"sig": None})
    assert "sig" not in incoming.fields


def test_the_content_digest_is_of_the_canonical_form():
    a = check(env(body={"type": "x", "n": 1.0, "a": [1, 2]}))
    b = check(json.loads('{"v": 1, "id": "m1", "kind": "request", "from": "acme/dev/joel/cli",'
                         ' "to": "acme/dev/joel/shout", "body": {"a": [1, 2], "n": 1, '
                         '"type": "x"}}'))
    assert a.digest == b.digest and len(a.digest) == 64


@pytest.mark.parametrize("data,where", [
    (b'{"description": "\\ud800"}', "description"),
    (b'{"body": {"type": "text/plain", "text": "a\\udc00b"}}', "body.text"),
    (b'{"refs": [{"url": "u", "note": "\\udfff"}]}', "refs[0].note"),
    (b'{"body": {"type": "application/json", "json": {"k": ["\\ud83d"]}}}', "body.json.k[0]"),
    (b'{"x": {"\\ud800": 1}}', "a key of x"),
])
def test_a_lone_surrogate_escape_anywhere_is_400_naming_where(data, where):
    with pytest.raises(RedsynError) as err:
        decode_body(data)
    assert err.value.status == 400 and where in err.value.error


@pytest.mark.parametrize("data", [
    b'{"description": "\xed\xa0\x80"}',  # U+D800 encoded as if it were UTF-8
    b'{"description": "\xff"}', b'{"description": "\xc0\xaf"}',  # not UTF-8, overlong
    b'{"n": NaN}', b'{"n": -Infinity}', b'\xef\xbb\xbf{}', b'{"a": ', b'[' * 100_000,
])
def test_bytes_that_are_not_strict_utf8_json_are_400(data):
    with pytest.raises(RedsynError) as err:
        decode_body(data)
    assert err.value.status == 400


def test_valid_text_passes_the_strict_decoder():
    assert decode_body(b"") == {}
    assert decode_body('{"t": "\\ud83d\\ude00 \u00e9 \\\\ud800"}'.encode()) == \
        {"t": "\U0001f600 \u00e9 \\ud800"}  # a pair, and an escaped backslash


def test_size_limits():
    big_files = {"zip": b64url(b"x" * (MAX_FILES_BYTES + 1))}
    with pytest.raises(RedsynError) as err:
        check(env(files=big_files))
    assert err.value.status == 413
    with pytest.raises(RedsynError) as err:
        check(env(body={"type": "text/plain", "text": "x" * MAX_ENVELOPE_BYTES}))
    assert err.value.status == 413
    ok = check(env(files={"zip": b64url(b"PK" * 1000)}))
    assert ok.files == b"PK" * 1000 and len(ok.files_sha256) == 64


# -- signatures


def signed(private, **fields):
    document = env(ts=int(time.time()), **fields)
    document["sig"] = signing.sign(private, document)
    return document


def test_a_signature_verifies_and_the_receiver_check_holds():
    private = Ed25519PrivateKey.generate()
    document = signed(private)
    incoming = check(document)
    payload = signing.verify_arrival(incoming.fields, "", document["sig"]["key"], time.time())
    delivered = {**document, "sig": {**document["sig"], "payload": payload}}
    assert signing.signed_by(delivered) == document["sig"]["key"]
    delivered["body"] = {"type": "text/plain", "text": "changed"}
    assert signing.signed_by(delivered) == ""


@pytest.mark.parametrize("tamper", ["body", "old", "key", "unregistered", "files"])
def test_signatures_that_do_not_hold_are_401(tamper):
    private = Ed25519PrivateKey.generate()
    document = signed(private)
    registered = document["sig"]["key"]
    now = time.time()
    files_sha = ""
    if tamper == "body":
        document["body"] = {"type": "text/plain", "text": "other"}
    elif tamper == "old":
        document = env(ts=int(now) - 601)
        document["sig"] = signing.sign(private, document)
    elif tamper == "key":
        registered = b64url(Ed25519PrivateKey.generate().public_key().public_bytes_raw())
    elif tamper == "unregistered":
        registered = None
    elif tamper == "files":
        files_sha = "0" * 64
    incoming = check(document)
    with pytest.raises(RedsynError) as err:
        signing.verify_arrival(incoming.fields, files_sha, registered, now)
    assert err.value.status == 401


def test_enc_sig():
    private = Ed25519PrivateKey.generate()
    _, enc_key = e2e.new_enc_key()
    sig = signing.sign_enc_key(private, enc_key)
    public = b64url(private.public_key().public_bytes_raw())
    assert signing.verify_enc_sig(public, enc_key, sig)
    _, other = e2e.new_enc_key()
    assert not signing.verify_enc_sig(public, other, sig)


# -- end-to-end


def test_seal_and_open_bind_id_and_kind():
    private, enc_key = e2e.new_enc_key()
    body, files = e2e.seal(enc_key, "m1", "request", {"type": "text/plain", "text": "secret"},
                           [{"url": "https://x.example"}], "replykey", files=b"PKzip")
    document = env(body=body, refs=[])
    assert check(document).encrypted
    opened = e2e.open_envelope(document, private)
    assert opened == {"body": {"type": "text/plain", "text": "secret"},
                      "refs": [{"url": "https://x.example"}], "reply_key": "replykey"}
    assert e2e.open_files(document, files, private) == b"PKzip"
    assert e2e.open_envelope({**document, "id": "m2"}, private) is None
    assert e2e.open_envelope({**document, "kind": "reply"}, private) is None
    stranger, _ = e2e.new_enc_key()
    assert e2e.open_envelope(document, stranger) is None


# -- webhooks


def test_webhook_signature_is_genuine_and_only_when_recent_and_exact():
    body = b'{"id":"m1"}'
    now = time.time()
    header = webhook.signature_header("s3cret-s3cret-s3", int(now), body)
    assert webhook.genuine({"redsyn-signature": header}, body, "s3cret-s3cret-s3", now)
    assert not webhook.genuine({"redsyn-signature": header}, body + b" ", "s3cret-s3cret-s3",
                               now)
    assert not webhook.genuine({"redsyn-signature": header}, body, "other-secret-xxx", now)
    assert not webhook.genuine({"redsyn-signature": header}, body, "s3cret-s3cret-s3",
                               now + 301)
    assert not webhook.genuine({}, body, "s3cret-s3cret-s3", now)


def test_webhook_retry_schedule():
    delays = [webhook.retry_delay(n, SEED_FIRST_RETRY) for n in range(1, 11)]
    assert delays == [10, 20, 40, 80, 160, 320, 640, 1280, 2560, None]
    assert sum(d for d in delays if d) < 10 * 3600
    # the cap: an hour
    assert all(d <= 3600 for d in delays if d)


def test_webhook_retry_delay_cap_applies_beyond_the_doubling():
    import hubd.wire.redsyn.webhook as w
    assert min(SEED_FIRST_RETRY * 2 ** 9, w.MAX_RETRY_SECONDS) == 3600


@pytest.mark.parametrize("url,loopback,ok", [
    ("https://hooks.example.com/x", False, True),
    ("http://hooks.example.com/x", False, False),
    ("https://localhost/x", False, False),
    ("https://10.0.0.1/x", False, False),
    ("https://intranet/x", False, False),
    ("http://127.0.0.1:9/x", False, False),
    ("http://127.0.0.1:9/x", True, True),
])
def test_webhook_urls(url, loopback, ok):
    hook = {"url": url, "secret": "0123456789abcdef"}
    if ok:
        assert webhook.check_webhook(hook, loopback)["url"] == url
    else:
        with pytest.raises(RedsynError):
            webhook.check_webhook(hook, loopback)

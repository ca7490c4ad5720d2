"""The reference's identity checks as pure decisions: the ACL policy and role
grants (hubd/state/acl.py), the trust bundle and a signed registration
(identity_binding.py), the per-message `auth` object (message_auth.py).
The signatures are made here with plain hmac/cryptography, the construction
docs/reference-observed.md §11.2 and §12.1 describe; the reference client's
own signing is the interop tests' (tests/interop/test_signed_frames.py)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from hubd.state import acl, identity_binding as ib, message_auth as ma

NOW = 1_800_000_000.0


# -- ACL and role grants

def test_acl_rules_have_no_subject_and_match_by_namespace_and_glob():
    rules = acl.parse_acl_policy({"rules": [
        {"permission": "attachment-write", "target_kind": "attachment", "target_pattern": "p"},
        {"permission": "claim", "target_kind": "claim", "target_pattern": "T-*",
         "namespace": "q"},
        {"permission": "claim", "target_kind": "path", "target_pattern": "*"}]})
    frame = {"scope": "p"}
    assert acl.acl_denial(rules, "p/alice", "attachment_chunk", frame) is None
    assert acl.acl_denial(rules, "z/anyone", "attachment_begin", frame) is None
    denied = acl.acl_denial(rules, "p/alice", "attachment_read", frame)
    assert denied.text == "access denied: attachment-read on attachment:p"
    # chunk without scope: the empty target (reference-observed §13.2)
    assert acl.acl_denial(rules, "p/alice", "attachment_chunk", {}).text == \
        "access denied: attachment-write on attachment:"
    # namespace: the sender's project
    assert acl.acl_denial(rules, "q/bob", "claim", {"task_id": "T-1"}) is None
    assert acl.acl_denial(rules, "p/bob", "claim", {"task_id": "T-1"}).text == \
        "access denied: claim on claim:T-1"
    # a claim's paths are accesses too, normalised; an escaping one is the whole worktree
    assert acl.required_accesses("claim", {"task_id": "T", "paths": ["a/./b", "../x", ""]},
                                 "p/a") == [("claim", "claim", "T"), ("claim", "path", "a/b"),
                                            ("claim", "path", "")]
    # reads and keepalives are not gated
    assert acl.acl_denial(rules, "p/a", "heartbeat", {}) is None
    assert acl.acl_denial(rules, "p/a", "wait_request", {"task_id": "T"}) is None


@pytest.mark.parametrize("doc, says", [
    ({"rules": [{"permission": "fly", "target_kind": "k", "target_pattern": "p"}]},
     "ACL rule 0 has unknown permission 'fly'"),
    ({"rules": [{"permission": "claim", "target_kind": "", "target_pattern": "p"}]},
     "ACL rule 0 needs non-empty target_kind and target_pattern"),
    ({"rules": "x"}, "ACL policy must be an object with a 'rules' list"),
    ({"rules": [{"permission": ["claim"], "target_kind": "k", "target_pattern": "p"}]},
     "ACL rule 0: 'permission' must be text"),
])
def test_a_bad_acl_policy_is_refused_with_the_reason(doc, says):
    with pytest.raises(acl.PolicyError) as err:
        acl.parse_acl_policy(doc)
    assert str(err.value) == says


def test_role_grants_accept_globs_and_refuse_a_bad_file():
    grants = acl.parse_role_grants({"grants": {"p/attachment-write": ["p/alice", "p/bot-*"]}})
    assert acl.holds_role(grants, "p/alice", "p/attachment-write")
    assert acl.holds_role(grants, "p/bot-7", "p/attachment-write")
    assert not acl.holds_role(grants, "p/bob", "p/attachment-write")
    assert not acl.holds_role(grants, "p/alice", "p/attachment-read")
    with pytest.raises(acl.PolicyError):
        acl.parse_role_grants({"grants": {"p/x": "p/alice"}})


# -- identity binding

def _keypair():
    private = Ed25519PrivateKey.generate()
    raw = private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    return private, base64.b64encode(raw).decode()


def _sign(frame: dict, private, key_id: str, nonce="n-1", sequence=1, signed_at=NOW) -> dict:
    frame = dict(frame, signature={"version": 1, "key_id": key_id, "algorithm": "ed25519",
                                   "nonce": nonce, "sequence": sequence,
                                   "signed_at": signed_at})
    body = json.dumps(frame, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    frame["signature"]["value"] = base64.b64encode(private.sign(body.encode())).decode()
    return frame


def test_a_registration_is_bound_only_by_a_trusted_key_of_its_sender():
    alice, alice_pub = _keypair()
    mallory, mallory_pub = _keypair()
    keys = ib.parse_trust_bundle({"keys": [
        {"key_id": "id-0", "public_key": alice_pub, "senders": ["p/alice"]},
        {"key_id": "id-1", "public_key": mallory_pub, "senders": ["p/mallory"]},
        {"key_id": "id-old", "public_key": alice_pub, "senders": ["p/alice"],
         "expires_at": NOW - 1}]})
    hello = {"sender": "p/alice", "target": "System", "type": "heartbeat",
             "payload": "online", "protocol_version": 7, "token": "t", "name": "Ünïcode"}
    assert ib.verify_registration(keys, _sign(hello, alice, "id-0"), NOW) == ib.OK
    assert ib.verify_registration(keys, hello, NOW) == ib.MISSING_SIGNATURE
    assert ib.verify_registration(keys, _sign(hello, mallory, "id-1"), NOW) == \
        ib.SENDER_MISMATCH
    assert ib.verify_registration(keys, _sign(hello, alice, "id-9"), NOW) == ib.UNKNOWN_KEY
    assert ib.verify_registration(keys, _sign(hello, alice, "id-old"), NOW) == ib.EXPIRED
    # the token is inside the signed bytes
    tampered = dict(_sign(hello, alice, "id-0"), token="other")
    assert ib.verify_registration(keys, tampered, NOW) == ib.BAD_SIGNATURE
    forged = _sign(hello, mallory, "id-0")
    assert ib.verify_registration(keys, forged, NOW) == ib.BAD_SIGNATURE


def test_a_registration_is_fresh_once_and_its_sequence_positive():
    alice, pub = _keypair()
    keys = ib.parse_trust_bundle({"keys": [{"key_id": "id-0", "public_key": pub,
                                            "senders": ["p/alice"]}]})
    hello = {"sender": "p/alice", "target": "System", "type": "heartbeat", "payload": "online"}
    nonces = ma.AuthNonces()
    signed = _sign(hello, alice, "id-0")
    assert ib.verify_registration(keys, signed, NOW, nonces) == ib.OK
    nonces.add("id-0", "n-1", NOW)
    assert ib.verify_registration(keys, signed, NOW + 1, nonces) == ib.REPLAYED
    assert ib.verify_registration(keys, _sign(hello, alice, "id-0", "n-2", signed_at=NOW - 11),
                                  NOW, nonces) == ib.EXPIRED
    assert ib.verify_registration(keys, _sign(hello, alice, "id-0", "n-3", signed_at=NOW + 2),
                                  NOW, nonces) == ib.EXPIRED
    for bad in (0, True, "1"):
        assert ib.verify_registration(keys, _sign(hello, alice, "id-0", "n-4", sequence=bad),
                                      NOW, nonces) == ib.SEQUENCE_MISMATCH
    assert ib.verify_registration(keys, _sign(hello, alice, "id-0", "n-5"), NOW, nonces,
                                  capacity=1) == ib.REPLAY_LEDGER_FULL


def test_a_bad_trust_bundle_is_refused():
    with pytest.raises(acl.PolicyError, match="base64 of 32 bytes"):
        ib.parse_trust_bundle({"keys": [{"key_id": "k", "public_key": "AAAA",
                                         "senders": ["p/a"]}]})
    _, pub = _keypair()
    with pytest.raises(acl.PolicyError, match="appears twice"):
        ib.parse_trust_bundle({"keys": [{"key_id": "k", "public_key": pub, "senders": ["a"]}] * 2})


# -- per-message auth

SECRET = "s3cret-not-in-any-log"


def _mac(frame: dict, kid="mac-0", secret=SECRET, nonce="n-1", sequence=5, ts=NOW,
         alg="hmac-sha256") -> dict:
    frame = dict(frame, auth={"alg": alg, "kid": kid, "nonce": nonce, "sequence": sequence,
                              "timestamp": ts})
    body = json.dumps(frame, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    frame["auth"]["value"] = hmac.new(secret.encode(), body.encode(), hashlib.sha256).hexdigest()
    return frame


CLAIM = {"sender": "p/alice", "target": "all", "type": "claim", "payload": "",
         "timestamp": NOW, "task_id": "T-1", "idem_key": "k"}


def test_key_entries_parse_and_a_secret_is_never_printed():
    key = ma.parse_key("mac-0:" + "x" * 20 + ":p/alice, p/bob")
    assert key.senders == {"p/alice", "p/bob"} and key.secret == b"x" * 20
    assert "x" * 20 not in repr(key) and "x" * 20 not in str(key)
    for bad in ("justone", "k::p/a", "k:s:", ":s:p/a"):
        with pytest.raises(ma.KeyFormatError, match="KEY_ID:SECRET:SENDER"):
            ma.parse_key(bad)
    assert [k.key_id for k in ma.parse_key_file("# c\n\nk1:s:p/a\nk2:t:p/b\n")] == ["k1", "k2"]
    with pytest.raises(ma.KeyFormatError, match="given twice"):
        ma.keyring([ma.parse_key("k:s:p/a"), ma.parse_key("k:t:p/b")])


def _verify(frame, nonces=None, sender="p/alice", capacity=4096, now=NOW):
    ring = ma.keyring([ma.parse_key(f"mac-0:{SECRET}:p/alice"),
                       ma.parse_key(f"mac-f:{SECRET}:p/bob,p/carol")])
    return ma.verify(ring, frame, sender, now, 10.0, nonces or ma.AuthNonces(), capacity).result


@pytest.mark.parametrize("frame, result", [
    (CLAIM, ma.MISSING),
    (_mac(CLAIM, kid="nope"), ma.UNKNOWN_KEY),
    (_mac(CLAIM, kid="mac-f"), ma.SENDER_MISMATCH),
    (_mac(CLAIM, sequence=0), ma.SEQUENCE_MISMATCH),
    (_mac(CLAIM, sequence=True), ma.SEQUENCE_MISMATCH),
    (_mac(CLAIM, ts=NOW - 60), ma.EXPIRED),
    (_mac(CLAIM, ts=NOW + 5), ma.EXPIRED),
    (_mac(CLAIM, alg="hmac-sha1"), ma.BAD_AUTHENTICATION),
    (_mac(CLAIM, secret="wrong"), ma.BAD_AUTHENTICATION),
    (dict(_mac(CLAIM), task_id="T-2"), ma.BAD_AUTHENTICATION),
    (_mac(CLAIM), ma.OK),
])
def test_each_auth_fault_has_the_references_result(frame, result):
    assert _verify(frame) == result


def test_a_nonce_is_accepted_once_while_fresh_and_the_ledger_is_bounded():
    nonces = ma.AuthNonces()
    frame = _mac(CLAIM)
    assert _verify(frame, nonces) == ma.OK
    nonces.add("mac-0", "n-1", NOW)
    assert _verify(frame, nonces) == ma.REPLAYED
    # a full ledger of fresh nonces refuses a new one instead of forgetting one
    assert _verify(_mac(CLAIM, nonce="n-2"), nonces, capacity=1) == ma.REPLAY_LEDGER_FULL
    # once its frame is too old to pass, a nonce needs no memory
    later = NOW + 12
    assert _verify(_mac(CLAIM, nonce="n-3", ts=later), nonces, capacity=1, now=later) == ma.OK
    assert len(nonces) == 0


def _floor_verify(frame, nonces, mode, sender="p/alice"):
    ring = ma.keyring([ma.parse_key(f"mac-0:{SECRET}:p/alice,p/bob"),
                       ma.parse_key(f"mac-1:{SECRET}:p/alice")])
    verified = ma.verify(ring, frame, sender, NOW, 10.0, nonces, 4096, mode)
    if verified.result == ma.OK:  # what the nonce event's applier does
        nonces.add(verified.kid, verified.nonce, verified.timestamp)
        nonces.raise_floor(verified.kid, sender, verified.sequence)
    return verified.result


@pytest.mark.parametrize("mode, below, again", [
    ("off", ma.OK, ma.OK), ("compat", ma.OK, ma.OK),
    ("strict", ma.SEQUENCE_MISMATCH, ma.SEQUENCE_MISMATCH)])
def test_strict_refuses_a_sequence_at_or_below_its_key_and_senders_floor(mode, below, again):
    """As the reference's modes were seen to (reference-observed.md §12.4)."""
    nonces = ma.AuthNonces()
    assert _floor_verify(_mac(CLAIM, sequence=200, nonce="a"), nonces, mode) == ma.OK
    assert _floor_verify(_mac(CLAIM, sequence=150, nonce="b"), nonces, mode) == below
    assert _floor_verify(_mac(CLAIM, sequence=200, nonce="c"), nonces, mode) == again
    # per key and sender: another key of alice's, and bob on the same key, start afresh
    assert _floor_verify(_mac(CLAIM, kid="mac-1", sequence=5, nonce="d"), nonces, mode) == ma.OK
    bob = dict(CLAIM, sender="p/bob")
    assert _floor_verify(_mac(bob, sequence=5, nonce="e"), nonces, mode, "p/bob") == ma.OK
    assert _floor_verify(_mac(CLAIM, sequence=201, nonce="f"), nonces, mode) == ma.OK
    # the identical frame again is a replay, whatever its sequence
    frame = _mac(CLAIM, sequence=300, nonce="g")
    assert _floor_verify(frame, nonces, mode) == ma.OK
    assert _floor_verify(frame, nonces, mode) == ma.REPLAYED
    # the floor is kept in every mode (switching to strict starts from it)
    assert nonces.floor("mac-0", "p/alice") == 300 and nonces.floor("mac-0", "p/bob") == 5


def test_the_floor_is_rebuilt_from_the_nonce_events_and_an_old_event_has_none():
    from types import SimpleNamespace

    state = SimpleNamespace(extensions={"message_auth": ma.AuthNonces()})
    [apply] = ma.appliers[ma.NONCE_EVENT]
    base = {"kid": "mac-0", "timestamp": NOW, "at": NOW, "window": 10.0}
    apply(state, SimpleNamespace(payload=dict(base, nonce="old")))  # before the floor
    apply(state, SimpleNamespace(payload=dict(base, nonce="n", sender="p/a", sequence=7)))
    apply(state, SimpleNamespace(payload=dict(base, nonce="m", sender="p/a", sequence=3)))
    nonces = state.extensions["message_auth"]
    assert nonces.floor("mac-0", "p/a") == 7 and nonces.seen("mac-0", "old")


def test_a_key_bound_to_a_principal_proves_that_principals_sessions_only():
    key = ma.parse_key(f"mac-ci:{SECRET}:@ci,p/ops")
    assert (key.senders, key.principals) == ({"p/ops"}, {"ci"})
    assert "ci" in repr(key) and SECRET not in repr(key)
    assert key.proves("p/ci/runner-7", "ci") and key.proves("p/ops", None)
    assert not key.proves("p/ci/runner-7", "alice") and not key.proves("p/ci/runner-7", None)
    with pytest.raises(ma.KeyFormatError, match="@NAME"):
        ma.parse_key(f"k:{SECRET}:@")
    ring = ma.keyring([key])
    frame = _mac(dict(CLAIM, sender="p/ci/runner-7"), kid="mac-ci")
    verify = ma.verify  # the session's principal decides (the frame names none)
    assert verify(ring, frame, "p/ci/runner-7", NOW, 10.0, ma.AuthNonces(), 9,
                  principal="ci").result == ma.OK
    assert verify(ring, frame, "p/ci/runner-7", NOW, 10.0, ma.AuthNonces(), 9,
                  principal="mallory").result == ma.SENDER_MISMATCH

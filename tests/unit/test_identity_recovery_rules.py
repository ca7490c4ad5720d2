"""The governed identity recovery decisions (hubd/state/identity_recovery.py):
the TOFU table, the reclaim gates, the enrolment and revocation gates in the
reference's order with its texts, the rate window, and the projection."""

from __future__ import annotations

import base64
import json
import secrets
import time
from types import SimpleNamespace

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from hubd.state import identity_recovery as ir
from hubd.state.acl import Rule
from hubd.state.identity_binding import TrustedKey, verify_registration
from hubd.state.message_auth import AuthNonces


def keypair():
    private = Ed25519PrivateKey.generate()
    raw = private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    return private, base64.b64encode(raw).decode()


def signed(name, private, key_id, public=None, at=None):
    frame = {"sender": name, "type": "heartbeat", "target": "System",
             "signature": {"version": 1, "key_id": key_id, "algorithm": "ed25519",
                           "nonce": secrets.token_hex(8), "sequence": 1,
                           "signed_at": time.time() if at is None else at}}
    if public is not None:
        frame["identity_public_key"] = public
    body = json.dumps(frame, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    frame["signature"]["value"] = base64.b64encode(private.sign(body.encode())).decode()
    return frame


# -- trust on first use

def test_an_unpinned_name_with_a_complete_proof_is_pinned():
    private, public = keypair()
    decided = ir.first_use({}, signed("p/a", private, "k1", public), time.time(), AuthNonces())
    assert decided == ir.FirstUse(pin=("k1", public))


def test_no_proof_passes_and_pins_nothing():
    private, public = keypair()
    assert ir.first_use({}, {"sender": "p/a"}, time.time(), None) == ir.FirstUse()
    # a signature without the public key is not a self-contained proof
    assert ir.first_use({}, signed("p/a", private, "k1"), time.time(), None) == ir.FirstUse()


def test_a_broken_first_proof_is_refused_and_pins_nothing():
    private, public = keypair()
    _, other = keypair()
    decided = ir.first_use({}, signed("p/a", private, "k1", other), time.time(), None)
    assert decided.refusal == "identity signature invalid: bad_signature"
    assert decided.pin is None
    old = signed("p/a", private, "k1", public, at=time.time() - 60)
    assert ir.first_use({}, old, time.time(), None).result == "expired"


def test_a_pinned_name_must_prove_its_pinned_key():
    private, public = keypair()
    other, other_public = keypair()
    pins = {"p/a": ir.Pin("k1", public, 0.0)}
    now = time.time()
    assert ir.first_use(pins, signed("p/a", private, "k1"), now, None) == ir.FirstUse()
    missing = ir.first_use(pins, {"sender": "p/a"}, now, None)
    assert missing.result == "signature missing"
    assert missing.refusal.startswith(
        "identity pin: name 'p/a' is pinned to key k1 (signature missing).")
    assert ir.first_use(pins, signed("p/a", other, "k2", other_public), now,
                        None).result == "unknown_key"
    # the same key id with another key's signature
    assert ir.first_use(pins, signed("p/a", other, "k1", other_public), now,
                        None).result == "bad_signature"


def test_a_replayed_proof_is_refused():
    private, public = keypair()
    frame = signed("p/a", private, "k1", public)
    nonces = AuthNonces()
    nonces.add("k1", frame["signature"]["nonce"], frame["signature"]["signed_at"])
    assert ir.first_use({}, frame, time.time(), nonces).result == "replayed"


# -- reclaim

def reclaim(**over):
    base = dict(pin_name="p/t", expected_key_id="k1", reason="lost laptop", break_glass=False)
    return ir.Reclaim(**{**base, **over})


PIN = ir.Pin("k1", "x", 0.0)
GATES = dict(acl_allowed=True, requester_bound=True, owner_online=False)


@pytest.mark.parametrize("request_, pin, gates, text", [
    (reclaim(pin_name=""), PIN, {}, "pin name is required"),
    (reclaim(expected_key_id=""), PIN, {}, "expected key id is required"),
    (reclaim(reason=""), PIN, {}, "a non-empty operator reason is required"),
    (reclaim(reason="x" * 501), PIN, {}, "operator reason exceeds 500 characters"),
    (reclaim(pin_name="p/op"), PIN, {},
     "an operator cannot reclaim the identity used by its own live connection"),
    (reclaim(), PIN, {"acl_allowed": False},
     "no identity-pin-reclaim ACL grant authorises this operator and target"),
    (reclaim(), PIN, {"requester_bound": False},
     "the operator identity is not cryptographically bound"),
    (reclaim(), None, {}, "the target has no identity pin"),
    (reclaim(expected_key_id="k2"), PIN, {},
     "the current pin does not match the expected key id"),
    (reclaim(), PIN, {"owner_online": True},
     "the pinned identity is online; use explicit break-glass recovery to evict it"),
    (reclaim(), PIN, {"lease_live": True},
     "the ownership lease is still live; wait for its offline TTL or use break-glass"),
    (reclaim(break_glass=True), PIN, {"owner_online": True}, ""),
    (reclaim(), PIN, {}, ""),
])
def test_the_reclaim_gates_in_order(request_, pin, gates, text):
    assert ir.reclaim_denial(request_, "p/op", pin, **{**GATES, **gates}) == text


def test_the_acl_is_told_nothing_about_the_target_before_the_grant():
    # no grant and no pin: the grant is what the refusal names
    assert ir.reclaim_denial(reclaim(), "p/op", None, acl_allowed=False, requester_bound=False,
                             owner_online=True).startswith("no identity-pin-reclaim ACL")


def test_the_reclaim_grant_is_always_checked_and_no_policy_grants_nothing():
    rules = (Rule("identity-pin-reclaim", "agent", "p/*"),)
    assert ir.acl_grants(rules, "p/op", ir.PIN_RECLAIM_PERMISSION, "p/t")
    assert not ir.acl_grants(rules, "p/op", ir.PIN_RECLAIM_PERMISSION, "q/t")
    assert not ir.acl_grants(None, "p/op", ir.PIN_RECLAIM_PERMISSION, "p/t")


def test_read_reclaim_strips_and_takes_only_true_as_break_glass():
    got = ir.read_reclaim({"pin_name": " p/t ", "expected_key_id": "k1 ", "reason": " r ",
                           "break_glass": 1})
    assert got == ir.Reclaim("p/t", "k1", "r", False)


# -- enrolment

def authority(**over):
    base = dict(enabled=True, requester_bound=True, acl_allowed=True, role_granted=True,
                namespace_allowed=True, rate_allowed=True)
    return ir.Authority(**{**base, **over})


@pytest.mark.parametrize("over, text", [
    ({"enabled": False}, "online enrolment is disabled on this hub"),
    ({"requester_bound": False},
     "enrolment requires a cryptographically proven requester identity"),
    ({"acl_allowed": False}, "not authorised to enrol keys for this name"),
    ({"role_granted": False}, "enrolment requires the 'identity-enroller' role grant"),
    ({"namespace_allowed": False}, "this hub does not allow enrolment in the name's namespace"),
    ({"rate_allowed": False}, "enrolment rate limit reached; try again later"),
    ({}, ""),
])
def test_the_authority_gates_in_order(over, text):
    assert authority(**over).denial() == text


def test_only_an_authorised_requester_s_refusals_are_audited():
    assert authority(namespace_allowed=False, rate_allowed=False).authorised
    assert not authority(role_granted=False).authorised


def test_authority_reads_the_acl_the_role_and_the_namespace():
    rules = (Rule("identity-enroll", "agent", "p/*"),)
    got = ir.authority(enabled=True, requester="p/op", requester_bound=True, rules=rules,
                       roles={"p/identity-enroller": ("p/op",)}, namespaces=("p",),
                       name="p/new", rate_allowed=True)
    assert got.denial() == ""
    assert ir.authority(enabled=True, requester="p/clerk", requester_bound=True, rules=rules,
                        roles={"p/identity-enroller": ("p/op",)}, namespaces=("p",),
                        name="p/new", rate_allowed=True).role_granted is False


def enrolment(**over):
    _, public = keypair()
    base = dict(requester="p/op", name="p/new", key_id="k-new", public_key=public,
                raw=base64.b64decode(public), reason="onboard", expected_key_id="",
                expires_at=None)
    return ir.Enrolment(**{**base, **over})


def recovery_with(*keys: ir.EnrolledKey) -> ir.IdentityRecovery:
    return ir.IdentityRecovery(enrolled={k.key_id: k for k in keys})


STATIC = {"id-op": TrustedKey("id-op", b"\0" * 32, ("p/op",))}


@pytest.mark.parametrize("request_, recovery, text", [
    (enrolment(name="new"), recovery_with(), "the name must be <project>/<id>"),
    (enrolment(name="p/"), recovery_with(), "the name must be <project>/<id>"),
    (enrolment(key_id="bad key"), recovery_with(),
     "key id must be 1-64 characters of letters, digits, '.', '_' or '-'"),
    (enrolment(raw=None), recovery_with(), "public key must be base64 of 32 raw Ed25519 bytes"),
    (enrolment(reason="  "), recovery_with(), "a non-empty operator reason is required"),
    (enrolment(reason="r" * 501), recovery_with(), "reason exceeds 500 characters"),
    (enrolment(expires_at=1.0), recovery_with(), "expires_at must be a future time"),
    (enrolment(expires_at=True), recovery_with(), "expires_at must be a future time"),
    (enrolment(key_id="id-op"), recovery_with(), "key id is already in use"),
    (enrolment(), recovery_with(ir.EnrolledKey("k-new", "p/x", "k")), "key id is already in use"),
    (enrolment(name="p/op", key_id="k2"), recovery_with(),
     "the identity trust bundle already covers this name"),
    (enrolment(name="p/op2", requester="p/op2"), recovery_with(),
     "an enroller may only rotate its own key, naming the current key id"),
    (enrolment(expected_key_id="k-old"), recovery_with(),
     "no current enrolled key to rotate for this name"),
    (enrolment(), recovery_with(ir.EnrolledKey("k-old", "p/new", "k")),
     "the name already has an enrolled key; rotate it by naming the current key id"),
    (enrolment(expected_key_id="k-old"), recovery_with(ir.EnrolledKey("k-old", "p/new", "k")),
     ""),
    (enrolment(), recovery_with(ir.EnrolledKey("k-old", "p/new", "k", revoked=True)), ""),
    (enrolment(), recovery_with(), ""),
])
def test_the_enrolment_gates_in_order(request_, recovery, text):
    assert ir.enrolment_denial(request_, STATIC, recovery, time.time()) == text


def test_a_full_enrolment_store_refuses_a_new_key(monkeypatch):
    monkeypatch.setattr(ir, "MAX_ENROLLED", 2)
    full = recovery_with(ir.EnrolledKey("a", "p/a", "k"), ir.EnrolledKey("b", "p/b", "k"))
    assert ir.enrolment_denial(enrolment(), STATIC, full, time.time()).startswith(
        "the enrolment store is full")


@pytest.mark.parametrize("name, key_id, reason, text", [
    ("new", "k", "r", "the name must be <project>/<id>"),
    ("p/new", "k", " ", "a non-empty operator reason is required"),
    ("p/op", "id-op", "r", "keys in the identity trust bundle are revoked by editing that file"),
    ("p/new", "k-none", "r", "no enrolled key has this id"),
    ("p/other", "k-new", "r", "the enrolled key does not prove this name"),
    ("p/new", "k-gone", "r", "the enrolled key is already revoked"),
    ("p/new", "k-new", "r", ""),
])
def test_the_revocation_gates_in_order(name, key_id, reason, text):
    recovery = recovery_with(ir.EnrolledKey("k-new", "p/new", "k"),
                             ir.EnrolledKey("k-gone", "p/new", "k", revoked=True))
    assert ir.revocation_denial(name, key_id, reason, STATIC, recovery) == text


def test_the_rate_window_is_per_requester_and_slides():
    rate = ir.EnrolmentRate(2, 10.0)
    assert rate.allows("p/op", 0.0)
    rate.record("p/op", 0.0)
    rate.record("p/op", 1.0)
    assert not rate.allows("p/op", 5.0)
    assert rate.allows("p/other", 5.0)
    assert rate.allows("p/op", 10.5)  # the first left the window
    assert not ir.EnrolmentRate(0, 10.0).allows("p/op", 0.0)


# -- the projection and the effective keys

def ev(kind, payload, seq=1):
    return SimpleNamespace(kind=kind, payload=payload, seq=seq)


def test_the_appliers_pin_remove_enrol_rotate_and_revoke():
    state = SimpleNamespace(extensions={"identity_recovery": ir.IdentityRecovery()})
    for kind, payload in [
        (ir.PINNED, {"name": "p/a", "key_id": "k1", "public_key": "x", "pinned_at": 1.0}),
        (ir.PIN_REMOVED, {"name": "p/a", "key_id": "k-other"}),  # not the pin: kept
    ]:
        for fn in ir.appliers[kind]:
            fn(state, ev(kind, payload))
    recovery = ir.recovery_of(state)
    assert recovery.pins == {"p/a": ir.Pin("k1", "x", 1.0)}
    for fn in ir.appliers[ir.PIN_REMOVED]:
        fn(state, ev(ir.PIN_REMOVED, {"name": "p/a", "key_id": "k1"}))
    assert recovery.pins == {}
    _, public = keypair()
    for kind, payload in [
        (ir.KEY_ENROLLED, {"key_id": "k1", "name": "p/n", "public_key": public,
                           "expires_at": None, "replaces": None}),
        (ir.KEY_ENROLLED, {"key_id": "k2", "name": "p/n", "public_key": public,
                           "expires_at": None, "replaces": "k1"}),
    ]:
        for fn in ir.appliers[kind]:
            fn(state, ev(kind, payload))
    assert recovery.enrolled["k1"].revoked and not recovery.enrolled["k2"].revoked
    assert recovery.live_key("p/n", time.time()).key_id == "k2"
    for fn in ir.appliers[ir.KEY_REVOKED]:
        fn(state, ev(ir.KEY_REVOKED, {"key_id": "k2", "name": "p/n"}))
    assert recovery.live_key("p/n", time.time()) is None
    assert ir.appliers[ir.RECLAIM_AUDIT] == [] and ir.appliers[ir.ENROLLMENT_AUDIT] == []


def test_enrolled_keys_prove_their_name_and_a_revoked_one_is_refused():
    private, public = keypair()
    recovery = recovery_with(ir.EnrolledKey("k1", "p/n", public),
                             ir.EnrolledKey("id-op", "p/x", public))  # the bundle's id wins
    keys = ir.effective_keys(STATIC, recovery)
    assert keys["id-op"] is STATIC["id-op"]
    assert verify_registration(keys, signed("p/n", private, "k1"), time.time()) == "ok"
    revoked = recovery_with(ir.EnrolledKey("k1", "p/n", public, revoked=True))
    assert verify_registration(ir.effective_keys(STATIC, revoked), signed("p/n", private, "k1"),
                               time.time()) == "revoked_key"


def test_the_generic_acl_gate_checks_the_governed_verbs_too():
    from hubd.state.acl import acl_denial, required_accesses

    assert required_accesses("identity_pin_reclaim", {"pin_name": "p/t"}, "p/op") == [
        ("identity-pin-reclaim", "agent", "p/t")]
    assert required_accesses("identity_revoke", {"name": "p/n"}, "p/op") == [
        ("identity-enroll", "agent", "p/n")]
    denial = acl_denial((), "p/op", "identity_enroll", {"name": "p/n"})
    assert denial.text == "access denied: identity-enroll on agent:p/n"

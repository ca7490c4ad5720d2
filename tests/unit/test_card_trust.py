"""Signed capability cards: the pure verification (hubd/state/card_trust.py)
and the trust bundle's parsing."""

from __future__ import annotations

import base64
import hashlib
import json

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from hubd.state import card_trust as ct
from hubd.state.acl import PolicyError
from hubd.state.capabilities import card

NOW = 1_800_000_000.0
PRIVATE = Ed25519PrivateKey.generate()
PUBLIC = PRIVATE.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def _bundle(**over) -> dict:
    entry = {"key_id": "card-1", "public_key": base64.b64encode(PUBLIC).decode(),
             "agents": ["p/alice"], "projects": ["p"], **over}
    return ct.parse_card_trust({"keys": [entry]})


def _canonical(value) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _signed(sequence=1, skills=("python",), signed_at=NOW, expires_at=NOW + 300, key=PRIVATE,
            **fields) -> dict:
    """A card as the hub projects it, signed the way the reference client signs."""
    frame = {"description": "builder", "skills": list(skills), "task_classes": ["code"],
             **fields}
    projected = card(frame, "p/alice", NOW)
    stable = {k: v for k, v in projected.items()
              if k not in ("advertised_at", "verification", "signature")}
    signature = {"algorithm": "ed25519", "version": 1, "key_id": "card-1",
                 "sequence": sequence, "signed_at": signed_at, "expires_at": expires_at,
                 "card_digest": hashlib.sha256(ct.DIGEST_DOMAIN + _canonical(stable)).hexdigest()}
    value = key.sign(ct.SIGNATURE_DOMAIN + _canonical({**stable, "signature": signature}))
    return card({**frame, "signature": {**signature,
                                        "value": base64.b64encode(value).decode()}},
                "p/alice", NOW)


def _result(c, keys=None, history=None, agent="p/alice", project="p") -> str:
    keys = _bundle() if keys is None else keys
    return ct.verify_card(c, keys, history or ct.CardHistory(), NOW, agent, project) \
        .verification["result"]


def test_each_result():
    assert _result(_signed()) == "valid"
    assert _result(card({"description": "x"}, "p/alice", NOW)) == "missing_signature"
    assert _result(_signed(), keys={}) == "unknown_key"
    assert _result(_signed(), keys=_bundle(revoked=True)) == "revoked_key"
    assert _result(_signed(), keys=_bundle(expires_at=NOW - 1)) == "expired"
    assert _result(_signed(), agent="q/mallory") == "agent_mismatch"
    assert _result(_signed(), keys=_bundle(projects=["other"])) == "project_scope_mismatch"
    assert _result(_signed(sequence=0)) == "sequence_mismatch"
    assert _result(_signed(expires_at=NOW - 100, signed_at=NOW - 400)) == "expired"
    changed = _signed()
    changed["description"] = "something else"
    assert _result(changed) == "bad_signature"
    forged = _signed(key=Ed25519PrivateKey.generate())
    assert ct.verify_card(forged, _bundle(), ct.CardHistory(), NOW, "p/alice", "p") \
        .verification["detail"] == "Ed25519 signature does not verify over the canonical card"


def test_the_lifecycle_history_refuses_a_replay_and_flags_a_downgrade():
    history = ct.CardHistory()

    def accept(c) -> str:
        verdict = ct.verify_card(c, _bundle(), history, NOW, "p/alice", "p")
        if verdict.remember is not None:  # what the journal applier does
            history.entries[("p/alice", "card-1")] = (
                verdict.remember["sequence"], frozenset(verdict.remember["capabilities"]),
                verdict.remember["expires_at"])
        return verdict.verification["result"]

    assert accept(_signed(sequence=1, skills=("python", "rust"))) == "valid"
    assert accept(_signed(sequence=1, skills=("python", "rust"))) == "sequence_mismatch"
    assert accept(_signed(sequence=2, skills=("python",))) == "capability_downgrade"
    # judged against what it had: rust stays missing
    assert accept(_signed(sequence=3, skills=("python",))) == "capability_downgrade"
    assert accept(_signed(sequence=4, skills=("python", "rust"))) == "valid"


def test_a_valid_verification_carries_its_context():
    shown = ct.verify_card(_signed(sequence=7), _bundle(), ct.CardHistory(), NOW, "p/alice",
                           "p").verification
    assert {k: shown[k] for k in ("key_id", "sequence", "signed_at", "expires_at")} == \
        {"key_id": "card-1", "sequence": 7, "signed_at": NOW, "expires_at": NOW + 300}
    assert len(shown["card_digest"]) == 64


@pytest.mark.parametrize("doc", [
    [], {"keys": {}}, {"keys": [5]}, {"keys": [{"key_id": "k"}]},
    {"keys": [{"key_id": "k", "public_key": "AAAA", "agents": ["a"], "projects": ["p"]}]},
    {"keys": [{"key_id": "k", "public_key": base64.b64encode(PUBLIC).decode(),
               "agents": "a", "projects": ["p"]}]},
    {"keys": [{"key_id": "k", "public_key": base64.b64encode(PUBLIC).decode(),
               "agents": ["a"], "projects": ["p"], "revoked": "no"}]},
])
def test_a_bad_trust_bundle_is_refused_with_a_reason(doc):
    with pytest.raises(PolicyError):
        ct.parse_card_trust(doc)

"""Equivocation quarantine rows and recovery decisions (federation/quarantine.py)."""

from __future__ import annotations

import hashlib

import pytest

from federation.log_model import Equivocation
from federation.quarantine import (MULTIHUB_EQUIVOCATION, MULTIHUB_EQUIVOCATION_RECOVERY,
                                   RecoveryRefused, active_quarantines, equivocation_payload,
                                   recovery_decision, recovery_payload)

A, B = "a" * 64, "b" * 64


def test_equivocation_payload_is_digest_only():
    payload = equivocation_payload(Equivocation("west", 3, A, B), "east", 12.5)
    assert payload["peer_id"] == "west" and payload["observer_id"] == "east"
    assert (payload["seq"], payload["accepted_fingerprint"], payload["conflicting_fingerprint"],
            payload["detected_at"], payload["status"]) == (3, A, B, 12.5, "quarantined")
    assert payload["peer_id_sha256"] == hashlib.sha256(b"west").hexdigest()


def test_recovery_payload():
    payload = recovery_payload("west", "incident-commander", "checkpoint verified",
                               "west-generation-2", 99.0)
    assert {k: payload[k] for k in ("peer_id", "operator", "new_log_generation",
                                    "recovered_at")} == {
        "peer_id": "west", "operator": "incident-commander",
        "new_log_generation": "west-generation-2", "recovered_at": 99.0}
    assert payload["reason_sha256"] == hashlib.sha256(b"checkpoint verified").hexdigest()
    assert "checkpoint verified" not in str(payload)
    assert payload["recovered_by"] == "incident-commander"
    assert payload["explicit_recovery"] is True and payload["status"] == "recovered"
    long = recovery_payload("w", "o" * 300, "r", "é" * 200, 1.0)
    assert long["recovered_by_truncated"] and len(long["recovered_by"].encode()) == 256
    assert long["new_log_generation_truncated"] and long["operator"] == "o" * 300
    for bad in ({"peer_id": " "}, {"operator": ""}, {"reason": None},
                {"new_log_generation": ""}, {"recovered_at": float("nan")}):
        args = {"peer_id": "w", "operator": "o", "reason": "r", "new_log_generation": "g",
                "recovered_at": 1.0, **bad}
        with pytest.raises(RecoveryRefused):
            recovery_payload(**args)


def rows():
    return [
        (MULTIHUB_EQUIVOCATION, {"peer_id": "west", "seq": 3, "accepted_fingerprint": A,
                                 "conflicting_fingerprint": B, "detected_at": 5.0,
                                 "observer_id": "east"}),
        (MULTIHUB_EQUIVOCATION, {"peer_id": "north", "seq": True,
                                 "accepted_fingerprint": "bad"}),
        (MULTIHUB_EQUIVOCATION_RECOVERY, {"peer_id": "north", "new_log_generation": "g2"}),
        ("claim", {"peer_id": "west"}),
    ]


def test_active_quarantines():
    active = active_quarantines(rows())
    assert set(active) == {"west", "north"}  # north's recovery is not explicit
    assert active["west"].to_json() == {"peer_id": "west", "seq": 3, "accepted_fingerprint": A,
                                        "conflicting_fingerprint": B, "detected_at": 5.0,
                                        "observer_id": "east", "reason": "conflicting_offer"}
    assert active["north"].seq == 0 and active["north"].accepted_fingerprint == "0" * 64
    recovered = rows() + [(MULTIHUB_EQUIVOCATION_RECOVERY,
                           recovery_payload("west", "op", "r", "g2", 9.0))]
    assert set(active_quarantines(recovered)) == {"north"}
    again = recovered + [rows()[0]]  # a new equivocation after recovery
    assert set(active_quarantines(again)) == {"north", "west"}


def test_recovery_decision():
    payload = recovery_decision(rows(), "west", "op", "why", "g2", 9.0)
    assert payload["peer_id"] == "west"
    with pytest.raises(RecoveryRefused, match="no equivocation record"):
        recovery_decision(rows(), "south", "op", "why", "g2", 9.0)
    done = rows() + [(MULTIHUB_EQUIVOCATION_RECOVERY, payload)]
    with pytest.raises(RecoveryRefused, match="already recovered"):
        recovery_decision(done, "west", "op", "why", "g2", 9.0)

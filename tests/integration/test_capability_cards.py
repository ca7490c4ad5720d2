"""Signed capability cards on a real hubd process: the card's verification
is projected on the broadcast, its lifecycle history is journaled (a frame
replayed after a restart is still a sequence_mismatch), and a bad trust file
stops the start with its reason (docs/capabilities.md "Signed cards")."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import time

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from hubd.state import card_trust as ct
from hubd.state.capabilities import card
from tests.support.procs import hubd_process
from tests.support.wsprobe import joined


def _canonical(value) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def signed_frame(private, sequence: int, sender: str = "p/alice", key_id: str = "card-1",
                 task_classes: tuple = ("code",)) -> dict:
    """An advertise frame signed over the card the hub projects from it."""
    now = time.time()
    frame = {"sender": sender, "target": "System", "type": "advertise", "payload": "",
             "description": "builder", "skills": ["python"], "task_classes": list(task_classes)}
    stable = {k: v for k, v in card(frame, sender, now).items()
              if k not in ("advertised_at", "verification", "signature")}
    signature = {"algorithm": "ed25519", "version": 1, "key_id": key_id,
                 "sequence": sequence, "signed_at": now, "expires_at": now + 300,
                 "card_digest": hashlib.sha256(ct.DIGEST_DOMAIN + _canonical(stable)).hexdigest()}
    value = private.sign(ct.SIGNATURE_DOMAIN + _canonical({**stable, "signature": signature}))
    return {**frame, "signature": {**signature, "value": base64.b64encode(value).decode()}}


def trust_file(tmp_path, private) -> str:
    """A trust file with one key, card-1, for p/alice in project p."""
    public = private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    path = tmp_path / "card-trust.json"
    path.write_text(json.dumps({"keys": [{"key_id": "card-1", "agents": ["p/alice"],
                                          "projects": ["p"],
                                          "public_key": base64.b64encode(public).decode()}]}))
    return str(path)


async def _advertised(url: str, frame: dict) -> dict:
    alice = await joined(url, "p/alice")
    await alice.send_json(frame)
    got = await alice.recv_type("capability_advertised", agent="p/alice")
    await alice.close()
    return got["card"]["verification"]


def test_a_replayed_signed_card_is_refused_across_a_restart(tmp_path):
    private = Ed25519PrivateKey.generate()
    hub = hubd_process(tmp_path / "hub", "--capability-card-trust", trust_file(tmp_path, private))
    hub.start()
    try:
        first = signed_frame(private, 1)
        shown = asyncio.run(_advertised(hub.url, first))
        assert (shown["result"], shown["key_id"], shown["sequence"]) == ("valid", "card-1", 1)
        hub.stop()
        hub.start()
        assert asyncio.run(_advertised(hub.url, first))["result"] == "sequence_mismatch"
        assert asyncio.run(_advertised(hub.url, signed_frame(private, 2)))["result"] == "valid"
        # a card changed after signing: advertised all the same, but not valid
        tampered = dict(signed_frame(private, 3), description="something else")
        shown = asyncio.run(_advertised(hub.url, tampered))
        assert (shown["result"], shown["detail"]) == (
            "bad_signature", "card digest does not match its stable advertisement fields")
    finally:
        hub.stop()


@pytest.mark.parametrize("text, reason", [
    ("[]", "must be an object with a 'keys' list"),
    ('{"keys": [{"key_id": "k", "public_key": "AAAA", "agents": ["a"], "projects": ["p"]}]}',
     "public_key must be base64 of 32 bytes"),
])
def test_a_bad_trust_file_stops_the_start_with_its_reason(tmp_path, text, reason):
    path = tmp_path / "bad.json"
    path.write_text(text)
    hub = hubd_process(tmp_path / "hub", "--capability-card-trust", str(path))
    with pytest.raises(RuntimeError):
        hub.start(ready_timeout=15)
    assert reason in hub.log(), hub.log()[-2000:]

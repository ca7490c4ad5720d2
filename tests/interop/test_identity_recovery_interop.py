"""Governed identity recovery with the reference's own operator CLI
(`synapse identity reclaim|enroll|revoke --json`), unchanged, against the
reference hub and hubd started with the same flags and files: the same exit
codes and the same verdicts (docs/reference-observed.md §19, §24;
docs/identity.md, "Governed identity recovery"). The audit sequence numbers
are each hub's own journal's; where one is given, both give one.
"""

from __future__ import annotations

import asyncio
import base64
import json
import secrets
import time
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from tests.support.procs import hubd_process, reference_hub_process
from tests.support.refclient import RefClient
from tests.support.wsprobe import WsProbe

pytestmark = pytest.mark.interop

KINDS = ["reference", "hubd"]


def owner_only(path: Path, doc) -> Path:
    path.write_text(json.dumps(doc))
    path.chmod(0o600)
    return path


def start(kind: str, root: Path, *args: str):
    common = [*args, "--no-durable-ingress-quota"]
    if kind == "reference":
        proc = reference_hub_process(root / "hub", *common, hub_id="iop-east")
    else:
        proc = hubd_process(root / "hub", *common, hub_id="iop-east")
    return proc.start()


def pin(url: str, name: str, key_id: str) -> None:
    """A first signed registration presenting its public key: both hubs pin it."""
    private = Ed25519PrivateKey.generate()
    public = base64.b64encode(private.public_key().public_bytes(
        Encoding.Raw, PublicFormat.Raw)).decode()
    frame = {"sender": name, "target": "System", "type": "heartbeat", "payload": "online",
             "timestamp": time.time(), "protocol_version": 7, "identity_public_key": public,
             "signature": {"version": 1, "key_id": key_id, "algorithm": "ed25519",
                           "nonce": secrets.token_urlsafe(18), "sequence": 1,
                           "signed_at": time.time()}}
    body = json.dumps(frame, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    frame["signature"]["value"] = base64.b64encode(private.sign(body.encode())).decode()

    async def run():
        probe = await WsProbe.open(url)
        await probe.send_json(frame)
        await probe.recv_type("presence_update", agent=name, timeout=10)
        await probe.close()
    asyncio.run(run())


def verdict(ref: RefClient, *argv: str) -> tuple[int, dict]:
    res = ref.run("identity", *argv, "--uri", ref.url, "--json", uri=False, timeout=40)
    assert res.stdout.startswith("{"), str(res)
    got = json.loads(res.stdout)
    seq = got.pop("audit_seq", None)
    got["audited"] = isinstance(seq, int) and not isinstance(seq, bool)
    return res.returncode, got


@pytest.fixture(params=KINDS)
def kind(request, reference_venv_status):
    if reference_venv_status[0] is None:
        from tests.support.prereq import missing
        missing(reference_venv_status[1])
    return request.param


EXPECTED_RECLAIM = [
    (1, {"applied": False, "audited": False, "break_glass": False,
         "detail": "the current pin does not match the expected key id",
         "expected_key_id": "wrong", "pin_name": "p/tofu"}),
    (1, {"applied": False, "audited": False, "break_glass": False,
         "detail": "a non-empty operator reason is required",
         "expected_key_id": "id-tofu", "pin_name": "p/tofu"}),
    (0, {"applied": True, "audited": True, "break_glass": False,
         "detail": "identity pin reclaimed; the next valid proof may pin the name",
         "expected_key_id": "id-tofu", "pin_name": "p/tofu"}),
    (1, {"applied": False, "audited": False, "break_glass": False,
         "detail": "the target has no identity pin",
         "expected_key_id": "id-tofu", "pin_name": "p/tofu"}),
]


def test_the_reference_cli_reclaims_a_pin_the_same_on_both_hubs(kind, tmp_path):
    policy = owner_only(tmp_path / "acl.json", {"rules": [
        {"permission": "identity-pin-reclaim", "target_kind": "agent",
         "target_pattern": "p/*"}]})
    proc = start(kind, tmp_path, "--acl-policy", str(policy))
    ref = RefClient(proc.url, tmp_path / "home")
    try:
        pin(proc.url, "p/tofu", "id-tofu")
        got = [
            verdict(ref, "reclaim", "p/tofu", "--operator", "p/op", "--expected-key-id",
                    "wrong", "--reason", "stale laptop"),
            verdict(ref, "reclaim", "p/tofu", "--operator", "p/op", "--expected-key-id",
                    "id-tofu", "--reason", " "),
            verdict(ref, "reclaim", "p/tofu", "--operator", "p/op", "--expected-key-id",
                    "id-tofu", "--reason", "stale laptop"),
            verdict(ref, "reclaim", "p/tofu", "--operator", "p/op", "--expected-key-id",
                    "id-tofu", "--reason", "again"),
        ]
        assert got == EXPECTED_RECLAIM
        pin(proc.url, "p/tofu", "id-new")  # the next valid proof pins the name again
    finally:
        ref.stop_all()
        proc.stop()


EXPECTED_ENROLMENT = [
    (0, {"applied": True, "audited": True, "detail": "identity key 'k-new' enrolled for 'p/new'",
         "expected_key_id": "", "key_id": "k-new", "name": "p/new"}),
    (1, {"applied": False, "audited": True, "detail": "key id is already in use",
         "expected_key_id": "", "key_id": "k-new", "name": "p/other"}),
    (1, {"applied": False, "audited": False,
         "detail": "not authorised to enrol keys for this name",
         "expected_key_id": "", "key_id": "k-q", "name": "q/new"}),
    (1, {"applied": False, "audited": True,
         "detail": "public key must be base64 of 32 raw Ed25519 bytes",
         "expected_key_id": "", "key_id": "k-bad", "name": "p/bad"}),
    (0, {"applied": True, "audited": True, "detail": "identity key 'k-new' for 'p/new' revoked",
         "expected_key_id": "", "key_id": "k-new", "name": "p/new"}),
    (1, {"applied": False, "audited": True, "detail": "the enrolled key is already revoked",
         "expected_key_id": "", "key_id": "k-new", "name": "p/new"}),
]


def test_the_reference_cli_enrols_and_revokes_the_same_on_both_hubs(kind, tmp_path):
    files = tmp_path / "files"
    files.mkdir(mode=0o700)
    ref = RefClient("ws://unused", tmp_path / "home")
    trust, grants = files / "identity-trust.json", files / "role-grants.json"
    for argv in (("identity", "machine-key", "--sender", "p/op", "--trust", str(trust)),
                 ("role", "grant", "--to", "p/op", "--store", str(grants),
                  "p/identity-enroller")):
        res = ref.run(*argv, uri=False, token="")
        assert res.returncode == 0, str(res)
    policy = owner_only(files / "acl.json", {"rules": [
        {"permission": "identity-enroll", "target_kind": "agent", "target_pattern": "p/*"}]})
    proc = start(kind, tmp_path, "--identity-trust", str(trust), "--require-identity-binding",
                 "--acl-policy", str(policy), "--role-grants", str(grants),
                 "--identity-enrollments", str(files / "enrolled.json"),
                 "--identity-enrollment-namespace", "p")
    ref.url = proc.url
    key = base64.b64encode(Ed25519PrivateKey.generate().public_key().public_bytes(
        Encoding.Raw, PublicFormat.Raw)).decode()
    try:
        got = [
            verdict(ref, "enroll", "p/new", "--operator", "p/op", "--key-id", "k-new",
                    "--public-key", key, "--reason", "onboard"),
            verdict(ref, "enroll", "p/other", "--operator", "p/op", "--key-id", "k-new",
                    "--public-key", key, "--reason", "onboard"),
            verdict(ref, "enroll", "q/new", "--operator", "p/op", "--key-id", "k-q",
                    "--public-key", key, "--reason", "onboard"),
            verdict(ref, "enroll", "p/bad", "--operator", "p/op", "--key-id", "k-bad",
                    "--public-key", "notbase64", "--reason", "onboard"),
            verdict(ref, "revoke", "p/new", "--operator", "p/op", "--key-id", "k-new",
                    "--reason", "offboard"),
            verdict(ref, "revoke", "p/new", "--operator", "p/op", "--key-id", "k-new",
                    "--reason", "offboard"),
        ]
        assert got == EXPECTED_ENROLMENT
    finally:
        ref.stop_all()
        proc.stop()

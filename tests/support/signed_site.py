"""A hub's identity files made by the reference's own CLI (trust bundle, role
grants) plus an ACL policy and per-message keys, and the flags that name
them: the same argument list starts the reference hub and hubd
(docs/reference-observed.md §11-§13).

Raw probes sign with independent code (plain hmac / cryptography), the
construction the docs describe; the reference client signs for itself.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.refclient import RefClient

TOKEN = "signed-site-token-0123"
MAC_SECRET = "mac-secret-0123456789abcdef"
ATTACH_ACL = [{"permission": p, "target_kind": "attachment", "target_pattern": "p"}
              for p in ("attachment-read", "attachment-write", "attachment-admin")]
CLAIM_ACL = [{"permission": p, "target_kind": "claim", "target_pattern": "*"}
             for p in ("claim", "release")] + \
    [{"permission": "claim", "target_kind": "path", "target_pattern": "*"}]


def owner_only(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o600)
    return path


@dataclass
class Seat:
    name: str
    pem: Path
    key_id: str
    mac_kid: str

    @property
    def identity(self) -> tuple[Path, str]:
        return self.pem, self.key_id

    @property
    def mac(self) -> tuple[str, str]:
        return self.mac_kid, MAC_SECRET


@dataclass
class SignedSite:
    """Files under `root` for seats name -> role grants."""

    root: Path
    # runs `synapse identity keygen` / `synapse role grant`; None: the same
    # files written here (for hubd-only tests that need no reference)
    ref: RefClient | None
    seats: dict[str, Seat] = field(default_factory=dict)
    flags: list[str] = field(default_factory=list)

    @classmethod
    def make(cls, root: Path, ref: RefClient | None, roles: dict[str, list[str]], acl: list[dict],
             attachments: bool = False) -> "SignedSite":
        root.mkdir(parents=True, exist_ok=True)
        root.chmod(0o700)
        site = cls(root, ref)
        trust, grants = root / "identity-trust.json", root / "role-grants.json"
        mac_flags = []
        for index, (name, granted) in enumerate(roles.items()):
            pem = root / f"id-{index}.pem"
            if ref is None:
                _keygen(name, f"id-{index}", pem, trust)
                _grant(name, granted, grants)
            else:
                site._synapse("identity", "keygen", "--sender", name, "--key-id",
                              f"id-{index}", "--private-out", str(pem), "--trust", str(trust))
                for role in granted:
                    site._synapse("role", "grant", "--to", name, "--store", str(grants), role)
            site.seats[name] = Seat(name, pem, f"id-{index}", f"mac-{index}")
            mac_flags += ["--message-auth-key", f"mac-{index}:{MAC_SECRET}:{name}"]
        if not grants.exists():
            owner_only(grants, json.dumps({"grants": {}}))
        policy = owner_only(root / "acl.json", json.dumps({"rules": acl}))
        site.flags = ["--token", TOKEN, "--identity-trust", str(trust),
                      "--require-identity-binding", *mac_flags, "--require-message-auth",
                      "--acl-policy", str(policy), "--require-acl", "--role-grants", str(grants)]
        if attachments:
            store = root / "attachments"
            store.mkdir(mode=0o700)
            site.flags += ["--attachment-root", str(store)]
        return site

    def _synapse(self, *args: str) -> None:
        res = self.ref.run(*args, uri=False, token="")
        assert res.returncode == 0, str(res)


def _keygen(sender: str, key_id: str, pem: Path, trust: Path) -> None:
    """What `synapse identity keygen --trust` writes (reference-observed §11.1)."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import (Encoding, NoEncryption,
                                                              PrivateFormat, PublicFormat)

    private = Ed25519PrivateKey.generate()
    pem.write_bytes(private.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()))
    pem.chmod(0o600)
    doc = json.loads(trust.read_text()) if trust.exists() else {"keys": []}
    raw = private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    doc["keys"].append({"key_id": key_id, "public_key": base64.b64encode(raw).decode(),
                        "senders": [sender]})
    owner_only(trust, json.dumps(doc))


def _grant(name: str, roles: list[str], grants: Path) -> None:
    doc = json.loads(grants.read_text()) if grants.exists() else {"grants": {}}
    for role in roles:
        doc["grants"].setdefault(role, []).append(name)
    owner_only(grants, json.dumps(doc))


def sign_registration(frame: dict, pem: Path, key_id: str, sequence: int = 1) -> dict:
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    private = load_pem_private_key(pem.read_bytes(), password=None)
    frame = dict(frame, signature={"version": 1, "key_id": key_id, "algorithm": "ed25519",
                                   "nonce": secrets.token_urlsafe(18), "sequence": sequence,
                                   "signed_at": time.time()})
    body = json.dumps(frame, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    frame["signature"]["value"] = base64.b64encode(private.sign(body.encode())).decode()
    return frame


def mac(frame: dict, kid: str, secret: str = MAC_SECRET, **auth) -> dict:
    frame = dict(frame, auth={"alg": "hmac-sha256", "kid": kid,
                              "nonce": secrets.token_urlsafe(18),
                              "sequence": time.time_ns() // 1000, "timestamp": time.time(),
                              **auth})
    body = json.dumps(frame, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    frame["auth"]["value"] = hmac.new(secret.encode(), body.encode(), hashlib.sha256).hexdigest()
    return frame


def envelope(sender: str, type_: str, target: str = "SynapseHub", **fields) -> dict:
    return {"sender": sender, "target": target, "type": type_, "payload": "",
            "timestamp": time.time(), **fields}


class SignedProbe:
    """A raw connection registered with a signed registration, whose
    attachment requests are signed (`ask`) and answered in order."""

    def __init__(self, probe, seat: Seat):
        self.probe, self.seat = probe, seat

    @classmethod
    async def open(cls, url: str, seat: Seat, version: int | None = 7) -> "SignedProbe":
        from tests.support.wsprobe import WsProbe

        probe = await WsProbe.open(url)
        hello = envelope(seat.name, "heartbeat", target="System", payload="online",
                         token=TOKEN, **({"protocol_version": version} if version else {}))
        await probe.send_json(sign_registration(hello, seat.pem, seat.key_id))
        await probe.recv_type("welcome")
        return cls(probe, seat)

    async def ask(self, type_: str, signed: bool = True, **fields) -> dict:
        """The answer to one request: its attachment_result (or
        attachment_peer_result) or an `error`."""
        frame = envelope(self.seat.name, type_, **fields)
        await self.probe.send_json(mac(frame, self.seat.mac_kid) if signed else frame)
        return await self.probe.recv(lambda f: f.get("type") in (
            "attachment_result", "attachment_peer_result", "error"), timeout=20)

    async def close(self) -> None:
        await self.probe.close()


def begin_fields(data: bytes, scope: str = "p", **over) -> dict:
    return {"scope": scope, "digest": hashlib.sha256(data).hexdigest(), "length": len(data),
            "media_type": "application/octet-stream", "provenance": "test:run1",
            "expires_at": time.time() + 3600, **over}


async def upload(conn: SignedProbe, data: bytes, scope: str = "p", chunk: int = 32768,
                 **over) -> dict:
    """Begin, chunks, commit; the commit's answer (or the first refusal)."""
    begun = await conn.ask("attachment_begin", **begin_fields(data, scope, **over))
    if not begun.get("ok"):
        return begun
    upload_id = begun["upload_id"]
    for offset in range(0, len(data), chunk):
        body = base64.b64encode(data[offset:offset + chunk]).decode()
        got = await conn.ask("attachment_chunk", scope=scope, upload_id=upload_id,
                             offset=offset, body=body)
        if not got.get("ok"):
            return got
    return await conn.ask("attachment_commit", scope=scope, upload_id=upload_id)


async def read_back(conn: SignedProbe, digest: str, scope: str = "p") -> bytes:
    data, offset = b"", 0
    while True:
        got = await conn.ask("attachment_read", scope=scope, digest=digest, offset=offset)
        assert got.get("ok"), got
        data += base64.b64decode(got["body"])
        offset += len(base64.b64decode(got["body"]))
        if got["eof"]:
            return data


def start_signed_hub(kind: str, tmp_path: Path, roles: dict[str, list[str]], acl: list[dict],
                     attachments: bool = False, extra: tuple[str, ...] = (),
                     reference_files: bool = True, scheme: str = "ws",
                     hub_id: str = "iop-east", folder: str = "") -> SignedSite:
    """The reference hub or hubd (`kind`) with the same identity files and
    flags (plus `extra`), started; `site.proc` is the process, `site.ref` a
    reference client for it."""
    from tests.support.procs import hubd_process, reference_hub_process

    base = tmp_path / folder if folder else tmp_path
    ref = RefClient("ws://unused", base / "home") if reference_files else None
    site = SignedSite.make(base / "files", ref, roles, acl, attachments)
    # the identical argument list for both (the process helpers add --host,
    # --port, --db and --hub-id; the reference's adds --metrics, which hubd takes too)
    args = [*site.flags, *extra, "--no-durable-ingress-quota"]
    if kind == "reference":
        proc = reference_hub_process(base / "hub", *args, hub_id=hub_id, scheme=scheme)
    else:
        proc = hubd_process(base / "hub", *args, hub_id=hub_id, scheme=scheme)
    proc.start()
    if ref is not None:
        ref.url, ref.token = proc.url, TOKEN
    site.proc = proc
    return site

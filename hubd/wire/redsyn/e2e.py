"""End-to-end encryption (seed 003): P-256 ECDH, HKDF-SHA256, AES-256-GCM.

The hub never calls `seal` or `open_envelope`: it stores and passes sealed
bodies unread. These are here for the nodes hubd's tests and tools run, and
so the format lives in one place.
"""

from __future__ import annotations

import json
import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from .envelope import ENCRYPTED_TYPE, b64url, b64url_decode

INFO = b"redsyn-e2e-v1"
ALG = "P256-HKDF-SHA256-A256GCM"


def new_enc_key() -> tuple[ec.EllipticCurvePrivateKey, str]:
    """A node's P-256 key pair; the public half as the seed sends it."""
    private = ec.generate_private_key(ec.SECP256R1())
    return private, public_b64(private)


def public_b64(private: ec.EllipticCurvePrivateKey) -> str:
    return b64url(private.public_key().public_bytes(serialization.Encoding.X962,
                                                    serialization.PublicFormat.UncompressedPoint))


def _key(private: ec.EllipticCurvePrivateKey, peer_public: bytes, epk: bytes) -> bytes:
    shared = private.exchange(ec.ECDH(), ec.EllipticCurvePublicKey.from_encoded_point(
        ec.SECP256R1(), peer_public))
    return HKDF(hashes.SHA256(), 32, salt=epk, info=INFO).derive(shared)


def _aad(id_: str, kind: str, files: bool = False) -> bytes:
    return f"redsyn-e2e-v1|{id_}|{kind}".encode() + (b"|files" if files else b"")


def seal(enc_key: str, id_: str, kind: str, body: dict, refs: list, reply_key: str,
         files: bytes | None = None) -> tuple[dict, bytes | None]:
    """The encrypted body (and sealed zip) for a message to the holder of enc_key."""
    ephemeral = ec.generate_private_key(ec.SECP256R1())
    epk = b64url_decode(public_b64(ephemeral), "epk")
    key = _key(ephemeral, b64url_decode(enc_key, "enc_key"), epk)
    nonce = os.urandom(12)
    plain = json.dumps({"body": body, "refs": refs, "reply_key": reply_key}).encode()
    ct = AESGCM(key).encrypt(nonce, plain, _aad(id_, kind))
    sealed_files = None
    files_nonce = b""
    if files is not None:
        files_nonce = os.urandom(12)
        sealed_files = AESGCM(key).encrypt(files_nonce, files, _aad(id_, kind, files=True))
    enc = {"v": 1, "alg": ALG, "epk": b64url(epk), "nonce": b64url(nonce), "ct": b64url(ct),
           "files_nonce": b64url(files_nonce) if files_nonce else ""}
    return {"type": ENCRYPTED_TYPE, "enc": enc}, sealed_files


def open_envelope(e: dict, private: ec.EllipticCurvePrivateKey) -> dict | None:
    """The seed's open(): the sealed {"body", "refs", "reply_key"}, or None."""
    enc = e["body"]["enc"]
    epk = b64url_decode(enc["epk"], "epk")
    key = _key(private, epk, epk)
    try:
        plain = AESGCM(key).decrypt(b64url_decode(enc["nonce"], "nonce"),
                                    b64url_decode(enc["ct"], "ct"), _aad(e["id"], e["kind"]))
    except InvalidTag:
        return None
    return json.loads(plain.decode())


def open_files(e: dict, sealed: bytes, private: ec.EllipticCurvePrivateKey) -> bytes | None:
    enc = e["body"]["enc"]
    epk = b64url_decode(enc["epk"], "epk")
    try:
        return AESGCM(_key(private, epk, epk)).decrypt(
            b64url_decode(enc["files_nonce"], "files_nonce"), sealed,
            _aad(e["id"], e["kind"], files=True))
    except InvalidTag:
        return None

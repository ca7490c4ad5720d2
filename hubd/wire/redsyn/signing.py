"""Ed25519 node signatures (seed 003, "Signatures").

A node signs the RFC 8785 form of the seed's fields of an envelope; the hub
accepts a signature only from the key that node registered, only if it covers
exactly what arrived, and only within ten minutes of the hub's clock (401
otherwise). Delivered envelopes carry the exact payload that was signed, so
a receiver can check it without trusting the hub (`signed_by`).
"""

from __future__ import annotations

import hashlib
import json

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from .canonical import canonical_bytes, canonical_json
from .envelope import RedsynError, b64url, b64url_decode

MAX_SKEW_SECONDS = 600
ENC_KEY_PREFIX = b"redsyn-enc-v1:"


def unauthorized(error: str) -> RedsynError:
    return RedsynError(401, error)


def fingerprint(public_key_b64: str) -> str:
    return "sha256:" + hashlib.sha256(b64url_decode(public_key_b64, "key")).hexdigest()


def parse_public_key(text, what: str = "public_key") -> Ed25519PublicKey:
    raw = b64url_decode(text, what)
    if len(raw) != 32:
        raise RedsynError(400, f"{what} must be 32 bytes (an ed25519 public key), base64url")
    return Ed25519PublicKey.from_public_bytes(raw)


def signed_fields(fields: dict, files_sha256: str) -> dict:
    """The object a signature covers, built from the envelope as it arrived."""
    def text(name: str) -> str:
        value = fields.get(name)
        return value if isinstance(value, str) else ""
    return {"v": 1, "id": text("id"), "kind": text("kind"), "from": text("from"),
            "to": text("to"), "thread": text("thread"), "reply_to": text("reply_to"),
            "ts": fields.get("ts", 0), "body": fields.get("body"),
            "refs": fields.get("refs", []), "files_sha256": files_sha256,
            "error": fields.get("error", False)}


def sign(private: Ed25519PrivateKey, fields: dict, files_sha256: str = "") -> dict:
    """The `sig` a node sends (clients and tests)."""
    public = private.public_key().public_bytes_raw()
    value = private.sign(canonical_bytes(signed_fields(fields, files_sha256)))
    return {"alg": "ed25519", "key": b64url(public), "value": b64url(value)}


def verify_arrival(fields: dict, files_sha256: str, registered_key: str | None,
                   now: float) -> str:
    """Check the signature of an arriving envelope; its signed payload (the
    canonical JSON text) when it holds, RedsynError(401) otherwise."""
    sig = fields["sig"]
    if registered_key is None:
        raise unauthorized("this node has registered no signing key (PUT /nodes/key); "
                           "its signatures cannot be checked")
    if sig["key"] != registered_key:
        raise unauthorized("sig.key is not the key this node registered")
    if not fields.get("id") or fields.get("ts") is None:
        raise unauthorized("a signed envelope carries its own id and ts")
    if abs(now - fields["ts"]) > MAX_SKEW_SECONDS:
        raise unauthorized(f"the signature's ts is more than {MAX_SKEW_SECONDS} s from the "
                           "hub's clock")
    payload = canonical_json(signed_fields(fields, files_sha256))
    try:
        parse_public_key(registered_key, "sig.key").verify(
            b64url_decode(sig["value"], "sig.value"), payload.encode())
    except InvalidSignature:
        raise unauthorized("the signature does not cover this envelope as it arrived") from None
    return payload


def verify_enc_sig(signing_key: str, enc_key: str, enc_sig: str) -> bool:
    try:
        parse_public_key(signing_key).verify(b64url_decode(enc_sig, "enc_sig"),
                                             ENC_KEY_PREFIX + enc_key.encode())
    except InvalidSignature:
        return False
    return True


def sign_enc_key(private: Ed25519PrivateKey, enc_key: str) -> str:
    return b64url(private.sign(ENC_KEY_PREFIX + enc_key.encode()))


def signed_by(e: dict) -> str:
    """The seed's receiver-side check: the key that signed this delivered
    envelope, or "" when the signature is missing or does not hold."""
    sig = e.get("sig")
    if not sig:
        return ""
    try:
        ok = True
        parse_public_key(sig["key"], "sig.key").verify(b64url_decode(sig["value"], "sig.value"),
                                                       sig["payload"].encode())
    except (InvalidSignature, RedsynError, KeyError, TypeError):
        ok = False
    if not ok:
        return ""
    p = json.loads(sig["payload"])
    if p["id"] != e["id"] or p["kind"] != e["kind"] or p["body"] != e["body"]:
        return ""
    return sig["key"]

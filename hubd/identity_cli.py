"""`hubd identity ...`: the operator's governed identity commands
(docs/identity.md, "Governed identity recovery").

`reclaim`, `enroll` and `revoke` each open one connection to a running hub
as the operator, register with the operator's Ed25519 identity key (a signed
registration: proven by the trust bundle under --require-identity-binding,
by its trust-on-first-use pin otherwise), send one request to `System` and
print the hub's private verdict: exit 0 when applied, 1 when refused, 2 when
no verdict came (the reference's `synapse identity ...` contract, with its
--json shape). `keygen` makes an identity key and prints its trust-bundle
entry. The reclaim is emitted only here: no client sends it on its own.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import secrets
import sys
import time
from pathlib import Path

from hubd.state.identity_binding import signed_bytes

RESULTS = {"identity_pin_reclaim": "identity_pin_reclaim_result",
           "identity_enroll": "identity_enroll_result",
           "identity_revoke": "identity_revoke_result"}
VERB_TEXT = {"identity_enroll": "identity enrolment", "identity_revoke": "identity revocation"}


def _load_key(path: str):
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    key = load_pem_private_key(Path(path).read_bytes(), password=None)
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError(f"{path} is not an Ed25519 private key")
    return key


def public_b64(key) -> str:
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    return base64.b64encode(key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)).decode()


def signed_registration(sender: str, key, key_id: str, token: str | None = None,
                        sequence: int = 1) -> dict:
    """A registering heartbeat signed as the reference client signs one
    (docs/reference-observed.md §11.2), presenting its public key for a
    trust-on-first-use hub."""
    frame = {"sender": sender, "target": "System", "type": "heartbeat", "payload": "online",
             "timestamp": time.time(), "protocol_version": 7,
             "identity_public_key": public_b64(key),
             "signature": {"version": 1, "key_id": key_id, "algorithm": "ed25519",
                           "nonce": secrets.token_urlsafe(24), "sequence": sequence,
                           "signed_at": time.time()}}
    if token:
        frame["token"] = token
    value = key.sign(signed_bytes(frame, "value", "signature"))
    frame["signature"]["value"] = base64.b64encode(value).decode()
    return frame


async def governed_request(uri: str, operator: str, key, key_id: str, token: str | None,
                           request: dict, timeout: float) -> tuple[dict | None, str]:
    """Register as the operator, send `request`, return (the verdict frame or
    None, why not)."""
    import aiohttp

    result_type = RESULTS[request["type"]]
    async with aiohttp.ClientSession() as http:
        try:
            ws = await http.ws_connect(uri, timeout=aiohttp.ClientWSTimeout(ws_close=timeout))
        except (aiohttp.ClientError, OSError) as exc:
            return None, f"cannot connect to {uri}: {exc}"
        async with ws:
            await ws.send_json(signed_registration(operator, key, key_id, token))
            await ws.send_json({"sender": operator, "target": "System", "payload": "",
                                "timestamp": time.time(), **request})
            last_error = ""
            deadline = time.monotonic() + timeout
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None, last_error or "the hub returned no authoritative verdict"
                try:
                    message = await ws.receive(timeout=left)
                except asyncio.TimeoutError:
                    continue
                if message.type != aiohttp.WSMsgType.TEXT:
                    code = ws.close_code
                    return None, (f"{last_error} (closed {code})" if last_error
                                  else f"the hub closed the connection ({code})")
                frame = json.loads(message.data)
                if frame.get("type") == result_type:
                    return frame, ""
                if frame.get("type") in ("error", "auth_denied", "name_conflict"):
                    last_error = str(frame.get("payload") or "")
                    if frame.get("verification_result") is None and \
                            frame.get("type") == "error":
                        return frame, ""  # the request's own refusal (an ACL gate)


def _render(verb: str, request: dict, frame: dict) -> dict:
    detail = str(frame.get("payload") or "hub refused the request")
    if verb == "identity_pin_reclaim":
        if frame.get("type") == "error":
            return {"applied": False, "pin_name": request["pin_name"],
                    "expected_key_id": request["expected_key_id"], "detail": detail}
        return {"applied": bool(frame.get("applied")),
                "pin_name": str(frame.get("pin_name") or request["pin_name"]),
                "expected_key_id": str(frame.get("expected_key_id")
                                       or request["expected_key_id"]),
                "break_glass": bool(frame.get("break_glass")),
                "audit_seq": frame.get("audit_seq"), "detail": detail}
    return {"applied": bool(frame.get("applied")), "name": request["name"],
            "key_id": request["key_id"], "expected_key_id": request.get("expected_key_id", ""),
            "audit_seq": frame.get("audit_seq"), "detail": detail}


def _request(args: argparse.Namespace) -> dict:
    if args.command == "reclaim":
        return {"type": "identity_pin_reclaim", "pin_name": args.pin_name,
                "expected_key_id": args.expected_key_id, "reason": args.reason,
                "break_glass": args.break_glass}
    request = {"type": f"identity_{args.command}", "name": args.name, "key_id": args.key_id,
               "reason": args.reason}
    if args.command == "enroll":
        request["public_key"] = args.public_key
        if args.expected_key_id:
            request["expected_key_id"] = args.expected_key_id
        if args.expires_at is not None:
            request["expires_at"] = args.expires_at
    return request


def _governed(args: argparse.Namespace) -> int:
    try:
        key = _load_key(args.identity_key)
    except (OSError, ValueError) as exc:
        print(f"identity error: {exc}")
        return 2
    token = args.token
    if args.token_file:
        token = Path(args.token_file).read_text().strip()
    request = _request(args)
    frame, why = asyncio.run(governed_request(args.uri, args.operator, key,
                                              args.operator_key_id, token, request,
                                              args.timeout))
    verb = request["type"]
    label = "pin reclaim" if verb == "identity_pin_reclaim" else VERB_TEXT[verb]
    if frame is None:
        print(f"{label} failed: {why}")
        return 2
    rendered = _render(verb, request, frame)
    if args.json:
        print(json.dumps(rendered, indent=2, sort_keys=True))
    elif rendered["applied"]:
        suffix = f" (audit seq {rendered['audit_seq']})" if rendered.get("audit_seq") else ""
        text = (f"reclaimed identity pin for {rendered['pin_name']}"
                if verb == "identity_pin_reclaim" else rendered["detail"])
        print(f"{text}{suffix}")
    else:
        print(f"{label} refused: {rendered['detail']}")
    return 0 if rendered["applied"] else 1


def _keygen(args: argparse.Namespace) -> int:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import (Encoding, NoEncryption,
                                                              PrivateFormat)

    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
    try:
        fd = os.open(args.private_out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as exc:
        print(f"identity keygen error: cannot create {args.private_out}: {exc.strerror}")
        return 2
    with os.fdopen(fd, "wb") as out:
        out.write(pem)
    entry = {"key_id": args.key_id, "public_key": public_b64(key), "senders": [args.sender]}
    print(json.dumps({"keys": [entry]}, indent=2, sort_keys=True))
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hubd identity",
        description="Governed identity recovery: reclaim a pin, enrol or revoke a key "
                    "(docs/identity.md).")
    sub = parser.add_subparsers(dest="command", required=True)

    def governed(name: str, text: str) -> argparse.ArgumentParser:
        cmd = sub.add_parser(name, help=text)
        cmd.add_argument("--operator", required=True, help="the operator identity to send as")
        cmd.add_argument("--identity-key", required=True, metavar="PEM",
                         help="the operator's Ed25519 private key (PKCS#8 PEM)")
        cmd.add_argument("--identity-key-id", dest="operator_key_id", required=True,
                         metavar="KEY_ID",
                         help="the operator key's id (its trust-bundle entry or its pin)")
        cmd.add_argument("--reason", required=True, help="why (audited, at most 500 characters)")
        cmd.add_argument("--uri", default="ws://127.0.0.1:8876")
        cmd.add_argument("--token", default=None, help="the hub's token, if it needs one")
        cmd.add_argument("--token-file", default=None, help="read the token from this file")
        cmd.add_argument("--timeout", type=float, default=10.0, metavar="SECONDS")
        cmd.add_argument("--json", action="store_true", help="print the verdict as JSON")
        return cmd

    reclaim = governed("reclaim", "remove one exact trust-on-first-use pin")
    reclaim.add_argument("pin_name", help="the pinned identity")
    reclaim.add_argument("--expected-key-id", required=True,
                         help="the key id the pin holds now (compare-and-swap)")
    reclaim.add_argument("--break-glass", action="store_true",
                         help="also evict the identity's live connection")
    enroll = governed("enroll", "enrol (or rotate) one identity key")
    enroll.add_argument("name", help="<project>/<id> the key proves")
    enroll.add_argument("--key-id", required=True, help="the new key's id")
    enroll.add_argument("--public-key", required=True, help="base64 of the 32 raw bytes")
    enroll.add_argument("--expected-key-id", default="",
                        help="rotation: the name's current enrolled key this replaces")
    enroll.add_argument("--expires-at", type=float, default=None, metavar="TS")
    revoke = governed("revoke", "revoke one enrolled identity key")
    revoke.add_argument("name", help="<project>/<id> the key proves")
    revoke.add_argument("--key-id", required=True, help="the enrolled key's id")
    keygen = sub.add_parser("keygen", help="make an Ed25519 identity key; print its "
                                           "trust-bundle entry")
    keygen.add_argument("--sender", required=True)
    keygen.add_argument("--key-id", required=True)
    keygen.add_argument("--private-out", required=True, metavar="PEM",
                        help="where the private key goes (made owner-only; never overwritten)")
    return parser


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    code = _keygen(args) if args.command == "keygen" else _governed(args)
    sys.stdout.flush()
    return code

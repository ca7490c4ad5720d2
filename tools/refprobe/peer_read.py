"""Issue 23: wire v6 cross-hub attachment reads over mTLS."""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import time
from pathlib import Path
from typing import Any

import websockets

from .harness import (
    TOKEN,
    owner_only,
    Workdir,
    Hub,
    Conn,
    envelope,
    secure_setup,
    ATTACH_ACL,
    ledger_rows,
)


def make_pki(work: Workdir) -> dict[str, Path]:
    """A private CA, a server certificate for 127.0.0.1 and two client certificates (0600 PEMs)."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    files: dict[str, Path] = {}

    def write(name: str, data: bytes) -> Path:
        path = work.path / name
        path.write_bytes(data)
        path.chmod(0o600)
        files[name] = path
        return path

    def key_pem(key: Any) -> bytes:
        return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                 serialization.NoEncryption())

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "probe-ca")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(hours=1))
          .not_valid_after(now + datetime.timedelta(days=2))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    write("ca.pem", ca.public_bytes(serialization.Encoding.PEM))

    def leaf(name: str, usage: Any, san: bool) -> None:
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
                   .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=2))
                   .add_extension(x509.ExtendedKeyUsage([usage]), critical=False))
        if san:
            import ipaddress

            builder = builder.add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]), critical=False)
        cert = builder.sign(ca_key, hashes.SHA256())
        write(f"{name}.pem", cert.public_bytes(serialization.Encoding.PEM))
        write(f"{name}.key", key_pem(key))
        pin = hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).hexdigest()
        write(f"{name}.pin", f"sha256:{pin}".encode())

    leaf("server", ExtendedKeyUsageOID.SERVER_AUTH, True)
    leaf("dst-client", ExtendedKeyUsageOID.CLIENT_AUTH, False)
    leaf("other-client", ExtendedKeyUsageOID.CLIENT_AUTH, False)
    return files


async def probe_peer_read(work: Workdir) -> None:
    """Wire v6: a recipient hub id reads an attachment from the source hub over mTLS."""
    import ssl

    from synapse_channel.core.attachment_transport import request_attachment

    pki = make_pki(work)
    flags, signers = secure_setup(work, {"p/alice": ["p/attachment-write", "p/attachment-read"]}, ATTACH_ACL)
    store = owner_only(work.path / "federation.json", json.dumps({"version": 1, "records": [
        {"domain_id": "dst.test", "namespaces": ["p"], "certificate_pins": [pki["dst-client.pin"].read_text()],
         "signing_key_ids": ["dst-key"], "scope_grants": [{"verb": "read", "namespace": "p"}],
         "expires_at": None, "revoked": False,
         "provenance": {"source": "probe", "imported_at": 0, "confirmed_by": "probe"}},
        {"domain_id": "other.test", "namespaces": ["p"], "certificate_pins": [pki["other-client.pin"].read_text()],
         "signing_key_ids": ["other-key"], "scope_grants": [{"verb": "read", "namespace": "p"}],
         "expires_at": None, "revoked": False,
         "provenance": {"source": "probe", "imported_at": 0, "confirmed_by": "probe"}}]}))
    serving = owner_only(work.path / "serving.json", json.dumps({
        "version": 1, "federation_store": store.name, "client_ca_file": "ca.pem",
        "grants": [{"sender": "dst", "domain_id": "dst.test", "namespace": "p", "signing_key_id": "dst-key"},
                   {"sender": "other", "domain_id": "other.test", "namespace": "p", "signing_key_id": "other-key"}]}))
    recipients = owner_only(work.path / "recipients.json", json.dumps({"version": 1, "grants": []}))
    print(f"## federation store: {store.read_text()}", flush=True)
    print(f"## serving policy: {serving.read_text()}", flush=True)
    flags += ["--tls-certfile", str(pki["server.pem"]), "--tls-keyfile", str(pki["server.key"]),
              "--multihub-serving-policy", str(serving), "--attachment-recipient-policy", str(recipients)]
    hub = Hub(work, flags, "source")
    hub.start()
    try:
        client_ctx = ssl.create_default_context(cafile=str(pki["ca.pem"]))
        uri = f"wss://127.0.0.1:{hub.port}"
        ws = await websockets.connect(uri, ssl=client_ctx, compression=None)
        alice = Conn(ws, "p/alice")
        s = signers["p/alice"]
        reg = s.register(envelope("p/alice", "heartbeat", target="System", payload="online", protocol_version=7, token=TOKEN))
        await alice.send(reg, " (registration)")
        await alice.until("welcome")
        data = secrets.token_bytes(50000)
        digest = hashlib.sha256(data).hexdigest()

        async def att(msg_type: str, **fields: Any) -> dict | None:
            await alice.send(s.mac(envelope("p/alice", msg_type, scope="p", **fields), "p/alice"))
            return await alice.until("attachment_result", 2.0)

        begun = await att("attachment_begin", digest=digest, length=len(data), media_type="application/octet-stream",
                          provenance="probe:peer", expires_at=time.time() + 600)
        for offset in range(0, len(data), 32768):
            await att("attachment_chunk", upload_id=begun["upload_id"], offset=offset,
                      body=base64.b64encode(data[offset:offset + 32768]).decode())
        await att("attachment_commit", upload_id=begun["upload_id"])

        def ctx_for(name: str) -> ssl.SSLContext:
            ctx = ssl.create_default_context(cafile=str(pki["ca.pem"]))
            ctx.load_cert_chain(str(pki[f"{name}.pem"]), str(pki[f"{name}.key"]))
            return ctx

        async def peer(label: str, local_id: str, cert: str | None, action: str, dig: str = digest,
                       offset: int | None = None, version_override: Any = None) -> dict | None:
            ctx = ctx_for(cert) if cert else ssl.create_default_context(cafile=str(pki["ca.pem"]))
            try:
                result = await request_attachment(action, uri=uri, local_id=local_id, source_hub_id="src", scope="p",
                                                  digest=dig, offset=offset, token=TOKEN, ssl_context=ctx, timeout=5)
                shown = dict(result)
                if "body" in shown:  # request_attachment returns the chunk already decoded
                    shown["body"] = f"<{len(shown['body'])} bytes>"
                print(f"## {label}: {json.dumps(shown, sort_keys=True)}", flush=True)
                return result
            except Exception as exc:  # the reference raises AttachmentError with its text
                print(f"## {label}: {type(exc).__name__}: {exc}", flush=True)
                return None

        print("## before any recipient grant", flush=True)
        await peer("dst info, no grant", "dst", "dst-client", "info")
        owner_only(recipients, json.dumps({"version": 1, "grants": [
            {"recipient_hub": "dst", "scope": "p", "digest": digest, "expires_at": time.time() + 600}]}))
        print(f"## recipient policy now: {recipients.read_text()}", flush=True)
        await peer("dst info", "dst", "dst-client", "info")
        back = b""
        while True:
            got = await peer(f"dst read offset {len(back)}", "dst", "dst-client", "read", offset=len(back))
            if not got:
                break
            back += got["body"]
            if got["eof"]:
                break
        print(f"## read back {len(back)} bytes, identical={back == data}", flush=True)
        await peer("dst read past end", "dst", "dst-client", "read", offset=len(data) + 1)
        await peer("dst other digest", "dst", "dst-client", "info", dig=hashlib.sha256(b"other").hexdigest())
        await peer("other hub (served, no recipient grant)", "other", "other-client", "info")
        await peer("dst name with other's certificate", "dst", "other-client", "info")
        await peer("dst without a client certificate", "dst", None, "info")
        print("## the raw frames: register as dst, send attachment_peer_request", flush=True)
        raw = await websockets.connect(uri, ssl=ctx_for("dst-client"), compression=None)
        conn = Conn(raw, "dst(raw)")
        await conn.send(envelope("dst", "heartbeat", target="System", payload="online", protocol_version=6, token=TOKEN))
        await conn.recv(2.0)
        await conn.send(envelope("dst", "attachment_peer_request", action="read", scope="p", digest=digest, offset=32768))
        await conn.recv(2.0)
        await conn.send(envelope("dst", "attachment_peer_request", action="read", scope="p", digest=digest, offset="0"))
        await conn.recv(2.0)
        await raw.close()
        for label, ctx in (("dst(no client cert)", ssl.create_default_context(cafile=str(pki["ca.pem"]))),
                           ("dst(other's cert)", ctx_for("other-client"))):
            raw = await websockets.connect(uri, ssl=ctx, compression=None)
            conn = Conn(raw, label)
            await conn.send(envelope("dst", "heartbeat", target="System", payload="online", protocol_version=6, token=TOKEN))
            await conn.recv(2.0)
            await conn.send(envelope("dst", "attachment_peer_request", action="info", scope="p", digest=digest))
            await conn.recv(2.0)
            await conn.recv(1.0)
            await raw.close()
        raw = await websockets.connect(uri, ssl=ctx_for("dst-client"), compression=None)
        conn = Conn(raw, "dst(v5)")
        await conn.send(envelope("dst", "heartbeat", target="System", payload="online", protocol_version=5, token=TOKEN))
        await conn.recv(2.0)
        await conn.send(envelope("dst", "attachment_peer_request", action="info", scope="p", digest=digest))
        await conn.recv(2.0)
        await raw.close()
        owner_only(recipients, json.dumps({"version": 1, "grants": [
            {"recipient_hub": "dst", "scope": "p", "digest": digest, "expires_at": time.time() - 1}]}))
        await peer("dst info, grant expired", "dst", "dst-client", "info")
        owner_only(recipients, "{not json")
        await peer("dst info, policy file broken", "dst", "dst-client", "info")
        await ws.close()
        rows = ledger_rows(work, "peer_read_audit")
        print(f"## peer_read_audit rows: {rows}", flush=True)
        import sqlite3

        db = sqlite3.connect(f"file:{work.path / 'hub.db'}?mode=ro", uri=True)
        kinds = [r for r in db.execute("SELECT kind, COUNT(*) FROM events GROUP BY kind")]
        print(f"## journal kinds: {kinds}", flush=True)
    finally:
        hub.stop()

"""Issue 23: v4 attachments, their startup flags, and the reference client API."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import secrets
import time
from typing import Any

import websockets

from .harness import (
    TOKEN,
    MAC_SECRET,
    show,
    owner_only,
    Workdir,
    Hub,
    running,
    startup_refusal,
    Conn,
    envelope,
    Signer,
    connect,
    secure_setup,
    ATTACH_ACL,
    show_files,
    ledger_rows,
    sha,
)


async def probe_attachments(work: Workdir) -> None:
    flags, signers = secure_setup(
        work,
        {"p/alice": ["p/attachment-write", "p/attachment-read", "p/attachment-admin"],
         "p/bob": ["p/attachment-read"], "q/carol": ["q/attachment-write"],
         "p/dave": ["p/attachment-read"], "p/erin": ["p/attachment-read"]},
        ATTACH_ACL,
    )
    show_files(work)
    with running(work, flags) as hub:
        alice_s = signers["p/alice"]
        alice = await connect(hub, "p/alice", signer=alice_s, protocol_version=7)

        async def att(conn: Conn, sender: str, signer: Signer | None, msg_type: str, **fields: Any) -> dict | None:
            # Every attachment verb, upload_id ones included, must name the scope.
            fields.setdefault("scope", sender.split("/")[0])
            frame = envelope(sender, msg_type, **fields)
            if signer is not None:
                frame = signer.mac(frame, sender)
            await conn.send(frame)
            return await conn.until("attachment_result", 1.5)

        body = secrets.token_bytes(40 * 1024 + 123)
        digest = hashlib.sha256(body).hexdigest()
        meta = dict(scope="p", digest=digest, length=len(body), media_type="application/octet-stream",
                    provenance="probe:run1", expires_at=time.time() + 3600)
        print("## begin / chunk / commit", flush=True)
        begun = await att(alice, "p/alice", alice_s, "attachment_begin", **meta)
        upload = begun and begun.get("upload_id")
        await att(alice, "p/alice", alice_s, "attachment_chunk", upload_id=upload, offset=0,
                  body=base64.b64encode(body[:32768]).decode())
        print("## a chunk without scope (the ACL gate sees attachment:'')", flush=True)
        frame = alice_s.mac(envelope("p/alice", "attachment_chunk", upload_id=upload, offset=32768,
                                     body=base64.b64encode(body[32768:]).decode()), "p/alice")
        await alice.send(frame)
        await alice.recv(1.5)
        print("## chunk at a wrong offset, an oversize chunk, bad base64", flush=True)
        await att(alice, "p/alice", alice_s, "attachment_chunk", upload_id=upload, offset=5,
                  body=base64.b64encode(body[32768:]).decode())
        await att(alice, "p/alice", alice_s, "attachment_chunk", upload_id=upload, offset=32768,
                  body=base64.b64encode(secrets.token_bytes(32769)).decode())
        await att(alice, "p/alice", alice_s, "attachment_chunk", upload_id=upload, offset=32768, body="!!notb64")
        print("## commit before the last chunk", flush=True)
        await att(alice, "p/alice", alice_s, "attachment_commit", upload_id=upload)
        await att(alice, "p/alice", alice_s, "attachment_chunk", upload_id=upload, offset=32768,
                  body=base64.b64encode(body[32768:]).decode())
        await att(alice, "p/alice", alice_s, "attachment_commit", upload_id=upload)
        print("## begin again the same digest", flush=True)
        await att(alice, "p/alice", alice_s, "attachment_begin", **meta)
        print("## info / read / read past end / preview", flush=True)
        await att(alice, "p/alice", alice_s, "attachment_info", scope="p", digest=digest)
        first = await att(alice, "p/alice", alice_s, "attachment_read", scope="p", digest=digest, offset=0)
        if first and first.get("body"):
            print(f"## read chunk decodes to {len(base64.b64decode(first['body']))} bytes", flush=True)
        await att(alice, "p/alice", alice_s, "attachment_read", scope="p", digest=digest, offset=32768)
        await att(alice, "p/alice", alice_s, "attachment_read", scope="p", digest=digest, offset=len(body))
        await att(alice, "p/alice", alice_s, "attachment_read", scope="p", digest=digest, offset=len(body) + 1)
        print("## digest mismatch at commit", flush=True)
        small = b"hello attachment\n"
        wrong = dict(meta, digest="0" * 64, length=len(small), media_type="text/plain")
        begun = await att(alice, "p/alice", alice_s, "attachment_begin", **wrong)
        up2 = begun and begun.get("upload_id")
        await att(alice, "p/alice", alice_s, "attachment_chunk", upload_id=up2, offset=0, body=base64.b64encode(small).decode())
        await att(alice, "p/alice", alice_s, "attachment_commit", upload_id=up2)
        await att(alice, "p/alice", alice_s, "attachment_abort", upload_id=up2)
        print("## text/plain with preview", flush=True)
        sd = hashlib.sha256(small).hexdigest()
        begun = await att(alice, "p/alice", alice_s, "attachment_begin", **dict(wrong, digest=sd))
        up3 = begun and begun.get("upload_id")
        await att(alice, "p/alice", alice_s, "attachment_chunk", upload_id=up3, offset=0, body=base64.b64encode(small).decode())
        await att(alice, "p/alice", alice_s, "attachment_commit", upload_id=up3)
        await att(alice, "p/alice", alice_s, "attachment_read", scope="p", digest=sd, offset=0, preview=True)
        print("## abort an open upload, then chunk it", flush=True)
        begun = await att(alice, "p/alice", alice_s, "attachment_begin",
                          **dict(meta, digest=hashlib.sha256(b"x").hexdigest(), length=1))
        up4 = begun and begun.get("upload_id")
        await att(alice, "p/alice", alice_s, "attachment_abort", upload_id=up4)
        await att(alice, "p/alice", alice_s, "attachment_chunk", upload_id=up4, offset=0, body=base64.b64encode(b"x").decode())
        print("## validation refusals at begin", flush=True)
        for bad in (dict(meta, length=8 * 1024 * 1024 + 1), dict(meta, digest="XYZ"), dict(meta, media_type="Bad Type"),
                    dict(meta, provenance=""), dict(meta, expires_at=time.time() - 5), dict(meta, length=True)):
            await att(alice, "p/alice", alice_s, "attachment_begin", **dict(bad, digest=bad["digest"] if bad["digest"] != digest else hashlib.sha256(secrets.token_bytes(8)).hexdigest()))
        await att(alice, "p/alice", alice_s, "attachment_begin", scope="p")
        print("## too many active uploads (limit probe)", flush=True)
        for i in range(5):
            await att(alice, "p/alice", alice_s, "attachment_begin",
                      **dict(meta, digest=hashlib.sha256(f"n{i}".encode()).hexdigest(), length=2))
        print("## ref / gc", flush=True)
        await att(alice, "p/alice", alice_s, "attachment_ref", scope="p", digest=digest, ref="task:T-1")
        await att(alice, "p/alice", alice_s, "attachment_ref", scope="p", digest=digest, ref="bad ref!")
        await att(alice, "p/alice", alice_s, "attachment_gc", scope="p")
        await att(alice, "p/alice", alice_s, "attachment_gc", scope="p", dry_run=False)
        await att(alice, "p/alice", alice_s, "attachment_info", scope="p", digest=sd)
        await att(alice, "p/alice", alice_s, "attachment_ref", scope="p", digest=digest, ref="task:T-1", remove=True)
        await att(alice, "p/alice", alice_s, "attachment_gc", scope="p", dry_run=True)
        print("## scope other than the sender's project", flush=True)
        await att(alice, "p/alice", alice_s, "attachment_info", scope="q", digest=digest)
        print("## bob: read grant only", flush=True)
        bob = await connect(hub, "p/bob", signer=signers["p/bob"], protocol_version=7)
        await att(bob, "p/bob", signers["p/bob"], "attachment_info", scope="p", digest=digest)
        await att(bob, "p/bob", signers["p/bob"], "attachment_begin", **dict(meta, digest=hashlib.sha256(b"b").hexdigest(), length=1))
        await att(bob, "p/bob", signers["p/bob"], "attachment_gc", scope="p")
        print("## carol: role grant but no ACL rule for attachment:q", flush=True)
        carol = await connect(hub, "q/carol", signer=signers["q/carol"], protocol_version=7)
        await att(carol, "q/carol", signers["q/carol"], "attachment_begin", **dict(meta, scope="q", digest=hashlib.sha256(b"c").hexdigest(), length=1))
        print("## per-message auth refusals on an attachment verb", flush=True)
        await att(alice, "p/alice", None, "attachment_info", scope="p", digest=digest)
        frame = alice_s.mac(envelope("p/alice", "attachment_info", scope="p", digest=digest), "p/alice")
        frame["auth"]["value"] = "0" * 64
        await alice.send(frame)
        await alice.recv()
        frame = alice_s.mac(envelope("p/alice", "attachment_info", scope="p", digest=digest), "p/alice")
        await alice.send(frame)
        await alice.recv()
        await alice.send(frame, " (same frame again)")
        await alice.recv()
        print("## a v3 registration", flush=True)
        old = await connect(hub, "p/dave", signer=signers["p/dave"], protocol_version=3, label="p/dave(v3)")
        await old.drain(0.5)
        await att(old, "p/dave", signers["p/dave"], "attachment_info", scope="p", digest=digest)
        nov = await connect(hub, "p/erin", signer=signers["p/erin"], protocol_version=None, label="p/erin(no version)")
        await nov.drain(0.5)
        await att(nov, "p/erin", signers["p/erin"], "attachment_info", scope="p", digest=digest)
        print("## upload left open by a closed connection", flush=True)
        begun = await att(alice, "p/alice", alice_s, "attachment_begin",
                          **dict(meta, digest=hashlib.sha256(b"left").hexdigest(), length=4))
        for conn in (alice, bob, carol, old, nov):
            await conn.ws.close()
    root = work.path / "attachments"
    print("## attachment root after stop:", flush=True)
    for path in sorted(root.rglob("*")):
        print(f"   {oct(path.stat().st_mode & 0o777)} {path.relative_to(root)} {path.stat().st_size if path.is_file() else ''}")
    ledger = root / "attachments.sqlite3"
    if ledger.exists():
        import sqlite3

        db = sqlite3.connect(f"file:{ledger}?mode=ro", uri=True)
        for (sql,) in db.execute("SELECT sql FROM sqlite_master WHERE sql IS NOT NULL"):
            print(f"   schema: {' '.join(sql.split())}")
        for table in [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")]:
            for row in db.execute(f"SELECT * FROM {table} LIMIT 6"):
                print(f"   {table}: {row}")


async def probe_attachment_lifecycle(work: Workdir) -> None:
    """Expiry and gc, ref protection, a closed connection's upload, SIGKILL mid-upload."""
    flags, signers = secure_setup(
        work, {"p/alice": ["p/attachment-write", "p/attachment-read", "p/attachment-admin"]}, ATTACH_ACL)
    s = signers["p/alice"]

    async def att(conn: Conn, msg_type: str, **fields: Any) -> dict | None:
        fields.setdefault("scope", "p")
        await conn.send(s.mac(envelope("p/alice", msg_type, **fields), "p/alice"))
        return await conn.until("attachment_result", 1.5)

    async def upload(conn: Conn, data: bytes, expires_in: float) -> str:
        digest = hashlib.sha256(data).hexdigest()
        begun = await att(conn, "attachment_begin", digest=digest, length=len(data), media_type="text/plain",
                          provenance="probe:gc", expires_at=time.time() + expires_in)
        await att(conn, "attachment_chunk", upload_id=begun["upload_id"], offset=0, body=base64.b64encode(data).decode())
        await att(conn, "attachment_commit", upload_id=begun["upload_id"])
        return digest

    hub = Hub(work, flags)
    hub.start()
    try:
        a = await connect(hub, "p/alice", signer=s)
        short = await upload(a, b"short lived", 2.0)
        kept = await upload(a, b"short lived but referenced", 2.0)
        await att(a, "attachment_ref", digest=kept, ref="task:T-9")
        await asyncio.sleep(2.5)
        print("## after expiry: info, read, ref, gc dry run, gc", flush=True)
        await att(a, "attachment_info", digest=short)
        await att(a, "attachment_read", digest=short, offset=0)
        await att(a, "attachment_ref", digest=short, ref="task:late")
        await att(a, "attachment_gc")
        await att(a, "attachment_gc", dry_run=False)
        await att(a, "attachment_gc", dry_run=True)
        print("## an upload left open, then the connection closes", flush=True)
        begun = await att(a, "attachment_begin", digest=sha("open"), length=4, media_type="text/plain",
                          provenance="probe:open", expires_at=time.time() + 60)
        print(f"## uploads while open: {ledger_rows(work, 'uploads')}", flush=True)
        print(f"## staging while open: {sorted(p.name for p in (work.path / 'attachments' / 'staging').iterdir())}", flush=True)
        await a.ws.close()
        await asyncio.sleep(0.5)
        print(f"## uploads after close: {ledger_rows(work, 'uploads')}", flush=True)
        print(f"## staging after close: {sorted(p.name for p in (work.path / 'attachments' / 'staging').iterdir())}", flush=True)
        print("## SIGKILL with one chunk of two written", flush=True)
        a = await connect(hub, "p/alice", signer=s)
        data = secrets.token_bytes(40000)
        begun = await att(a, "attachment_begin", digest=hashlib.sha256(data).hexdigest(), length=len(data),
                          media_type="application/octet-stream", provenance="probe:kill", expires_at=time.time() + 600)
        await att(a, "attachment_chunk", upload_id=begun["upload_id"], offset=0, body=base64.b64encode(data[:32768]).decode())
        hub.kill()
        print(f"## after SIGKILL uploads={ledger_rows(work, 'uploads')}", flush=True)
        print(f"## after SIGKILL staging={[(p.name, p.stat().st_size) for p in (work.path / 'attachments' / 'staging').iterdir()]}", flush=True)
        hub.start()
        print(f"## after restart uploads={ledger_rows(work, 'uploads')}", flush=True)
        print(f"## after restart staging={[(p.name, p.stat().st_size) for p in (work.path / 'attachments' / 'staging').iterdir()]}", flush=True)
        a = await connect(hub, "p/alice", signer=s)
        await att(a, "attachment_chunk", upload_id=begun["upload_id"], offset=32768, body=base64.b64encode(data[32768:]).decode())
        await att(a, "attachment_info", digest=kept)
        await a.ws.close()
    finally:
        hub.stop()


async def probe_attachment_disabled(work: Workdir) -> None:
    """Attachment and v6/v7 verbs on a hub without --attachment-root; odd registration versions."""
    with running(work, ["--message-auth-key", f"mac-0:{MAC_SECRET}:p/alice"]) as hub:
        a = await connect(hub, "p/alice", token=None)
        await a.drain(0.3)
        s = Signer(key_id="mac-0")
        await a.send(s.mac(envelope("p/alice", "attachment_info", scope="p", digest="0" * 64), "p/alice"))
        await a.recv(1.5)
        await a.send(envelope("p/alice", "attachment_info", scope="p", digest="0" * 64), " (unsigned)")
        await a.recv(1.5)
        await a.send(envelope("p/alice", "attachment_peer_request", action="info", scope="p", digest="0" * 64))
        await a.recv(1.5)
        await a.send(envelope("p/alice", "native_message_record"))
        await a.recv(1.5)
        await a.ws.close()
        for name, version in (("p/bob", 99), ("p/carol", "seven")):
            conn = await connect(hub, name, token=None, protocol_version=version)
            await conn.drain(0.5)
            await conn.ws.close()


async def probe_client_api(work: Workdir) -> None:
    """The reference client's own attachment API: SynapseAgent.send_attachment."""
    from synapse_channel.client.agent import SynapseAgent

    flags, signers = secure_setup(work, {"p/alice": ["p/attachment-write", "p/attachment-read"]}, ATTACH_ACL)
    with running(work, flags) as hub:
        received: list[dict] = []

        async def on_message(frame: dict) -> None:
            if frame.get("type") not in ("presence_update",):
                show("<< agent callback:", frame)
            received.append(frame)

        agent = SynapseAgent("p/alice", on_message, uri=hub.uri, token=TOKEN,
                             per_message_auth_key_id="mac-0", per_message_auth_secret=MAC_SECRET,
                             identity_key_path=str(work.path / "id-0.pem"), identity_key_id="id-0")
        task = asyncio.create_task(agent.connect())
        await agent.wait_until_ready(5)
        print(f"## agent.hub_protocol_version = {agent.hub_protocol_version}", flush=True)
        orig_send = agent.connection.send

        async def spy(raw: str) -> None:
            show(">> agent sends:", json.loads(raw))
            await orig_send(raw)

        agent.connection.send = spy  # type: ignore[method-assign]
        data = b"client api payload\n" * 4000
        digest = hashlib.sha256(data).hexdigest()
        await agent.send_attachment("attachment_begin", scope="p", digest=digest, length=len(data),
                                    media_type="text/plain", provenance="probe:client", expires_at=time.time() + 600)
        await asyncio.sleep(0.5)
        upload = next(f["upload_id"] for f in received if f.get("type") == "attachment_result" and f.get("upload_id"))
        print("## first without scope on chunk (as the API's docstring would suggest), then with it", flush=True)
        await agent.send_attachment("attachment_chunk", upload_id=upload, offset=0,
                                    body=base64.b64encode(data[:32768]).decode())
        await asyncio.sleep(0.5)
        for offset in range(0, len(data), 32768):
            await agent.send_attachment("attachment_chunk", scope="p", upload_id=upload, offset=offset,
                                        body=base64.b64encode(data[offset:offset + 32768]).decode())
        await agent.send_attachment("attachment_commit", scope="p", upload_id=upload)
        back = b""
        while True:
            received.clear()
            await agent.send_attachment("attachment_read", scope="p", digest=digest, offset=len(back))
            for _ in range(50):
                await asyncio.sleep(0.05)
                reads = [f for f in received if f.get("operation") == "attachment_read"]
                if reads:
                    break
            if not reads or not reads[0].get("ok"):
                break
            back += base64.b64decode(reads[0]["body"])
            if reads[0]["eof"]:
                break
        print(f"## read back {len(back)} bytes, identical={back == data}", flush=True)
        for bad in ("attachment_peer_request", "attachment_result"):
            try:
                await agent.send_attachment(bad, scope="p")
            except ValueError as exc:
                print(f"## send_attachment({bad!r}) raised ValueError: {exc}", flush=True)
        agent.running = False
        await agent.connection.close()
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
    # The same API against a version-3-advertising peer and without a key: checked client-side.
    from synapse_channel.client.agent import SynapseAgent as Agent2

    bare = Agent2("p/x", None, uri="ws://127.0.0.1:1", machine_identity=False)
    for version, label in ((3, "hub at v3"), (7, "no per-message key")):
        bare.hub_protocol_version = version
        bare.connection = object()  # never used: the checks run first
        try:
            await bare.send_attachment("attachment_info", scope="p", digest="0" * 64)
        except ValueError as exc:
            print(f"## send_attachment with {label}: ValueError: {exc}", flush=True)


async def probe_startup(work: Workdir) -> None:
    """Which flags --attachment-root and friends require."""
    flags, _ = secure_setup(work, {"p/alice": ["p/attachment-write"]}, ATTACH_ACL)

    def without(*names: str) -> list[str]:
        out, skip = [], 0
        for i, arg in enumerate(flags):
            if skip:
                skip -= 1
                continue
            if arg in names:
                takes_value = i + 1 < len(flags) and not flags[i + 1].startswith("--")
                skip = 1 if takes_value else 0
                continue
            out.append(arg)
        return out

    for drop in (("--token",), ("--db",), ("--require-identity-binding",), ("--identity-trust", "--require-identity-binding"),
                 ("--require-message-auth",), ("--message-auth-key",), ("--require-acl",), ("--acl-policy", "--require-acl"),
                 ("--role-grants",)):
        print(f"## --attachment-root without {drop}", flush=True)
        startup_refusal(work, without(*drop))
    root = work.path / "attachments"
    root.chmod(0o755)
    print("## --attachment-root 0755", flush=True)
    startup_refusal(work, flags)
    root.chmod(0o700)
    policy = owner_only(work.path / "recipients.json", json.dumps({"version": 1, "grants": []}))
    print("## --attachment-recipient-policy without --multihub-serving-policy", flush=True)
    startup_refusal(work, flags + ["--attachment-recipient-policy", str(policy)])
    print("## the full set starts; /health and welcome", flush=True)
    with running(work, flags + ["--metrics"]) as hub:
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{hub.port}/health", timeout=5) as resp:
            health = json.loads(resp.read())
        print(f"<< /health protocol_version={health.get('protocol_version')} keys={sorted(health)[:40]}", flush=True)
        ws = await websockets.connect(hub.uri, compression=None)
        conn = Conn(ws, "anon")
        await conn.recv(1.5)
        await ws.close()


# ---------------------------------------------------------------------------------------
# Issue 24: resources, guard evidence, planning, identity recovery, channels, cards
# ---------------------------------------------------------------------------------------

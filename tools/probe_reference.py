"""Black-box probes of the reference hub (synapse-channel 0.99.38) for issues 23 and 24.

Run it with the reference's own interpreter, so the reference client API is importable:

    /work/main/.cache/reference-venv/bin/python tools/probe_reference.py attachments

Each probe starts one or more reference hubs on loopback ports it picks, in a fresh
temporary directory (HOME and XDG dirs point into it, so no machine key or pin leaks
between runs), drives them with raw WebSocket frames (signed where needed with the
reference client's own signing helpers) and prints every frame it sends (`>>`) and
receives (`<<`), one JSON object a line. Startup refusals print the hub's stderr.
Every hub it starts is stopped by its PID.

This file only drives the reference; it copies none of its code into hubd.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import hashlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import websockets

REFERENCE_VENV = Path(os.environ.get("HUBD_REFERENCE_VENV", "/work/main/.cache/reference-venv"))
SYNAPSE = str(REFERENCE_VENV / "bin" / "synapse")
TOKEN = "probe-token-0123456789"
MAC_SECRET = "probe-mac-secret-0123456789abcdef"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def show(direction: str, frame: Any) -> None:
    text = json.dumps(frame, sort_keys=True) if not isinstance(frame, str) else frame
    if len(text) > 1600:
        text = text[:1600] + f"…(+{len(text) - 1600} chars)"
    print(f"{direction} {text}", flush=True)


def owner_only(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o600)
    return path


class Workdir:
    """A private temp directory with its own HOME, where hubs and keys live."""

    def __init__(self) -> None:
        self.path = Path(tempfile.mkdtemp(prefix="refprobe-"))
        self.path.chmod(0o700)
        self.env = dict(os.environ)
        for var in ("HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME", "XDG_CACHE_HOME"):
            self.env[var] = str(self.path / "home")
        (self.path / "home").mkdir(mode=0o700)
        os.environ.update({k: self.env[k] for k in ("HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME")})

    def synapse(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([SYNAPSE, *args], env=self.env, capture_output=True, text=True, timeout=60)
        if check and done.returncode != 0:
            raise RuntimeError(f"synapse {' '.join(args)} failed: {done.stdout}{done.stderr}")
        return done

    def identity_key(self, sender: str, key_id: str, trust: Path) -> Path:
        """Generate an Ed25519 key with the reference CLI and enrol it in `trust`."""
        private = self.path / f"{key_id}.pem"
        self.synapse("identity", "keygen", "--sender", sender, "--key-id", key_id,
                     "--private-out", str(private), "--trust", str(trust))
        return private

    def role_grant(self, role: str, to: str, store: Path) -> None:
        self.synapse("role", "grant", "--to", to, "--store", str(store), role)


class Hub:
    """One reference hub process on a free loopback port."""

    def __init__(self, work: Workdir, args: list[str], name: str = "hub") -> None:
        self.work, self.args, self.name = work, args, name
        self.port = free_port()
        self.proc: subprocess.Popen[str] | None = None
        self.log = work.path / f"{name}.log"

    @property
    def uri(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return [SYNAPSE, "hub", "--host", "127.0.0.1", "--port", str(self.port), *self.args]

    def start(self, wait: float = 20.0) -> None:
        print(f"## start {self.name}: synapse hub --port {self.port} {' '.join(self.args)}", flush=True)
        self.proc = subprocess.Popen(self.command(), env=self.work.env, stdout=open(self.log, "w"),
                                     stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"hub exited {self.proc.returncode}: {self.log.read_text()}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), 0.2):
                return
            time.sleep(0.1)
        raise RuntimeError(f"hub did not listen: {self.log.read_text()}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)


@contextlib.contextmanager
def running(work: Workdir, args: list[str], name: str = "hub") -> Iterator[Hub]:
    hub = Hub(work, args, name)
    hub.start()
    try:
        yield hub
    finally:
        hub.stop()


def startup_refusal(work: Workdir, args: list[str]) -> None:
    """Run a hub that is expected to refuse to start; print its exit code and stderr."""
    hub = Hub(work, args, "refusal")
    print(f"## expect refusal: synapse hub {' '.join(args)}", flush=True)
    proc = subprocess.Popen(hub.command(), env=work.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGTERM)
        out, _ = proc.communicate(timeout=10)
        lines = [line for line in out.splitlines() if line.strip()]
        print("STARTED (no refusal within 10 s; stopped): " + " | ".join(lines[-3:]), flush=True)
        return
    lines = [line for line in out.splitlines() if line.strip()]
    print(f"exit {proc.returncode}: " + " | ".join(lines[-4:]), flush=True)


class Conn:
    """A raw WebSocket connection that prints every frame both ways."""

    def __init__(self, ws: Any, name: str) -> None:
        self.ws, self.name = ws, name

    async def send(self, frame: dict[str, Any], label: str = "") -> None:
        show(f">> {self.name}{label}:", frame)
        try:
            await self.ws.send(json.dumps(frame))
        except websockets.ConnectionClosed as exc:
            print(f"   (not sent: connection closed, code={exc.rcvd.code if exc.rcvd else None})", flush=True)

    async def recv(self, timeout: float = 3.0, quiet_types: tuple[str, ...] = ("presence_update",)) -> dict | None:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                print(f"<< {self.name}: (nothing within {timeout}s)", flush=True)
                return None
            try:
                raw = await asyncio.wait_for(self.ws.recv(), left)
            except asyncio.TimeoutError:
                continue
            except websockets.ConnectionClosed as exc:
                print(f"<< {self.name}: CLOSED code={exc.code} reason={exc.reason!r}", flush=True)
                return None
            frame = json.loads(raw)
            if frame.get("type") in quiet_types:
                continue
            show(f"<< {self.name}:", frame)
            return frame

    async def until(self, msg_type: str, timeout: float = 3.0) -> dict | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            frame = await self.recv(deadline - time.monotonic())
            if frame is None:
                return None
            if frame.get("type") in (msg_type, "error"):
                return frame
        return None

    async def drain(self, timeout: float = 0.6) -> list[dict]:
        frames = []
        while (frame := await self.recv(timeout)) is not None:
            frames.append(frame)
        return frames


def envelope(sender: str, msg_type: str, target: str = "SynapseHub", payload: str = "", **extra: Any) -> dict:
    return {"sender": sender, "target": target, "type": msg_type, "payload": payload,
            "timestamp": time.time(), **extra}


class Signer:
    """Per-message HMAC (`auth`) and Ed25519 registration signing via the reference client API."""

    def __init__(self, key_id: str | None = None, secret: str = MAC_SECRET,
                 identity_pem: Path | None = None, identity_key_id: str = "") -> None:
        from synapse_channel.core.message_auth import MessageAuthKey

        self.mac_key = None
        self.sequence = 0
        self.id_sequence = 0
        self.key_id = key_id
        self.secret = secret
        self.identity_pem, self.identity_key_id = identity_pem, identity_key_id

    def mac(self, frame: dict[str, Any], sender: str, **override: Any) -> dict[str, Any]:
        from synapse_channel.core.message_auth import MessageAuthKey, sign_frame

        key = MessageAuthKey(key_id=self.key_id, secret=self.secret.encode(), senders=frozenset({sender}))
        self.sequence = max(self.sequence + 1, time.time_ns() // 1000)
        signed = sign_frame(frame, key=key, nonce=override.pop("nonce", secrets.token_urlsafe(18)),
                            sequence=override.pop("sequence", self.sequence),
                            timestamp=override.pop("timestamp", None))
        signed["auth"].update(override)
        return signed

    def register(self, frame: dict[str, Any]) -> dict[str, Any]:
        from synapse_channel.core.identity_keys import load_signing_key, sign_registration

        if self.identity_pem is None:
            return frame
        self.id_sequence += 1
        return sign_registration(frame, private_key=load_signing_key(str(self.identity_pem)),
                                 key_id=self.identity_key_id, nonce=secrets.token_urlsafe(18),
                                 sequence=self.id_sequence)


async def connect(hub: Hub, name: str, *, signer: Signer | None = None, token: str | None = TOKEN,
                  protocol_version: int | None = 7, extra: dict | None = None, label: str = "") -> Conn:
    ws = await websockets.connect(hub.uri, max_size=4 * 1024 * 1024, compression=None)
    conn = Conn(ws, label or name)
    fields: dict[str, Any] = dict(extra or {})
    if protocol_version is not None:
        fields["protocol_version"] = protocol_version
    if token is not None:
        fields["token"] = token
    registration = envelope(name, "heartbeat", target="System", payload="online", **fields)
    if signer is not None:
        registration = signer.register(registration)
    await conn.send(registration, " (registration)")
    await conn.until("welcome", 3.0)
    return conn


# ---------------------------------------------------------------------------------------
# Issue 23: identity, ACL, per-message auth, attachments
# ---------------------------------------------------------------------------------------


def secure_setup(work: Workdir, senders: dict[str, list[str]], acl_rules: list[dict]) -> tuple[list[str], dict[str, Signer]]:
    """Files and flags for an attachment-capable hub; `senders` maps name -> role grants."""
    trust = work.path / "identity-trust.json"
    roles = work.path / "role-grants.json"
    signers: dict[str, Signer] = {}
    mac_flags: list[str] = []
    for index, (name, grants) in enumerate(senders.items()):
        key_id = f"id-{index}"
        pem = work.identity_key(name, key_id, trust)
        for role in grants:
            work.role_grant(role, name, roles)
        signers[name] = Signer(key_id=f"mac-{index}", identity_pem=pem, identity_key_id=key_id)
        mac_flags += ["--message-auth-key", f"mac-{index}:{MAC_SECRET}:{name}"]
    if not roles.exists():
        owner_only(roles, json.dumps({"grants": {}}))
    acl = owner_only(work.path / "acl.json", json.dumps({"rules": acl_rules}))
    root = work.path / "attachments"
    root.mkdir(mode=0o700)
    flags = ["--db", str(work.path / "hub.db"), "--hub-id", "src", "--token", TOKEN,
             "--attachment-root", str(root), "--identity-trust", str(trust), "--require-identity-binding",
             *mac_flags, "--require-message-auth", "--acl-policy", str(acl), "--require-acl",
             "--role-grants", str(roles)]
    return flags, signers


ATTACH_ACL = [
    {"permission": p, "target_kind": "attachment", "target_pattern": "p"}
    for p in ("attachment-read", "attachment-write", "attachment-admin")
]


def show_files(work: Workdir) -> None:
    for name in ("identity-trust.json", "role-grants.json", "acl.json"):
        path = work.path / name
        if path.exists():
            mode = oct(path.stat().st_mode & 0o777)
            print(f"## file {name} ({mode}): {path.read_text().strip()[:900]}", flush=True)


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


def ledger_rows(work: Workdir, table: str) -> list[tuple]:
    import sqlite3

    db = sqlite3.connect(f"file:{work.path / 'attachments' / 'attachments.sqlite3'}?mode=ro", uri=True)
    try:
        return list(db.execute(f"SELECT * FROM {table}"))
    finally:
        db.close()


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


async def probe_message_auth(work: Workdir) -> None:
    """The `auth` object on claims and the other signed verbs, with and without --require-message-auth."""
    key_file = owner_only(work.path / "mac-keys.txt", f"# kid:secret:senders\nmac-f:{MAC_SECRET}:p/bob,p/carol\n")
    flags = ["--db", str(work.path / "hub.db"), "--hub-id", "src",
             "--message-auth-key", f"mac-0:{MAC_SECRET}:p/alice", "--message-auth-key-file", str(key_file),
             "--require-message-auth", "--message-auth-window-seconds", "10"]
    with running(work, flags) as hub:
        signer = Signer(key_id="mac-0")
        alice = await connect(hub, "p/alice", token=None)
        await alice.drain(0.4)
        print("## unsigned claim", flush=True)
        await alice.send(envelope("p/alice", "claim", target="all", task_id="T-1", idem_key="k1"))
        await alice.recv()
        print("## signed claim", flush=True)
        await alice.send(signer.mac(envelope("p/alice", "claim", target="all", task_id="T-1", idem_key="k2"), "p/alice"))
        await alice.recv()
        print("## replayed (same nonce)", flush=True)
        frame = signer.mac(envelope("p/alice", "task_update", target="all", task_id="T-1", idem_key="k3", status="working"), "p/alice")
        await alice.send(frame)
        await alice.recv()
        await alice.send(frame, " (again)")
        await alice.recv()
        print("## bad value, unknown kid, wrong alg, expired, future, bool sequence, sender-mismatch", flush=True)
        cases: list[tuple[str, Callable[[dict], None]]] = [
            ("bad value", lambda f: f["auth"].__setitem__("value", "00" * 32)),
            ("unknown kid", lambda f: f["auth"].__setitem__("kid", "nope")),
        ]
        for label, mutate in cases:
            f = signer.mac(envelope("p/alice", "checkpoint", target="all", task_id="T-1", checkpoint="c"), "p/alice")
            mutate(f)
            await alice.send(f, f" ({label})")
            await alice.recv()
        for label, override in (("expired", {"timestamp": time.time() - 60}), ("future +5s", {"timestamp": time.time() + 5}),
                                ("sequence 0", {"sequence": 0}), ("alg", {"alg": "hmac-sha1"})):
            f = envelope("p/alice", "checkpoint", target="all", task_id="T-1", checkpoint="c")
            if "alg" in override:
                f = signer.mac(f, "p/alice")
                f["auth"]["alg"] = "hmac-sha1"
            else:
                f = signer.mac(f, "p/alice", **override)
            await alice.send(f, f" ({label})")
            await alice.recv()
        print("## key bound to p/bob used by p/alice", flush=True)
        f = Signer(key_id="mac-f").mac(envelope("p/alice", "checkpoint", target="all", task_id="T-1", checkpoint="c"), "p/alice")
        await alice.send(f)
        await alice.recv()
        print("## unsigned resource / release / handoff / chat / ledger_task", flush=True)
        for msg_type, extra in (("resource", {"kind": "gpu", "name": "a100"}), ("release", {"task_id": "T-1"}),
                                ("handoff", {"task_id": "T-1", "new_owner": "p/bob"}), ("chat", {"payload": "hi"}),
                                ("ledger_task", {"task_id": "B-1", "title": "t"}),
                                ("delivery_cancel", {"operation_key": "0" * 64})):
            await alice.send(envelope("p/alice", msg_type, target="all", **extra))
            await alice.drain(0.5)
        print("## signed release", flush=True)
        await alice.send(signer.mac(envelope("p/alice", "release", target="all", task_id="T-1", idem_key="k9"), "p/alice"))
        await alice.drain(0.5)
        await alice.ws.close()
    print("## without --require-message-auth: an unsigned claim and a badly signed claim", flush=True)
    flags = ["--message-auth-key", f"mac-0:{MAC_SECRET}:p/alice"]
    with running(work, flags, "lenient") as hub:
        alice = await connect(hub, "p/alice", token=None)
        await alice.drain(0.4)
        await alice.send(envelope("p/alice", "claim", target="all", task_id="T-2"))
        await alice.recv()
        f = signer.mac(envelope("p/alice", "claim", target="all", task_id="T-3"), "p/alice")
        f["auth"]["value"] = "1" * 64
        await alice.send(f)
        await alice.recv()
        await alice.ws.close()
    startup_refusal(work, ["--require-message-auth"])
    startup_refusal(work, ["--message-auth-key", "justone"])
    startup_refusal(work, ["--message-auth-key", f"k::p/a"])
    loose = work.path / "loose-keys.txt"
    loose.write_text(f"mac-x:{MAC_SECRET}:p/a\n")
    loose.chmod(0o644)
    startup_refusal(work, ["--message-auth-key-file", str(loose)])


async def probe_identity(work: Workdir) -> None:
    trust = work.path / "identity-trust.json"
    pem = work.identity_key("p/alice", "id-a", trust)
    other = work.identity_key("p/mallory", "id-m", trust)
    show_files(work)
    flags = ["--identity-trust", str(trust), "--require-identity-binding", "--identity-pins", ""]
    with running(work, flags) as hub:
        print("## signed registration", flush=True)
        ok = await connect(hub, "p/alice", signer=Signer(identity_pem=pem, identity_key_id="id-a"), token=None)
        await ok.drain(0.4)
        await ok.ws.close()
        print("## unsigned registration", flush=True)
        bad = await connect(hub, "p/alice", token=None)
        await bad.drain(1.0)
        print("## registration signed by another name's key", flush=True)
        bad = await connect(hub, "p/alice", signer=Signer(identity_pem=other, identity_key_id="id-m"), token=None)
        await bad.drain(1.0)
        print("## registration signed with a key id not in the bundle", flush=True)
        bad = await connect(hub, "p/alice", signer=Signer(identity_pem=pem, identity_key_id="id-zzz"), token=None)
        await bad.drain(1.0)
        print("## a name not in the bundle", flush=True)
        bad = await connect(hub, "p/nobody", token=None)
        await bad.drain(1.0)
    startup_refusal(work, ["--require-identity-binding"])
    startup_refusal(work, ["--identity-trust", str(work.path / "missing.json"), "--require-identity-binding"])


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


async def probe_resources(work: Workdir) -> None:
    flags = ["--db", str(work.path / "hub.db"), "--hub-id", "src", "--max-offers-per-agent", "4"]
    with running(work, flags) as hub:
        alice = await connect(hub, "p/alice", token=None)
        bob = await connect(hub, "p/bob", token=None)
        await alice.drain(0.4)
        await bob.drain(0.4)
        for extra in ({"kind": "gpu", "name": "a100", "capacity": 2, "meta": {"zone": "eu"}},
                      {"kind": "gpu", "name": "a100", "capacity": 3},
                      {"kind": "gpu"}, {"name": "n"}, {"kind": 5, "name": "n"},
                      {"kind": "k" * 300, "name": "n"}, {"kind": "gpu", "name": "b", "capacity": -1},
                      {"kind": "gpu", "name": "b", "capacity": "lots"},
                      {"kind": "cpu", "name": "x"}, {"kind": "disk", "name": "d"}, {"kind": "net", "name": "n2"}):
            await alice.send(envelope("p/alice", "resource", target="all", **extra))
            await alice.drain(0.5)
            await bob.drain(0.3)
        await alice.send(envelope("p/alice", "resource_offer", target="all", kind="tpu", name="v4"), " (alias verb)")
        await alice.drain(0.5)
        await bob.send(envelope("p/bob", "resource_offer", target="all", kind="tpu", name="v4"), " (alias verb)")
        await bob.drain(0.5)
        await alice.send(envelope("p/alice", "state_request", target="SynapseHub"))
        snap = await alice.until("state_snapshot")
        if snap:
            print(f"## snapshot.resources = {json.dumps((snap.get('snapshot') or {}).get('resources'))}", flush=True)
        await alice.ws.close()
        await bob.send(envelope("p/bob", "state_request", target="SynapseHub"))
        snap = await bob.until("state_snapshot")
        if snap:
            print(f"## after alice left: snapshot.resources = {json.dumps((snap.get('snapshot') or {}).get('resources'))}", flush=True)
        await bob.ws.close()
    with running(work, flags, "restarted") as hub:
        carol = await connect(hub, "p/carol", token=None)
        await carol.drain(0.4)
        await carol.send(envelope("p/carol", "state_request", target="SynapseHub"))
        snap = await carol.until("state_snapshot")
        if snap:
            print(f"## after restart: snapshot.resources = {json.dumps((snap.get('snapshot') or {}).get('resources'))}", flush=True)
        await carol.ws.close()


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


async def probe_guard(work: Workdir) -> None:
    good = dict(provider="claude", reason_code="GUARD_NO_CLAIM", path_count=1,
                actor_sha256=sha("actor"), call_sha256=sha("call"), scope_sha256=sha("scope"))
    print("## open hub (no token, no db)", flush=True)
    with running(work, [], "open") as hub:
        a = await connect(hub, "claim-hook/alice-1", token=None)
        await a.drain(0.4)
        await a.send(envelope("claim-hook/alice-1", "guard_denial", **good))
        await a.recv()
        await a.ws.close()
    print("## token, no db", flush=True)
    with running(work, ["--token", TOKEN], "tokenonly") as hub:
        a = await connect(hub, "claim-hook/alice-1")
        await a.drain(0.4)
        await a.send(envelope("claim-hook/alice-1", "guard_denial", **good))
        await a.recv()
        await a.ws.close()
    print("## token and db", flush=True)
    with running(work, ["--token", TOKEN, "--db", str(work.path / "g.db"), "--hub-id", "g"], "durable") as hub:
        a = await connect(hub, "claim-hook/alice-1")
        b = await connect(hub, "p/bob")
        await a.drain(0.4)
        await b.drain(0.4)
        await a.send(envelope("claim-hook/alice-1", "guard_denial", idem_key="g-1", **good))
        await a.recv()
        await b.drain(0.5)
        await a.send(envelope("claim-hook/alice-1", "guard_denial", idem_key="g-1", **good), " (retry)")
        await a.recv()
        await a.send(envelope("claim-hook/alice-1", "guard_denial", idem_key="g-1", **dict(good, path_count=2)), " (same key, other content)")
        await a.recv()
        await a.send(envelope("claim-hook/alice-1", "guard_denial", **dict(good, call_sha256=sha("call2"))), " (no idem_key)")
        await a.recv()
        for label, bad in (("reason", dict(good, reason_code="NOPE")), ("provider", dict(good, provider="vim")),
                           ("upper hex", dict(good, call_sha256=sha("x").upper())), ("path_count -1", dict(good, path_count=-1)),
                           ("path_count big", dict(good, path_count=10**9)), ("payload", dict(good, payload="text")),
                           ("extra field", dict(good, path="/etc/passwd")), ("missing scope", {k: v for k, v in good.items() if k != "scope_sha256"})):
            await a.send(envelope("claim-hook/alice-1", "guard_denial", **bad), f" ({label})")
            await a.recv()
        await a.ws.close()
        await b.ws.close()
    import sqlite3

    db = sqlite3.connect(f"file:{work.path / 'g.db'}?mode=ro", uri=True)
    cols = [r[1] for r in db.execute("PRAGMA table_info(events)")]
    print(f"## events columns: {cols}", flush=True)
    for row in db.execute("SELECT * FROM events ORDER BY seq"):
        print(f"   row: {row}", flush=True)


ADVERT = {
    "schema": 1, "pool_alias": "team-gpu", "unit": "tokens", "resource_kind": None, "capabilities": ["chat"],
    "data_classes": [], "eligible_projects": ["p"], "account_usable": True, "as_of": "2026-12-02T12:00:00+00:00",
    "windows": [{"window_ref": "0123456789abcdef", "ends_at": "2026-12-03T00:00:00+00:00", "current": True,
                 "remaining_bucket": ">50%", "balance_evidence": "observed", "observation_age_seconds": 5,
                 "forecast_state": "quiet", "confidence": "operator"}],
}


async def probe_entitlement(work: Workdir) -> None:
    """entitlement_advert from an identity-bound sender with the entitlement-advertise ACL grant."""
    trust = work.path / "identity-trust.json"
    pem = work.identity_key("p/owner", "id-owner", trust)
    other = work.identity_key("p/other", "id-other", trust)
    acl = owner_only(work.path / "acl.json", json.dumps({"rules": [
        {"permission": "entitlement-advertise", "target_kind": "pool-alias", "target_pattern": "team-*"}]}))
    flags = ["--db", str(work.path / "hub.db"), "--hub-id", "owner", "--identity-trust", str(trust),
             "--require-identity-binding", "--acl-policy", str(acl)]
    with running(work, flags) as hub:
        o = await connect(hub, "p/owner", signer=Signer(identity_pem=pem, identity_key_id="id-owner"), token=None)
        w = await connect(hub, "p/other", signer=Signer(identity_pem=other, identity_key_id="id-other"), token=None)
        await o.drain(0.4)
        await w.drain(0.4)
        await o.send(envelope("p/owner", "entitlement_advert", advert=ADVERT))
        await o.drain(0.5)
        await w.drain(0.3)
        await o.send(envelope("p/owner", "entitlement_advert", advert=dict(ADVERT, pool_alias="solo-gpu")), " (alias outside the ACL)")
        await o.drain(0.5)
        for label, bad in (("extra field", dict(ADVERT, amount=5)), ("schema 2", dict(ADVERT, schema=2)),
                           ("no offset", dict(ADVERT, as_of="2026-12-02T12:00:00")),
                           ("bad bucket", dict(ADVERT, windows=[dict(ADVERT["windows"][0], remaining_bucket="12%")]))):
            await o.send(envelope("p/owner", "entitlement_advert", advert=bad), f" ({label})")
            await o.drain(0.5)
        await w.send(envelope("p/other", "entitlement_advert", advert=ADVERT), " (another bound sender)")
        await w.drain(0.5)
        await o.ws.close()
        await w.ws.close()
    import sqlite3

    db = sqlite3.connect(f"file:{work.path / 'hub.db'}?mode=ro", uri=True)
    for row in db.execute("SELECT seq, kind, payload FROM events WHERE kind LIKE '%entitlement%'"):
        print(f"   journal row: {row}", flush=True)


async def probe_planning(work: Workdir) -> None:
    """entitlement_advert, spend_request, and their refusals."""
    flags = ["--db", str(work.path / "hub.db"), "--hub-id", "owner", "--token", TOKEN]
    with running(work, flags) as hub:
        a = await connect(hub, "p/alice")
        b = await connect(hub, "p/bob")
        await a.drain(0.4)
        await b.drain(0.4)
        advert = {"pool_alias": "team-gpu", "provider": "openai", "window_seconds": 3600, "remaining_fraction": 0.5}
        await a.send(envelope("p/alice", "entitlement_advert", **advert))
        await a.recv()
        await a.send(envelope("p/alice", "entitlement_advert", advert=advert))
        await a.recv()
        await b.drain(0.4)
        for label, doc in (("no spend doc", None), ("spend not an object", "x")):
            extra = {} if doc is None else {"spend": doc}
            await a.send(envelope("p/alice", "spend_request", spend_action="query", **extra), f" ({label})")
            await a.recv()
        for action in ("reserve", "settle", "query", "bogus"):
            await a.send(envelope("p/alice", "spend_request", spend_action=action, spend={"pool": "team-gpu", "amount": 1}))
            await a.recv()
        await a.ws.close()
        await b.ws.close()


async def probe_identity_recovery(work: Workdir) -> None:
    trust = work.path / "identity-trust.json"
    op_pem = work.identity_key("p/op", "id-op", trust)
    alice_pem = work.identity_key("p/alice", "id-alice", trust)
    acl = owner_only(work.path / "acl.json", json.dumps({"rules": [
        {"permission": "identity-pin-reclaim", "target_kind": "agent", "target_pattern": "p/*"},
        {"permission": "identity-enroll", "target_kind": "agent", "target_pattern": "p/*"},
    ]}))
    roles = work.path / "roles.json"
    work.role_grant("p/identity-enroller", "p/op", roles)
    enroll = work.path / "enrollments.json"
    flags = ["--db", str(work.path / "hub.db"), "--hub-id", "idh", "--identity-trust", str(trust),
             "--acl-policy", str(acl), "--role-grants", str(roles), "--identity-enrollments", str(enroll),
             "--identity-enrollment-namespace", "p", "--require-identity-binding"]
    # A TOFU pin for p/tofu, written before start in the format the hub itself writes
    # ({"pins": {name: {key_id, pinned_at, public_key}}}; see docs/reference-observed.md §1).
    owner_only(work.path / "hub.db.identity-pins.json", json.dumps({"pins": {"p/tofu": {
        "key_id": "id-tofu", "pinned_at": time.time() - 3600,
        "public_key": "oBTimsMKc1xYy6fQCsJNSyZWH+vqKiLFw/S0EIOtKDY="}}}))
    with running(work, flags) as hub:
        pins = work.path / "hub.db.identity-pins.json"
        print(f"## pins file the hub wrote: {pins.read_text() if pins.exists() else '(none)'}", flush=True)
        op = await connect(hub, "p/op", signer=Signer(identity_pem=op_pem, identity_key_id="id-op"), token=None)
        await op.drain(0.4)
        print("## identity_pin_reclaim: wrong expected key, missing reason, ok", flush=True)
        for fields in ({"pin_name": "p/tofu", "expected_key_id": "nope", "reason": "stale"},
                       {"pin_name": "p/tofu", "expected_key_id": "id-tofu"},
                       {"pin_name": "p/tofu", "expected_key_id": "id-tofu", "reason": "stale", "break_glass": "yes"},
                       {"pin_name": "p/tofu", "expected_key_id": "id-tofu", "reason": "stale laptop"},
                       {"pin_name": "p/tofu", "expected_key_id": "id-tofu", "reason": "again"}):
            await op.send(envelope("p/op", "identity_pin_reclaim", **fields))
            await op.drain(0.4)
        print(f"## pins file after the reclaim: {pins.read_text()}", flush=True)
        print("## identity_enroll / identity_revoke", flush=True)
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
        from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

        pub = base64.b64encode(Ed25519PrivateKey.generate().public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)).decode()
        for fields in ({"name": "p/new", "key_id": "k-new", "public_key": pub, "reason": "onboard"},
                       {"name": "p/new", "key_id": "k-new", "public_key": pub, "reason": "again"},
                       {"name": "q/new", "key_id": "k-q", "public_key": pub, "reason": "other ns"},
                       {"name": "p/new2", "key_id": "k-2", "public_key": "notbase64", "reason": "bad key"}):
            await op.send(envelope("p/op", "identity_enroll", **fields))
            await op.drain(0.4)
        await op.send(envelope("p/op", "identity_revoke", name="p/new", key_id="k-new", reason="offboard"))
        await op.drain(0.4)
        await op.send(envelope("p/op", "identity_revoke", name="p/new", key_id="k-new", reason="twice"))
        await op.drain(0.4)
        print("## requester without the grant (p/alice)", flush=True)
        al = await connect(hub, "p/alice", signer=Signer(identity_pem=alice_pem, identity_key_id="id-alice"), token=None)
        await al.drain(0.4)
        await al.send(envelope("p/alice", "identity_enroll", name="p/x", key_id="k-x", public_key=pub, reason="r"))
        await al.drain(0.4)
        await al.send(envelope("p/alice", "identity_pin_reclaim", pin_name="p/op", expected_key_id="id-op", reason="r"))
        await al.drain(0.4)
        await op.ws.close()
        await al.ws.close()
    if enroll.exists():
        print(f"## enrollments file ({oct(enroll.stat().st_mode & 0o777)}): {enroll.read_text()[:600]}", flush=True)


async def probe_channels(work: Workdir) -> None:
    flags = ["--db", str(work.path / "hub.db"), "--hub-id", "ch"]
    with running(work, flags) as hub:
        a = await connect(hub, "p/alice", token=None)
        b = await connect(hub, "p/bob", token=None)
        c = await connect(hub, "p/carol", token=None)
        d = await connect(hub, "p/dan", token=None)
        for conn in (a, b, c, d):
            await conn.drain(0.4)
        await a.send(envelope("p/alice", "channel_create", channel="ops", label="Ops room"))
        await a.recv()
        await a.send(envelope("p/alice", "channel_create", channel="ops"), " (again)")
        await a.recv()
        await a.send(envelope("p/alice", "channel_invite", channel="ops", invitee="p/bob"))
        await a.recv()
        await b.drain(0.5)
        await c.send(envelope("p/carol", "channel_invite", channel="ops", invitee="p/carol"), " (non-member invites)")
        await c.recv()
        await b.send(envelope("p/bob", "channel_join", channel="ops"))
        await b.recv()
        await c.send(envelope("p/carol", "channel_join", channel="ops"), " (uninvited)")
        await c.recv()
        await a.send(envelope("p/alice", "channel_invite", channel="ops", invitee="p/dan"))
        await a.recv()
        await d.drain(0.4)
        print("## chat to the channel, receipt requested (dan invited, not joined)", flush=True)
        await a.send(envelope("p/alice", "chat", target="all", payload="to ops", channel="ops",
                              receipt_requested=True, client_msg_id="m-1"))
        await a.drain(0.6)
        await b.drain(0.6)
        await c.drain(0.6)
        await d.drain(0.6)
        print("## member chat with a directed target inside the channel", flush=True)
        await b.send(envelope("p/bob", "chat", target="p/alice", payload="just alice", channel="ops", receipt_requested=True))
        await a.drain(0.6)
        await b.drain(0.6)
        await c.drain(0.6)
        await c.send(envelope("p/carol", "chat", target="all", payload="let me in", channel="ops"), " (non-member)")
        await c.drain(0.6)
        await a.send(envelope("p/alice", "chat", target="all", payload="x", channel="nosuch"), " (unknown channel)")
        await a.drain(0.6)
        for label, bad in (("no channel", {}), ("space and slash", {"channel": "a b/c"}), ("200 chars", {"channel": "x" * 200})):
            await a.send(envelope("p/alice", "channel_create", **bad), f" ({label})")
            await a.recv()
        await a.send(envelope("p/alice", "channel_list_request"))
        await a.recv()
        await c.send(envelope("p/carol", "channel_list_request"), " (non-member)")
        await c.recv()
        await a.send(envelope("p/alice", "channel_history_request", channel="ops", limit=5))
        await a.recv()
        await c.send(envelope("p/carol", "channel_history_request", channel="ops", limit=5), " (non-member)")
        await c.recv()
        await c.send(envelope("p/carol", "history_request", target="SynapseHub", limit=5), " (global history, non-member)")
        await c.until("history_snapshot")
        await b.send(envelope("p/bob", "channel_leave", channel="ops"))
        await b.recv()
        await b.send(envelope("p/bob", "channel_leave", channel="ops"), " (again)")
        await b.recv()
        for conn in (a, b, c, d):
            await conn.ws.close()
    print("## restart: does the channel survive?", flush=True)
    with running(work, flags, "restarted") as hub:
        a = await connect(hub, "p/alice", token=None)
        await a.drain(0.4)
        await a.send(envelope("p/alice", "channel_list_request"))
        await a.recv()
        await a.ws.close()


async def probe_cards(work: Workdir) -> None:
    """Signed capability cards: advertise through the reference client with a card key."""
    from synapse_channel.client.agent import SynapseAgent

    trust = work.path / "card-trust.json"
    good = work.path / "card-good.pem"
    work.synapse("capability-card", "keygen", "--key-id", "card-1", "--private-out", str(good),
                 "--agent", "p/alice", "--project", "p", "--trust", str(trust))
    stray = work.path / "card-stray.pem"
    work.synapse("capability-card", "keygen", "--key-id", "card-9", "--private-out", str(stray),
                 "--agent", "p/alice", "--project", "p")
    owner_only(trust, trust.read_text())
    print(f"## card trust file: {trust.read_text().strip()}", flush=True)
    flags = ["--capability-card-trust", str(trust)]
    with running(work, flags) as hub:
        watcher = await connect(hub, "p/watch", token=None)
        await watcher.drain(0.4)
        captured: list[dict] = []
        for label, pem, kid in (("valid", good, "card-1"), ("unknown key", stray, "card-9")):
            print(f"## advertise signed through SynapseAgent.advertise: {label}", flush=True)
            agent = SynapseAgent("p/alice", None, uri=hub.uri, machine_identity=False,
                                 capability_card_key_path=str(pem), capability_card_key_id=kid,
                                 capability_card_project="p")
            task = asyncio.create_task(agent.connect())
            await agent.wait_until_ready(5)
            orig = agent.connection.send

            async def spy(raw: str, orig: Any = orig) -> None:
                frame = json.loads(raw)
                if frame.get("type") == "advertise":
                    captured.append(frame)
                show(">> agent sends:", frame)
                await orig(raw)

            agent.connection.send = spy  # type: ignore[method-assign]
            await agent.advertise(description="builder", skills=["python"], task_classes=["code"])
            await watcher.until("capability_advertised", 2.0)
            agent.running = False
            await agent.connection.close()
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
            await watcher.drain(0.3)
        print("## the valid signed frame replayed raw: tampered body, another sender, same frame again", flush=True)
        signed = captured[0]
        raw = await connect(hub, "p/alice", token=None, label="p/alice(raw)")
        await raw.drain(0.3)
        await raw.send(dict(signed, description="tampered", timestamp=time.time()), " (tampered)")
        await watcher.until("capability_advertised", 2.0)
        await raw.send(dict(signed, timestamp=time.time()), " (same signed card again)")
        await watcher.until("capability_advertised", 2.0)
        await raw.ws.close()
        other = await connect(hub, "q/mallory", token=None)
        await other.drain(0.3)
        await other.send(dict(signed, sender="q/mallory", timestamp=time.time()), " (other namespace)")
        await watcher.until("capability_advertised", 2.0)
        await other.ws.close()
        print("## advertise unsigned (raw), then a tampered signature", flush=True)
        raw = await connect(hub, "p/raw", token=None)
        await raw.drain(0.3)
        await raw.send(envelope("p/raw", "advertise", target="all", description="plain", skills=["x"]))
        await watcher.until("capability_advertised", 2.0)
        await raw.send(envelope("p/raw", "manifest_request", target="SynapseHub"))
        snap = await raw.until("manifest_snapshot", 2.0)
        await raw.ws.close()
        await watcher.ws.close()
    print("## hub without --capability-card-trust, a signed card", flush=True)
    with running(work, [], "notrust") as hub:
        watcher = await connect(hub, "p/watch", token=None)
        await watcher.drain(0.3)
        agent = SynapseAgent("p/alice", None, uri=hub.uri, machine_identity=False,
                             capability_card_key_path=str(good), capability_card_key_id="card-1",
                             capability_card_project="p")
        task = asyncio.create_task(agent.connect())
        await agent.wait_until_ready(5)
        await agent.advertise(description="builder")
        await watcher.until("capability_advertised", 2.0)
        agent.running = False
        await agent.connection.close()
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
        await watcher.ws.close()


class EmbeddedHub(Hub):
    """The reference SynapseHub class run in its own process with constructor options the CLI lacks."""

    def __init__(self, work: Workdir, options: dict[str, Any], name: str = "embedded") -> None:
        super().__init__(work, [], name)
        self.options = options

    def command(self) -> list[str]:
        code = ("import asyncio, json, sys; from synapse_channel.core.hub import SynapseHub; "
                "asyncio.run(SynapseHub(**json.loads(sys.argv[1])).serve('127.0.0.1', int(sys.argv[2])))")
        return [str(REFERENCE_VENV / "bin" / "python"), "-c", code, json.dumps(self.options), str(self.port)]


async def probe_deadletter(work: Workdir) -> None:
    print("## CLI hub (no threshold flag exists): three undelivered directed chats", flush=True)
    flags = ["--db", str(work.path / "hub.db"), "--hub-id", "dl"]
    with running(work, flags) as hub:
        a = await connect(hub, "p/alice", token=None)
        w = await connect(hub, "p/watch", token=None)
        await a.drain(0.4)
        for i in range(3):
            await a.send(envelope("p/alice", "chat", target="p/nobody", payload=f"hello {i}"))
            await a.drain(0.4)
        await w.drain(0.5)
        await a.ws.close()
        await w.ws.close()
    print("## embedded SynapseHub(dead_letter_escalation_threshold=2)", flush=True)
    hub = EmbeddedHub(work, {"dead_letter_escalation_threshold": 2, "db_path": str(work.path / "emb.db"),
                             "hub_id": "emb"})
    try:
        hub.start()
    except RuntimeError as exc:
        print(f"## embedded start failed: {str(exc)[-600:]}", flush=True)
        hub = EmbeddedHub(work, {"dead_letter_escalation_threshold": 2})
        hub.start()
    try:
        a = await connect(hub, "p/alice", token=None)
        w = await connect(hub, "p/watch", token=None)
        await a.drain(0.4)
        await w.drain(0.2)
        for i in range(5):
            await a.send(envelope("p/alice", "chat", target="p/nobody", payload=f"hello {i}"))
            await a.drain(0.4)
            await w.drain(0.2)
        await a.ws.close()
        await w.ws.close()
    finally:
        hub.stop()


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


async def probe_guard_window(work: Workdir) -> None:
    """The per-credential evidence window: 101 denials in a row on one token."""
    good = dict(provider="claude", reason_code="GUARD_NO_CLAIM", path_count=1,
                actor_sha256=sha("actor"), scope_sha256=sha("scope"))
    with running(work, ["--token", TOKEN, "--db", str(work.path / "g.db"), "--hub-id", "g"]) as hub:
        a = await connect(hub, "claim-hook/alice-1")
        b = await connect(hub, "claim-hook/bob-1", label="claim-hook/bob-1 (same token)")
        await a.drain(0.3)
        await b.drain(0.3)
        answers: dict[str, int] = {}
        last = None
        for i in range(101):
            await a.ws.send(json.dumps(envelope("claim-hook/alice-1", "guard_denial", call_sha256=sha(f"c{i}"), **good)))
            frame = json.loads(await a.ws.recv())
            key = frame.get("type") + ":" + str(frame.get("error_code", ""))
            answers[key] = answers.get(key, 0) + 1
            last = frame
        print(f"## 101 denials from one name: {answers}; last frame:", flush=True)
        show("<< claim-hook/alice-1:", last)
        print("## another name on the same token", flush=True)
        await b.send(envelope("claim-hook/bob-1", "guard_denial", call_sha256=sha("b"), **good))
        await b.recv()
        await a.ws.close()
        await b.ws.close()


async def probe_message_auth_restart(work: Workdir) -> None:
    """Is a signed frame accepted once more after a restart (durable nonce ledger)?"""
    flags = ["--db", str(work.path / "hub.db"), "--hub-id", "src",
             "--message-auth-key", f"mac-0:{MAC_SECRET}:p/alice", "--require-message-auth"]
    signer = Signer(key_id="mac-0")
    frame = signer.mac(envelope("p/alice", "checkpoint", target="all", task_id="T-1", checkpoint="c"), "p/alice")
    claim = signer.mac(envelope("p/alice", "claim", target="all", task_id="T-1", idem_key="k-1"), "p/alice")
    hub = Hub(work, flags)
    hub.start()
    try:
        a = await connect(hub, "p/alice", token=None)
        await a.drain(0.3)
        await a.send(claim)
        await a.recv()
        await a.send(frame)
        await a.recv()
        await a.ws.close()
        hub.stop()
        print(f"## files beside the db: {sorted(p.name for p in work.path.iterdir() if p.name.startswith('hub.db'))}", flush=True)
        hub.start()
        a = await connect(hub, "p/alice", token=None)
        await a.drain(0.3)
        await a.send(frame, " (the same signed checkpoint after restart)")
        await a.recv()
        await a.ws.close()
    finally:
        hub.stop()


async def probe_channels_private(work: Workdir) -> None:
    """Directed chat routing under --private-directed-messages, and the observe grant."""
    acl = owner_only(work.path / "acl.json", json.dumps({"rules": [
        {"permission": "observe", "target_kind": "agent", "target_pattern": "p/*"}]}))
    flags = ["--private-directed-messages", "--insecure-unbound-identity", "--acl-policy", str(acl)]
    with running(work, flags) as hub:
        a = await connect(hub, "p/alice", token=None)
        b = await connect(hub, "p/bob", token=None)
        c = await connect(hub, "p/carol", token=None)
        for conn in (a, b, c):
            await conn.drain(0.3)
        await a.send(envelope("p/alice", "chat", target="p/bob", payload="for bob only", receipt_requested=True))
        for conn in (a, b, c):
            await conn.drain(0.5)
    print("## the same without the ACL observe rule", flush=True)
    with running(work, ["--private-directed-messages", "--insecure-unbound-identity"], "noobserve") as hub:
        a = await connect(hub, "p/alice", token=None)
        b = await connect(hub, "p/bob", token=None)
        c = await connect(hub, "p/carol", token=None)
        for conn in (a, b, c):
            await conn.drain(0.3)
        await a.send(envelope("p/alice", "chat", target="p/bob", payload="for bob only", receipt_requested=True))
        for conn in (a, b, c):
            await conn.drain(0.5)
    print("## --team-secure without its material", flush=True)
    startup_refusal(work, ["--team-secure"])


class RecordingProxy:
    """A WebSocket relay that prints every frame between a reference CLI and a hub."""

    def __init__(self, hub: Hub) -> None:
        self.hub, self.port, self.server = hub, free_port(), None

    async def _relay(self, client: Any) -> None:
        async with websockets.connect(self.hub.uri, compression=None) as upstream:
            async def pump(src: Any, dst: Any, arrow: str) -> None:
                try:
                    async for raw in src:
                        frame = json.loads(raw)
                        if frame.get("type") != "presence_update":
                            show(arrow, frame)
                        await dst.send(raw)
                except websockets.ConnectionClosed:
                    pass
                finally:
                    await dst.close()

            await asyncio.gather(pump(client, upstream, ">> cli:"), pump(upstream, client, "<< cli:"))

    async def __aenter__(self) -> "RecordingProxy":
        self.server = await websockets.serve(self._relay, "127.0.0.1", self.port, compression=None)
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.server.close()
        await self.server.wait_closed()


async def probe_operator_cli(work: Workdir) -> None:
    """The frames `synapse identity reclaim|enroll|revoke` send, through a recording relay."""
    trust = work.path / "identity-trust.json"
    work.identity_key("p/watch", "id-watch", trust)
    work.synapse("identity", "machine-key", "--sender", "p/op", "--trust", str(trust))
    acl = owner_only(work.path / "acl.json", json.dumps({"rules": [
        {"permission": "identity-pin-reclaim", "target_kind": "agent", "target_pattern": "p/*"},
        {"permission": "identity-enroll", "target_kind": "agent", "target_pattern": "p/*"}]}))
    roles = work.path / "roles.json"
    work.role_grant("p/identity-enroller", "p/op", roles)
    owner_only(work.path / "hub.db.identity-pins.json", json.dumps({"pins": {"p/tofu": {
        "key_id": "id-tofu", "pinned_at": time.time() - 3600,
        "public_key": "oBTimsMKc1xYy6fQCsJNSyZWH+vqKiLFw/S0EIOtKDY="}}}))
    flags = ["--db", str(work.path / "hub.db"), "--hub-id", "idh", "--identity-trust", str(trust),
             "--require-identity-binding", "--acl-policy", str(acl), "--role-grants", str(roles),
             "--identity-enrollments", str(work.path / "enrollments.json"), "--identity-enrollment-namespace", "p"]
    with running(work, flags) as hub:
        async with RecordingProxy(hub) as proxy:
            uri = f"ws://127.0.0.1:{proxy.port}"
            commands = [
                ["identity", "reclaim", "p/tofu", "--operator", "p/op", "--expected-key-id", "id-tofu",
                 "--reason", "stale laptop", "--uri", uri, "--json"],
                ["identity", "enroll", "p/new", "--operator", "p/op", "--key-id", "k-new", "--public-key",
                 "oBTimsMKc1xYy6fQCsJNSyZWH+vqKiLFw/S0EIOtKDY=", "--reason", "onboard", "--uri", uri, "--json"],
                ["identity", "revoke", "p/new", "--operator", "p/op", "--key-id", "k-new", "--reason", "offboard",
                 "--uri", uri, "--json"],
                ["identity", "reclaim", "p/tofu", "--operator", "p/op", "--expected-key-id", "id-tofu",
                 "--reason", "again", "--uri", uri],
            ]
            for args in commands:
                print(f"## synapse {' '.join(args)}", flush=True)
                proc = await asyncio.create_subprocess_exec(SYNAPSE, *args, env=work.env,
                                                            stdout=asyncio.subprocess.PIPE,
                                                            stderr=asyncio.subprocess.STDOUT)
                out, _ = await asyncio.wait_for(proc.communicate(), 60)
                print(f"## exit {proc.returncode}: {' '.join(out.decode().split())[:700]}", flush=True)


PROBES = {
    "attachments": probe_attachments,
    "attachment-lifecycle": probe_attachment_lifecycle,
    "attachment-disabled": probe_attachment_disabled,
    "peer-read": probe_peer_read,
    "client-api": probe_client_api,
    "message-auth": probe_message_auth,
    "identity": probe_identity,
    "startup": probe_startup,
    "resources": probe_resources,
    "guard": probe_guard,
    "planning": probe_planning,
    "guard-window": probe_guard_window,
    "message-auth-restart": probe_message_auth_restart,
    "channels-private": probe_channels_private,
    "operator-cli": probe_operator_cli,
    "identity-recovery": probe_identity_recovery,
    "channels": probe_channels,
    "entitlement": probe_entitlement,
    "cards": probe_cards,
    "dead-letter": probe_deadletter,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("probe", choices=[*PROBES, "all"])
    args = parser.parse_args()
    names = list(PROBES) if args.probe == "all" else [args.probe]
    for name in names:
        print(f"# probe {name}", flush=True)
        work = Workdir()
        asyncio.run(PROBES[name](work))


if __name__ == "__main__":
    sys.exit(main())

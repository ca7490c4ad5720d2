"""Harness for the reference probes: private workdirs, hub processes, raw connections, signing."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import secrets
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
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


def ledger_rows(work: Workdir, table: str) -> list[tuple]:
    import sqlite3

    db = sqlite3.connect(f"file:{work.path / 'attachments' / 'attachments.sqlite3'}?mode=ro", uri=True)
    try:
        return list(db.execute(f"SELECT * FROM {table}"))
    finally:
        db.close()


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


class EmbeddedHub(Hub):
    """The reference SynapseHub class run in its own process with constructor options the CLI lacks."""

    def __init__(self, work: Workdir, options: dict[str, Any], name: str = "embedded") -> None:
        super().__init__(work, [], name)
        self.options = options

    def command(self) -> list[str]:
        code = ("import asyncio, json, sys; from synapse_channel.core.hub import SynapseHub; "
                "asyncio.run(SynapseHub(**json.loads(sys.argv[1])).serve('127.0.0.1', int(sys.argv[2])))")
        return [str(REFERENCE_VENV / "bin" / "python"), "-c", code, json.dumps(self.options), str(self.port)]


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

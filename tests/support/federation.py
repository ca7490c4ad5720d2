"""Build real federated sites for tests: certificates from `hubd certs`, serving
policies and federation stores in the reference v1 format, and the flags each
hub needs."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Pki:
    folder: Path
    hubs: dict  # hub_id -> the `hubd certs peer-setup --json` entry

    def server_pin(self, hub: str) -> str:
        return self.hubs[hub]["server"]["pins"]["sha256"]

    def client_pin(self, hub: str) -> str:
        return self.hubs[hub]["client"]["pins"]["sha256"]

    def file(self, hub: str, role: str, kind: str) -> str:
        return self.hubs[hub][role][kind]


def make_pki(folder: Path, hub_ids: list[str], sans: list[str] = ()) -> Pki:
    """CA, server and client certificates for every hub, made by `hubd certs`."""
    argv = [sys.executable, "-m", "hubd", "certs", "peer-setup", "--dir", str(folder), "--json"]
    for hub in hub_ids:
        argv += ["--hub-id", hub]
    for san in sans:
        argv += ["--san", san]
    out = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
    document = json.loads(out)
    # The reference hub refuses certificate files other users can read.
    for path in folder.iterdir():
        os.chmod(path, 0o600)
    return Pki(folder, {entry["hub_id"]: entry for entry in document["hubs"]})


def write_serving_policy(folder: Path, pki: Pki, grants: dict[str, list[str]],
                         pins: dict[str, list[str]] | None = None) -> Path:
    """A serving policy + federation store + client CA, owner-only, in folder.

    grants: peer hub id -> namespaces it may address. pins overrides the
    certificate pins recorded for a peer (default: its client certificate).
    """
    folder.mkdir(parents=True, exist_ok=True)
    records, policy_grants = [], []
    for peer, namespaces in grants.items():
        domain = f"{peer}.test"
        records.append({
            "domain_id": domain, "namespaces": namespaces,
            "certificate_pins": (pins or {}).get(peer, [pki.client_pin(peer)]),
            "signing_key_ids": [f"{peer}-hub-key"], "scope_grants": [], "expires_at": None,
            "revoked": False, "provenance": {"source": "tests", "imported_at": 0,
                                             "confirmed_by": "tests"}})
        policy_grants.append({"sender": peer, "domain_id": domain, "namespace": namespaces[0],
                              "signing_key_id": f"{peer}-hub-key"})
    store = folder / "federation.json"
    store.write_text(json.dumps({"version": 1, "records": records}))
    ca = folder / "client-ca.pem"
    shutil.copyfile(pki.folder / "ca.pem", ca)
    policy = folder / "serving-policy.json"
    policy.write_text(json.dumps({"version": 1, "federation_store": store.name,
                                  "client_ca_file": ca.name, "grants": policy_grants}))
    for path in (store, ca, policy):
        os.chmod(path, 0o600)
    return policy


@dataclass
class Site:
    hub_id: str
    serve: list[str] = field(default_factory=list)  # TLS + policy flags
    connect: list[str] = field(default_factory=list)  # client identity flags

    def peer_flags(self, pki: Pki, peer: str, url: str) -> list[str]:
        return ["--message-peer", f"{peer}={url}", "--message-peer-pin",
                f"{peer}={pki.server_pin(peer)}"]


def site_flags(pki: Pki, hub: str, policy: Path | None) -> Site:
    site = Site(hub)
    site.serve = ["--tls-certfile", pki.file(hub, "server", "cert"),
                  "--tls-keyfile", pki.file(hub, "server", "key")]
    if policy is not None:
        site.serve += ["--multihub-serving-policy", str(policy)]
    site.connect = ["--multihub-client-certfile", pki.file(hub, "client", "cert"),
                    "--multihub-client-keyfile", pki.file(hub, "client", "key")]
    return site


@contextlib.asynccontextmanager
async def fake_peer_hub(pki: Pki, hub_id: str, protocol_version: int | None, on_frame,
                        features: list[str] | None = None, mtls: bool = False):
    """A hand-written peer hub serving wss:// with `hub_id`'s certificate on a
    free port (yielded): it sends a welcome at `protocol_version` (none at all
    when None; listing `features` as hubd_features, if given), then hands
    every frame it reads to `await on_frame(ws, frame)`. With `mtls` the TLS
    handshake requires a client certificate signed by the test CA."""
    from aiohttp import web

    from federation.tls import server_context

    async def serve(request):
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        welcome = {"sender": "SynapseHub", "target": "self", "type": "welcome",
                   "payload": "Welcome", "hub_id": hub_id, "timestamp": time.time()}
        if protocol_version is not None:
            welcome["protocol_version"] = protocol_version
        if features is not None:
            welcome["hubd_features"] = features
        await ws.send_json(welcome)
        async for msg in ws:
            await on_frame(ws, json.loads(msg.data))
        return ws

    app = web.Application()
    app.router.add_get("/", serve)
    runner = web.AppRunner(app)
    await runner.setup()
    context = server_context(pki.file(hub_id, "server", "cert"), pki.file(hub_id, "server", "key"),
                             client_ca_file=pki.folder / "ca.pem" if mtls else None)
    if mtls:
        import ssl

        context.verify_mode = ssl.CERT_REQUIRED
    await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context).start()
    try:
        yield runner.addresses[0][1]
    finally:
        await runner.cleanup()

"""The reference hub and hubd read the same serving-policy files the same way.

The reference hub (synapse-channel, AGPL) runs only as a separate program from
its own virtual environment. Each test writes real files with real modes into
tmp_path, starts the reference hub with `--multihub-serving-policy`, and checks
that hubd's loader agrees: both accept the same files, and both refuse the same
broken ones. One test also sends forwards to the reference hub as a peer would,
and checks that hubd's `authorise` reaches the same verdict for each.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import ssl
import uuid
from pathlib import Path
from typing import Any, Callable

import aiohttp
import pytest
from cryptography.hazmat.primitives import serialization

from federation import pki
from federation.pins import certificate_pin
from federation.policy import PolicyError
from federation.policy_loading import load_serving_policy
from tests.support.prereq import missing
from tests.support.procs import HubProcess, reference_hub_process

pytestmark = pytest.mark.interop

POLICIES = Path(__file__).resolve().parents[2] / "policies"
NOW_FOR_EXPIRY = 1.0  # expires_at of the "expired" record: long past for both hubs


def write(path: Path, content: bytes | str | dict, mode: int = 0o600) -> Path:
    if isinstance(content, dict):
        content = json.dumps(content, indent=2)
    if isinstance(content, str):
        content = content.encode()
    path.write_bytes(content)
    os.chmod(path, mode)
    return path


class Pki:
    """A CA, west's server certificate, and two client certificates signed by the CA."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        directory.mkdir(parents=True, exist_ok=True)
        ca = pki.make_ca(name="policy interop CA", days=30)
        server = pki.make_server_certificate(ca, "west", sans=("127.0.0.1", "localhost"), days=10)
        self.ca_pem = pki.certificate_pem(ca.certificate)
        self.server_cert = write(directory / "west-server.pem",
                                 pki.certificate_pem(server.certificate))
        self.server_key = write(directory / "west-server.key", pki.private_key_pem(server.key))
        self.clients: dict[str, tuple[Path, Path, bytes]] = {}
        for name in ("east", "imposter"):
            issued = pki.make_client_certificate(ca, name, days=10)
            cert = write(directory / f"{name}-client.pem", pki.certificate_pem(issued.certificate))
            key = write(directory / f"{name}-client.key", pki.private_key_pem(issued.key))
            der = issued.certificate.public_bytes(serialization.Encoding.DER)
            self.clients[name] = (cert, key, der)

    def der(self, name: str) -> bytes:
        return self.clients[name][2]


def record(domain_id: str, pin: str, namespaces: list[str], **overrides: Any) -> dict[str, Any]:
    base = {
        "domain_id": domain_id,
        "namespaces": namespaces,
        "certificate_pins": [pin],
        "signing_key_ids": [f"{domain_id}-key"],
        "scope_grants": [],
        "expires_at": None,
        "revoked": False,
        "provenance": {"source": "interop test", "imported_at": 0, "confirmed_by": "tester"},
    }
    base.update(overrides)
    return base


def grant(sender: str, domain_id: str, namespace: str) -> dict[str, str]:
    return {"sender": sender, "domain_id": domain_id, "namespace": namespace,
            "signing_key_id": f"{domain_id}-key"}


def write_site(directory: Path, certs: Pki) -> Path:
    """West's policy, store and client CA: east is granted PROJ and DOCS.

    north and south are granted too, but their records are revoked and
    expired; they present east's certificate, which their records pin.
    """
    pin = certificate_pin(certs.der("east"))
    store = {"version": 1, "records": [
        record("east.test", pin, ["PROJ", "DOCS"]),
        record("north.test", pin, ["PROJ"], revoked=True),
        record("south.test", pin, ["PROJ"], expires_at=NOW_FOR_EXPIRY),
    ]}
    policy = {"version": 1, "federation_store": "west-federation.json", "client_ca_file": "ca.pem",
              "grants": [grant("east", "east.test", "PROJ"), grant("north", "north.test", "PROJ"),
                         grant("south", "south.test", "PROJ")]}
    write(directory / "west-federation.json", store)
    write(directory / "ca.pem", certs.ca_pem)
    return write(directory / "west-serving.json", policy)


def reference_west(workdir: Path, certs: Pki, policy: Path) -> HubProcess:
    return reference_hub_process(
        workdir, "--tls-certfile", str(certs.server_cert), "--tls-keyfile", str(certs.server_key),
        "--multihub-serving-policy", str(policy), "--no-durable-ingress-quota",
        hub_id="west", scheme="wss")


@pytest.fixture
def need_reference(reference_venv_status):
    venv, why = reference_venv_status
    if venv is None:
        missing(why)


@pytest.fixture
def certs(tmp_path) -> Pki:
    return Pki(tmp_path / "pki")


@pytest.fixture
def site(tmp_path, certs) -> Path:
    directory = tmp_path / "west"
    directory.mkdir()
    return write_site(directory, certs)


def test_reference_hub_serves_with_files_hubd_accepts(need_reference, tmp_path, certs, site):
    policy = load_serving_policy(site)
    assert [g.sender for g in policy.grants] == ["east", "north", "south"]
    hub = reference_west(tmp_path / "ref", certs, site)
    try:
        hub.start()
        assert hub.get_json("/health")  # TLS listener up, policy loaded
    finally:
        hub.stop()


def test_shipped_examples_start_the_reference_hub(need_reference, tmp_path, certs):
    directory = tmp_path / "examples"
    directory.mkdir()
    for name in ("serving-policy.example.json", "federation-store.example.json"):
        shutil.copyfile(POLICIES / name, directory / name)
        os.chmod(directory / name, 0o600)
    write(directory / "ca.pem", certs.ca_pem)
    policy_path = directory / "serving-policy.example.json"
    assert load_serving_policy(policy_path).grant_for("east") is not None
    hub = reference_west(tmp_path / "ref", certs, policy_path)
    try:
        hub.start()
    finally:
        hub.stop()


def _chmod(name: str, mode: int) -> Callable[[Path], Path]:
    def breaks(policy: Path) -> Path:
        os.chmod(policy.parent / name, mode)
        return policy
    return breaks


def _edit_policy(change: Callable[[dict], None]) -> Callable[[Path], Path]:
    def breaks(policy: Path) -> Path:
        document = json.loads(policy.read_text())
        change(document)
        return write(policy, document)
    return breaks


def _symlinked(policy: Path) -> Path:
    link = policy.parent / "linked-serving.json"
    link.symlink_to(policy.name)
    return link


def _repeated_version(policy: Path) -> Path:
    text = policy.read_text().replace('"version": 1', '"version": 1, "version": 1', 1)
    return write(policy, text)


BREAKAGES: dict[str, Callable[[Path], Path]] = {
    "policy mode 0644": _chmod("west-serving.json", 0o644),
    "store mode 0640": _chmod("west-federation.json", 0o640),
    "client CA mode 0644": _chmod("ca.pem", 0o644),
    "unknown grant field": _edit_policy(lambda d: d["grants"][0].update(hub="east")),
    "grant namespace not in record": _edit_policy(lambda d: d["grants"][0].update(namespace="OPS")),
    "grant for unknown domain": _edit_policy(lambda d: d["grants"][0].update(domain_id="x.test")),
    "two grants for one sender": _edit_policy(lambda d: d["grants"].append(dict(d["grants"][0]))),
    "version 2": _edit_policy(lambda d: d.update(version=2)),
    "symlinked policy": _symlinked,
    "repeated field": _repeated_version,
}


@pytest.mark.parametrize("breakage", list(BREAKAGES))
def test_both_refuse_the_same_broken_files(need_reference, tmp_path, certs, site, breakage):
    policy_path = BREAKAGES[breakage](site)
    with pytest.raises(PolicyError) as ours:
        load_serving_policy(policy_path)
    hub = reference_west(tmp_path / "ref", certs, policy_path)
    with pytest.raises(RuntimeError, match="exited with"):
        hub.start()
    assert hub.proc is not None and hub.proc.returncode != 0
    if "mode" in breakage:
        # Both tell the operator the same fix.
        assert "chmod 600" in hub.log()
        assert "chmod 600" in str(ours.value)


# --- the same verdict on the wire -----------------------------------------------------


async def _forward(url: str, sender: str, target_seat: str,
                   client: tuple[Path, Path, bytes] | None) -> dict[str, Any]:
    """Send one multihub_message_forward as peer `sender`; return the result frame."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # the test trusts its own loopback hub
    if client is not None:
        context.load_cert_chain(str(client[0]), str(client[1]))
    frame = {"sender": sender, "type": "multihub_message_forward", "forward_id": uuid.uuid4().hex,
             "kind": "chat", "sender_seat": "PROJ/alice", "target_seat": target_seat,
             "body": {"payload": "policy interop", "origin_msg_id": 1, "origin_timestamp": 1.0}}
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(url, ssl=context) as ws:
            await ws.send_json(frame)
            while True:
                message = await ws.receive(timeout=15)
                if message.type != aiohttp.WSMsgType.TEXT:
                    raise AssertionError(f"connection ended without a result: {message!r}")
                reply = json.loads(message.data)
                if reply.get("type") in ("multihub_message_result", "error"):
                    return reply


CASES = [
    # sender, client certificate, namespace addressed
    ("east", "east", "PROJ"),
    ("east", "east", "DOCS"),
    ("east", "east", "OTHER"),
    ("east", None, "PROJ"),
    ("east", "imposter", "PROJ"),
    ("mallory", "east", "PROJ"),
    ("north", "east", "PROJ"),
    ("south", "east", "PROJ"),
]


def test_authorise_matches_the_reference_verdict(need_reference, tmp_path, certs, site):
    policy = load_serving_policy(site)
    hub = reference_west(tmp_path / "ref", certs, site)
    try:
        hub.start()
        for sender, client, namespace in CASES:
            reply = asyncio.run(_forward(hub.url, sender, f"{namespace}/bob",
                                         certs.clients[client] if client else None))
            ours = policy.authorise(sender, certs.der(client) if client else None, namespace,
                                    now=1_800_000_000.0)
            case = f"{sender} with {client} certificate addressing {namespace}"
            if ours.allowed:
                assert reply.get("disposition") == "accepted", (case, reply)
            else:
                assert reply.get("disposition") == "refused", (case, reply)
                assert reply.get("detail") == (
                    f"peer may not address {namespace}: {ours.reference_reason}"), (case, reply)
    finally:
        hub.stop()

"""What `hubd site setup` writes for a set of federated hubs, as pure functions.

Given the hubs (an id and the wss:// URL its peers dial), the namespaces the
hubs grant each other, an optional namespace-owner map and the certificate
pins, this decides every hub's documents: its serving policy and federation
store naming every other hub with its client pins, one pin file per peer with
that peer's server pins, and its config file (`hubd --config`): listener,
journal, TLS, policy, client identity, a message peer per other hub (both
directions, so a reply crosses back), and with an owner map the claim routes
and watches. federation/site_cli.py writes them; docs/operations.md, "Sites
with hubd site setup", is the user's page.
"""

from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass
from urllib.parse import urlsplit

from . import pki
from .pins import parse_pin

FIRST_PORT = 8876
DEFAULT_NAMESPACES = ("PROJ",)
CONFIG_FILE = "hubd.toml"
POLICY_FILE = "serving-policy.json"
STORE_FILE = "federation.json"
CLIENT_CA_FILE = "client-ca.pem"
PINS_FOLDER = "pins"
DEFAULT_JOURNAL = "hubd.db"


class SiteError(ValueError):
    """A `hubd site setup` argument that cannot be used; the message says why."""


@dataclass(frozen=True)
class SiteHub:
    hub_id: str
    host: str  # as in the URL (an IPv6 address without brackets)
    port: int

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"wss://{host}:{self.port}/"

    @property
    def loopback(self) -> bool:
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False

    @property
    def bind(self) -> str:
        """Where it listens: loopback for a hub its peers reach on loopback
        (all on one machine), every interface otherwise."""
        return "127.0.0.1" if self.loopback else "0.0.0.0"


def parse_hubs(values: list[str]) -> list[SiteHub]:
    """`ID` (wss://127.0.0.1:PORT/, ports 8876, 8877, ... in order) or
    `ID=wss://HOST:PORT/` (the URL the other hubs dial: its host is also a
    name in the hub's server certificate)."""
    hubs: list[SiteHub] = []
    for index, value in enumerate(values):
        hub_id, sep, url = value.partition("=")
        try:
            pki.validate_hub_id(hub_id)
        except pki.PkiError as exc:
            raise SiteError(f"--hub {value!r}: {exc}") from None
        if not sep:
            hubs.append(SiteHub(hub_id, "127.0.0.1", FIRST_PORT + index))
            continue
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError:
            port, parts = None, None
        if parts is None or parts.scheme != "wss" or not parts.hostname or port is None \
                or parts.path not in ("", "/") or parts.query or parts.username:
            raise SiteError(f"--hub {value!r}: expected ID=wss://HOST:PORT/ (the URL the other "
                            "hubs dial, with its port)")
        hubs.append(SiteHub(hub_id, parts.hostname, port))
    ids = [hub.hub_id for hub in hubs]
    if len(set(ids)) != len(ids):
        raise SiteError("--hub names the same hub twice")
    if len(hubs) < 2:
        raise SiteError("give at least two --hub: a site setup federates hubs with each other")
    bound = [(hub.bind, hub.port) for hub in hubs if hub.loopback]
    if len(set(bound)) != len(bound):
        raise SiteError("two hubs on this machine (loopback URLs) share a port; give each its "
                        "own, e.g. --hub east=wss://127.0.0.1:8876/ --hub west=wss://127.0.0.1:8877/")
    return hubs


def parse_owners(values: list[str], hubs: list[SiteHub]) -> dict[str, str]:
    """--namespace-owner NS=HUB: the one owner map every hub carries."""
    known = {hub.hub_id for hub in hubs}
    owners: dict[str, str] = {}
    for value in values:
        namespace, sep, hub_id = value.partition("=")
        if not sep or not namespace or "/" in namespace or "@" in namespace:
            raise SiteError(f"--namespace-owner expects NAMESPACE=HUB, got {value!r}")
        if hub_id not in known:
            raise SiteError(f"--namespace-owner {value!r}: {hub_id!r} is not one of the hubs "
                            f"({', '.join(sorted(known))})")
        if owners.setdefault(namespace, hub_id) != hub_id:
            raise SiteError(f"--namespace-owner names two owners for {namespace!r}")
    return owners


def granted_namespaces(namespaces: list[str], owners: dict[str, str]) -> list[str]:
    """What every hub grants every peer: the --namespace list (PROJ when none
    is given and no owner map either) and every namespace of the owner map,
    so a claim routed to its owner is one the owner serves."""
    chosen = list(namespaces) or ([] if owners else list(DEFAULT_NAMESPACES))
    for namespace in [*chosen, *owners]:
        if not namespace or any(c in namespace for c in "/@*?[] \t"):
            raise SiteError(f"--namespace {namespace!r} is not a namespace name")
    return list(dict.fromkeys([*chosen, *owners]))


def server_sans(hub: SiteHub, extra: list[str]) -> list[str]:
    """The loopback names, the host its peers dial, and any --san."""
    return list(dict.fromkeys([*pki.DEFAULT_SANS, hub.host, *extra]))


def serving_policy(peers: list[str], namespaces: list[str]) -> dict:
    return {"version": 1, "federation_store": STORE_FILE, "client_ca_file": CLIENT_CA_FILE,
            "grants": [{"sender": peer, "domain_id": domain_of(peer), "namespace": namespaces[0],
                        "signing_key_id": f"{peer}-hub-key"} for peer in peers]}


def domain_of(peer: str) -> str:
    return f"{peer}.hubd"


def federation_store(client_pins: dict[str, list[str]], namespaces: list[str],
                     now: int) -> dict:
    """One record per peer: its client certificate's pins."""
    for pins in client_pins.values():
        for pin in pins:
            parse_pin(pin)  # a pin that cannot match is a bug here, not a file to write
    return {"version": 1, "records": [
        {"domain_id": domain_of(peer), "namespaces": namespaces, "certificate_pins": pins,
         "signing_key_ids": [f"{peer}-hub-key"], "scope_grants": [], "expires_at": None,
         "revoked": False,
         "provenance": {"source": f"hubd site setup: {peer}-client.pem", "imported_at": now,
                        "confirmed_by": "hubd site setup"}}
        for peer, pins in client_pins.items()]}


def pin_file(peer: str, pins: list[str]) -> str:
    return "\n".join([
        f"# {peer}'s server certificate ({peer}-server.pem); any line may match.",
        "# sha256: this certificate; spki-sha256: its key (survives a re-issue on the same key).",
        "# To rotate: add the new pin here, then SIGHUP this hub (kill -HUP).",
        *pins, ""])


def json_text(document: dict) -> str:
    return json.dumps(document, indent=2) + "\n"


def config_file(hub: SiteHub, hubs: list[SiteHub], owners: dict[str, str],
                journal: str | None) -> str:
    """The hub's `hubd --config` file: flag names as keys, paths beside it."""
    peers = [other for other in hubs if other.hub_id != hub.hub_id]

    def lst(items: list[str]) -> str:
        return "[" + ", ".join(json.dumps(item) for item in items) + "]"

    routes = [f"{p.hub_id}={p.url}" for p in peers]
    pins = [f"{p.hub_id}=@{PINS_FOLDER}/{p.hub_id}.pins" for p in peers]
    lines = [
        f"# Hub {hub.hub_id}, written by `hubd site setup`: run `hubd --config` with this file.",
        "# Keys are hubd's flags (hubd --help), relative paths resolve beside this file, and",
        "# flags on the command line override it. SIGHUP re-reads it: peers, pins, certificates",
        "# and the serving policy change live; anything else needs a restart (docs/operations.md,",
        '# "Configuration file").',
        "",
        f'hub-id = "{hub.hub_id}"',
        f'host = "{hub.bind}"',
        f"port = {hub.port}",
        f"db = {json.dumps(journal or DEFAULT_JOURNAL)}",
        "",
        f"# wss:// for agents and peers: {hub.url} (agents trust it with",
        "# SSL_CERT_FILE=<setup folder>/public/ca.pem)",
        f'tls-certfile = "{hub.hub_id}-server.pem"',
        f'tls-keyfile = "{hub.hub_id}-server.key"',
        f"# which peer hubs may forward to this hub: {POLICY_FILE} grants each one,",
        f"# {STORE_FILE} holds their client certificate pins, {CLIENT_CA_FILE} their CA",
        f'multihub-serving-policy = "{POLICY_FILE}"',
        "",
        "# this hub's identity on its links to its peers",
        f'multihub-client-certfile = "{hub.hub_id}-client.pem"',
        f'multihub-client-keyfile = "{hub.hub_id}-client.key"',
        "# every other hub, trusted by the pins of the certificate it serves",
        f"message-peer = {lst(routes)}",
        f"message-peer-pin = {lst(pins)}",
    ]
    if owners:
        owning = [p for p in peers if p.hub_id in owners.values()]
        lines += [
            "",
            "# namespace authority: one owner per namespace, claims routed to it, every peer",
            "# watched for namespaces it contests (docs/federation.md, \"Namespace ownership\")",
            f"namespace-owner = {lst([f'{ns}={owner}' for ns, owner in owners.items()])}",
        ]
        if owning:
            lines += [f"claim-peer = {lst([f'{p.hub_id}={p.url}' for p in owning])}",
                      "claim-peer-pin = " + lst([f"{p.hub_id}=@{PINS_FOLDER}/{p.hub_id}.pins"
                                                 for p in owning])]
        lines += [f"multihub-watch = {lst(routes)}", f"multihub-watch-pin = {lst(pins)}"]
    if not hub.loopback:
        lines += [
            "",
            "# Listening on every interface, for the peers. Agents of other machines need a",
            "# token or principals (docs/identity.md): without, agents may connect from this",
            "# machine only. To check the Host header of their requests (the DNS-rebinding",
            "# guard), name every authority they reach this hub by:",
            f'# advertised-host = ["{hub.url[len("wss://"):-1]}"]',
        ]
    return "\n".join(lines) + "\n"

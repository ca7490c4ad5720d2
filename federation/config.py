"""Federation settings: message peers, pins, the client identity, the serving policy.

The flags and their refusals are the reference hub's, so a site's command line
moves over unchanged:

    --message-peer west=wss://west.example:8876/     (repeatable)
    --message-peer-pin west=sha256:<hex>             (repeatable; several per peer for rotation;
                                                      spki-sha256:<hex> also accepted;
                                                      west=@FILE reads pins from a file, one per
                                                      line, again on every SIGHUP)
    --message-peer-token / --message-peer-token-file
    --multihub-client-certfile / --multihub-client-keyfile
    --message-forward-ttl SECONDS                    (default 86400)
    --tls-certfile / --tls-keyfile / --multihub-serving-policy
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from federation.pins import PinError, PinSet, parse_pin
from hubd.wire.envelope import HUB_ID_RE

DEFAULT_FORWARD_TTL = 86400.0


class FederationConfigError(ValueError):
    """A federation flag or file is wrong; the message says which and why."""


@dataclass(frozen=True)
class PeerRoute:
    hub_id: str
    uri: str
    pins: PinSet | None
    token: str | None

    @property
    def secure(self) -> bool:
        return self.uri.startswith("wss://")


@dataclass(frozen=True)
class FederationConfig:
    message_peers: dict[str, PeerRoute] = field(default_factory=dict)
    client_certfile: Path | None = None
    client_keyfile: Path | None = None
    forward_ttl: float = DEFAULT_FORWARD_TTL
    tls_certfile: Path | None = None
    tls_keyfile: Path | None = None
    serving_policy_path: Path | None = None
    namespace_owners: dict[str, str] = field(default_factory=dict)  # namespace -> hub id
    watches: dict[str, PeerRoute] = field(default_factory=dict)
    claim_peers: dict[str, PeerRoute] = field(default_factory=dict)
    # --relay-peer: where dead-letter pointers for a namespace a peer owns go
    # (federation/handlers/dead_letter_pointer.py)
    relay_peers: dict[str, PeerRoute] = field(default_factory=dict)
    # the flag values this was built from: SIGHUP builds it again from them,
    # re-reading every file they name
    flags: dict = field(default_factory=dict, compare=False, repr=False)

    def rebuild(self) -> "FederationConfig":
        return build_federation_config(**self.flags) if self.flags else self

    @property
    def enabled(self) -> bool:
        return bool(self.message_peers) or self.serving_policy_path is not None

    def client_context(self) -> "ClientContexts":
        from federation.tls import peer_client_context, verified_client_context

        return ClientContexts(
            pinned=peer_client_context(self.client_certfile, self.client_keyfile),
            verified=verified_client_context(self.client_certfile, self.client_keyfile))


@dataclass(frozen=True)
class ClientContexts:
    """TLS for outgoing peer links: a pinned route skips CA checks because the
    pin is checked on the live connection before any frame; a route without
    a pin gets ordinary CA and hostname verification."""

    pinned: ssl.SSLContext
    verified: ssl.SSLContext

    def for_route(self, route: "PeerRoute") -> ssl.SSLContext:
        return self.pinned if route.pins is not None else self.verified


def _pairs(values: list[str], flag: str) -> list[tuple[str, str]]:
    pairs = []
    for value in values:
        name, sep, rest = value.partition("=")
        if not sep or not name or not rest:
            raise FederationConfigError(f"{flag} expects HUB_ID=VALUE, got {value!r}")
        if not HUB_ID_RE.match(name):
            raise FederationConfigError(
                f"{flag}: hub id {name!r} must be 1-64 letters, digits, '.', '_' or '-', "
                "starting with a letter or digit")
        pairs.append((name, rest))
    return pairs


def _routes(values: list[str], pin_values: list[str], token: str | None, flag: str,
            pin_flag: str, client_certfile: str | None) -> dict[str, PeerRoute]:
    """HUB_ID=URI routes with their pins; the reference's refusals, word for word."""
    routes = dict(_pairs(values, flag))
    if len(routes) != len(values):
        raise FederationConfigError(f"{flag} names the same hub twice")
    pins: dict[str, list] = {}
    for name, value in _pairs(pin_values, pin_flag):
        if name not in routes:
            raise FederationConfigError(
                f"{pin_flag} requires {flag}; no route named {name!r}")
        pins.setdefault(name, []).extend(read_pins(value, f"{pin_flag} {name}"))
    out = {}
    for name, uri in routes.items():
        scheme = urlsplit(uri).scheme
        if scheme not in ("ws", "wss"):
            raise FederationConfigError(f"{flag} URI for {name!r} must be ws:// or wss://")
        if client_certfile and scheme == "wss" and name not in pins:
            raise FederationConfigError(
                f"multi-hub client identity requires {pin_flag} for hub {name!r}")
        if name in pins and scheme != "wss":
            raise FederationConfigError(f"{pin_flag} {name}: a pin needs a wss:// URI")
        out[name] = PeerRoute(name, uri, PinSet(pins[name]) if name in pins else None, token)
    return out


def build_federation_config(*, message_peers: list[str], message_peer_pins: list[str],
                            message_peer_token: str | None, client_certfile: str | None,
                            client_keyfile: str | None, forward_ttl: float,
                            tls_certfile: str | None, tls_keyfile: str | None,
                            serving_policy: str | None, hub_id: str | None,
                            namespace_owners: list[str] = (),
                            watches: list[str] = (), watch_pins: list[str] = (),
                            watch_token: str | None = None,
                            claim_peers: list[str] = (), claim_peer_pins: list[str] = (),
                            claim_peer_token: str | None = None,
                            relay_peers: list[str] = (), relay_peer_pins: list[str] = (),
                            relay_peer_token: str | None = None) -> FederationConfig:
    """Check the flags together, as the reference does, and build the config."""
    if (tls_certfile is None) != (tls_keyfile is None):
        raise FederationConfigError("native WSS requires both --tls-certfile and --tls-keyfile")
    if serving_policy and tls_certfile is None:
        raise FederationConfigError(
            "--multihub-serving-policy requires native WSS: native WSS requires both "
            "--tls-certfile and --tls-keyfile")
    if (client_certfile is None) != (client_keyfile is None):
        raise FederationConfigError("--multihub-client-certfile requires --multihub-client-keyfile "
                                    "(and the reverse)")
    if forward_ttl < 1:
        raise FederationConfigError("--message-forward-ttl must be at least 1 second")
    peers = _routes(list(message_peers), list(message_peer_pins), message_peer_token,
                    "--message-peer", "--message-peer-pin", client_certfile)
    if peers and not hub_id:
        raise FederationConfigError("--message-peer requires --hub-id: peers know this hub by it")
    owners = _owners(list(namespace_owners))
    if owners and not hub_id:
        raise FederationConfigError("--namespace-owner requires --hub-id: the ownership map "
                                    "compares owners against it")
    watch_routes = _routes(list(watches), list(watch_pins), watch_token, "--multihub-watch",
                           "--multihub-watch-pin", client_certfile)
    if watch_routes and not owners:
        raise FederationConfigError("--multihub-watch requires --namespace-owner")
    claim_routes = _routes(list(claim_peers), list(claim_peer_pins), claim_peer_token,
                           "--claim-peer", "--claim-peer-pin", client_certfile)
    if claim_routes and not owners:
        raise FederationConfigError("--claim-peer requires --namespace-owner")
    if relay_peer_pins and not relay_peers:
        raise FederationConfigError("--relay-peer-pin requires --relay-peer; a pin without a "
                                    "route cannot secure any owner connection.")
    relay_routes = _routes(list(relay_peers), list(relay_peer_pins), relay_peer_token,
                           "--relay-peer", "--relay-peer-pin", client_certfile)
    if relay_routes and not owners:
        raise FederationConfigError("--relay-peer requires --namespace-owner; relay routes are "
                                    "keyed by the authoritative owning hub id.")
    _merge_routes({"--message-peer": peers, "--multihub-watch": watch_routes,
                   "--claim-peer": claim_routes, "--relay-peer": relay_routes})
    return FederationConfig(
        message_peers=peers,
        client_certfile=Path(client_certfile) if client_certfile else None,
        client_keyfile=Path(client_keyfile) if client_keyfile else None,
        forward_ttl=float(forward_ttl),
        tls_certfile=Path(tls_certfile) if tls_certfile else None,
        tls_keyfile=Path(tls_keyfile) if tls_keyfile else None,
        serving_policy_path=Path(serving_policy) if serving_policy else None,
        namespace_owners=owners, watches=watch_routes,
        claim_peers=claim_routes, relay_peers=relay_routes,
        flags=dict(message_peers=list(message_peers), message_peer_pins=list(message_peer_pins),
                   message_peer_token=message_peer_token, client_certfile=client_certfile,
                   client_keyfile=client_keyfile, forward_ttl=forward_ttl,
                   tls_certfile=tls_certfile, tls_keyfile=tls_keyfile,
                   serving_policy=serving_policy, hub_id=hub_id,
                   namespace_owners=list(namespace_owners), watches=list(watches),
                   watch_pins=list(watch_pins), watch_token=watch_token,
                   claim_peers=list(claim_peers),
                   claim_peer_pins=list(claim_peer_pins), claim_peer_token=claim_peer_token,
                   relay_peers=list(relay_peers), relay_peer_pins=list(relay_peer_pins),
                   relay_peer_token=relay_peer_token))


def merged_routes(config: FederationConfig) -> dict[str, PeerRoute]:
    """One route per peer hub, whatever roles it has: each peer gets one link."""
    return _merge_routes({"--message-peer": config.message_peers,
                          "--multihub-watch": config.watches,
                          "--claim-peer": config.claim_peers,
                          "--relay-peer": config.relay_peers})


def _merge_routes(by_flag: dict[str, dict[str, PeerRoute]]) -> dict[str, PeerRoute]:
    merged: dict[str, tuple[str, PeerRoute]] = {}
    for flag, routes in by_flag.items():
        for peer, route in routes.items():
            if peer not in merged:
                merged[peer] = (flag, route)
                continue
            first_flag, first = merged[peer]
            if route.uri != first.uri:
                raise FederationConfigError(
                    f"{flag} {peer}={route.uri} and {first_flag} {peer}={first.uri}: one hub, "
                    "one link: give it the same URI")
            if route.pins != first.pins:
                raise FederationConfigError(
                    f"{flag}-pin and {first_flag}-pin differ for hub {peer!r}: one link is "
                    "checked against one pin set; give it the same pins")
            if route.token and first.token and route.token != first.token:
                raise FederationConfigError(
                    f"{flag} and {first_flag} give hub {peer!r} two different tokens; its one "
                    "link registers with one")
            if route.token and not first.token:
                merged[peer] = (first_flag, route)
    return {peer: route for peer, (_, route) in merged.items()}


def _owners(values: list[str]) -> dict[str, str]:
    """--namespace-owner NS=HUB_ID (repeatable): one owner per namespace."""
    owners: dict[str, str] = {}
    for value in values:
        namespace, sep, hub = value.partition("=")
        if not sep or not namespace or not hub or "/" in namespace:
            raise FederationConfigError(
                f"--namespace-owner expects NAMESPACE=HUB_ID, got {value!r}")
        if not HUB_ID_RE.match(hub):
            raise FederationConfigError(f"--namespace-owner {namespace}: {hub!r} is not a hub id")
        if owners.get(namespace, hub) != hub:
            raise FederationConfigError(
                f"--namespace-owner names two owners for {namespace!r}: "
                f"{owners[namespace]!r} and {hub!r}")
        owners[namespace] = hub
    return owners


def read_pins(value: str, flag: str) -> list:
    """One pin, or `@FILE`: every non-blank, non-comment line of FILE (a file
    lets an operator rotate pins and SIGHUP the hub instead of restarting it)."""
    if not value.startswith("@"):
        lines = [value]
    else:
        path = value[1:]
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise FederationConfigError(f"{flag}: cannot read pin file {path}: "
                                        f"{exc.strerror or exc}") from exc
        lines = [ln.strip() for ln in text.splitlines()
                 if ln.strip() and not ln.strip().startswith("#")]
        if not lines:
            raise FederationConfigError(f"{flag}: pin file {path} holds no pin")
    try:
        return [parse_pin(line) for line in lines]
    except PinError as exc:
        raise FederationConfigError(f"{flag}: {exc}") from exc

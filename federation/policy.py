"""Serving policy and federation store: which peer hubs may use this hub, and for what.

The model and the decision: this module holds the immutable objects a
loaded policy is (federation/policy_loading.py reads and checks the files)
and `ServingPolicy.authorise`, the one answer to "may this peer, with this
certificate, act in this namespace now".

A hub that accepts forwarded messages, log pulls or forwarded claims is
configured with a *serving policy* file. The policy names a *federation store*
(one trust record per peer domain: its certificate pins, namespaces, expiry,
revocation) and a *client CA* (handed to TLS so the server can ask peers for a
client certificate). All three files and their formats are the reference
hub's (``--multihub-serving-policy``), so a site moves to hubd with the same
files. policies/README.md is the commented companion to the formats.

    policy = load_serving_policy("/etc/hubd/west-serving.json")   # or PolicyError
    context.load_verify_locations(cadata=policy.client_ca_pem)
    decision = policy.authorise("east", peer_der, "PROJ", time.time())
    visible = policy.granted_namespaces("east", peer_der, time.time())

Loading is a pure function of the path: it returns immutable objects or raises
PolicyError, so a hub can reload on SIGHUP and keep the old policy when the new
one is refused. Authorisation is pure and denies by default. A peer is
identified by its grant (keyed by the name it registers under) plus the pinned
client certificate on its connection. It may then address every namespace of
its federation record, as with the reference hub, which allows one grant per
sender.

Where hubd differs from the reference (each deliberate, each documented in
policies/README.md):

- ``certificate_pins`` may also hold ``spki-sha256:<hex>`` pins (SHA-256 of the
  certificate's SubjectPublicKeyInfo), which survive re-issuing a certificate
  on the same key. The reference only understands ``sha256:`` pins.
- A malformed pin, an unknown or repeated field anywhere in the store, or a
  missing record field refuses loading; the reference ignores unknown record
  fields (a misspelt ``"revokd": true`` would leave a peer trusted) and keeps
  malformed pins that can never match.
- A grant's ``identity_key_id`` is accepted but authorises nothing: hubd
  authorises peers by pinned client certificate only, so a granted record
  must carry at least one certificate pin.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

from federation.pins import PinSet, describe_certificate

# Decision reasons: stable, lower-case, for logs and metrics labels.
GRANTED = "granted"
UNKNOWN_PEER = "unknown_peer"
MISSING_CERTIFICATE = "missing_certificate"
REVOKED = "revoked"
EXPIRED = "expired"
PIN_MISMATCH = "pin_mismatch"
NAMESPACE_NOT_GRANTED = "namespace_not_granted"

# The reference hub's words for the same refusals, as it puts them on the wire
# in a refused forward's detail ("peer may not address PROJ: revoked_peering").
REFERENCE_REASONS: Mapping[str, str] = MappingProxyType({
    GRANTED: "",
    UNKNOWN_PEER: "unknown_peer",
    MISSING_CERTIFICATE: "missing_certificate",
    REVOKED: "revoked_peering",
    EXPIRED: "expired_peering",
    PIN_MISMATCH: "certificate_pin_not_accepted",
    NAMESPACE_NOT_GRANTED: "namespace_not_granted",
})


class PolicyError(ValueError):
    """A serving policy, federation store or client CA file is refused; the message says why."""



# --- federation store ------------------------------------------------------------


@dataclass(frozen=True)
class ScopeGrant:
    """Kept for fidelity with the reference format; hubd's serving gate does not use it."""

    verb: str
    namespace: str


@dataclass(frozen=True)
class FederationRecord:
    """What this hub trusts about one peer trust domain."""

    domain_id: str
    namespaces: frozenset[str]
    certificate_pins: PinSet
    signing_key_ids: tuple[str, ...]
    scope_grants: tuple[ScopeGrant, ...]
    expires_at: float | None
    revoked: bool
    provenance: Mapping[str, Any] = field(hash=False)

    def expired(self, now: float) -> bool:
        # The expiry instant itself is already outside the trust window.
        return self.expires_at is not None and now >= self.expires_at


@dataclass(frozen=True)
class FederationStore:
    path: str
    records: tuple[FederationRecord, ...]
    _by_domain: Mapping[str, FederationRecord] = field(
        init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_domain",
                           MappingProxyType({r.domain_id: r for r in self.records}))

    def record(self, domain_id: str) -> FederationRecord | None:
        return self._by_domain.get(domain_id)


# --- serving policy ------------------------------------------------------------------


@dataclass(frozen=True)
class ServingGrant:
    """Peer hub `sender` (its --hub-id) is the trust domain `domain_id`."""

    sender: str
    domain_id: str
    namespace: str
    signing_key_id: str
    identity_key_id: str | None = None  # accepted for reference policies; never authorises


@dataclass(frozen=True)
class Decision:
    allowed: bool
    reason: str  # GRANTED or one of the refusal codes above
    detail: str  # for the operator log: names the layer that refused
    domain_id: str | None = None

    @property
    def reference_reason(self) -> str:
        """The reference hub's code for this outcome (empty when allowed)."""
        return REFERENCE_REASONS[self.reason]


@dataclass(frozen=True)
class ServingPolicy:
    path: str
    federation_store_path: str
    client_ca_path: str
    client_ca_bytes: bytes = field(repr=False)
    store: FederationStore = field(repr=False)
    grants: tuple[ServingGrant, ...] = ()
    _by_sender: Mapping[str, ServingGrant] = field(
        init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_sender",
                           MappingProxyType({g.sender: g for g in self.grants}))

    @property
    def client_ca_pem(self) -> str:
        """The client CA as text, for SSLContext.load_verify_locations(cadata=...).

        cadata must be a str for PEM (bytes would be read as DER); the bytes
        are the ones read at load time, so OpenSSL never reopens the path.
        """
        return self.client_ca_bytes.decode("utf-8-sig")

    def grant_for(self, sender: str) -> ServingGrant | None:
        return self._by_sender.get(sender)

    def authorise(self, sender: str, peer_cert_der: bytes | None, namespace: str | None,
                  now: float) -> Decision:
        """May peer `sender`, presenting `peer_cert_der` on its TLS connection, act in `namespace`?

        namespace=None asks whether the peer may be served at all (a log pull).
        Checks run in the reference hub's order, and the first failure is the
        reason: grant for the sender, certificate presented, record revoked,
        record expired, certificate pinned, namespace listed in the record.
        """
        grant = self._by_sender.get(sender)
        if grant is None:
            return Decision(False, UNKNOWN_PEER,
                            f"no grant in the serving policy names sender {sender!r}")
        domain = grant.domain_id
        if not peer_cert_der:
            return Decision(False, MISSING_CERTIFICATE,
                            f"peer presented no client certificate (sender {sender!r}, "
                            f"domain {domain!r})", domain)
        record = self.store.record(domain)
        if record is None:  # impossible after load validation; fail closed regardless
            return Decision(False, UNKNOWN_PEER,
                            f"federation store has no record for domain {domain!r}", domain)
        if record.revoked:
            return Decision(False, REVOKED,
                            f"federation record {domain!r} is revoked", domain)
        if record.expired(now):
            return Decision(False, EXPIRED,
                            f"federation record {domain!r} expired at {record.expires_at:.0f} "
                            f"(now {now:.0f})", domain)
        if not record.certificate_pins.matches(peer_cert_der):
            return Decision(False, PIN_MISMATCH,
                            f"client certificate of sender {sender!r} matches none of the "
                            f"{len(record.certificate_pins)} pin(s) of federation record "
                            f"{domain!r}; it presented {describe_certificate(peer_cert_der)}",
                            domain)
        # The record's namespaces are what the peer may address; the grant's
        # own namespace is one of them (checked at load). This is how the
        # reference hub decides too: one grant per sender, many namespaces.
        if namespace is not None and namespace not in record.namespaces:
            return Decision(False, NAMESPACE_NOT_GRANTED,
                            f"namespace {namespace!r} is not among those federation record "
                            f"{domain!r} grants ({', '.join(sorted(record.namespaces))})", domain)
        return Decision(True, GRANTED,
                        f"sender {sender!r} authenticated as domain {domain!r}", domain)

    def may_read_scope(self, sender: str, peer_cert_der: bytes | None, scope: str,
                       now: float) -> bool:
        """Cross-hub attachment reads (wire v6): the peer is authorised for
        the namespace `scope` and its record's `scope_grants` hold
        {"verb": "read", "namespace": scope}."""
        if not self.authorise(sender, peer_cert_der, scope, now).allowed:
            return False
        record = self.store.record(self._by_sender[sender].domain_id)
        return any(g.verb == "read" and g.namespace == scope for g in record.scope_grants)

    def granted_namespaces(self, sender: str, peer_cert_der: bytes | None,
                           now: float) -> frozenset[str]:
        """The namespaces `sender` may see or address (empty when it is not authorised)."""
        if not self.authorise(sender, peer_cert_der, None, now).allowed:
            return frozenset()
        grant = self._by_sender[sender]
        record = self.store.record(grant.domain_id)
        return record.namespaces if record is not None else frozenset()

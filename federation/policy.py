"""Serving policy and federation store: which peer hubs may use this hub, and for what.

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

import errno
import json
import math
import os
import re
import ssl
import stat
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

from federation.pins import PinError, PinSet, parse_pin, pins_for_certificate
from hubd.owner_only import open_to_others

SUPPORTED_VERSION = 1

# Policy files are small; a bound keeps a wrong path (a log, a device) from
# being read into memory whole.
MAX_FILE_BYTES = 4 * 1024 * 1024

POLICY_LABEL = "serving policy"
STORE_LABEL = "federation store"
CLIENT_CA_LABEL = "client CA"

POLICY_FIELDS = frozenset({"version", "federation_store", "client_ca_file", "grants"})
GRANT_FIELDS = frozenset({"sender", "domain_id", "namespace", "signing_key_id"})
# The reference's alternative to a client certificate (signed registration).
# hubd accepts the field so reference policies load, but never authorises by it.
GRANT_OPTIONAL_FIELDS = frozenset({"identity_key_id"})
STORE_FIELDS = frozenset({"version", "records"})
RECORD_FIELDS = frozenset({
    "domain_id", "namespaces", "certificate_pins", "signing_key_ids",
    "scope_grants", "expires_at", "revoked", "provenance",
})
SCOPE_GRANT_FIELDS = frozenset({"verb", "namespace"})

# The exact written form of a pin (the schema's pattern). federation.pins is
# more forgiving (spaces, upper-case kind); a trust file should say it one way.
PIN_PATTERN = re.compile(r"(sha256|spki-sha256):[0-9a-fA-F]{64}")

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


class _Invalid(Exception):
    """A content error at `where` inside one file; the loader adds the file to the message."""

    def __init__(self, where: str, problem: str) -> None:
        super().__init__(f"{where} {problem}" if where else problem)
        self.where = where

    def in_file(self, label: str, path: str) -> PolicyError:
        # "serving policy P: grants[0] has ..." but "serving policy P has ..." at top level.
        return PolicyError(f"{label} {path}{': ' if self.where else ' '}{self}")


# --- reading owner-only files -------------------------------------------------


def read_owner_only_file(path: str | os.PathLike[str], label: str) -> bytes:
    """The bytes of `path`, read once through one descriptor, if it is safe to trust.

    Safe means: no symbolic link anywhere in the path, a regular file, owned by
    the effective user, no permission bits for group or others (the reference
    hub's rule: 0600 and 0400 are the usual modes), non-empty, and at most
    MAX_FILE_BYTES. Every check is made on the open descriptor, so the file
    cannot be swapped between the check and the read.
    """
    path = os.fspath(path)
    try:
        fd = _open_without_symlinks(path)
    except OSError as exc:
        raise PolicyError(_open_failure(label, path, exc)) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise PolicyError(f"{label} {path} is not a regular file")
        if info.st_uid != os.geteuid():
            raise PolicyError(
                f"{label} {path} is owned by uid {info.st_uid}, not by the user hubd runs as "
                f"(uid {os.geteuid()}); run: chown {os.geteuid()} {path}"
            )
        refused = open_to_others(label, [(path, info.st_mode)])
        if refused is not None:
            raise PolicyError(refused)
        if info.st_size > MAX_FILE_BYTES:
            raise PolicyError(f"{label} {path} is larger than {MAX_FILE_BYTES} bytes")
        chunks = []
        remaining = MAX_FILE_BYTES + 1
        while remaining > 0:
            chunk = os.read(fd, min(remaining, 1 << 16))
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
        data = b"".join(chunks)
    except OSError as exc:
        raise PolicyError(f"cannot read {label} {path}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if len(data) > MAX_FILE_BYTES:  # grew after fstat
        raise PolicyError(f"{label} {path} is larger than {MAX_FILE_BYTES} bytes")
    if not data.strip():
        raise PolicyError(f"{label} {path} is empty")
    return data


def _open_without_symlinks(path: str) -> int:
    """Open `path` read-only, refusing a symbolic link in *any* component.

    O_NOFOLLOW alone only guards the last component; walking the directories
    one at a time with O_NOFOLLOW guards the rest, as the reference hub does.
    """
    if not path:
        raise OSError(errno.ENOENT, "empty path")
    components = [part for part in path.split("/") if part not in ("", ".")]
    if not components:
        raise OSError(errno.EISDIR, os.strerror(errno.EISDIR))
    # O_PATH opens a directory without needing read permission on it (Linux);
    # with O_NOFOLLOW|O_DIRECTORY a symlinked directory fails with ENOTDIR.
    dir_flags = getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY | os.O_CLOEXEC
    dir_fd = os.open("/" if path.startswith("/") else ".", dir_flags)
    try:
        for part in components[:-1]:
            next_fd = os.open(part, dir_flags | os.O_NOFOLLOW, dir_fd=dir_fd)
            os.close(dir_fd)
            dir_fd = next_fd
        # O_NONBLOCK: opening a FIFO must not hang; fstat then refuses it.
        return os.open(
            components[-1],
            os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
            dir_fd=dir_fd,
        )
    finally:
        os.close(dir_fd)


def _open_failure(label: str, path: str, exc: OSError) -> str:
    if exc.errno == errno.ELOOP:
        return (f"{label} {path} is a symbolic link; hubd reads only regular files "
                "it can open without following links; point the setting at the real file")
    if exc.errno == errno.ENOTDIR:
        return (f"cannot open {label} {path}: a directory in the path is a symbolic link "
                "or not a directory; hubd follows no symbolic links; use the real path")
    if exc.errno == errno.ENOENT:
        return f"cannot open {label} {path}: no such file"
    return f"cannot open {label} {path}: {exc.strerror or exc}"


# --- strict JSON ----------------------------------------------------------------


def _parse_json(data: bytes, label: str, path: str) -> Any:
    try:
        text = data.decode("utf-8-sig")  # the reference tolerates a byte-order mark
    except UnicodeDecodeError:
        raise PolicyError(f"{label} {path} is not valid UTF-8") from None
    try:
        return json.loads(text, object_pairs_hook=_refuse_repeated_fields,
                          parse_constant=_refuse_constant)
    except _Invalid as exc:
        raise exc.in_file(label, path) from None
    except json.JSONDecodeError as exc:
        raise PolicyError(
            f"{label} {path} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
    except RecursionError:
        raise PolicyError(f"{label} {path} nests too deeply") from None


def _refuse_repeated_fields(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # json.loads would silently keep the last of two equal keys; in a trust
    # file that hides an edit (two "revoked" fields, say), so refuse instead.
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise _Invalid("", f"repeats field {key!r}")
        obj[key] = value
    return obj


def _refuse_constant(name: str) -> Any:
    raise _Invalid("", f"contains the non-finite constant {name!r}")


# --- field checks -------------------------------------------------------------------


def _check_fields(obj: Any, where: str, required: frozenset[str],
                  optional: frozenset[str] = frozenset()) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise _Invalid(where, "must be a JSON object")
    unknown = sorted(set(obj) - required - optional)
    if unknown:
        raise _Invalid(where, f"has unknown fields: {', '.join(unknown)}")
    missing = sorted(required - set(obj))
    if missing:
        raise _Invalid(where, f"is missing fields: {', '.join(missing)}")
    return obj


def _check_version(obj: dict[str, Any], where: str) -> None:
    version = obj["version"]
    if not isinstance(version, int) or isinstance(version, bool):
        raise _Invalid(_at(where, "version"), f"must be the integer {SUPPORTED_VERSION}")
    if version != SUPPORTED_VERSION:
        raise _Invalid(_at(where, "version"),
                       f"is {version}; hubd reads version {SUPPORTED_VERSION} only")


def _string(obj: dict[str, Any], key: str, where: str) -> str:
    value = obj[key]
    if not isinstance(value, str) or not value:
        raise _Invalid(_at(where, key), "must be a non-empty string")
    return value


def _string_list(obj: dict[str, Any], key: str, where: str) -> tuple[str, ...]:
    value = obj[key]
    if not isinstance(value, list):
        raise _Invalid(_at(where, key), "must be a list of strings")
    for index, item in enumerate(value):
        if not isinstance(item, str) or not item:
            raise _Invalid(f"{_at(where, key)}[{index}]", "must be a non-empty string")
    return tuple(dict.fromkeys(value))  # the reference tolerates repeats; keep first order


def _expiry(value: Any, where: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            seconds = float(value)
        except OverflowError:
            seconds = math.inf
        if math.isfinite(seconds):
            return seconds
    raise _Invalid(where, "must be null or a finite number (Unix seconds)")


def _at(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _freeze(value: Any) -> Any:
    """An immutable copy of parsed JSON (objects become read-only mappings, lists tuples)."""
    if isinstance(value, dict):
        return MappingProxyType({key: _freeze(item) for key, item in value.items()})
    if isinstance(value, list):
        return tuple(_freeze(item) for item in value)
    return value


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


def load_federation_store(path: str | os.PathLike[str]) -> FederationStore:
    """Read and validate a federation store file; PolicyError if it is refused."""
    path = os.fspath(path)
    data = read_owner_only_file(path, STORE_LABEL)
    return parse_federation_store(data, path)


def parse_federation_store(data: bytes, path: str = "<bytes>") -> FederationStore:
    """Validate federation store JSON (no file checks; `path` only labels messages)."""
    document = _parse_json(data, STORE_LABEL, path)
    try:
        return FederationStore(path=path, records=_records(document))
    except _Invalid as exc:
        raise exc.in_file(STORE_LABEL, path) from None


def _records(document: Any) -> tuple[FederationRecord, ...]:
    _check_fields(document, "", STORE_FIELDS)
    _check_version(document, "")
    raw_records = document["records"]
    if not isinstance(raw_records, list):
        raise _Invalid("records", "must be a list")
    records: list[FederationRecord] = []
    seen: dict[str, int] = {}
    for index, raw in enumerate(raw_records):
        record = _record(raw, f"records[{index}]")
        if record.domain_id in seen:
            raise _Invalid(f"records[{index}]", f"repeats domain_id {record.domain_id!r} "
                           f"(already records[{seen[record.domain_id]}])")
        seen[record.domain_id] = index
        records.append(record)
    return tuple(records)


def _record(raw: Any, where: str) -> FederationRecord:
    obj = _check_fields(raw, where, RECORD_FIELDS)
    pins = []
    for index, text in enumerate(_string_list(obj, "certificate_pins", where)):
        try:
            if not PIN_PATTERN.fullmatch(text):
                parse_pin(text)  # its message says what is wrong, when it can tell
                raise PinError(f"{text!r}")
            pins.append(parse_pin(text))
        except PinError as exc:
            raise _Invalid(f"{where}.certificate_pins[{index}]",
                           f"is not a pin ({exc}); write 'sha256:<64 hex digits>' or "
                           "'spki-sha256:<64 hex digits>'") from None
    expires_at = _expiry(obj["expires_at"], _at(where, "expires_at"))
    if not isinstance(obj["revoked"], bool):
        raise _Invalid(_at(where, "revoked"), "must be true or false")
    if not isinstance(obj["provenance"], dict):
        raise _Invalid(_at(where, "provenance"), "must be a JSON object")
    if not isinstance(obj["scope_grants"], list):
        raise _Invalid(_at(where, "scope_grants"), "must be a list")
    scope_grants = []
    for index, raw_grant in enumerate(obj["scope_grants"]):
        grant_where = f"{where}.scope_grants[{index}]"
        grant = _check_fields(raw_grant, grant_where, SCOPE_GRANT_FIELDS)
        scope_grants.append(ScopeGrant(_string(grant, "verb", grant_where),
                                       _string(grant, "namespace", grant_where)))
    return FederationRecord(
        domain_id=_string(obj, "domain_id", where),
        namespaces=frozenset(_string_list(obj, "namespaces", where)),
        certificate_pins=PinSet(pins),
        signing_key_ids=_string_list(obj, "signing_key_ids", where),
        scope_grants=tuple(scope_grants),
        expires_at=expires_at,
        revoked=obj["revoked"],
        provenance=_freeze(obj["provenance"]),
    )


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
                            f"{domain!r}; it presented {_describe_certificate(peer_cert_der)}",
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

    def granted_namespaces(self, sender: str, peer_cert_der: bytes | None,
                           now: float) -> frozenset[str]:
        """The namespaces `sender` may see or address (empty when it is not authorised)."""
        if not self.authorise(sender, peer_cert_der, None, now).allowed:
            return frozenset()
        grant = self._by_sender[sender]
        record = self.store.record(grant.domain_id)
        return record.namespaces if record is not None else frozenset()


def _describe_certificate(der: bytes) -> str:
    try:
        pins = pins_for_certificate(der)
    except PinError:
        return "an unparseable certificate"
    return f"{pins.sha256} ({pins.spki_sha256})"


def load_serving_policy(path: str | os.PathLike[str]) -> ServingPolicy:
    """Read and validate a serving policy, its federation store and its client CA.

    Relative paths in the policy resolve beside the policy file. Each of the
    three files is read exactly once (see read_owner_only_file). Raises
    PolicyError naming the file and the field at fault.
    """
    path = os.fspath(path)
    document = _parse_json(read_owner_only_file(path, POLICY_LABEL), POLICY_LABEL, path)
    try:
        _check_fields(document, "", POLICY_FIELDS)
        _check_version(document, "")
        store_path = _beside(path, _string(document, "federation_store", ""))
        ca_path = _beside(path, _string(document, "client_ca_file", ""))
        grants = _grants(document["grants"])
    except _Invalid as exc:
        raise exc.in_file(POLICY_LABEL, path) from None

    store = load_federation_store(store_path)
    try:
        _check_grants_against_store(grants, store)
    except _Invalid as exc:
        raise exc.in_file(POLICY_LABEL, path) from None

    ca_bytes = read_owner_only_file(ca_path, CLIENT_CA_LABEL)
    _check_client_ca(ca_bytes, ca_path)
    return ServingPolicy(path=path, federation_store_path=store_path, client_ca_path=ca_path,
                         client_ca_bytes=ca_bytes, store=store, grants=grants)


def _beside(policy_path: str, value: str) -> str:
    if os.path.isabs(value):
        return value
    return os.path.join(os.path.dirname(policy_path), value)


def _grants(raw: Any) -> tuple[ServingGrant, ...]:
    if not isinstance(raw, list) or not raw:
        raise _Invalid("grants", "must be a non-empty list (a policy that grants nothing "
                       "is better expressed by giving no policy)")
    grants: list[ServingGrant] = []
    seen: dict[str, int] = {}
    for index, item in enumerate(raw):
        where = f"grants[{index}]"
        obj = _check_fields(item, where, GRANT_FIELDS, GRANT_OPTIONAL_FIELDS)
        grant = ServingGrant(
            sender=_string(obj, "sender", where),
            domain_id=_string(obj, "domain_id", where),
            namespace=_string(obj, "namespace", where),
            signing_key_id=_string(obj, "signing_key_id", where),
            identity_key_id=_string(obj, "identity_key_id", where)
            if "identity_key_id" in obj else None,
        )
        if grant.sender in seen:
            # As in the reference: one grant per sender. More namespaces for
            # the same peer go in its federation record's "namespaces".
            raise _Invalid(where, f"repeats sender {grant.sender!r} (already "
                           f"grants[{seen[grant.sender]}]); list further namespaces in the "
                           "federation record instead")
        seen[grant.sender] = index
        grants.append(grant)
    return tuple(grants)


def _check_grants_against_store(grants: tuple[ServingGrant, ...], store: FederationStore) -> None:
    for index, grant in enumerate(grants):
        where = f"grants[{index}] (sender {grant.sender!r})"
        record = store.record(grant.domain_id)
        if record is None:
            raise _Invalid(where, f"names domain {grant.domain_id!r}, which has no record in "
                           f"the federation store {store.path}")
        if grant.namespace not in record.namespaces:
            raise _Invalid(where, f"grants namespace {grant.namespace!r}, which federation "
                           f"record {record.domain_id!r} does not list in its namespaces")
        if grant.signing_key_id not in record.signing_key_ids:
            raise _Invalid(where, f"names signing key {grant.signing_key_id!r}, which "
                           f"federation record {record.domain_id!r} does not list in its "
                           "signing_key_ids")
        if len(record.certificate_pins) == 0:
            raise _Invalid(where, f"relies on federation record {record.domain_id!r}, which has "
                           "no certificate pins; hubd authorises peers by client certificate "
                           "only, so add the peer's pin (hubd certs pin FILE)")


def _check_client_ca(data: bytes, path: str) -> None:
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise PolicyError(f"{CLIENT_CA_LABEL} {path} is not valid UTF-8 "
                          "(it must be PEM; convert DER with: openssl x509 -inform DER)") from None
    # Load it now, into a throwaway context, so a bad CA refuses startup here
    # rather than failing the first TLS handshake.
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_verify_locations(cadata=text)
    except (ssl.SSLError, ValueError) as exc:
        reason = getattr(exc, "reason", None) or str(exc)
        raise PolicyError(f"{CLIENT_CA_LABEL} {path} holds no PEM certificate OpenSSL can "
                          f"load ({reason})") from None

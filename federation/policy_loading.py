"""Reading a serving policy, its federation store and its client CA: the decoding.

Loading is a pure function of the path: each file is read once, owner-only
(hubd/owner_only.py), parsed as strict JSON (a repeated field or a
non-finite constant refuses it), and every field checked by name and type;
the result is the immutable model of federation/policy.py, or PolicyError
naming the file and the field at fault. So a hub can reload on SIGHUP and
keep the old policy when the new one is refused. policies/README.md is the
commented companion to the formats.
"""

from __future__ import annotations

import json
import math
import os
import re
import ssl
from types import MappingProxyType
from typing import Any

from hubd.owner_only import OwnerOnlyFileError, read_owner_only_file
from federation.pins import PinError, PinSet, parse_pin
from federation.policy import (FederationRecord, FederationStore, PolicyError, ScopeGrant,
                               ServingGrant, ServingPolicy)

SUPPORTED_VERSION = 1

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

class _Invalid(Exception):
    """A content error at `where` inside one file; the loader adds the file to the message."""

    def __init__(self, where: str, problem: str) -> None:
        super().__init__(f"{where} {problem}" if where else problem)
        self.where = where

    def in_file(self, label: str, path: str) -> PolicyError:
        # "serving policy P: grants[0] has ..." but "serving policy P has ..." at top level.
        return PolicyError(f"{label} {path}{': ' if self.where else ' '}{self}")


def _read(path: str, label: str) -> bytes:
    try:
        return read_owner_only_file(path, label)
    except OwnerOnlyFileError as exc:
        raise PolicyError(str(exc)) from None


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


def load_federation_store(path: str | os.PathLike[str]) -> FederationStore:
    """Read and validate a federation store file; PolicyError if it is refused."""
    path = os.fspath(path)
    data = _read(path, STORE_LABEL)
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


def load_serving_policy(path: str | os.PathLike[str]) -> ServingPolicy:
    """Read and validate a serving policy, its federation store and its client CA.

    Relative paths in the policy resolve beside the policy file. Each of the
    three files is read exactly once (see read_owner_only_file). Raises
    PolicyError naming the file and the field at fault.
    """
    path = os.fspath(path)
    document = _parse_json(_read(path, POLICY_LABEL), POLICY_LABEL, path)
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

    ca_bytes = _read(ca_path, CLIENT_CA_LABEL)
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

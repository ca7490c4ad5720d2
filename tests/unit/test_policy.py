"""Serving policy and federation store: loading, refusals and authorisation, on real files.

Every file is written to tmp_path with a real mode; nothing is mocked. Times
passed to `authorise` are plain numbers, so no assertion depends on the clock.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import ssl
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization

from federation import pki
from tests.support.prereq import need_module, need_root
from federation.pins import certificate_pin, spki_pin
from hubd.owner_only import read_owner_only_file
from federation.policy import (
    EXPIRED,
    GRANTED,
    MISSING_CERTIFICATE,
    NAMESPACE_NOT_GRANTED,
    PIN_MISMATCH,
    REVOKED,
    UNKNOWN_PEER,
    PolicyError,
    ServingPolicy,
)
from federation.policy_loading import (
    GRANT_FIELDS,
    GRANT_OPTIONAL_FIELDS,
    POLICY_FIELDS,
    RECORD_FIELDS,
    SCOPE_GRANT_FIELDS,
    STORE_FIELDS,
    load_federation_store,
    load_serving_policy,
    parse_federation_store,
)

POLICIES = Path(__file__).resolve().parents[2] / "policies"
NOW = 1_800_000_000.0


# --- certificates -------------------------------------------------------------


@pytest.fixture(scope="module")
def ca() -> pki.CertificateAuthority:
    return pki.make_ca(name="policy test CA", days=30)


def _der(issued: pki.IssuedCertificate) -> bytes:
    return issued.certificate.public_bytes(serialization.Encoding.DER)


@pytest.fixture(scope="module")
def east_der(ca) -> bytes:
    return _der(pki.make_client_certificate(ca, "east", days=10))


@pytest.fixture(scope="module")
def other_der(ca) -> bytes:
    return _der(pki.make_client_certificate(ca, "mallory", days=10))


@pytest.fixture(scope="module")
def ca_pem(ca) -> bytes:
    return pki.certificate_pem(ca.certificate)


# --- files ----------------------------------------------------------------------


def write(path: Path, content: str | bytes | dict, mode: int = 0o600) -> Path:
    if isinstance(content, dict):
        content = json.dumps(content, indent=2)
    if isinstance(content, str):
        content = content.encode()
    path.write_bytes(content)
    os.chmod(path, mode)
    return path


def store_doc(pin: str) -> dict[str, Any]:
    return {
        "version": 1,
        "records": [
            {
                "domain_id": "east.test",
                "namespaces": ["PROJ", "DOCS"],
                "certificate_pins": [pin],
                "signing_key_ids": ["east-hub-key"],
                "scope_grants": [],
                "expires_at": None,
                "revoked": False,
                "provenance": {"source": "test", "imported_at": 0, "confirmed_by": "alice"},
            }
        ],
    }


def policy_doc() -> dict[str, Any]:
    return {
        "version": 1,
        "federation_store": "store.json",
        "client_ca_file": "ca.pem",
        "grants": [
            {"sender": "east", "domain_id": "east.test", "namespace": "PROJ",
             "signing_key_id": "east-hub-key"}
        ],
    }


class Site:
    """A directory holding policy.json, store.json and ca.pem, each mode 0600."""

    def __init__(self, root: Path, east_der: bytes, ca_pem: bytes) -> None:
        self.root = root
        self.policy = policy_doc()
        self.store = store_doc(certificate_pin(east_der))
        self.ca_pem = ca_pem

    @property
    def record(self) -> dict[str, Any]:
        return self.store["records"][0]

    @property
    def grant(self) -> dict[str, Any]:
        return self.policy["grants"][0]

    def write(self) -> Path:
        write(self.root / "store.json", self.store)
        write(self.root / "ca.pem", self.ca_pem)
        return write(self.root / "policy.json", self.policy)

    def load(self) -> ServingPolicy:
        return load_serving_policy(self.write())

    def refusal(self) -> str:
        path = self.write()
        with pytest.raises(PolicyError) as caught:
            load_serving_policy(path)
        return str(caught.value)


@pytest.fixture
def site(tmp_path, east_der, ca_pem) -> Site:
    return Site(tmp_path, east_der, ca_pem)


# --- a valid load -----------------------------------------------------------------


def test_valid_policy_loads_with_paths_beside_it(site, tmp_path, ca_pem):
    policy = site.load()
    assert policy.path == str(tmp_path / "policy.json")
    assert policy.federation_store_path == str(tmp_path / "store.json")
    assert policy.client_ca_path == str(tmp_path / "ca.pem")
    assert policy.client_ca_bytes == ca_pem
    grant = policy.grant_for("east")
    assert grant is not None and grant.domain_id == "east.test" and grant.identity_key_id is None
    record = policy.store.record("east.test")
    assert record is not None
    assert record.namespaces == frozenset({"PROJ", "DOCS"})
    assert record.provenance["confirmed_by"] == "alice"


def test_client_ca_text_loads_into_an_ssl_context(site):
    # The lead hands client_ca_pem to OpenSSL as cadata; a str means PEM.
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_verify_locations(cadata=site.load().client_ca_pem)
    assert context.cert_store_stats()["x509_ca"] == 1


def test_loaded_policy_is_immutable(site):
    policy = site.load()
    with pytest.raises(AttributeError):
        policy.grants = ()  # type: ignore[misc]
    with pytest.raises(TypeError):
        policy.store.record("east.test").provenance["source"] = "changed"  # type: ignore[index]


def test_relative_policy_path_resolves_against_its_own_directory(site, tmp_path, monkeypatch):
    site.write()
    monkeypatch.chdir(tmp_path.parent)
    policy = load_serving_policy(Path(tmp_path.name) / "policy.json")
    assert policy.federation_store_path == os.path.join(tmp_path.name, "store.json")


def test_absolute_paths_and_subdirectories(site, tmp_path):
    (tmp_path / "trust").mkdir()
    write(tmp_path / "trust" / "store.json", site.store)
    site.policy["federation_store"] = "trust/store.json"
    site.policy["client_ca_file"] = str(tmp_path / "ca.pem")
    policy = site.load()
    assert policy.federation_store_path == str(tmp_path / "trust" / "store.json")
    assert policy.client_ca_path == str(tmp_path / "ca.pem")


def test_identity_key_id_grant_variant_is_accepted(site):
    site.grant["identity_key_id"] = "east-identity"
    assert site.load().grant_for("east").identity_key_id == "east-identity"


@pytest.mark.parametrize("mode", [0o600, 0o400, 0o700])
def test_owner_only_modes_are_accepted(site, mode):
    path = site.write()
    os.chmod(path, mode)
    assert load_serving_policy(path).grants


def test_byte_order_mark_is_tolerated(site):
    site.write()
    path = site.root / "policy.json"
    write(path, b"\xef\xbb\xbf" + path.read_bytes())
    assert load_serving_policy(path).grants


def test_repeated_list_entries_are_tolerated(site, east_der):
    site.record["namespaces"] = ["PROJ", "PROJ"]
    site.record["certificate_pins"] = [certificate_pin(east_der)] * 2
    assert site.load().store.record("east.test").namespaces == frozenset({"PROJ"})


# --- file refusals ------------------------------------------------------------------


def test_group_readable_policy_is_refused_with_the_fix(site):
    path = site.write()
    os.chmod(path, 0o644)
    with pytest.raises(PolicyError) as caught:
        load_serving_policy(path)
    message = str(caught.value)
    assert "accessible by other users (mode 0644)" in message
    assert f"chmod 600 {path}" in message


@pytest.mark.parametrize("name", ["store.json", "ca.pem"])
def test_group_readable_store_or_ca_is_refused(site, name):
    path = site.write()
    os.chmod(site.root / name, 0o640)
    with pytest.raises(PolicyError, match=r"mode 0640.*chmod 600"):
        load_serving_policy(path)


def test_symlinked_policy_is_refused(site, tmp_path):
    real = site.write()
    link = tmp_path / "link.json"
    link.symlink_to(real)
    with pytest.raises(PolicyError, match="is a symbolic link"):
        load_serving_policy(link)


def test_symlinked_store_is_refused(site, tmp_path):
    site.write()
    os.rename(tmp_path / "store.json", tmp_path / "real-store.json")
    (tmp_path / "store.json").symlink_to("real-store.json")
    with pytest.raises(PolicyError, match=r"federation store .*store.json is a symbolic link"):
        load_serving_policy(tmp_path / "policy.json")


def test_symlinked_directory_in_the_path_is_refused(site, tmp_path):
    site.write()
    (tmp_path / "alias").symlink_to(tmp_path)
    with pytest.raises(PolicyError, match="a directory in the path is a symbolic link"):
        load_serving_policy(tmp_path / "alias" / "policy.json")


def test_missing_files_are_refused(site, tmp_path):
    with pytest.raises(PolicyError, match=r"cannot open serving policy .*: no such file"):
        load_serving_policy(tmp_path / "policy.json")
    path = site.write()
    (tmp_path / "ca.pem").unlink()
    with pytest.raises(PolicyError, match=r"cannot open client CA .*ca.pem: no such file"):
        load_serving_policy(path)


def test_directory_is_not_a_regular_file(tmp_path):
    (tmp_path / "dir").mkdir(mode=0o700)
    with pytest.raises(PolicyError, match="is not a regular file"):
        load_serving_policy(tmp_path / "dir")


def test_fifo_is_refused_without_waiting_for_a_writer(tmp_path):
    os.mkfifo(tmp_path / "fifo", 0o600)
    with pytest.raises(PolicyError, match="is not a regular file"):
        load_serving_policy(tmp_path / "fifo")


def test_file_owned_by_another_user_is_refused(site):
    need_root("give a file away")
    path = site.write()
    os.chown(path, 4242, 4242)
    with pytest.raises(PolicyError, match=r"owned by uid 4242.*run: chown"):
        load_serving_policy(path)


def test_empty_file_is_refused(site, tmp_path):
    path = site.write()
    write(path, b"")
    with pytest.raises(PolicyError, match="is empty"):
        load_serving_policy(path)


def test_read_owner_only_file_returns_the_bytes(tmp_path):
    path = write(tmp_path / "secret", b"abc\n")
    assert read_owner_only_file(path, "test file") == b"abc\n"


# --- content refusals: policy -----------------------------------------------------------


def test_unknown_grant_field_is_named(site):
    site.grant["hub"] = "east"
    assert "grants[0] has unknown fields: hub" in site.refusal()


def test_unknown_top_level_field_is_named(site):
    site.policy["extra"] = True
    assert site.refusal().endswith("policy.json has unknown fields: extra")


def test_missing_field_is_named(site):
    del site.grant["signing_key_id"]
    assert "grants[0] is missing fields: signing_key_id" in site.refusal()


def test_duplicate_key_is_refused(site, tmp_path):
    site.write()
    text = json.dumps(site.policy).replace('"version": 1', '"version": 1, "version": 1')
    write(tmp_path / "policy.json", text)
    with pytest.raises(PolicyError, match="repeats field 'version'"):
        load_serving_policy(tmp_path / "policy.json")


def test_duplicate_key_in_store_is_refused(site, tmp_path):
    policy_path = site.write()
    text = json.dumps(site.store).replace('"revoked": false', '"revoked": false, "revoked": true')
    write(tmp_path / "store.json", text)
    with pytest.raises(PolicyError, match=r"federation store .* repeats field 'revoked'"):
        load_serving_policy(policy_path)


@pytest.mark.parametrize("version, expected", [
    (2, "version is 2; hubd reads version 1 only"),
    (True, "version must be the integer 1"),
    (1.0, "version must be the integer 1"),
    ("1", "version must be the integer 1"),
])
def test_wrong_version_is_refused(site, version, expected):
    site.policy["version"] = version
    assert expected in site.refusal()


def test_wrong_store_version_is_refused(site):
    site.store["version"] = 2
    assert "federation store" in site.refusal()


def test_empty_grants_are_refused(site):
    site.policy["grants"] = []
    assert "grants must be a non-empty list" in site.refusal()


def test_two_grants_for_one_sender_are_refused(site):
    site.policy["grants"].append(dict(site.grant, namespace="DOCS"))
    assert "grants[1] repeats sender 'east'" in site.refusal()


@pytest.mark.parametrize("value", ["", 5, None, ["east"]])
def test_grant_strings_must_be_non_empty_strings(site, value):
    site.grant["sender"] = value
    assert "grants[0].sender must be a non-empty string" in site.refusal()


def test_invalid_json_and_non_finite_numbers_are_refused(site, tmp_path):
    path = site.write()
    write(path, "{")
    with pytest.raises(PolicyError, match="is not valid JSON"):
        load_serving_policy(path)
    write(path, '{"version": NaN}')
    with pytest.raises(PolicyError, match="non-finite constant 'NaN'"):
        load_serving_policy(path)
    write(path, "[]")
    with pytest.raises(PolicyError, match="must be a JSON object"):
        load_serving_policy(path)
    write(path, '{"version": 1}'.encode("utf-16"))
    with pytest.raises(PolicyError, match="is not valid UTF-8"):
        load_serving_policy(path)


# --- content refusals: grants against the store ------------------------------------------------


def test_grant_namespace_not_in_record_is_refused(site):
    site.grant["namespace"] = "OTHER"
    message = site.refusal()
    assert "grants[0] (sender 'east') grants namespace 'OTHER'" in message
    assert "does not list in its namespaces" in message


def test_grant_for_unknown_domain_is_refused(site):
    site.grant["domain_id"] = "nowhere.test"
    assert "names domain 'nowhere.test', which has no record" in site.refusal()


def test_grant_signing_key_not_in_record_is_refused(site):
    site.grant["signing_key_id"] = "other-key"
    assert "names signing key 'other-key'" in site.refusal()


def test_granted_record_without_signing_keys_is_refused(site):
    site.record["signing_key_ids"] = []
    assert "names signing key 'east-hub-key'" in site.refusal()


def test_granted_record_without_pins_is_refused(site):
    site.record["certificate_pins"] = []
    assert "has no certificate pins" in site.refusal()


# --- content refusals: the store -----------------------------------------------------------------


@pytest.mark.parametrize("pin", [
    "sha256:abc",
    "f2f0a39d03d7e45decb9ef66625a3dd5f415e0e55c56209b355c5e502c956efc",
    "md5:" + "ab" * 32,
    "SHA256:" + "ab" * 32,
    "sha256:" + ":".join(["ab"] * 32),
    " sha256:" + "ab" * 32,
])
def test_bad_pin_string_is_refused(site, pin):
    site.record["certificate_pins"].append(pin)
    assert "records[0].certificate_pins[1] is not a pin" in site.refusal()


@pytest.mark.parametrize("field, value, expected", [
    ("revoked", 0, "records[0].revoked must be true or false"),
    ("expires_at", "2030", "records[0].expires_at must be null or a finite number"),
    ("expires_at", True, "records[0].expires_at must be null or a finite number"),
    ("expires_at", 10 ** 400, "records[0].expires_at must be null or a finite number"),
    ("provenance", "x", "records[0].provenance must be a JSON object"),
    ("namespaces", "PROJ", "records[0].namespaces must be a list of strings"),
    ("namespaces", ["PROJ", ""], "records[0].namespaces[1] must be a non-empty string"),
    ("scope_grants", ["claim"], "records[0].scope_grants[0] must be a JSON object"),
    ("scope_grants", [{"verb": "claim"}],
     "records[0].scope_grants[0] is missing fields: namespace"),
    ("domain_id", "", "records[0].domain_id must be a non-empty string"),
])
def test_store_types_are_strict(site, field, value, expected):
    site.record[field] = value
    assert expected in site.refusal()


def test_unknown_and_missing_record_fields_are_refused(site):
    site.record["revokd"] = True
    assert "records[0] has unknown fields: revokd" in site.refusal()
    del site.record["revokd"]
    del site.record["provenance"]
    assert "records[0] is missing fields: provenance" in site.refusal()


def test_duplicate_domain_is_refused(site):
    site.store["records"].append(copy.deepcopy(site.record))
    assert "records[1] repeats domain_id 'east.test'" in site.refusal()


def test_ungranted_record_may_be_sparse(site):
    # The reference's importer can write records with empty lists; they are
    # harmless until a grant uses them.
    site.store["records"].append(dict(
        copy.deepcopy(site.record), domain_id="idle.test", namespaces=[],
        certificate_pins=[], signing_key_ids=[]))
    assert site.load().store.record("idle.test").namespaces == frozenset()


def test_client_ca_that_is_not_pem_is_refused(site, ca):
    site.ca_pem = b"hello\n"
    assert "holds no PEM certificate OpenSSL can load" in site.refusal()
    site.ca_pem = ca.certificate.public_bytes(serialization.Encoding.DER)
    assert "client CA" in site.refusal()


def test_store_loads_on_its_own(site, tmp_path):
    site.write()
    store = load_federation_store(tmp_path / "store.json")
    assert [r.domain_id for r in store.records] == ["east.test"]
    assert parse_federation_store((tmp_path / "store.json").read_bytes()).records == store.records


# --- authorisation ---------------------------------------------------------------------------


def test_granted_peer_is_allowed_for_each_record_namespace(site, east_der):
    policy = site.load()
    for namespace in ("PROJ", "DOCS", None):
        decision = policy.authorise("east", east_der, namespace, NOW)
        assert decision.allowed and decision.reason == GRANTED
        assert decision.domain_id == "east.test"
        assert decision.reference_reason == ""


def test_unknown_sender(site, east_der):
    decision = site.load().authorise("mallory", east_der, "PROJ", NOW)
    assert (decision.allowed, decision.reason) == (False, UNKNOWN_PEER)
    assert "no grant in the serving policy names sender 'mallory'" in decision.detail
    assert decision.reference_reason == "unknown_peer"


@pytest.mark.parametrize("der", [None, b""])
def test_missing_certificate(site, der):
    decision = site.load().authorise("east", der, "PROJ", NOW)
    assert (decision.allowed, decision.reason) == (False, MISSING_CERTIFICATE)
    assert "peer presented no client certificate" in decision.detail


def test_pin_mismatch(site, other_der):
    decision = site.load().authorise("east", other_der, "PROJ", NOW)
    assert (decision.allowed, decision.reason) == (False, PIN_MISMATCH)
    assert "matches none of the 1 pin(s) of federation record 'east.test'" in decision.detail
    assert certificate_pin(other_der) in decision.detail
    assert decision.reference_reason == "certificate_pin_not_accepted"


def test_garbage_certificate_is_a_pin_mismatch(site):
    decision = site.load().authorise("east", b"not a certificate", None, NOW)
    assert decision.reason == PIN_MISMATCH
    assert "unparseable certificate" in decision.detail


def test_revoked(site, east_der):
    site.record["revoked"] = True
    decision = site.load().authorise("east", east_der, "PROJ", NOW)
    assert (decision.allowed, decision.reason) == (False, REVOKED)
    assert "federation record 'east.test' is revoked" in decision.detail
    assert decision.reference_reason == "revoked_peering"


def test_expired_from_the_expiry_instant(site, east_der):
    site.record["expires_at"] = NOW
    policy = site.load()
    assert policy.authorise("east", east_der, "PROJ", NOW - 1).allowed
    decision = policy.authorise("east", east_der, "PROJ", NOW)
    assert (decision.allowed, decision.reason) == (False, EXPIRED)
    assert "expired" in decision.detail
    assert decision.reference_reason == "expired_peering"


def test_namespace_not_granted(site, east_der):
    decision = site.load().authorise("east", east_der, "OTHER", NOW)
    assert (decision.allowed, decision.reason) == (False, NAMESPACE_NOT_GRANTED)
    assert "namespace 'OTHER'" in decision.detail


def test_checks_run_in_the_reference_order(site, other_der):
    # Revoked and expired outrank a wrong certificate; an absent one outranks both,
    # and every identity failure outranks the namespace (as the reference decides).
    site.record["revoked"] = True
    site.record["expires_at"] = 1.0
    policy = site.load()
    assert policy.authorise("east", None, "OTHER", NOW).reason == MISSING_CERTIFICATE
    assert policy.authorise("east", other_der, "OTHER", NOW).reason == REVOKED
    site.record["revoked"] = False
    assert site.load().authorise("east", other_der, "OTHER", NOW).reason == EXPIRED
    site.record["expires_at"] = None
    assert site.load().authorise("east", other_der, "OTHER", NOW).reason == PIN_MISMATCH


def test_spki_pin_matches_a_reissued_certificate(site, ca):
    key = pki.generate_private_key()
    first = _der(pki.make_client_certificate(ca, "east", days=10, key=key))
    reissued = _der(pki.make_client_certificate(ca, "east", days=10, key=key))
    assert first != reissued
    site.record["certificate_pins"] = [spki_pin(first)]
    policy = site.load()
    assert policy.authorise("east", first, "PROJ", NOW).allowed
    assert policy.authorise("east", reissued, "PROJ", NOW).allowed


def test_either_pin_form_is_enough(site, east_der, other_der):
    site.record["certificate_pins"] = [certificate_pin(other_der), spki_pin(east_der)]
    policy = site.load()
    assert policy.authorise("east", east_der, None, NOW).allowed
    assert policy.authorise("east", other_der, None, NOW).allowed


def test_upper_case_hex_pin_matches(site, east_der):
    site.record["certificate_pins"] = ["sha256:" + certificate_pin(east_der)[7:].upper()]
    assert site.load().authorise("east", east_der, "PROJ", NOW).allowed


def test_granted_namespaces(site, east_der, other_der):
    policy = site.load()
    assert policy.granted_namespaces("east", east_der, NOW) == frozenset({"PROJ", "DOCS"})
    assert policy.granted_namespaces("east", other_der, NOW) == frozenset()
    assert policy.granted_namespaces("east", None, NOW) == frozenset()
    assert policy.granted_namespaces("mallory", east_der, NOW) == frozenset()


def test_identity_key_id_does_not_replace_the_certificate(site):
    site.grant["identity_key_id"] = "east-identity"
    decision = site.load().authorise("east", None, "PROJ", NOW)
    assert decision.reason == MISSING_CERTIFICATE


# --- shipped examples and schemas ------------------------------------------------------------


def copy_examples(destination: Path, ca_pem: bytes) -> Path:
    for name in ("serving-policy.example.json", "federation-store.example.json"):
        shutil.copyfile(POLICIES / name, destination / name)
        os.chmod(destination / name, 0o600)
    write(destination / "ca.pem", ca_pem)
    return destination / "serving-policy.example.json"


def test_example_files_load(tmp_path, ca_pem):
    policy = load_serving_policy(copy_examples(tmp_path, ca_pem))
    assert policy.grant_for("east").namespace == "PROJ"
    north = policy.store.record("north.example")
    assert north.revoked and north.expires_at == 1798761600.0


def _schema(name: str) -> dict[str, Any]:
    return json.loads((POLICIES / name).read_text())


def test_schemas_name_exactly_the_fields_the_loader_accepts():
    # jsonschema is not a dependency; this keeps schema and loader in step anyway.
    policy = _schema("serving-policy.schema.json")
    assert set(policy["properties"]) == POLICY_FIELDS == set(policy["required"])
    grant = policy["$defs"]["grant"]
    assert set(grant["required"]) == GRANT_FIELDS
    assert set(grant["properties"]) == GRANT_FIELDS | GRANT_OPTIONAL_FIELDS
    store = _schema("federation-store.schema.json")
    assert set(store["properties"]) == STORE_FIELDS == set(store["required"])
    record = store["$defs"]["record"]
    assert set(record["properties"]) == RECORD_FIELDS == set(record["required"])
    scope = record["properties"]["scope_grants"]["items"]
    assert set(scope["properties"]) == SCOPE_GRANT_FIELDS == set(scope["required"])
    for schema in (policy, store, grant, record, scope):
        assert schema["additionalProperties"] is False


def test_every_schema_field_is_described():
    def walk(node: Any, where: str) -> None:
        if isinstance(node, dict):
            for name, sub in node.get("properties", {}).items():
                assert sub.get("description"), f"{where}.{name} has no description"
            for key, sub in node.items():
                walk(sub, f"{where}.{key}")
        elif isinstance(node, list):
            for index, sub in enumerate(node):
                walk(sub, f"{where}[{index}]")

    for name in ("serving-policy.schema.json", "federation-store.schema.json"):
        schema = _schema(name)
        assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
        walk(schema, name)


def test_examples_validate_against_the_schemas():
    jsonschema = need_module("jsonschema")
    for example, schema in (("serving-policy.example.json", "serving-policy.schema.json"),
                            ("federation-store.example.json", "federation-store.schema.json")):
        jsonschema.Draft202012Validator(_schema(schema)).validate(
            json.loads((POLICIES / example).read_text()))

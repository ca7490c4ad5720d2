"""Pin strings, pin computation and PinSet matching, on real certificates."""

from __future__ import annotations

import hashlib
import ssl
import subprocess

import pytest
from cryptography.hazmat.primitives import serialization
from hypothesis import given
from hypothesis import strategies as st

from federation import pki
from tests.support.prereq import need_tool
from federation.pins import (
    Pin,
    PinError,
    PinSet,
    certificate_der,
    certificate_pin,
    check_peer_pin,
    parse_pin,
    peer_certificate_der,
    pins_for_certificate,
    pins_for_file,
    spki_pin,
)


@pytest.fixture(scope="module")
def ca() -> pki.CertificateAuthority:
    return pki.make_ca(name="pins test CA", days=30)


@pytest.fixture(scope="module")
def server(ca) -> pki.IssuedCertificate:
    return pki.make_server_certificate(ca, "west", days=10)


def der_of(issued: pki.IssuedCertificate) -> bytes:
    return issued.certificate.public_bytes(serialization.Encoding.DER)


def pem_of(issued: pki.IssuedCertificate) -> bytes:
    return issued.certificate.public_bytes(serialization.Encoding.PEM)


# --- parsing ----------------------------------------------------------------

HEX = "ab" * 32


def test_parse_both_pin_kinds():
    assert parse_pin(f"sha256:{HEX}") == Pin("sha256", bytes.fromhex(HEX))
    assert parse_pin(f"spki-sha256:{HEX}") == Pin("spki-sha256", bytes.fromhex(HEX))


def test_parse_normalises_case_and_whitespace():
    pin = parse_pin(f"  SHA256:{HEX.upper()}\n")
    assert str(pin) == f"sha256:{HEX}"


@given(st.binary(min_size=32, max_size=32), st.sampled_from(["sha256", "spki-sha256"]))
def test_pin_text_round_trips(digest, kind):
    pin = Pin(kind, digest)
    assert parse_pin(str(pin)) == pin


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        (HEX, "expected 'sha256:<64 hex digits>'"),
        (f"md5:{HEX}", "unknown pin kind 'md5'"),
        ("sha256:abcd", "expected 64 hex digits, got 4 characters"),
        (f"sha256:{HEX}00", "got 66 characters"),
        ("sha256:" + "zz" * 32, "including non-hex ones"),
        ("sha256:", "got 0 characters"),
        ("", "expected 'sha256:"),
        (f"sha256: {HEX}", "including non-hex ones"),
    ],
)
def test_bad_pins_raise_pin_error_saying_why(text, fragment):
    with pytest.raises(PinError) as caught:
        parse_pin(text)
    assert fragment in str(caught.value)
    assert isinstance(caught.value, ValueError)


def test_non_string_pin_is_refused():
    with pytest.raises(PinError, match="must be a string"):
        parse_pin(b"sha256:" + HEX.encode())  # type: ignore[arg-type]


# --- computing pins ---------------------------------------------------------


def test_certificate_pin_is_sha256_of_der(server):
    der = der_of(server)
    assert certificate_pin(der) == "sha256:" + hashlib.sha256(der).hexdigest()


def test_spki_pin_is_sha256_of_subject_public_key_info(server):
    spki = server.key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    assert spki_pin(der_of(server)) == "spki-sha256:" + hashlib.sha256(spki).hexdigest()


def test_pem_and_der_give_the_same_pins(server):
    from_pem = pins_for_certificate(pem_of(server))
    from_der = pins_for_certificate(der_of(server))
    assert from_pem == from_der
    assert certificate_der(pem_of(server)) == der_of(server)


def test_reissued_certificate_keeps_spki_pin_only(ca, server):
    reissued = pki.make_server_certificate(ca, "west", days=10, key=server.key)
    before, after = pins_for_certificate(der_of(server)), pins_for_certificate(der_of(reissued))
    assert before.spki_sha256 == after.spki_sha256
    assert before.sha256 != after.sha256


def test_garbage_is_not_a_certificate():
    with pytest.raises(PinError, match="not a PEM or DER X.509 certificate"):
        pins_for_certificate(b"\x30\x03\x02\x01\x01")
    with pytest.raises(PinError, match="not a PEM or DER X.509 certificate"):
        pins_for_certificate(b"-----BEGIN CERTIFICATE-----\nnope\n-----END CERTIFICATE-----\n")


def test_pins_for_file_reads_pem_and_der(tmp_path, server):
    (tmp_path / "c.pem").write_bytes(pem_of(server))
    (tmp_path / "c.der").write_bytes(der_of(server))
    assert pins_for_file(tmp_path / "c.pem") == pins_for_file(tmp_path / "c.der")


def test_pins_for_missing_file_names_it(tmp_path):
    with pytest.raises(PinError, match="not found"):
        pins_for_file(tmp_path / "absent.pem")


def test_openssl_der_sha256sum_agrees(tmp_path, server):
    """The pin operators compute by hand for the reference hub is ours."""
    need_tool("openssl")
    path = tmp_path / "server.pem"
    path.write_bytes(pem_of(server))
    der = subprocess.run(
        ["openssl", "x509", "-in", str(path), "-outform", "DER"],
        check=True, capture_output=True,
    ).stdout
    assert pins_for_file(path).sha256 == "sha256:" + hashlib.sha256(der).hexdigest()


# --- PinSet -----------------------------------------------------------------


def test_pinset_matches_either_form(server):
    pins = pins_for_certificate(der_of(server))
    assert PinSet([pins.sha256]).matches(der_of(server))
    assert PinSet([pins.spki_sha256]).matches(der_of(server))


def test_pinset_rotation_accepts_old_and_new(ca, server):
    new = pki.make_server_certificate(ca, "west", days=10)
    rotating = PinSet([certificate_pin(der_of(server)), certificate_pin(der_of(new))])
    assert rotating.matches(der_of(server))
    assert rotating.matches(der_of(new))
    assert not PinSet([certificate_pin(der_of(server))]).matches(der_of(new))


def test_pinset_fails_closed(server):
    der = der_of(server)
    assert not PinSet().matches(der)
    assert not PinSet([f"sha256:{HEX}", f"spki-sha256:{HEX}"]).matches(der)
    assert not PinSet([certificate_pin(der)]).matches(None)
    assert not PinSet([certificate_pin(der)]).matches(b"")
    assert not PinSet([f"spki-sha256:{HEX}"]).matches(b"not a certificate")


def test_pinset_parses_deduplicates_and_refuses_bad_strings(server):
    pin = certificate_pin(der_of(server))
    pinset = PinSet([pin, pin.upper().replace("SHA256:", "sha256:"), parse_pin(pin)])
    assert len(pinset) == 1
    assert pin in pinset
    assert "garbage" not in pinset
    assert PinSet([pin]) == pinset
    with pytest.raises(PinError):
        PinSet(["sha256:short"])


# --- peer certificate lookup ------------------------------------------------


class _NoTls:
    def get_extra_info(self, name, default=None):
        return default


def test_peer_certificate_of_plain_connection_is_none():
    assert peer_certificate_der(None) is None
    assert peer_certificate_der(_NoTls()) is None
    assert peer_certificate_der(object()) is None


def test_peer_certificate_before_handshake_is_none():
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ssl_object = context.wrap_bio(ssl.MemoryBIO(), ssl.MemoryBIO(), server_hostname="localhost")
    assert peer_certificate_der(ssl_object) is None


def test_check_peer_pin_names_the_failing_layer(server):
    with pytest.raises(PinError, match="west presented no TLS certificate"):
        check_peer_pin(_NoTls(), PinSet([f"sha256:{HEX}"]), peer="west")

"""The private CA and the certificates it issues, checked field by field."""

from __future__ import annotations

import datetime
import ipaddress
import os
import stat
import subprocess

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from federation import pki
from tests.support.prereq import need_tool
from federation.pki import PkiError


@pytest.fixture(scope="module")
def ca() -> pki.CertificateAuthority:
    return pki.make_ca(name="test CA")


def ext(cert: x509.Certificate, kind):
    return cert.extensions.get_extension_for_class(kind)


def lifetime(cert: x509.Certificate) -> datetime.timedelta:
    return cert.not_valid_after_utc - cert.not_valid_before_utc


# --- CA ---------------------------------------------------------------------


def test_ca_is_a_self_signed_p256_ca_for_leaves_only(ca):
    cert = ca.certificate
    assert isinstance(ca.key, ec.EllipticCurvePrivateKey)
    assert isinstance(ca.key.curve, ec.SECP256R1)
    assert cert.subject == cert.issuer
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "test CA"
    cert.verify_directly_issued_by(cert)
    constraints = ext(cert, x509.BasicConstraints)
    assert constraints.critical and constraints.value.ca and constraints.value.path_length == 0
    usage = ext(cert, x509.KeyUsage)
    assert usage.critical and usage.value.key_cert_sign and usage.value.crl_sign
    assert not usage.value.digital_signature


def test_ca_validity_follows_days():
    # issued 5 minutes in the past to tolerate clock skew between hubs
    short = pki.make_ca(days=100)
    assert lifetime(short.certificate) == datetime.timedelta(days=100, minutes=5)


# --- leaves -----------------------------------------------------------------


def test_server_certificate(ca):
    issued = pki.make_server_certificate(ca, "west", sans=["west.example", "10.1.2.3", "::1"], days=7)
    cert = issued.certificate
    cert.verify_directly_issued_by(ca.certificate)
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "west"
    assert ext(cert, x509.ExtendedKeyUsage).value == x509.ExtendedKeyUsage(
        [ExtendedKeyUsageOID.SERVER_AUTH]
    )
    sans = ext(cert, x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ["west.example"]
    assert sans.get_values_for_type(x509.IPAddress) == [
        ipaddress.ip_address("10.1.2.3"),
        ipaddress.ip_address("::1"),
    ]
    _assert_leaf_basics(cert, ca)
    assert lifetime(cert) == datetime.timedelta(days=7, minutes=5)


def test_server_certificate_defaults():
    long_lived_ca = pki.make_ca()
    assert lifetime(long_lived_ca.certificate) == datetime.timedelta(
        days=pki.DEFAULT_CA_DAYS, minutes=5
    )
    cert = pki.make_server_certificate(long_lived_ca, "west").certificate
    sans = ext(cert, x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ["localhost"]
    assert sans.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
    assert lifetime(cert) == datetime.timedelta(days=pki.DEFAULT_LEAF_DAYS, minutes=5)


def test_client_certificate(ca):
    cert = pki.make_client_certificate(ca, "east.site-1", days=3).certificate
    cert.verify_directly_issued_by(ca.certificate)
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "east.site-1"
    assert ext(cert, x509.ExtendedKeyUsage).value == x509.ExtendedKeyUsage(
        [ExtendedKeyUsageOID.CLIENT_AUTH]
    )
    with pytest.raises(x509.ExtensionNotFound):
        ext(cert, x509.SubjectAlternativeName)
    _assert_leaf_basics(cert, ca)


def _assert_leaf_basics(cert: x509.Certificate, ca: pki.CertificateAuthority) -> None:
    assert cert.issuer == ca.certificate.subject
    constraints = ext(cert, x509.BasicConstraints)
    assert constraints.critical and not constraints.value.ca
    usage = ext(cert, x509.KeyUsage)
    assert usage.critical and usage.value.digital_signature
    assert not usage.value.key_cert_sign and not usage.value.key_encipherment
    ca_ski = ext(ca.certificate, x509.SubjectKeyIdentifier).value.digest
    assert ext(cert, x509.AuthorityKeyIdentifier).value.key_identifier == ca_ski
    assert 0 < cert.serial_number < 2**159


def test_serial_numbers_are_unique(ca):
    serials = {pki.make_client_certificate(ca, "east").certificate.serial_number for _ in range(20)}
    assert len(serials) == 20


def test_reusing_a_key_keeps_the_public_key(ca):
    first = pki.make_client_certificate(ca, "east")
    second = pki.make_client_certificate(ca, "east", key=first.key)
    assert second.certificate.public_key() == first.certificate.public_key()
    assert second.certificate.serial_number != first.certificate.serial_number


def test_rsa_key_gets_key_encipherment(ca):
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    cert = pki.make_server_certificate(ca, "west", key=key).certificate
    assert ext(cert, x509.KeyUsage).value.key_encipherment


@pytest.mark.parametrize(
    ("key", "fragment"),
    [
        (ed25519.Ed25519PrivateKey.generate(), "unsupported key type"),
        (ec.generate_private_key(ec.SECP256K1()), "unsupported EC curve"),
        (rsa.generate_private_key(public_exponent=65537, key_size=1024), "too small"),
    ],
    ids=["ed25519", "secp256k1", "rsa1024"],
)
def test_unsuitable_keys_are_refused(ca, key, fragment):
    with pytest.raises(PkiError, match=fragment):
        pki.make_client_certificate(ca, "east", key=key)


def test_leaf_may_not_outlive_its_ca():
    short = pki.make_ca(days=100)
    pki.make_server_certificate(short, "west", days=99)
    with pytest.raises(PkiError, match="would outlive its CA"):
        pki.make_server_certificate(short, "west", days=101)


def test_ca_key_must_match_ca_certificate(ca):
    other = pki.make_ca()
    with pytest.raises(PkiError, match="CA key does not belong"):
        pki.make_client_certificate(pki.CertificateAuthority(ca.certificate, other.key), "east")


def test_a_leaf_is_not_a_ca(ca):
    leaf = pki.make_client_certificate(ca, "east")
    with pytest.raises(PkiError, match="not a CA"):
        pki.make_client_certificate(pki.CertificateAuthority(leaf.certificate, leaf.key), "x")


# --- inputs -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("localhost", x509.DNSName("localhost")),
        ("Hub-1.Example.org", x509.DNSName("hub-1.example.org")),
        ("*.example.org", x509.DNSName("*.example.org")),
        ("127.0.0.1", x509.IPAddress(ipaddress.ip_address("127.0.0.1"))),
        ("::1", x509.IPAddress(ipaddress.ip_address("::1"))),
        ("[fe80::1]", x509.IPAddress(ipaddress.ip_address("fe80::1"))),
        ("IP:10.0.0.1", x509.IPAddress(ipaddress.ip_address("10.0.0.1"))),
        ("dns:west", x509.DNSName("west")),
    ],
)
def test_parse_san(value, expected):
    assert pki.parse_san(value) == expected


@pytest.mark.parametrize(
    "value",
    ["", "bad_name", "-lead.example", "a..b", "300.1.2.3", "IP:west", "héhé.example",
     "a" * 64 + ".example", "with space", "http://x"],
)
def test_bad_san_is_refused(value):
    with pytest.raises(PkiError, match="bad SAN"):
        pki.parse_san(value)


def test_duplicate_sans_collapse_and_none_is_refused():
    assert pki.parse_sans(["localhost", "LOCALHOST", "DNS:localhost"]) == [x509.DNSName("localhost")]
    with pytest.raises(PkiError, match="at least one SAN"):
        pki.parse_sans([])


@pytest.mark.parametrize("hub_id", ["", ".west", "-west", "we/st", "..", "a" * 65, "west hub", "é"])
def test_bad_hub_ids_are_refused(ca, hub_id):
    with pytest.raises(PkiError, match="bad hub id"):
        pki.make_client_certificate(ca, hub_id)


@pytest.mark.parametrize("days", [0, -1, True, 36501])
def test_bad_days_are_refused(days):
    with pytest.raises(PkiError, match="bad validity"):
        pki.make_ca(days=days)


# --- files ------------------------------------------------------------------


def test_key_written_owner_only_even_with_open_umask(tmp_path, ca):
    old = os.umask(0)
    try:
        pki.write_private_key(tmp_path / "k.key", ca.key)
        pki.write_certificate(tmp_path / "c.pem", ca.certificate)
        pki.write_certificate(tmp_path / "p.pem", ca.certificate, mode=0o600)
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "k.key").stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "c.pem").stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "p.pem").stat().st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.pem", "k.key", "p.pem"]


def test_files_round_trip(tmp_path, ca):
    pki.write_private_key(tmp_path / "ca.key", ca.key)
    pki.write_certificate(tmp_path / "ca.pem", ca.certificate)
    loaded = pki.load_ca(tmp_path)
    assert loaded.certificate == ca.certificate
    assert loaded.key.private_numbers() == ca.key.private_numbers()


def test_no_overwrite_without_asking(tmp_path, ca):
    path = tmp_path / "k.key"
    path.write_bytes(b"keep me")
    with pytest.raises(PkiError, match="already exists"):
        pki.write_private_key(path, ca.key)
    assert path.read_bytes() == b"keep me"
    pki.write_private_key(path, ca.key, overwrite=True)
    assert path.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")
    assert [p.name for p in tmp_path.iterdir()] == ["k.key"]


def test_load_errors_are_pki_errors(tmp_path, ca):
    with pytest.raises(PkiError, match="no CA in"):
        pki.load_ca(tmp_path)
    with pytest.raises(PkiError, match="not found"):
        pki.load_private_key(tmp_path / "absent.key")
    with pytest.raises(PkiError, match="is a directory"):
        pki.load_certificate(tmp_path)
    (tmp_path / "junk").write_bytes(b"junk")
    with pytest.raises(PkiError, match="not a PEM or DER private key"):
        pki.load_private_key(tmp_path / "junk")
    with pytest.raises(PkiError, match="not a PEM or DER X.509 certificate"):
        pki.load_certificate(tmp_path / "junk")
    encrypted = ca.key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"secret"),
    )
    (tmp_path / "enc.key").write_bytes(encrypted)
    with pytest.raises(PkiError, match="encrypted"):
        pki.load_private_key(tmp_path / "enc.key")


# --- an independent verifier --------------------------------------------------


def test_openssl_accepts_each_certificate_for_its_purpose_only(tmp_path, ca):
    need_tool("openssl")
    pki.write_certificate(tmp_path / "ca.pem", ca.certificate)
    pki.write_certificate(tmp_path / "server.pem", pki.make_server_certificate(ca, "west").certificate)
    pki.write_certificate(tmp_path / "client.pem", pki.make_client_certificate(ca, "east").certificate)

    def verify(purpose: str, name: str) -> bool:
        done = subprocess.run(
            ["openssl", "verify", "-CAfile", str(tmp_path / "ca.pem"), "-purpose", purpose,
             str(tmp_path / name)],
            capture_output=True,
        )
        return done.returncode == 0

    assert verify("sslserver", "server.pem")
    assert verify("sslclient", "client.pem")
    assert not verify("sslclient", "server.pem")
    assert not verify("sslserver", "client.pem")

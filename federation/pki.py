"""A small private PKI for hub-to-hub mutual TLS.

One CA per deployment signs a server certificate (serverAuth) and a client
certificate (clientAuth, CN = hub id) for each hub. Trust between hubs comes
from pins (federation/pins.py); the CA is what a serving hub hands to its TLS
stack so it can ask for, and verify, a client certificate.

Keys are ECDSA P-256: Ed25519 is not accepted for TLS client authentication
by every stack a peer may run, while P-256 is. Only `cryptography` is used.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Union

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_CERT_FILE = "ca.pem"
CA_KEY_FILE = "ca.key"

DEFAULT_CA_NAME = "hubd private CA"
DEFAULT_CA_DAYS = 3650
DEFAULT_LEAF_DAYS = 825  # the longest leaf lifetime common TLS clients still accept
DEFAULT_SANS: tuple[str, ...] = ("localhost", "127.0.0.1")

KEY_FILE_MODE = 0o600
CERT_FILE_MODE = 0o644

# A certificate is valid from a little before "now" so that a peer whose clock
# runs slightly behind does not reject a certificate issued a moment ago.
CLOCK_SKEW_ALLOWANCE = datetime.timedelta(minutes=5)

# The wire protocol's HUB_ID: 1-64 letters, digits, '.', '_' or '-', starting
# with a letter or digit. It is also part of file names, so this rules out
# path separators and '..'.
HUB_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")

_DNS_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")

PrivateKey = Union[ec.EllipticCurvePrivateKey, rsa.RSAPrivateKey]
_ACCEPTED_CURVES = (ec.SECP256R1, ec.SECP384R1, ec.SECP521R1)
_MIN_RSA_BITS = 2048


class PkiError(ValueError):
    """A certificate, key or PKI input is unusable; the message says why."""


@dataclass(frozen=True)
class CertificateAuthority:
    certificate: x509.Certificate
    key: PrivateKey


@dataclass(frozen=True)
class IssuedCertificate:
    certificate: x509.Certificate
    key: PrivateKey


# --- inputs -----------------------------------------------------------------


def validate_hub_id(hub_id: str) -> str:
    if not isinstance(hub_id, str) or not HUB_ID_PATTERN.fullmatch(hub_id):
        raise PkiError(
            f"bad hub id {hub_id!r}: use 1-64 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return hub_id


def validate_days(days: int) -> int:
    if isinstance(days, bool) or not isinstance(days, int) or days < 1:
        raise PkiError(f"bad validity {days!r}: days must be a positive whole number")
    if days > 36500:
        raise PkiError(f"bad validity {days}: at most 36500 days")
    return days


def parse_san(value: str) -> x509.GeneralName:
    """Turn an operator's SAN ('localhost', '10.0.0.5', 'DNS:x', 'IP:::1') into a GeneralName."""
    text = value.strip()
    kind = None
    for prefix in ("DNS:", "IP:"):
        if text[: len(prefix)].upper() == prefix:
            kind, text = prefix[:-1], text[len(prefix) :].strip()
            break
    if kind != "DNS":
        candidate = text[1:-1] if text.startswith("[") and text.endswith("]") else text
        try:
            return x509.IPAddress(ipaddress.ip_address(candidate))
        except ValueError:
            if kind == "IP":
                raise PkiError(f"bad SAN {value!r}: not an IP address") from None
    if _is_dns_name(text):
        return x509.DNSName(text.lower())
    raise PkiError(
        f"bad SAN {value!r}: expected an IP address or a DNS name "
        "(ASCII letters, digits and '-' in dot-separated labels; '*.' allowed first)"
    )


def _is_dns_name(text: str) -> bool:
    if not text or len(text) > 253 or not text.isascii():
        return False
    labels = text.rstrip(".").split(".")
    if labels[0] == "*" and len(labels) > 1:
        labels = labels[1:]
    if all(label.isdigit() for label in labels):
        return False  # something like "300.1.2.3": a mistyped address, not a name
    return all(_DNS_LABEL.fullmatch(label) for label in labels)


def parse_sans(values: Iterable[str]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = []
    for value in values:
        name = parse_san(value)
        if name not in names:
            names.append(name)
    if not names:
        raise PkiError("a server certificate needs at least one SAN")
    return names


# --- keys and certificates --------------------------------------------------


def generate_private_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def check_private_key(key: object) -> PrivateKey:
    """Accept only key types every TLS peer can use for client and server auth."""
    if isinstance(key, ec.EllipticCurvePrivateKey):
        if isinstance(key.curve, _ACCEPTED_CURVES):
            return key
        raise PkiError(f"unsupported EC curve {key.curve.name}: use P-256, P-384 or P-521")
    if isinstance(key, rsa.RSAPrivateKey):
        if key.key_size >= _MIN_RSA_BITS:
            return key
        raise PkiError(f"RSA key of {key.key_size} bits is too small: at least {_MIN_RSA_BITS}")
    raise PkiError(
        f"unsupported key type {type(key).__name__}: use ECDSA (P-256 recommended) or RSA"
    )


def _utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def make_ca(
    name: str = DEFAULT_CA_NAME,
    days: int = DEFAULT_CA_DAYS,
    key: PrivateKey | None = None,
) -> CertificateAuthority:
    """A self-signed CA that may sign leaf certificates only (path length 0)."""
    validate_days(days)
    if not name or not name.strip() or len(name) > 64:
        raise PkiError(f"bad CA name {name!r}: 1-64 characters")
    key = check_private_key(key) if key is not None else generate_private_key()
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = _utc_now()
    public_key = key.public_key()
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW_ALLOWANCE)
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
        .sign(key, hashes.SHA256())
    )
    return CertificateAuthority(certificate=certificate, key=key)


def make_server_certificate(
    ca: CertificateAuthority,
    hub_id: str,
    sans: Iterable[str] = DEFAULT_SANS,
    days: int = DEFAULT_LEAF_DAYS,
    key: PrivateKey | None = None,
) -> IssuedCertificate:
    """A certificate a hub serves wss:// with; SANs are DNS names and IP addresses."""
    names = parse_sans(sans)
    return _issue_leaf(ca, hub_id, ExtendedKeyUsageOID.SERVER_AUTH, names, days, key)


def make_client_certificate(
    ca: CertificateAuthority,
    hub_id: str,
    days: int = DEFAULT_LEAF_DAYS,
    key: PrivateKey | None = None,
) -> IssuedCertificate:
    """A certificate a hub presents to its peers; CN is the hub id."""
    return _issue_leaf(ca, hub_id, ExtendedKeyUsageOID.CLIENT_AUTH, [], days, key)


def _issue_leaf(
    ca: CertificateAuthority,
    hub_id: str,
    purpose: x509.ObjectIdentifier,
    sans: list[x509.GeneralName],
    days: int,
    key: PrivateKey | None,
) -> IssuedCertificate:
    validate_hub_id(hub_id)
    validate_days(days)
    check_ca(ca)
    key = check_private_key(key) if key is not None else generate_private_key()
    now = _utc_now()
    not_after = now + datetime.timedelta(days=days)
    ca_expires = ca.certificate.not_valid_after_utc
    if not_after > ca_expires:
        # A leaf that outlives its CA stops verifying on the CA's expiry date,
        # which is a surprise better reported now than discovered then.
        raise PkiError(
            f"a {days}-day certificate would outlive its CA (CA expires "
            f"{ca_expires:%Y-%m-%d}); ask for fewer days or make a new CA"
        )
    public_key = key.public_key()
    ca_ski = ca.certificate.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hub_id)]))
        .issuer_name(ca.certificate.subject)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW_ALLOWANCE)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_leaf_key_usage(key), critical=True)
        .add_extension(x509.ExtendedKeyUsage([purpose]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski),
            critical=False,
        )
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    certificate = builder.sign(ca.key, hashes.SHA256())
    return IssuedCertificate(certificate=certificate, key=key)


def _leaf_key_usage(key: PrivateKey) -> x509.KeyUsage:
    # ECDHE handshakes only need the leaf key to sign. RSA keys may also be used
    # for RSA key transport by TLS 1.2 peers, hence keyEncipherment for them.
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=isinstance(key, rsa.RSAPrivateKey),
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=False,
        crl_sign=False,
        encipher_only=False,
        decipher_only=False,
    )


def check_ca(ca: CertificateAuthority) -> None:
    """Refuse a CA that cannot sign: wrong key, not a CA, expired."""
    cert = ca.certificate
    if cert.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    ) != ca.key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    ):
        raise PkiError("the CA key does not belong to the CA certificate")
    try:
        constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    except x509.ExtensionNotFound:
        constraints = None
    if constraints is None or not constraints.ca:
        raise PkiError("the CA certificate is not a CA (BasicConstraints CA:TRUE missing)")
    try:
        cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier)
    except x509.ExtensionNotFound:
        raise PkiError("the CA certificate has no SubjectKeyIdentifier") from None
    now = _utc_now()
    if cert.not_valid_after_utc <= now:
        raise PkiError(f"the CA certificate expired on {cert.not_valid_after_utc:%Y-%m-%d}")


# --- files ------------------------------------------------------------------


def private_key_pem(key: PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def certificate_pem(certificate: x509.Certificate) -> bytes:
    return certificate.public_bytes(serialization.Encoding.PEM)


def write_file(path: Path, data: bytes, mode: int, *, overwrite: bool = False) -> None:
    """Write atomically with exactly `mode`; the file never exists with wider permissions.

    The data goes to a temporary file in the same directory, created with
    owner-only permissions and then set to `mode`, and is moved into place.
    Without `overwrite`, an existing file is left untouched and PkiError raised.
    """
    path = Path(path)
    directory = path.parent
    try:
        fd, temp_name = tempfile.mkstemp(prefix=f".{path.name}.", dir=directory)
    except OSError as exc:
        raise PkiError(f"cannot write {path}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), mode)
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        if overwrite:
            os.replace(temp_name, path)
        else:
            # link() refuses an existing target, so a file that appeared since
            # the caller checked is still not clobbered.
            try:
                os.link(temp_name, path)
            except FileExistsError:
                raise PkiError(f"{path} already exists (use --force to replace it)") from None
            os.unlink(temp_name)
    except OSError as exc:
        _remove_quietly(temp_name)
        raise PkiError(f"cannot write {path}: {exc.strerror or exc}") from None
    except BaseException:
        _remove_quietly(temp_name)
        raise


def _remove_quietly(name: str) -> None:
    try:
        os.unlink(name)
    except FileNotFoundError:
        pass


def write_private_key(path: Path, key: PrivateKey, *, overwrite: bool = False) -> None:
    write_file(path, private_key_pem(key), KEY_FILE_MODE, overwrite=overwrite)


def write_certificate(
    path: Path,
    certificate: x509.Certificate,
    *,
    mode: int = CERT_FILE_MODE,
    overwrite: bool = False,
) -> None:
    write_file(path, certificate_pem(certificate), mode, overwrite=overwrite)


def read_bytes(path: Path, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        raise PkiError(f"{what} {path} not found") from None
    except IsADirectoryError:
        raise PkiError(f"{what} {path} is a directory") from None
    except OSError as exc:
        raise PkiError(f"cannot read {what} {path}: {exc.strerror or exc}") from None


def parse_certificate(data: bytes, source: str = "certificate") -> x509.Certificate:
    """Load one certificate from PEM (the first one) or DER bytes."""
    try:
        if b"-----BEGIN" in data:
            return x509.load_pem_x509_certificate(data)
        return x509.load_der_x509_certificate(data)
    except ValueError as exc:
        raise PkiError(f"{source} is not a PEM or DER X.509 certificate ({exc})") from None


def load_certificate(path: Path) -> x509.Certificate:
    return parse_certificate(read_bytes(path, "certificate"), str(path))


def load_private_key(path: Path) -> PrivateKey:
    data = read_bytes(path, "key")
    try:
        if b"-----BEGIN" in data:
            key = serialization.load_pem_private_key(data, password=None)
        else:
            key = serialization.load_der_private_key(data, password=None)
    except TypeError:
        raise PkiError(f"key {path} is encrypted; hubd needs an unencrypted key file") from None
    except ValueError as exc:
        raise PkiError(f"{path} is not a PEM or DER private key ({exc})") from None
    except Exception as exc:  # cryptography raises UnsupportedAlgorithm for odd keys
        raise PkiError(f"cannot load key {path}: {exc}") from None
    try:
        return check_private_key(key)
    except PkiError as exc:
        raise PkiError(f"key {path}: {exc}") from None


def load_ca(directory: Path) -> CertificateAuthority:
    """Load ca.pem and ca.key from `directory`, checking that they can sign."""
    directory = Path(directory)
    cert_path, key_path = directory / CA_CERT_FILE, directory / CA_KEY_FILE
    if not cert_path.exists() or not key_path.exists():
        raise PkiError(
            f"no CA in {directory} (need {CA_CERT_FILE} and {CA_KEY_FILE}; "
            "make one with `hubd certs ca --dir DIR`)"
        )
    ca = CertificateAuthority(load_certificate(cert_path), load_private_key(key_path))
    check_ca(ca)
    return ca


def server_file_names(hub_id: str) -> tuple[str, str]:
    validate_hub_id(hub_id)
    return f"{hub_id}-server.pem", f"{hub_id}-server.key"


def client_file_names(hub_id: str) -> tuple[str, str]:
    validate_hub_id(hub_id)
    return f"{hub_id}-client.pem", f"{hub_id}-client.key"

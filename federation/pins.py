"""Certificate pins: how a hub decides that the peer on a TLS connection is the one it means.

Two pin forms:

- ``sha256:<64 hex>`` is SHA-256 over the DER certificate. This is the form
  the reference hub uses (``--message-peer-pin``, federation ``certificate_pins``)
  and what ``openssl x509 -outform DER | sha256sum`` prints.
- ``spki-sha256:<64 hex>`` is SHA-256 over the DER SubjectPublicKeyInfo. A
  certificate re-issued on the same key keeps this pin, so renewing a
  certificate does not require every peer to change its configuration.

A peer may have several pins (a PinSet) so that a new certificate or key can
be pinned before the old one is retired.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import re
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Literal, Union

PinKind = Literal["sha256", "spki-sha256"]
CERT_PIN: PinKind = "sha256"
SPKI_PIN: PinKind = "spki-sha256"
PIN_KINDS: tuple[PinKind, ...] = (CERT_PIN, SPKI_PIN)

_HEX_DIGEST = re.compile(r"[0-9a-fA-F]{64}")


class PinError(ValueError):
    """A pin string, certificate or pin check is bad; the message says which and why."""


@dataclass(frozen=True)
class Pin:
    kind: PinKind
    digest: bytes  # 32 bytes

    def __str__(self) -> str:
        return f"{self.kind}:{self.digest.hex()}"

    def matches(self, der_cert: bytes) -> bool:
        try:
            actual = pin_digest(self.kind, der_cert)
        except PinError:
            return False  # an unparseable certificate matches nothing
        return hmac.compare_digest(actual, self.digest)


@dataclass(frozen=True)
class CertificatePins:
    """Both pins of one certificate."""

    sha256: str
    spki_sha256: str

    def as_dict(self) -> dict[str, str]:
        return {"sha256": self.sha256, "spki_sha256": self.spki_sha256}


def parse_pin(text: str) -> Pin:
    """Parse ``sha256:<hex>`` or ``spki-sha256:<hex>`` (hex case-insensitive)."""
    if not isinstance(text, str):
        raise PinError(f"a pin must be a string, not {type(text).__name__}")
    stripped = text.strip()
    kind, sep, hex_digest = stripped.partition(":")
    if not sep:
        raise PinError(
            f"bad pin {text!r}: expected 'sha256:<64 hex digits>' or 'spki-sha256:<64 hex digits>'"
        )
    kind = kind.lower()
    if kind not in PIN_KINDS:
        raise PinError(
            f"bad pin {text!r}: unknown pin kind {kind!r} (use 'sha256' or 'spki-sha256')"
        )
    if not _HEX_DIGEST.fullmatch(hex_digest):
        raise PinError(
            f"bad pin {text!r}: after '{kind}:' expected 64 hex digits, got "
            f"{len(hex_digest)} characters"
            + ("" if re.fullmatch(r"[0-9a-fA-F]*", hex_digest) else " including non-hex ones")
        )
    return Pin(kind=kind, digest=bytes.fromhex(hex_digest))  # type: ignore[arg-type]


def _x509():
    """cryptography's X.509 parsing, imported when a certificate is first
    parsed: a hub without TLS or peers never does, and the import is a tenth
    of a second of its start."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    return x509, serialization


def certificate_der(data: bytes) -> bytes:
    """The DER bytes of a certificate given as PEM or DER.

    PEM is decoded by parsing, so the DER pinned is exactly the certificate's
    own encoding (re-serialising a parsed certificate returns the same bytes).
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise PinError(f"certificate must be bytes, not {type(data).__name__}")
    data = bytes(data)
    x509, serialization = _x509()
    try:
        if b"-----BEGIN" in data:
            cert = x509.load_pem_x509_certificate(data)
            return cert.public_bytes(serialization.Encoding.DER)
        x509.load_der_x509_certificate(data)  # validate: a pin of garbage is useless
        return data
    except ValueError as exc:
        raise PinError(f"not a PEM or DER X.509 certificate ({exc})") from None


def spki_der(der_cert: bytes) -> bytes:
    x509, serialization = _x509()
    try:
        cert = x509.load_der_x509_certificate(der_cert)
    except ValueError as exc:
        raise PinError(f"not a DER X.509 certificate ({exc})") from None
    return cert.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


@functools.lru_cache(maxsize=256)
def pin_digest(kind: PinKind, der_cert: bytes) -> bytes:
    """Cached: a peer presents the same certificate on every frame of its link."""
    if kind == CERT_PIN:
        return hashlib.sha256(der_cert).digest()
    if kind == SPKI_PIN:
        return hashlib.sha256(spki_der(der_cert)).digest()
    raise PinError(f"unknown pin kind {kind!r}")


def certificate_pin(der_cert: bytes) -> str:
    """``sha256:<hex>`` of a DER certificate (the reference hub's pin)."""
    return f"{CERT_PIN}:{hashlib.sha256(der_cert).hexdigest()}"


def spki_pin(der_cert: bytes) -> str:
    """``spki-sha256:<hex>`` of a DER certificate's public key."""
    return f"{SPKI_PIN}:{hashlib.sha256(spki_der(der_cert)).hexdigest()}"


def pins_for_certificate(data: bytes) -> CertificatePins:
    """Both pins of a PEM or DER certificate."""
    der = certificate_der(data)
    return CertificatePins(sha256=certificate_pin(der), spki_sha256=spki_pin(der))


def describe_certificate(der: bytes | None) -> str:
    """A presented certificate by its pins, for a refusal an operator reads
    (what to pin, if it is the right certificate)."""
    if der is None:
        return "no certificate"
    try:
        pins = pins_for_certificate(der)
    except PinError:
        return "an unparseable certificate"
    return f"{pins.sha256} ({pins.spki_sha256})"


def pins_for_file(path: Union[str, Path]) -> CertificatePins:
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise PinError(f"certificate {path} not found") from None
    except OSError as exc:
        raise PinError(f"cannot read certificate {path}: {exc.strerror or exc}") from None
    try:
        return pins_for_certificate(data)
    except PinError as exc:
        raise PinError(f"{path}: {exc}") from None


class PinSet:
    """The pins a peer may present; any one matching is enough (rotation).

    An empty PinSet matches nothing: without a pin there is no trust.
    """

    def __init__(self, pins: Iterable[Union[Pin, str]] = ()) -> None:
        parsed: list[Pin] = []
        for pin in pins:
            pin = pin if isinstance(pin, Pin) else parse_pin(pin)
            if pin not in parsed:
                parsed.append(pin)
        self._pins: tuple[Pin, ...] = tuple(parsed)

    def matches(self, der_cert: bytes | None) -> bool:
        if not der_cert:
            return False
        return any(pin.matches(der_cert) for pin in self._pins)

    def __iter__(self):
        return iter(self._pins)

    def __len__(self) -> int:
        return len(self._pins)

    def __contains__(self, pin: object) -> bool:
        if isinstance(pin, str):
            try:
                pin = parse_pin(pin)
            except PinError:
                return False
        return pin in self._pins

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PinSet) and set(self._pins) == set(other._pins)

    def __hash__(self) -> int:
        return hash(frozenset(self._pins))

    def __repr__(self) -> str:
        return f"PinSet({[str(pin) for pin in self._pins]!r})"


def peer_certificate_der(connection: object) -> bytes | None:
    """The DER certificate the other end of a TLS connection presented, or None.

    Accepts an ssl.SSLObject or ssl.SSLSocket, an asyncio transport, or an
    aiohttp object that exposes one (web.Request, a client response's
    connection, a WebSocket response with get_extra_info). Returns None for a
    plain-text connection, a peer that sent no certificate, or a handshake
    that has not completed: in each case there is nothing to trust.

    An aiohttp ClientResponse gives up its connection once its body has
    arrived (at once, for a small body), after which this returns None; check
    pins on a WebSocket or stream that stays open, as a peer link does.
    """
    ssl_object = _find_ssl_object(connection)
    if ssl_object is None:
        return None
    try:
        der = ssl_object.getpeercert(binary_form=True)
    except ValueError:  # handshake not done yet
        return None
    return der or None


def _find_ssl_object(connection: object, _depth: int = 0) -> object | None:
    if connection is None or _depth > 4:
        return None
    if isinstance(connection, (ssl.SSLObject, ssl.SSLSocket)) or hasattr(
        connection, "getpeercert"
    ):
        return connection
    get_extra_info = getattr(connection, "get_extra_info", None)
    if callable(get_extra_info):
        found = get_extra_info("ssl_object")
        if found is not None:
            return found
    # aiohttp: web.Request.transport, ClientResponse.connection.transport
    for attribute in ("transport", "connection"):
        inner = getattr(connection, attribute, None)
        if inner is not None and inner is not connection:
            found = _find_ssl_object(inner, _depth + 1)
            if found is not None:
                return found
    return None


def check_peer_pin(connection: object, pins: PinSet, peer: str = "peer") -> bytes:
    """Return the peer's DER certificate if it matches `pins`; raise PinError naming the failure.

    Call this on the live connection before sending any frame: the client TLS
    context does not validate the server's chain, so this is the trust check.
    """
    der = peer_certificate_der(connection)
    if der is None:
        raise PinError(f"{peer} presented no TLS certificate")
    if not pins.matches(der):
        try:
            got = pins_for_certificate(der)
            described = f"{got.sha256}, {got.spki_sha256}"
        except PinError:
            described = "an unparseable certificate"
        if len(pins) == 0:
            raise PinError(f"no pin configured for {peer}; its certificate is {described}")
        raise PinError(f"{peer} certificate matches none of its {len(pins)} pin(s); got {described}")
    return der


def pin_mismatch_detail(peer: str, route, der: bytes | None, pins: str) -> str:
    """Why a pinned link is refused, with what the peer presented (so the
    operator can tell a rotated certificate from a wrong host) and how to
    read a hub's pins without trusting them first."""
    return (f"{peer} presented {describe_certificate(der)}, which matches none of {pins}; "
            f"if that is {peer}'s certificate, pin it (`hubd certs fetch {route.uri}` "
            "prints a hub's pins)")

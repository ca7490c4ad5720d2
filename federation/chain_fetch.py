"""Read the certificate chain a TLS server presents: how an operator learns a peer hub's pin.

`hubd certs fetch wss://HOST:PORT/` uses this. It connects, completes a TLS
handshake without trusting anything (no chain validation, no hostname check:
the point is to see what is presented, not to decide whether to trust it),
and returns every certificate the server sent, in the order it sent them,
with both pin forms computed by federation/pins.py, the same code the peer
links use to check them.

pyOpenSSL, not the standard library: on Python 3.11 an ssl.SSLSocket only
gives the peer's leaf certificate (getpeercert); the chain as presented
(SSL_get_peer_cert_chain) is reachable only through pyOpenSSL there.

Everything is bounded by one deadline (name resolution, TCP connect and the
handshake together); every way to fail raises ChainFetchError with a `cause`
a script can branch on.
"""

from __future__ import annotations

import errno
import ipaddress
import queue
import select
import socket
import threading
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from OpenSSL import SSL

from federation.pins import CertificatePins, pins_for_certificate
from federation.pki import PkiError

ACCEPTED_SCHEMES = ("wss", "https")  # the same listener serves both
DEFAULT_PORT = 443
DEFAULT_TIMEOUT_SECONDS = 10.0
MAX_TIMEOUT_SECONDS = 300.0

# Causes, one per way to fail; `hubd certs fetch --json` reports them as error.cause.
CAUSE_URL = "url"  # not a wss:// or https:// URL with a host
CAUSE_RESOLVE = "resolve"  # the host name does not resolve
CAUSE_REFUSED = "refused"  # nothing listens on that port
CAUSE_UNREACHABLE = "unreachable"  # no route to the host or network
CAUSE_CONNECT = "connect"  # any other TCP connect failure
CAUSE_TIMEOUT = "timeout"  # the deadline passed (resolving, connecting or in the handshake)
CAUSE_NOT_TLS = "not_tls"  # the port answered, but not with TLS
CAUSE_TLS = "tls"  # a TLS server that failed the handshake or closed it
CAUSE_NO_CERTIFICATE = "no_certificate"  # handshake done, no certificate presented

_UNREACHABLE_ERRNOS = {errno.ENETUNREACH, errno.EHOSTUNREACH, errno.EHOSTDOWN, errno.ENETDOWN}

# OpenSSL's reasons when the bytes that came back are not a TLS record: what a
# plain HTTP or WebSocket listener's "400 Bad Request" looks like to a client.
_NOT_TLS_REASONS = ("wrong version number", "packet length too long", "record layer failure",
                    "unknown protocol", "http request")


class ChainFetchError(PkiError):
    """Fetching a presented chain failed; `cause` names how (see CAUSE_*)."""

    def __init__(self, cause: str, detail: str) -> None:
        super().__init__(detail)
        self.cause = cause
        self.detail = detail


@dataclass(frozen=True)
class Target:
    url: str
    host: str
    port: int


@dataclass(frozen=True)
class PresentedCertificate:
    der: bytes
    subject: str
    issuer: str
    not_before: str
    not_after: str
    is_ca: bool
    pins: CertificatePins


@dataclass(frozen=True)
class PresentedChain:
    target: Target
    address: str  # the IP address actually connected to
    tls_version: str
    certificates: tuple[PresentedCertificate, ...]  # as sent: the leaf first


def parse_target(url: str) -> Target:
    """`wss://HOST[:PORT][/...]` (or https://) -> host and port; anything else is ChainFetchError."""
    if not isinstance(url, str) or not url.strip():
        raise ChainFetchError(CAUSE_URL, "expected a URL like wss://HOST:PORT/")
    text = url.strip()
    if "://" not in text:
        raise ChainFetchError(CAUSE_URL, f"bad URL {url!r}: expected wss://HOST:PORT/")
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as exc:
        raise ChainFetchError(CAUSE_URL, f"bad URL {url!r}: {exc}") from None
    scheme = parts.scheme.lower()
    if scheme not in ACCEPTED_SCHEMES:
        hint = (" (ws:// and http:// are plain text: there is no certificate to fetch)"
                if scheme in ("ws", "http") else "")
        raise ChainFetchError(
            CAUSE_URL, f"bad URL {url!r}: scheme {scheme}:// is not wss:// or https://{hint}"
        )
    if not parts.hostname:
        raise ChainFetchError(CAUSE_URL, f"bad URL {url!r}: no host")
    return Target(url=text, host=parts.hostname, port=port or DEFAULT_PORT)


def check_timeout(seconds: float) -> float:
    if not (0 < seconds <= MAX_TIMEOUT_SECONDS):
        raise ChainFetchError(
            CAUSE_URL, f"bad timeout {seconds!r}: more than 0 and at most {MAX_TIMEOUT_SECONDS:g} seconds"
        )
    return seconds


def fetch_chain(url: str, timeout: float = DEFAULT_TIMEOUT_SECONDS) -> PresentedChain:
    """Connect to `url` and return the chain its server presents; ChainFetchError otherwise."""
    target = parse_target(url)
    deadline = time.monotonic() + check_timeout(timeout)
    sock, address = _connect(target, deadline, timeout)
    try:
        connection = _handshake(sock, target, deadline, timeout)
        chain = connection.get_peer_cert_chain(as_cryptography=True)
        if not chain:
            raise ChainFetchError(
                CAUSE_NO_CERTIFICATE, f"{_where(target)} completed TLS but presented no certificate"
            )
        version = connection.get_protocol_version_name()
        _close_notify(connection)
    finally:
        sock.close()
    return PresentedChain(
        target=target,
        address=address,
        tls_version=version,
        certificates=tuple(_describe(certificate) for certificate in chain),
    )


# --- connecting -----------------------------------------------------------------


def _where(target: Target) -> str:
    host = f"[{target.host}]" if ":" in target.host else target.host
    return f"{host}:{target.port}"


def _remaining(deadline: float) -> float:
    return deadline - time.monotonic()


def _resolve(target: Target, deadline: float, timeout: float) -> list[tuple]:
    """getaddrinfo has no timeout of its own, so it runs in a daemon thread we stop waiting for."""
    try:
        ipaddress.ip_address(target.host)
    except ValueError:
        pass
    else:  # a literal address needs no resolver
        return socket.getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM,
                                  flags=socket.AI_NUMERICHOST)
    answers: queue.Queue = queue.Queue(maxsize=1)

    def lookup() -> None:
        try:
            answers.put(("ok", socket.getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM)))
        except (OSError, UnicodeError) as exc:  # gaierror; a name IDNA cannot encode
            answers.put(("error", exc))

    threading.Thread(target=lookup, name="hubd-certs-fetch-resolve", daemon=True).start()
    try:
        kind, value = answers.get(timeout=max(_remaining(deadline), 0))
    except queue.Empty:
        raise ChainFetchError(
            CAUSE_TIMEOUT, f"resolving {target.host} took longer than {timeout:g}s"
        ) from None
    if kind == "error":
        raise ChainFetchError(CAUSE_RESOLVE, f"cannot resolve {target.host}: {_reason(value)}")
    return value


def _connect(target: Target, deadline: float, timeout: float) -> tuple[socket.socket, str]:
    """TCP connect to the first address that answers, each attempt bounded by the deadline."""
    failures: list[tuple[str, OSError]] = []
    out_of_time = False
    for family, kind, proto, _name, sockaddr in _resolve(target, deadline, timeout):
        remaining = _remaining(deadline)
        if remaining <= 0:
            out_of_time = True
            break
        sock = socket.socket(family, kind, proto)
        sock.settimeout(remaining)
        try:
            sock.connect(sockaddr)
        except OSError as exc:
            sock.close()
            failures.append((sockaddr[0], exc))
            continue
        return sock, sockaddr[0]
    if out_of_time or not failures or isinstance(failures[-1][1], TimeoutError):
        raise ChainFetchError(
            CAUSE_TIMEOUT, f"connecting to {_where(target)} took longer than {timeout:g}s"
        )
    address, exc = failures[-1]
    if isinstance(exc, ConnectionRefusedError):
        raise ChainFetchError(CAUSE_REFUSED, f"{_where(target)} refused the connection "
                                             f"({address}: nothing listens on port {target.port})")
    if exc.errno in _UNREACHABLE_ERRNOS:
        raise ChainFetchError(CAUSE_UNREACHABLE, f"cannot reach {_where(target)} ({address}: "
                                                 f"{_reason(exc)})")
    raise ChainFetchError(CAUSE_CONNECT, f"cannot connect to {_where(target)} ({address}: "
                                         f"{_reason(exc)})")


def _client_context() -> SSL.Context:
    context = SSL.Context(SSL.TLS_CLIENT_METHOD)
    # The hub links refuse anything older (federation/tls.py); so does this.
    context.set_min_proto_version(SSL.TLS1_2_VERSION)
    # Nothing is trusted or refused here: fetch reports what the server
    # presents, and trust is the operator's decision, made by pinning.
    context.set_verify(SSL.VERIFY_NONE)
    return context


def _handshake(sock: socket.socket, target: Target, deadline: float,
               timeout: float) -> SSL.Connection:
    sock.setblocking(False)
    connection = SSL.Connection(_client_context(), sock)
    if not _is_ip_address(target.host):
        connection.set_tlsext_host_name(target.host.encode("idna"))  # SNI, as a peer link sends it
    connection.set_connect_state()
    while True:
        try:
            connection.do_handshake()
            return connection
        except SSL.WantReadError:
            wait_for = "read"
        except SSL.WantWriteError:
            wait_for = "write"
        except SSL.SysCallError as exc:
            raise ChainFetchError(
                CAUSE_TLS, f"{_where(target)} closed the connection during the TLS handshake "
                           f"({_syscall_reason(exc)}); is it a TLS port?"
            ) from None
        except SSL.Error as exc:
            reason = _ssl_reason(exc)
            if any(marker in reason.lower() for marker in _NOT_TLS_REASONS):
                raise ChainFetchError(
                    CAUSE_NOT_TLS, f"{_where(target)} answered, but not with TLS ({reason}); "
                                   "is it a plain ws:// listener?"
                ) from None
            raise ChainFetchError(
                CAUSE_TLS, f"TLS handshake with {_where(target)} failed: {reason}"
            ) from None
        remaining = _remaining(deadline)
        if remaining > 0:
            readable, writable, _ = select.select(
                [sock] if wait_for == "read" else [], [sock] if wait_for == "write" else [], [],
                remaining,
            )
            if readable or writable:
                continue
        raise ChainFetchError(
            CAUSE_TIMEOUT, f"{_where(target)} accepted the connection but the TLS handshake did "
                           f"not finish within {timeout:g}s (is it a TLS port?)"
        )


def _close_notify(connection: SSL.Connection) -> None:
    """Say goodbye politely; the chain is already read, so a peer that hung up or whose
    socket buffer is full at this instant changes nothing."""
    try:
        connection.shutdown()
    except (SSL.WantReadError, SSL.WantWriteError, SSL.SysCallError, SSL.ZeroReturnError):
        pass


# --- describing -----------------------------------------------------------------


def _describe(certificate: x509.Certificate) -> PresentedCertificate:
    der = certificate.public_bytes(serialization.Encoding.DER)
    try:
        constraints = certificate.extensions.get_extension_for_class(x509.BasicConstraints).value
        is_ca = constraints.ca
    except x509.ExtensionNotFound:
        is_ca = False
    return PresentedCertificate(
        der=der,
        subject=certificate.subject.rfc4514_string(),
        issuer=certificate.issuer.rfc4514_string(),
        not_before=certificate.not_valid_before_utc.strftime("%Y-%m-%dT%H:%M:%SZ"),
        not_after=certificate.not_valid_after_utc.strftime("%Y-%m-%dT%H:%M:%SZ"),
        is_ca=is_ca,
        pins=pins_for_certificate(der),
    )


def _is_ip_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _reason(exc: Exception) -> str:
    return getattr(exc, "strerror", None) or str(exc) or type(exc).__name__


def _syscall_reason(exc: SSL.SysCallError) -> str:
    # pyOpenSSL: (-1, 'Unexpected EOF') for a peer that hung up, (errno, text) otherwise.
    if len(exc.args) >= 2 and isinstance(exc.args[1], str):
        return exc.args[1]
    return str(exc) or "connection reset"


def _ssl_reason(exc: SSL.Error) -> str:
    # pyOpenSSL: args[0] is OpenSSL's error queue, a list of (library, function, reason).
    queue_entries = exc.args[0] if exc.args and isinstance(exc.args[0], list) else []
    reasons = [entry[-1] for entry in queue_entries if isinstance(entry, tuple) and entry]
    return "; ".join(str(reason) for reason in reasons) or str(exc) or type(exc).__name__

"""ssl.SSLContext factories for a hub's wss:// listener and its outgoing peer links."""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Union

from federation.pki import PkiError

PathLike = Union[str, Path]

MINIMUM_TLS_VERSION = ssl.TLSVersion.TLSv1_2


class TlsConfigError(PkiError):
    """A certificate, key or CA file cannot be loaded into a TLS context."""


def server_context(
    certfile: PathLike,
    keyfile: PathLike,
    *,
    client_ca_file: PathLike | None = None,
    client_ca_pem: str | None = None,
) -> ssl.SSLContext:
    """The context a hub serves wss:// with.

    With `client_ca_file`, the server asks every client for a certificate
    signed by that CA but does not require one (CERT_OPTIONAL): ordinary local
    agents connect without a certificate, while a peer hub presents its client
    certificate. A certificate that is presented but does not verify against
    the CA (or is not for clientAuth) fails the handshake. Whether a peer's
    certificate is the right one is decided later, by its pin.
    """
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = MINIMUM_TLS_VERSION
    _load_identity(context, certfile, keyfile, "server")
    if client_ca_pem is not None:
        # bytes the serving policy already read (owner-only checks done there),
        # so OpenSSL never reopens the path
        try:
            context.load_verify_locations(cadata=client_ca_pem)
        except ssl.SSLError as exc:
            raise TlsConfigError(f"cannot load the client CA: {exc.reason or exc}") from None
        context.verify_mode = ssl.CERT_OPTIONAL
    elif client_ca_file is not None:
        _load_ca(context, client_ca_file)
        context.verify_mode = ssl.CERT_OPTIONAL
    else:
        context.verify_mode = ssl.CERT_NONE
    return context


def peer_client_context(
    certfile: PathLike | None = None,
    keyfile: PathLike | None = None,
) -> ssl.SSLContext:
    """The context a hub uses to connect to a pinned peer, presenting its client certificate.

    Trust in the peer comes from its pin, not from a CA: the peer's server
    certificate may be self-signed or issued by a CA this hub has never seen,
    and its name need not match the URI (peers are often reached by an IP
    address). So this context neither validates the chain (CERT_NONE) nor
    checks the hostname. That is safe only because the caller MUST check the
    pin of the certificate on the live connection (pins.check_peer_pin) before
    it sends any frame; until then the connection is untrusted. The server
    still sends its certificate under CERT_NONE, so getpeercert(binary_form=True)
    returns it for that check.
    """
    if (certfile is None) != (keyfile is None):
        raise TlsConfigError("a client certificate needs both a certificate file and a key file")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = MINIMUM_TLS_VERSION
    context.check_hostname = False  # must precede CERT_NONE; the pin replaces both checks
    context.verify_mode = ssl.CERT_NONE
    if certfile is not None and keyfile is not None:
        _load_identity(context, certfile, keyfile, "client")
    return context


def verified_client_context(
    certfile: PathLike | None = None,
    keyfile: PathLike | None = None,
) -> ssl.SSLContext:
    """For a wss:// peer configured without a pin: the system's CA store (or
    SSL_CERT_FILE) and hostname checks, as any TLS client would do."""
    context = ssl.create_default_context()
    context.minimum_version = MINIMUM_TLS_VERSION
    if certfile is not None and keyfile is not None:
        _load_identity(context, certfile, keyfile, "client")
    return context


def _load_identity(context: ssl.SSLContext, certfile: PathLike, keyfile: PathLike, role: str) -> None:
    for path, what in ((certfile, "certificate"), (keyfile, "key")):
        if not Path(path).is_file():
            raise TlsConfigError(f"{role} {what} file {path} not found")
    try:
        context.load_cert_chain(certfile=str(certfile), keyfile=str(keyfile))
    except ssl.SSLError as exc:
        raise TlsConfigError(
            f"cannot load {role} certificate {certfile} with key {keyfile}: {exc.reason or exc}"
            " (is the key the certificate's own, and both PEM, unencrypted?)"
        ) from None
    except OSError as exc:
        raise TlsConfigError(f"cannot read {role} certificate or key: {exc.strerror or exc}") from None


def _load_ca(context: ssl.SSLContext, cafile: PathLike) -> None:
    if not Path(cafile).is_file():
        raise TlsConfigError(f"client CA file {cafile} not found")
    try:
        context.load_verify_locations(cafile=str(cafile))
    except ssl.SSLError as exc:
        raise TlsConfigError(f"cannot load client CA file {cafile}: {exc.reason or exc}") from None
    except OSError as exc:
        raise TlsConfigError(f"cannot read client CA file {cafile}: {exc.strerror or exc}") from None

"""`hubd certs ...`: make a private CA and the certificates hubs need to peer, and print pins.

Every subcommand prints what the operator needs next (paths, pins, flags) and
accepts --json for scripts. Errors are one line on stderr with exit status 2;
`fetch --json` also prints {"url", "error": {"cause", "detail"}} on stdout, so
a script can tell a timeout from a refused connection.

Files go to --dir, by default certs/out/ under the working directory: the
development PKI's place in the repository's layout (certs/README.md), ignored
by git.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

from cryptography import x509

from federation import chain_fetch, pki
from federation.chain_fetch import ChainFetchError
from federation.pins import PinError, pins_for_certificate, pins_for_file
from federation.pki import PkiError

EXIT_OK = 0
EXIT_ERROR = 2
PROG = "hubd certs"
DEFAULT_DIR = Path("certs") / "out"


class _Usage(Exception):
    """Raised instead of argparse's sys.exit so main() can return a status."""

    def __init__(self, status: int, message: str | None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class _Parser(argparse.ArgumentParser):
    def exit(self, status: int = 0, message: str | None = None):  # type: ignore[override]
        raise _Usage(status, message)

    def error(self, message: str):  # type: ignore[override]
        raise _Usage(EXIT_ERROR, f"{self.prog}: error: {message}\n")


def main(argv: Sequence[str]) -> int:
    parser = _build_parser()
    try:
        args = parser.parse_args(list(argv))
    except _Usage as usage:
        if usage.message:
            (sys.stderr if usage.status else sys.stdout).write(usage.message)
        return usage.status
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_ERROR
    try:
        result = args.handler(args)
    except ChainFetchError as exc:
        if args.json:
            print(json.dumps({"url": args.url, "error": {"cause": exc.cause, "detail": exc.detail}},
                             indent=2, sort_keys=True))
        print(f"{PROG}: error: {exc.cause}: {exc.detail}", file=sys.stderr)
        return EXIT_ERROR
    except (PkiError, PinError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    if args.json:
        print(json.dumps(result, indent=2, sort_keys=True))
    else:
        print(_render_text(args.command, result))
    return EXIT_OK


# --- argument parsing -------------------------------------------------------


def _build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="Make a private PKI for hub peering and print pins.")
    commands = parser.add_subparsers(dest="command", parser_class=_Parser, metavar="COMMAND")

    def add(name: str, handler: Callable[[argparse.Namespace], dict], help_text: str):
        sub = commands.add_parser(name, help=help_text, description=help_text)
        sub.set_defaults(handler=handler)
        sub.add_argument("--json", action="store_true", help="print the result as JSON")
        return sub

    ca = add("ca", _cmd_ca, "create a private CA (ca.pem, ca.key) in DIR")
    ca.add_argument("--dir", default=DEFAULT_DIR, type=Path,
                    help=f"directory for the PKI files (default: {DEFAULT_DIR})")
    ca.add_argument("--name", default=pki.DEFAULT_CA_NAME, help="CA common name")
    ca.add_argument("--days", type=int, default=pki.DEFAULT_CA_DAYS, help="validity in days")
    ca.add_argument("--force", action="store_true", help="replace an existing CA")

    for name, purpose in (("server", "a hub's wss:// listener"), ("client", "a hub's peer links")):
        sub = add(name, _cmd_leaf, f"issue a certificate for {purpose}, signed by the CA in DIR")
        sub.add_argument("--dir", default=DEFAULT_DIR, type=Path,
                         help=f"directory holding ca.pem and ca.key (default: {DEFAULT_DIR})")
        sub.add_argument("--hub-id", required=True, help="the hub's id (certificate CN, file names)")
        if name == "server":
            sub.add_argument(
                "--san",
                action="append",
                metavar="DNS_OR_IP",
                help="subject alternative name, repeatable (default: localhost, 127.0.0.1)",
            )
        sub.add_argument("--days", type=int, default=pki.DEFAULT_LEAF_DAYS, help="validity in days")
        sub.add_argument(
            "--key",
            type=Path,
            help="reuse this private key (re-issue keeping the spki-sha256 pin)",
        )
        sub.add_argument("--force", action="store_true", help="replace existing files")
        sub.add_argument(
            "--private-cert",
            action="store_true",
            help="write the certificate owner-only (0600) as well as the key",
        )
        sub.set_defaults(role=name)

    pin = add("pin", _cmd_pin, "print the sha256 and spki-sha256 pins of a PEM or DER certificate")
    pin.add_argument("file", type=Path, help="certificate file")

    setup = add(
        "peer-setup",
        _cmd_peer_setup,
        "CA (reused if DIR has one) plus server and client certificates for each hub",
    )
    setup.add_argument("--dir", default=DEFAULT_DIR, type=Path,
                       help=f"directory for the PKI files (default: {DEFAULT_DIR})")
    setup.add_argument(
        "--hub-id", required=True, action="append", dest="hub_ids", metavar="ID",
        help="a hub to set up, repeatable",
    )
    setup.add_argument(
        "--san",
        action="append",
        metavar="DNS_OR_IP",
        help="SAN for every server certificate, repeatable (default: localhost, 127.0.0.1)",
    )
    setup.add_argument("--days", type=int, default=pki.DEFAULT_LEAF_DAYS, help="leaf validity in days")
    setup.add_argument("--force", action="store_true", help="replace existing hub certificates")

    fetch = add(
        "fetch",
        _cmd_fetch,
        "connect to a hub's wss:// listener and print every certificate it presents, with pins",
    )
    fetch.add_argument("url", metavar="URL", help="wss://HOST:PORT/ (or https://), as in --message-peer")
    fetch.add_argument(
        "--timeout", type=float, default=chain_fetch.DEFAULT_TIMEOUT_SECONDS, metavar="SECONDS",
        help="give up after this long: resolving, connecting and the TLS handshake together "
             f"(default: {chain_fetch.DEFAULT_TIMEOUT_SECONDS:g})",
    )
    return parser


# --- subcommands ------------------------------------------------------------


def _cmd_ca(args: argparse.Namespace) -> dict[str, Any]:
    directory = _ensure_dir(args.dir)
    cert_path, key_path = directory / pki.CA_CERT_FILE, directory / pki.CA_KEY_FILE
    if not args.force:
        _refuse_existing([cert_path, key_path])
    ca = pki.make_ca(name=args.name, days=args.days)
    # Key first: a ca.pem without its key would look like a usable CA.
    pki.write_private_key(key_path, ca.key, overwrite=args.force)
    # owner-only: a serving policy's client_ca_file must be (policies/README.md)
    pki.write_certificate(cert_path, ca.certificate, mode=pki.KEY_FILE_MODE,
                          overwrite=args.force)
    return {
        "ca_cert": str(cert_path),
        "ca_key": str(key_path),
        "name": args.name,
        "not_after": _date(ca.certificate),
        "pins": pins_for_certificate(pki.certificate_pem(ca.certificate)).as_dict(),
    }


def _cmd_leaf(args: argparse.Namespace) -> dict[str, Any]:
    ca = pki.load_ca(args.dir)
    directory = Path(args.dir)
    return _issue(
        ca,
        directory,
        args.role,
        args.hub_id,
        sans=getattr(args, "san", None),
        days=args.days,
        key_file=args.key,
        force=args.force,
        cert_mode=pki.KEY_FILE_MODE if args.private_cert else pki.CERT_FILE_MODE,
    )


def _issue(
    ca: pki.CertificateAuthority,
    directory: Path,
    role: str,
    hub_id: str,
    *,
    sans: list[str] | None,
    days: int,
    key_file: Path | None,
    force: bool,
    cert_mode: int = pki.CERT_FILE_MODE,
) -> dict[str, Any]:
    names = pki.server_file_names(hub_id) if role == "server" else pki.client_file_names(hub_id)
    cert_path, key_path = directory / names[0], directory / names[1]
    key = pki.load_private_key(key_file) if key_file is not None else None
    # Re-issuing with --key pointing at the existing key file leaves that file alone.
    key_in_place = key_file is not None and _same_file(key_file, key_path)
    outputs = [cert_path] if key_in_place else [cert_path, key_path]
    if not force:
        _refuse_existing(outputs)
    if role == "server":
        issued = pki.make_server_certificate(
            ca, hub_id, sans=sans or pki.DEFAULT_SANS, days=days, key=key
        )
    else:
        issued = pki.make_client_certificate(ca, hub_id, days=days, key=key)
    if not key_in_place:
        pki.write_private_key(key_path, issued.key, overwrite=force)
    pki.write_certificate(cert_path, issued.certificate, mode=cert_mode, overwrite=force)
    result: dict[str, Any] = {
        "role": role,
        "hub_id": hub_id,
        "cert": str(cert_path),
        "key": str(key_path),
        "key_reused": key_file is not None,
        "not_after": _date(issued.certificate),
        "pins": pins_for_certificate(pki.certificate_pem(issued.certificate)).as_dict(),
    }
    if role == "server":
        result["sans"] = [_san_text(name) for name in pki.parse_sans(sans or pki.DEFAULT_SANS)]
    return result


def _cmd_pin(args: argparse.Namespace) -> dict[str, Any]:
    pins = pins_for_file(args.file)
    return {"file": str(args.file), **pins.as_dict()}


def _cmd_peer_setup(args: argparse.Namespace) -> dict[str, Any]:
    hub_ids = list(dict.fromkeys(args.hub_ids))
    result = peer_setup(args.dir, hub_ids, {hub_id: args.san for hub_id in hub_ids},
                        days=args.days, force=args.force)
    for hub in result["hubs"]:
        hub["flags"] = _hub_flags(hub, result["hubs"], Path(result["ca_cert"]))
    return result


def peer_setup(directory: Path, hub_ids: list[str], sans: dict[str, list[str] | None], *,
               days: int = pki.DEFAULT_LEAF_DAYS, force: bool = False) -> dict[str, Any]:
    """The CA in `directory` (made owner-only if absent, else reused) and a
    server and a client certificate for each hub; `sans` gives each hub's
    server certificate its names (None: the defaults). PkiError before
    anything is written when an argument or an existing file is refused."""
    for hub_id in hub_ids:
        pki.validate_hub_id(hub_id)
        pki.parse_sans(sans.get(hub_id) or pki.DEFAULT_SANS)  # fail before writing anything
    directory = _ensure_dir(directory)
    if not force:
        existing = []
        for hub_id in hub_ids:
            existing += [directory / n for n in pki.server_file_names(hub_id)]
            existing += [directory / n for n in pki.client_file_names(hub_id)]
        _refuse_existing(existing)

    ca_cert_path = directory / pki.CA_CERT_FILE
    ca_key_path = directory / pki.CA_KEY_FILE
    # An existing CA is reused, never replaced: replacing it would silently
    # invalidate every certificate it already signed for other hubs.
    ca_created = not ca_cert_path.exists() and not ca_key_path.exists()
    if ca_created:
        ca = pki.make_ca()
        pki.write_private_key(ca_key_path, ca.key)
        # owner-only like the key: a serving policy's client_ca_file must be
        # (policies/README.md, "File rules"), and this is the file it names
        pki.write_certificate(ca_cert_path, ca.certificate, mode=pki.KEY_FILE_MODE)
    else:
        ca = pki.load_ca(directory)

    hubs = []
    for hub_id in hub_ids:
        server = _issue(ca, directory, "server", hub_id, sans=sans.get(hub_id), days=days,
                        key_file=None, force=force)
        client = _issue(ca, directory, "client", hub_id, sans=None, days=days,
                        key_file=None, force=force)
        hubs.append({"hub_id": hub_id, "server": server, "client": client})
    return {
        "dir": str(directory),
        "ca_cert": str(ca_cert_path),
        "ca_key": str(ca_key_path),
        "ca_created": ca_created,
        "hubs": hubs,
    }


def _cmd_fetch(args: argparse.Namespace) -> dict[str, Any]:
    chain = chain_fetch.fetch_chain(args.url, timeout=args.timeout)
    return {
        "url": chain.target.url,
        "host": chain.target.host,
        "port": chain.target.port,
        "address": chain.address,
        "tls_version": chain.tls_version,
        "certificates": [
            {
                "position": position,
                "subject": certificate.subject,
                "issuer": certificate.issuer,
                "not_before": certificate.not_before,
                "not_after": certificate.not_after,
                "is_ca": certificate.is_ca,
                **certificate.pins.as_dict(),
            }
            for position, certificate in enumerate(chain.certificates)
        ],
    }


def _hub_flags(hub: dict[str, Any], hubs: list[dict[str, Any]], ca_cert: Path) -> dict[str, Any]:
    """What hub `hub` needs to serve and to reach/accept each other hub.

    Flag names follow the reference hub's, which hubd mirrors for peering.
    """
    serve = [
        f"--tls-certfile {hub['server']['cert']}",
        f"--tls-keyfile {hub['server']['key']}",
    ]
    peers = [other for other in hubs if other["hub_id"] != hub["hub_id"]]
    connect: list[str] = []
    if peers:
        connect += [
            f"--multihub-client-certfile {hub['client']['cert']}",
            f"--multihub-client-keyfile {hub['client']['key']}",
        ]
    for other in peers:
        peer_id = other["hub_id"]
        connect += [
            f"--message-peer {peer_id}=wss://<{peer_id}-host>:<{peer_id}-port>/",
            f"--message-peer-pin {peer_id}={other['server']['pins']['sha256']}",
        ]
    accept = {
        other["hub_id"]: other["client"]["pins"]["sha256"] for other in peers
    }
    return {
        "serve": serve,
        "client_ca_file": str(ca_cert),
        "connect": connect,
        "accept_certificate_pins": accept,
    }


# --- helpers ----------------------------------------------------------------


def _ensure_dir(directory: Path) -> Path:
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise PkiError(f"{directory} exists and is not a directory")
    try:
        # 0700: the directory holds private keys.
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise PkiError(f"cannot create directory {directory}: {exc.strerror or exc}") from None
    return directory


def _refuse_existing(paths: list[Path]) -> None:
    existing = [str(path) for path in paths if path.exists()]
    if existing:
        raise PkiError(f"refusing to overwrite {', '.join(existing)} (use --force to replace)")


def _same_file(a: Path, b: Path) -> bool:
    try:
        return Path(a).resolve() == Path(b).resolve() or (
            Path(b).exists() and Path(a).samefile(b)
        )
    except OSError:
        return False


def _date(certificate) -> str:
    return certificate.not_valid_after_utc.strftime("%Y-%m-%dT%H:%M:%SZ")


def _san_text(name) -> str:
    return f"IP:{name.value}" if isinstance(name, x509.IPAddress) else f"DNS:{name.value}"


# --- text output ------------------------------------------------------------


def _render_text(command: str, result: dict[str, Any]) -> str:
    if command == "ca":
        return "\n".join([
            f"CA certificate: {result['ca_cert']}",
            f"CA key:         {result['ca_key']} (0600, keep it private)",
            f"name:           {result['name']}",
            f"expires:        {result['not_after']}",
        ])
    if command in ("server", "client"):
        return _render_leaf(result)
    if command == "pin":
        return f"sha256:      {result['sha256']}\nspki-sha256: {result['spki_sha256']}"
    if command == "peer-setup":
        return _render_peer_setup(result)
    if command == "fetch":
        return _render_fetch(result)
    return json.dumps(result, indent=2)


def _render_leaf(result: dict[str, Any]) -> str:
    lines = [
        f"{result['role']} certificate for {result['hub_id']}: {result['cert']}",
        f"key: {result['key']} (0600){' (reused)' if result['key_reused'] else ''}",
        f"expires: {result['not_after']}",
    ]
    if "sans" in result:
        lines.append(f"SANs: {', '.join(result['sans'])}")
    lines += [
        f"sha256 pin:      {result['pins']['sha256']}",
        f"spki-sha256 pin: {result['pins']['spki_sha256']}",
    ]
    return "\n".join(lines)


def _render_fetch(result: dict[str, Any]) -> str:
    certificates = result["certificates"]
    count = len(certificates)
    lines = [
        f"{result['url']} ({result['address']}, {result['tls_version']}) presented "
        f"{count} certificate{'s' if count != 1 else ''}:",
    ]
    for certificate in certificates:
        role = "leaf" if certificate["position"] == 0 else ("CA" if certificate["is_ca"] else "chain")
        lines += [
            "",
            f"[{certificate['position']}] {role}: {certificate['subject']}",
            f"    issuer:          {certificate['issuer']}",
            f"    valid:           {certificate['not_before']} .. {certificate['not_after']}",
            f"    sha256 pin:      {certificate['sha256']}",
            f"    spki-sha256 pin: {certificate['spki_sha256']}",
        ]
    leaf = certificates[0]
    lines += [
        "",
        "Peer links check the leaf [0]: pin one of its pins, e.g.",
        f"    --message-peer-pin PEER={leaf['sha256']}",
        "  (spki-sha256 survives a re-issue on the same key). Before trusting it, compare it",
        "  with the pin the peer's operator printed (`hubd certs pin`): whoever answered this",
        "  connection chose what it presented.",
    ]
    return "\n".join(lines)


def _render_peer_setup(result: dict[str, Any]) -> str:
    ca_state = "created" if result["ca_created"] else "reused"
    lines = [f"CA ({ca_state}): {result['ca_cert']}", "", "pins:"]
    header = ("hub", "certificate", "sha256 pin", "spki-sha256 pin")
    rows = []
    for hub in result["hubs"]:
        for role in ("server", "client"):
            pins = hub[role]["pins"]
            rows.append((hub["hub_id"], role, pins["sha256"], pins["spki_sha256"]))
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        lines.append("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
    for hub in result["hubs"]:
        flags = hub["flags"]
        lines += ["", f"hub {hub['hub_id']}:", "  serve wss:// with:"]
        lines += [f"    {flag}" for flag in flags["serve"]]
        lines.append(f"  client CA (serving policy client_ca_file): {flags['client_ca_file']}")
        if flags["connect"]:
            lines.append("  reach its peers with:")
            lines += [f"    {flag}" for flag in flags["connect"]]
        for peer_id, pin in flags["accept_certificate_pins"].items():
            lines.append(f"  accept forwards from {peer_id}: certificate_pins [\"{pin}\"]")
    lines += ["", "`hubd site setup` writes these certificates and, besides, every hub's serving "
                  "policy, federation store, pin files and config file (docs/operations.md)."]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

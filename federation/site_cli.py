"""`hubd site setup`: everything two or more federated hubs need, in one folder.

    hubd site setup --hub east --hub west
    hubd --config sites/east/hubd.toml
    hubd --config sites/west/hubd.toml

writes (DIR is --dir, `sites` by default):

    DIR/pki/        the CA (key included) and every hub's certificates; stays here
    DIR/public/     ca.pem, world-readable: agents' SSL_CERT_FILE, Prometheus
    DIR/HUB/        all HUB needs and nothing of another hub's keys, owner-only:
        hubd.toml               its config file (`hubd --config DIR/HUB/hubd.toml`)
        HUB-server.pem/.key     its wss:// listener
        HUB-client.pem/.key     its identity on its links to the other hubs
        serving-policy.json     grants every other hub the namespaces
        federation.json         every other hub's client certificate pins
        client-ca.pem           the CA of those client certificates
        pins/PEER.pins          each other hub's server certificate pins

A hub given as `ID` is on this machine (wss://127.0.0.1:8876/, then 8877, ...);
`ID=wss://HOST:PORT/` is the URL the other hubs dial, and HOST is also a name
in its server certificate. A re-run makes certificates only for hubs that
have none, and keeps every file that exists (an operator may have edited a
pin file or a store); --refresh rewrites the hub folders from DIR/pki.
docs/operations.md, "Sites with hubd site setup", is the user's page;
federation/site.py decides each document.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from . import pki, site
from .certs_cli import peer_setup
from .pins import pins_for_file
from .pki import PkiError
from .site import SiteError, SiteHub

PROG = "hubd site"
DEFAULT_DIR = Path("sites")
PUBLIC_FOLDER = "public"


def main(argv: Sequence[str]) -> int:
    parser = _parser()
    args = parser.parse_args(list(argv))
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        result = setup(args)
    except (SiteError, PkiError, OSError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=2) if args.json else render(result))
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description="Set up federated hubs.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    s = commands.add_parser(
        "setup", help="certificates, serving policies, federation stores, pin files and a "
        "config file for each of two or more hubs that forward to each other",
        description="Write everything two or more federated hubs need into one folder, for "
                    "both directions: certificates, serving policies, federation stores, pin "
                    "files and a config file per hub (`hubd --config`); print the pins and the "
                    "start commands. docs/operations.md, \"Sites with hubd site setup\".")
    s.add_argument("--hub", action="append", required=True, metavar="ID[=wss://HOST:PORT/]",
                   help="a hub, repeatable: ID alone is on this machine (wss://127.0.0.1:8876/, "
                        "8877, ...); with a URL, the URL the other hubs dial")
    s.add_argument("--dir", type=Path, default=DEFAULT_DIR,
                   help=f"output folder (default: ./{DEFAULT_DIR})")
    s.add_argument("--namespace", action="append", default=[], metavar="NS",
                   help="a namespace every hub lets every other hub address, repeatable "
                        f"(default: {', '.join(site.DEFAULT_NAMESPACES)})")
    s.add_argument("--namespace-owner", action="append", default=[], metavar="NS=HUB",
                   help="namespace NS is owned by HUB (repeatable): every hub gets the map, "
                        "claim routes to the owners and watches of its peers")
    s.add_argument("--san", action="append", default=[], metavar="DNS_OR_IP",
                   help="another name of every server certificate, repeatable (each already "
                        "has localhost, 127.0.0.1 and the host of its URL)")
    s.add_argument("--db", metavar="PATH",
                   help="every hub's journal (default: hubd.db in its own folder; a relative "
                        "path is beside each config file); compose gives /var/lib/hubd/hubd.db, "
                        "each container its own volume")
    s.add_argument("--days", type=int, default=pki.DEFAULT_LEAF_DAYS,
                   help="certificate validity in days")
    s.add_argument("--owner", metavar="UID[:GID]",
                   help="hand the hub folders to this user (root only): the user the hubs run "
                        "as, since hubd refuses policy files another user owns")
    s.add_argument("--refresh", action="store_true",
                   default=os.environ.get("HUBD_SITE_REFRESH") == "1",
                   help="rewrite existing files in the hub folders from DIR/pki (default: keep "
                        "them; HUBD_SITE_REFRESH=1 in the environment sets it, e.g. "
                        "`docker compose run --rm -e HUBD_SITE_REFRESH=1 certs`)")
    s.add_argument("--json", action="store_true", help="print the result as JSON")
    return parser


def setup(args: argparse.Namespace) -> dict[str, Any]:
    hubs = site.parse_hubs(args.hub)
    owners = site.parse_owners(args.namespace_owner, hubs)
    namespaces = site.granted_namespaces(args.namespace, owners)
    owner = _owner(args.owner)
    pki.validate_days(args.days)
    for hub in hubs:  # before anything is written
        pki.parse_sans(site.server_sans(hub, args.san))
    root = Path(args.dir)
    root.mkdir(parents=True, exist_ok=True)
    folder = root / "pki"
    made = _certificates(folder, hubs, args.san, args.days)
    os.chmod(folder, 0o700)  # the CA key stays with whoever runs this, never in a hub folder

    files = {hub.hub_id: _cert_files(folder, hub.hub_id) for hub in hubs}
    server_pins = {h: _pins(files[h]["server.pem"]) for h in files}
    client_pins = {h: _pins(files[h]["client.pem"]) for h in files}
    ca_pem = (folder / pki.CA_CERT_FILE).read_bytes()
    writer = _Writer(args.refresh, owner)
    now = int(time.time())
    for hub in hubs:
        home = root / hub.hub_id
        peers = [other.hub_id for other in hubs if other.hub_id != hub.hub_id]
        writer.folder(home)
        writer.folder(home / site.PINS_FOLDER)
        for name, source in files[hub.hub_id].items():
            writer.file(home / source.name, source.read_bytes(),
                        0o600 if name.endswith(".key") else 0o644)
        writer.file(home / site.CLIENT_CA_FILE, ca_pem)
        writer.text(home / site.STORE_FILE, site.json_text(site.federation_store(
            {peer: client_pins[peer] for peer in peers}, namespaces, now)))
        writer.text(home / site.POLICY_FILE, site.json_text(site.serving_policy(peers,
                                                                                 namespaces)))
        for peer in peers:
            writer.text(home / site.PINS_FOLDER / f"{peer}.pins",
                        site.pin_file(peer, server_pins[peer]))
        writer.text(home / site.CONFIG_FILE, site.config_file(hub, hubs, owners, args.db))
    public = _Writer(args.refresh, None)
    public.folder(root / PUBLIC_FOLDER, 0o755)
    public.file(root / PUBLIC_FOLDER / pki.CA_CERT_FILE, ca_pem, 0o644)
    return {
        "dir": str(root), "pki": str(folder), "certificates_made_for": made,
        "namespaces": namespaces, "namespace_owners": owners,
        "ca_for_agents": str(root / PUBLIC_FOLDER / pki.CA_CERT_FILE),
        "hubs": [{"hub_id": hub.hub_id, "url": hub.url, "on_this_machine": hub.loopback,
                  "folder": str(root / hub.hub_id),
                  "config": str(root / hub.hub_id / site.CONFIG_FILE),
                  "start": f"hubd --config {shlex.quote(str(root / hub.hub_id / site.CONFIG_FILE))}",
                  "server_pins": server_pins[hub.hub_id], "client_pins": client_pins[hub.hub_id]}
                 for hub in hubs],
        "written": [str(p) for p in writer.written + public.written],
        "kept": [str(p) for p in writer.kept + public.kept],
    }


def _certificates(folder: Path, hubs: list[SiteHub], sans: list[str], days: int) -> list[str]:
    """Certificates for the hubs that have none in `folder`; their ids."""
    missing, partial = [], []
    for hub in hubs:
        present = [path.exists() for path in _cert_files(folder, hub.hub_id).values()]
        if not any(present):
            missing.append(hub)
        elif not all(present):
            partial.append(hub.hub_id)
    if partial:
        raise SiteError(f"{folder} holds only some of the certificate files of "
                        f"{', '.join(partial)}; remove them (or issue the rest with `hubd certs "
                        "server/client --dir`) and run again")
    if missing:
        peer_setup(folder, [hub.hub_id for hub in missing],
                   {hub.hub_id: site.server_sans(hub, sans) for hub in missing}, days=days)
    return [hub.hub_id for hub in missing]


def _cert_files(folder: Path, hub_id: str) -> dict[str, Path]:
    server, server_key = pki.server_file_names(hub_id)
    client, client_key = pki.client_file_names(hub_id)
    return {"server.pem": folder / server, "server.key": folder / server_key,
            "client.pem": folder / client, "client.key": folder / client_key}


def _pins(path: Path) -> list[str]:
    pins = pins_for_file(path)
    return [pins.sha256, pins.spki_sha256]


def _owner(text: str | None) -> tuple[int, int] | None:
    if not text:
        return None
    uid, _, gid = text.partition(":")
    try:
        owner = int(uid), int(gid or uid)
    except ValueError:
        raise SiteError(f"--owner expects UID[:GID] as numbers, got {text!r}") from None
    if os.geteuid() != 0 and owner[0] != os.geteuid():
        raise SiteError(f"--owner {text}: only root may hand files to another user "
                        f"(running as uid {os.geteuid()})")
    return owner


class _Writer:
    """Writes files atomically with their final mode (owner-only unless told),
    keeping existing ones unless refreshing, never through a symbolic link."""

    def __init__(self, refresh: bool, owner: tuple[int, int] | None):
        self.refresh = refresh
        self.owner = owner
        self.written: list[Path] = []
        self.kept: list[Path] = []

    def _own(self, path: Path) -> None:
        if self.owner is not None:
            os.chown(path, *self.owner, follow_symlinks=False)

    def folder(self, path: Path, mode: int = 0o700) -> None:
        if path.is_symlink():
            raise SiteError(f"{path} is a symbolic link; hubd reads its files only through "
                            "real folders")
        path.mkdir(parents=True, exist_ok=True)
        os.chmod(path, mode)
        self._own(path)

    def text(self, path: Path, text: str) -> None:
        self.file(path, text.encode())

    def file(self, path: Path, data: bytes, mode: int = 0o600) -> None:
        if path.is_symlink():
            raise SiteError(f"{path} is a symbolic link; hubd refuses files reached through "
                            "links")
        if path.exists() and not self.refresh:
            self.kept.append(path)
            return
        temporary = path.with_name(f".{path.name}.tmp")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.chmod(temporary, mode)
        self._own(temporary)
        os.replace(temporary, path)
        self.written.append(path)


def render(result: dict[str, Any]) -> str:
    made = result["certificates_made_for"]
    lines = [f"{PROG} setup: {len(result['hubs'])} hubs in {result['dir']}/ (certificates made "
             f"for: {', '.join(made) if made else 'none, all existed'}; "
             f"{len(result['written'])} files written, {len(result['kept'])} kept as they were"
             f"{'; --refresh rewrites them' if result['kept'] else ''})",
             f"every hub grants every other the namespaces: {', '.join(result['namespaces'])}",
             "", "pins (sha256 of the certificate, then spki-sha256 of its key):"]
    for hub in result["hubs"]:
        lines += [f"  {hub['hub_id']} server: {hub['server_pins'][0]}",
                  f"  {hub['hub_id']} client: {hub['client_pins'][0]}"]
    lines += ["", "start each hub:"]
    width = max(len(hub["start"]) for hub in result["hubs"])
    for hub in result["hubs"]:
        lines.append(f"  {hub['start'].ljust(width)}   # {hub['url']}")
    away = [hub for hub in result["hubs"] if not hub["on_this_machine"]]
    if away:
        lines += ["", "a hub on another machine: copy its folder there first, keeping it owner-only",
                  f"  (e.g. scp -rp {away[0]['folder']} HOST:), then start it there with "
                  f"`hubd --config {Path(away[0]['folder']).name}/{site.CONFIG_FILE}`;",
                  f"  {result['pki']}/ holds the CA key and never leaves this machine"]
    lines += ["", "agents connect over wss:// and trust the hubs' certificates with",
              f"  SSL_CERT_FILE={result['ca_for_agents']}"]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

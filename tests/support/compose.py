"""Run a compose file's hubd services without docker, for tests.

`ComposeProject` reads compose/docker-compose.yml (or another compose file)
and turns each service into what a test can start as a process:

* the command, with its program mapped to this checkout (`hubd` is
  `python -m hubd`);
* its environment, exactly as the compose file gives it (plus PATH and
  PYTHONPATH so this checkout is the one imported);
* its mounts, each mapped to a folder under one temporary root: a bind mount
  `./certs/east:/etc/hubd` becomes ROOT/binds/certs/east, a named volume
  `east-journal:/var/lib/hubd` ROOT/volumes/east-journal; every argument that
  names a path under a mount target is rewritten to the mapped folder, and so
  is every value of a hub's config file (`--config`: a rewritten copy is
  written beside it, so its relative paths still resolve there);
* its networks, for `Topology.network()` (one shared segment per compose
  network, each on a documentation subnet);
* compose service names in URIs (`wss://west:8876/`) rewritten to the address
  the named service has on a network it shares with the caller, as docker's
  per-network DNS would answer.

What docker does and this does not: image build, read-only root, capability
drops, restart policies, healthchecks, published ports. The image's user is
read from compose/Dockerfile (ARG HUBD_UID) so tests can run hubs as that
uid when this interpreter allows it.
"""

from __future__ import annotations

import ipaddress
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
COMPOSE_DIR = REPO / "compose"
PROGRAMS = {
    "hubd": [sys.executable, "-m", "hubd"],
    "hubd-journal-backup": [sys.executable, str(COMPOSE_DIR / "bin" / "hubd-journal-backup")],
}
# Subnets handed to compose networks, in order: documentation ranges only.
SUBNETS = [str(n) for base in ("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24")
           for n in ipaddress.ip_network(base).subnets(new_prefix=26)]
_URI_HOST = re.compile(r"((?:wss?|https?)://)([A-Za-z0-9_.-]+)(?=[:/]|$)")


def image_user() -> tuple[int, int]:
    """The uid/gid compose/Dockerfile runs hubd as (its HUBD_UID/HUBD_GID defaults)."""
    text = (COMPOSE_DIR / "Dockerfile").read_text()
    uid = int(re.search(r"^ARG HUBD_UID=(\d+)", text, re.M).group(1))
    gid = int(re.search(r"^ARG HUBD_GID=(\d+)", text, re.M).group(1))
    return uid, gid


@dataclass
class Mount:
    source: str  # as written (./path or a volume name)
    target: str
    host: Path  # where the test keeps it
    named: bool


@dataclass
class Service:
    name: str
    spec: dict
    command: list[str]
    environment: dict[str, str]
    mounts: list[Mount]
    networks: list[str]
    user: str | None

    @property
    def program(self) -> str:
        return self.command[0] if self.command else ""


@dataclass
class ComposeProject:
    path: Path
    root: Path  # temporary root for mounts
    document: dict = field(init=False)
    services: dict[str, Service] = field(init=False)

    def __post_init__(self) -> None:
        self.document = yaml.safe_load(self.path.read_text())
        self.services = {name: self._service(name, spec)
                         for name, spec in self.document["services"].items()}

    # -- reading

    def _service(self, name: str, spec: dict) -> Service:
        command = spec.get("command") or []
        if isinstance(command, str):
            command = command.split()
        entrypoint = spec.get("entrypoint")
        if entrypoint:
            command = ([entrypoint] if isinstance(entrypoint, str) else list(entrypoint)) + command
        env = spec.get("environment") or {}
        if isinstance(env, list):
            env = dict(item.split("=", 1) if "=" in item else (item, os.environ.get(item, ""))
                       for item in env)
        env = {str(k): "" if v is None else str(v) for k, v in env.items()}
        mounts = [self._mount(v) for v in spec.get("volumes") or []]
        networks = spec.get("networks") or []
        if isinstance(networks, dict):
            networks = list(networks)
        if not networks and spec.get("network_mode") is None:
            networks = ["default"]
        return Service(name, spec, [str(a) for a in command], env, mounts, list(networks),
                       spec.get("user"))

    def _mount(self, volume) -> Mount:
        if isinstance(volume, dict):
            source, target = volume.get("source", ""), volume["target"]
        else:
            parts = volume.split(":")
            source, target = parts[0], parts[1]
        named = not source.startswith((".", "/", "~"))
        if named:
            host = self.root / "volumes" / source
        else:
            relative = os.path.normpath(source)
            if os.path.isabs(relative) or relative.startswith(".."):
                raise ValueError(f"bind mount {source!r} leaves the compose folder")
            host = self.root / "binds" / relative
        return Mount(source, target, host, named)

    def hubs(self) -> list[Service]:
        """Services that run a hub, in file order."""
        return [s for s in self.services.values()
                if s.program == "hubd" and s not in self.setup_services()]

    def setup_services(self) -> list[Service]:
        """Services that run `hubd site setup`."""
        return [s for s in self.services.values() if s.command[:3] == ["hubd", "site", "setup"]]

    def networks_of(self, services: list[Service]) -> dict[str, list[str]]:
        """compose network -> member service names, for the given services."""
        out: dict[str, list[str]] = {}
        for s in services:
            for net in s.networks:
                out.setdefault(net, []).append(s.name)
        return out

    # -- mapping to this machine

    def prepare_mounts(self, service: Service, owner: tuple[int, int] | None = None) -> None:
        """Create the mapped folders; named volumes get the image user's ownership,
        as docker copies the image folder's owner into a new volume."""
        for m in service.mounts:
            m.host.mkdir(parents=True, exist_ok=True)
            if m.named and owner is not None:
                os.chown(m.host, *owner)

    def map_paths(self, service: Service, arg: str) -> str:
        for m in sorted(service.mounts, key=lambda m: len(m.target), reverse=True):
            pattern = r"(^|[=@])" + re.escape(m.target.rstrip("/")) + r"(?=/|$)"
            arg = re.sub(pattern, lambda match: match.group(1) + str(m.host), arg)
        return arg

    def map_hosts(self, service: Service, arg: str, address_of) -> str:
        """Rewrite `scheme://SERVICE` in an argument to the service's address."""
        def swap(match: re.Match) -> str:
            host = match.group(2)
            if host not in self.services:
                return match.group(0)
            return match.group(1) + address_of(service.name, host)
        return _URI_HOST.sub(swap, arg)

    def argv(self, service: Service, address_of=None) -> list[str]:
        program = PROGRAMS.get(service.program)
        if program is None:
            raise ValueError(f"service {service.name}: no local mapping for program "
                             f"{service.program!r}")
        args = [self.map_paths(service, a) for a in service.command[1:]]
        if address_of is not None:
            args = [self.map_hosts(service, a, address_of) for a in args]
        return [*program, *[self._localized_config(service, a, address_of) for a in args]]

    def _localized_config(self, service: Service, arg: str, address_of) -> str:
        """`--config=FILE` (already mapped): FILE's values mapped like the
        command line's, in a copy beside it (same owner and mode)."""
        if not arg.startswith("--config="):
            return arg
        import tomllib

        original = Path(arg.split("=", 1)[1])

        def mapped(value):
            if isinstance(value, list):
                return [mapped(item) for item in value]
            if not isinstance(value, str):
                return value
            value = self.map_paths(service, value)
            return self.map_hosts(service, value, address_of) if address_of else value

        document = tomllib.loads(original.read_text())
        copy = original.with_name(f".local-{original.name}")
        copy.write_text("".join(f"{key} = {_toml(mapped(value))}\n"
                                for key, value in document.items()))
        info = original.stat()
        os.chown(copy, info.st_uid, info.st_gid)
        os.chmod(copy, info.st_mode & 0o777)
        return f"--config={copy}"

    def env(self, service: Service) -> dict[str, str]:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(REPO),
               "LANG": "C.UTF-8"}
        env.update({k: self.map_paths(service, v) for k, v in service.environment.items()})
        return env

    def workdir(self, service: Service) -> Path:
        """The image's WORKDIR is the journal volume (/var/lib/hubd)."""
        for m in service.mounts:
            if m.target == "/var/lib/hubd":
                return m.host
        return self.root


def _toml(value) -> str:
    """A TOML value of a config file's kinds (strings, numbers, booleans, lists)."""
    import json

    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(_toml(item) for item in value) + "]"
    return json.dumps(value) if isinstance(value, str) else repr(value)

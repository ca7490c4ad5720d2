"""The `hubd` command line.

`hubd` alone runs one hub on 127.0.0.1:8876 with its journal in ./hubd.db.
Where a feature is the same as the reference hub's, the flag has the same name,
so an operator can move a site without rewriting its command line.
Operator subcommands: `hubd certs ...` (a private PKI and pins), `hubd multihub ...`
(observe a peer's journal, multi-hub authority state, quarantine recovery).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import signal
import sys
from pathlib import Path
from typing import Sequence

import structlog

from hubd import __version__, config_file, logs
from hubd.config_file import ConfigProblems, Layers
from hubd.config import BrokerConfig, HubConfig, broker_files_beside
from federation.config import FederationConfigError, build_federation_config
from hubd.http.host_trust import AuthorityError, parse_advertised
from hubd.evidence_config import evidence_config
from hubd.security_cli import security_config
from hubd.state.claims import LeaseLimits
from hubd.state.dead_letter_escalation import flag_problems as dead_letter_flag_problems
from hubd.state.principals import (SHARED_TOKEN_PRINCIPAL, PrincipalError, check_name,
                                   check_namespace_pattern)
from hubd.state.quota import QuotaLimits
from hubd.state.redsyn import Limits as RedsynLimits
from hubd.timing import Timing, TimingError, read_overrides

from hubd.cli_flags import (SUBCOMMANDS, TIMING, TIMING_FLAGS, WATCH_INTERVAL_FLOOR,  # noqa: F401
                            build_parser)


def timing_from_args(args: argparse.Namespace, problems: list[str]) -> Timing:
    """The timing profile: production's with the public flags' values and the
    --timing file's overrides (a field set by both is refused: which one
    should win is not obvious). A problem found is appended to `problems`."""
    flagged = {}
    for dest, name in TIMING_FLAGS.items():
        value = getattr(args, dest)
        if value is None:
            continue
        if dest == "multihub_watch_interval":
            value = max(value, WATCH_INTERVAL_FLOOR)
        elif not value > 0:
            problems.append(f"--{dest.replace('_', '-')} must be positive")
            continue
        flagged[name] = value
    timing = TIMING
    if args.timing:
        try:
            overrides = read_overrides(Path(args.timing))
            timing = timing.overridden(overrides)
        except TimingError as exc:
            problems.append(f"--timing {args.timing}: {exc}")
            return TIMING
        both = [dest for dest, name in TIMING_FLAGS.items()
                if name in flagged and name in overrides]
        if both:
            problems.append(f"--timing {args.timing} and --{both[0].replace('_', '-')} both "
                            f"set {TIMING_FLAGS[both[0]]}; give it once")
    try:
        return timing.overridden(flagged)
    except TimingError as exc:  # the flags' values together (a cap below its start)
        problems.append(str(exc))
        return TIMING


def _read_secret(path: str, what: str, problems: list[str]) -> str | None:
    try:
        value = Path(path).read_text(encoding="utf-8").strip()
    except OSError as exc:
        problems.append(f"cannot read {what} file {path}: {exc.strerror}")
        return None
    if not value:
        problems.append(f"{what} file {path} is empty")
        return None
    return value


def config_from_args(args: argparse.Namespace, parser: argparse.ArgumentParser) -> HubConfig:
    """hub_config(args), or the parser's exit naming every problem."""
    try:
        return hub_config(args)
    except ConfigProblems as exc:
        parser.error("; ".join(exc.problems))


def hub_config(args: argparse.Namespace) -> HubConfig:
    """The HubConfig the flags say; ConfigProblems names every flag at fault."""
    problems: list[str] = []

    def positive(*names: str) -> None:
        for name in names:
            if not getattr(args, name) > 0:
                problems.append(f"--{name.replace('_', '-')} must be positive")

    token = args.token
    if token is None and args.token_file:
        token = _read_secret(args.token_file, "token", problems)
    metrics_token = args.metrics_token
    if metrics_token is None and args.metrics_token_file:
        metrics_token = _read_secret(args.metrics_token_file, "metrics token", problems)
    positive("durable_ingress_events", "durable_ingress_bytes", "max_msg_kb", "max_clients")
    if args.max_connections_per_host < 0:  # a negative cap would refuse every socket
        problems.append("--max-connections-per-host must be 0 (no cap) or positive")
    positive("durable_ingress_window", "pending_receipts", "snapshot_keep")
    if args.snapshot_every < 0:
        problems.append("--snapshot-every must be 0 or positive")
    if args.checkpoint_every < 0:
        problems.append("--checkpoint-every must be 0 or positive")
    problems.extend(dead_letter_flag_problems(args.dead_letter_escalation_threshold,
                                              args.dead_letter_escalation_window))
    timing = timing_from_args(args, problems)
    advertised = frozenset()
    try:
        advertised = frozenset(parse_advertised(value) for value in args.advertised_host)
    except AuthorityError as exc:
        problems.append(str(exc))
    peer_token = args.message_peer_token
    if peer_token is None and args.message_peer_token_file:
        peer_token = _read_secret(args.message_peer_token_file, "message peer token", problems)
    federation = None
    try:
        federation = build_federation_config(
            message_peers=args.message_peer, message_peer_pins=args.message_peer_pin,
            message_peer_token=peer_token, client_certfile=args.multihub_client_certfile,
            client_keyfile=args.multihub_client_keyfile, forward_ttl=args.message_forward_ttl,
            tls_certfile=args.tls_certfile, tls_keyfile=args.tls_keyfile,
            serving_policy=args.multihub_serving_policy, hub_id=args.hub_id,
            namespace_owners=args.namespace_owner, watches=args.multihub_watch,
            watch_pins=args.multihub_watch_pin, watch_token=args.multihub_watch_token,
            claim_peers=args.claim_peer,
            claim_peer_pins=args.claim_peer_pin, claim_peer_token=args.claim_peer_token,
            relay_peers=args.relay_peer, relay_peer_pins=args.relay_peer_pin,
            relay_peer_token=args.relay_peer_token)
    except FederationConfigError as exc:
        problems.append(str(exc))
    positive("max_claims_per_agent", "max_paths_per_claim", "max_offers_per_agent")
    if args.lease_offline_ttl is not None and args.lease_offline_ttl < 0:
        problems.append("--lease-offline-ttl must not be negative")
    if not 0 < args.lease_min_ttl <= LeaseLimits.default_ttl:
        problems.append(f"--lease-min-ttl must be in (0, {LeaseLimits.default_ttl:g}]")
    positive("redsyn_messages_per_day", "redsyn_max_pending_messages", "redsyn_max_pending_bytes")
    broker = None
    if not args.no_broker:
        broker = _broker_config(args, problems)
    security = security_config(args, token, problems)
    evidence = evidence_config(args, problems)
    if problems:
        raise ConfigProblems(problems)
    claims = LeaseLimits(min_ttl=args.lease_min_ttl,
                         max_claims_per_agent=args.max_claims_per_agent,
                         max_paths_per_claim=args.max_paths_per_claim,
                         offline_ttl=args.lease_offline_ttl)
    redsyn_limits = RedsynLimits(args.redsyn_messages_per_day, args.redsyn_max_pending_messages,
                                 args.redsyn_max_pending_bytes)
    quota = None if args.no_durable_ingress_quota else QuotaLimits(
        args.durable_ingress_events, args.durable_ingress_bytes, args.durable_ingress_window)
    return HubConfig(
        host=args.host, port=args.port, db=Path(args.db), hub_id=args.hub_id, token=token,
        principals_file=Path(args.principals) if args.principals else None,
        open_network=args.open_network,
        max_msg_bytes=args.max_msg_kb * 1024,
        metrics_token=metrics_token, private_directed=args.private_directed_messages,
        quota=quota, max_clients=args.max_clients,
        max_connections_per_host=args.max_connections_per_host, max_history=args.max_history,
        allow_origins=frozenset(args.allow_origin), advertised_hosts=advertised,
        log_format=args.log_format,
        log_level=args.log_level, federation=federation, claims=claims,
        max_offers_per_agent=args.max_offers_per_agent,
        redsyn=not args.no_redsyn,
        redsyn_allow_loopback_webhooks=args.redsyn_allow_loopback_webhooks,
        redsyn_limits=redsyn_limits, broker=broker,
        warn_stale_recipients=args.warn_stale_recipients,
        pending_receipts=args.pending_receipts, timing=timing, security=security,
        dead_letter_escalation_threshold=args.dead_letter_escalation_threshold,
        dead_letter_escalation_window=args.dead_letter_escalation_window,
        snapshot_events=args.snapshot_every, snapshot_keep=args.snapshot_keep,
        checkpoint_events=args.checkpoint_every, evidence=evidence)


def _broker_config(args: argparse.Namespace, problems: list[str]) -> BrokerConfig | None:
    start = len(problems)
    try:
        if check_namespace_pattern(args.broker_namespace) == "*":
            raise PrincipalError("'*' is not a namespace")
    except PrincipalError:
        problems.append("--broker-namespace must be a non-empty name without '/', '@', "
                        "whitespace or glob characters")
    try:
        check_name(args.broker_principal)
        if args.broker_principal == SHARED_TOKEN_PRINCIPAL:
            raise PrincipalError("the shared --token's principal")
    except PrincipalError:
        problems.append("--broker-principal must be a principal's name (letters, digits, "
                        f"'.', '_', '-', '/'), not '{SHARED_TOKEN_PRINCIPAL}'")
    if len(problems) > start:
        return None
    default_socket, default_token = broker_files_beside(Path(args.db))
    return BrokerConfig(
        socket_path=Path(args.broker_socket) if args.broker_socket else default_socket,
        token_file=Path(args.broker_token_file) if args.broker_token_file else default_token,
        namespace=args.broker_namespace, rate_limit=not args.broker_no_rate_limit,
        principal=args.broker_principal)


def load(argv: Sequence[str]) -> tuple[Layers, HubConfig]:
    """The effective flags (defaults < --config FILE < command line) and the
    HubConfig they make; ConfigProblems names every problem found."""
    layers = config_file.layer(build_parser, argv)
    problems = list(layers.problems)
    try:
        config = hub_config(layers.args)
    except ConfigProblems as exc:
        problems += exc.problems
    if problems:
        raise ConfigProblems(problems)
    return layers, config


def owner_only_files(config: HubConfig, layers: Layers) -> list:
    from federation.checks import owner_only_files as federation_files
    from hubd.preflight import owner_only_files as core_files

    return core_files(config, layers) + federation_files(config.federation)


def check(layers: Layers, config: HubConfig) -> int:
    """`hubd --check`: the effective configuration on stdout, exit 0; or
    every problem on stderr, exit 2."""
    from federation.checks import file_problems
    from hubd import preflight
    from hubd.owner_only import survey

    unsafe = survey(owner_only_files(config, layers))
    refusal = unsafe.refusal()
    # a file named there is not read again only to be refused for the same reason
    problems = ([refusal] if refusal else []) + preflight.problems(config, unsafe.paths) + \
        file_problems(config.federation, unsafe.paths)
    if problems:
        return _refuse(problems)
    where = f"{layers.path} and the command line" if layers.path else "the command line"
    timers = {dest.replace("_", "-"): getattr(config.timing, field)
              for dest, field in TIMING_FLAGS.items()}
    print(config_file.render(layers, f"hubd {__version__}: the effective configuration from "
                                     f"{where}\n(source of each value: default, file or flag)",
                             timers), end="")
    scheme = "wss" if config.federation is not None and config.federation.tls_certfile else "ws"
    print(f"# listens on {scheme}://{config.host}:{config.port}/, journal {config.db.resolve()}")
    if config.broker is not None:
        print(f"# broker socket {config.broker.socket_path}, token {config.broker.token_file}")
    return 0


def _refuse(problems: list[str]) -> int:
    for problem in problems:
        print(f"hubd: error: {problem}", file=sys.stderr)
    return 2


class Reloader:
    """SIGHUP. Without --config: the hub re-reads the files its flags name.
    With it: the file is read again under the same command line; a change
    to a key a running hub cannot take (config_file.LIVE_KEYS) refuses the
    whole reload, naming the keys that need a restart."""

    def __init__(self, argv: Sequence[str], layers: Layers):
        self.argv = list(argv)
        self.layers = layers

    async def reload(self, hub) -> None:
        if self.layers.path is None:
            await hub.reload()
            return
        try:
            layers, config = load(self.argv)
        except ConfigProblems as exc:
            hub.refuse_reload("; ".join(exc.problems))
            return
        restart = config_file.restart_needed(config_file.changed_keys(self.layers, layers))
        if restart:
            hub.refuse_reload(f"{layers.path} changes {', '.join(restart)}: "
                              f"{'this needs' if len(restart) == 1 else 'these need'} a restart")
            return
        if await hub.reload(config):
            self.layers = layers


async def serve(config: HubConfig, reloader: Reloader) -> int:
    from hubd import loop_errors
    from hubd.server import HubServer, StartupError

    log = structlog.get_logger("hubd")
    server = HubServer(config)
    loop_errors.install(asyncio.get_running_loop(), server.hub.metrics)
    collect_again()
    try:
        await server.start()
    except StartupError as exc:
        log.error("refusing to start", reason=str(exc))
        return 2
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, server.hub.stop)
    loop.add_signal_handler(signal.SIGHUP, lambda: server.hub.track(
        loop.create_task(reloader.reload(server.hub))))
    return await server.wait()


def collect_again() -> None:
    """Turn the cyclic collector back on (main turned it off for the
    imports). What they made (modules, classes, functions: the process's
    lifetime) is frozen first, so no collection walks it again; the few
    thousand objects of garbage among it stay."""
    if not gc.isenabled():
        gc.freeze()
        gc.enable()


def main(argv: list[str] | None = None) -> int:
    if argv is not None:  # a caller's, in its own process
        return _main(argv)
    # the process's command: a start imports some 600 modules, allocating
    # much and freeing almost nothing, and the cyclic collector's passes over
    # what they made were a tenth of a start (~0.2 s); it is off until the
    # hub is built (before the journal is read: collect_again), or until a
    # command returns (`python -m hubd` turns it off before importing this)
    gc.disable()
    try:
        return _main(sys.argv[1:])
    finally:
        collect_again()


def _main(argv: list[str]) -> int:
    if argv and argv[0] in SUBCOMMANDS:
        import importlib

        collect_again()  # a command's own work (a journal verify replays it all)
        module = importlib.import_module(SUBCOMMANDS[argv[0]][0])
        return module.main(argv[1:])
    try:
        layers, config = load(argv)
    except ConfigProblems as exc:
        return _refuse(exc.problems)
    if layers.args.check:
        return check(layers, config)
    logs.configure(config.log_format, config.log_level)
    from hubd.owner_only import survey

    unsafe = survey(owner_only_files(config, layers)).refusal()
    if unsafe is not None:
        structlog.get_logger("hubd").error("refusing to start", reason=unsafe)
        return 2
    try:
        return asyncio.run(serve(config, Reloader(argv, layers)))
    except KeyboardInterrupt:
        return 130

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
from hubd.config import (BROKER_SOCKET_SUFFIX, BROKER_TOKEN_SUFFIX, DEFAULT_DB, DEFAULT_PORT,
                         DEFAULT_QUOTA_BYTES, DEFAULT_QUOTA_EVENTS, DEFAULT_QUOTA_WINDOW,
                         DEFAULT_SNAPSHOT_EVENTS, DEFAULT_CHECKPOINT_EVENTS, BrokerConfig, HubConfig, broker_files_beside)
from federation.config import FederationConfigError, build_federation_config
from hubd.http.host_trust import AuthorityError, parse_advertised
from hubd.security_cli import add_security_flags, security_config
from hubd.state.claims import LeaseLimits
from hubd.state.principals import (SHARED_TOKEN_PRINCIPAL, PrincipalError, check_name,
                                   check_namespace_pattern)
from hubd.state.quota import QuotaLimits
from hubd.state.receipts import PENDING_RECEIPTS
from hubd.state.redsyn import Limits as RedsynLimits
from hubd.timing import Timing, TimingError, read_overrides

TIMING = Timing()  # the production profile: the flags' defaults
# The flags that set a field of the timing profile (dest -> field). Their
# argparse default is None, so a flag given and a --timing file setting the
# same field can be told apart (and refused together).
TIMING_FLAGS = {
    "auth_timeout": "auth_timeout",
    "recipient_liveness_window": "reaction_window",
    "waiter_liveness_window": "waiter_window",
    "dark_seat_after": "dark_seat_after",
    "roster_timeout": "roster_timeout",
    "multihub_watch_interval": "watch_interval",
    "redsyn_webhook_first_retry": "redsyn_webhook_first_retry",
    "snapshot_interval": "snapshot_interval",
}
# A watch polls a peer at most once a second, whatever the flag says.
WATCH_INTERVAL_FLOOR = 1.0

SUBCOMMANDS = {
    "site": ("federation.site_cli",
             "set up two or more federated hubs: certificates, policies, pins and a config file "
             "for each"),
    "certs": ("federation.certs_cli",
              "make a private CA and hub certificates, print pins, fetch a hub's presented chain"),
    "principal": ("hubd.principal_cli",
                  "principals: who may speak for which seats, their tokens and grants"),
    "redsyn": ("hubd.doors.redsyn.nodes", "REDSYN nodes: make or revoke an HTTP agent's bearer token"),
    "journal": ("hubd.journal_cli", "check a journal and its snapshots (verify)"),
    "multihub": ("federation.multihub_cli",
                 "observe a peer hub's journal, show multi-hub authority state, recover a "
                 "quarantined peer"),
}


class ErrorFirstParser(argparse.ArgumentParser):
    """argparse, but a bad flag is told in one line, first: the usage of 66
    flags is 40 lines, and the error came after them (where a terminal or a
    journalctl excerpt cut it off)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n"
                     f"(`{self.prog} --help` lists every option)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = ErrorFirstParser(
        prog="hubd",
        description="Coordination hub for fleets of AI agents. Without options: one hub on "
                    f"127.0.0.1:{DEFAULT_PORT} with its journal in ./{DEFAULT_DB}.",
        epilog="Operator commands: " + "; ".join(
            f"hubd {name} --help ({text})" for name, (_, text) in SUBCOMMANDS.items()))
    parser.add_argument("--version", action="version", version=f"hubd {__version__}")
    conf = parser.add_argument_group(
        "configuration file", "Every flag below can be a key of a TOML file instead, spelled as "
        "the flag: port = 8877, message-peer = [\"west=wss://...\"], open-network = true; "
        "relative paths resolve beside the file (docs/operations.md, \"Configuration file\").")
    conf.add_argument("--config", metavar="FILE",
                      help="read the flags from this TOML file; flags given on the command line "
                           "override it (a repeatable flag replaces the file's list); SIGHUP "
                           "reads it again")
    conf.add_argument("--check", action="store_true",
                      help="check the configuration (file and flags, and the files they name) "
                           "without starting: print the effective configuration and exit 0, "
                           "or name every problem and exit 2")
    net = parser.add_argument_group("listening")
    net.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback)")
    net.add_argument("--port", type=int, default=DEFAULT_PORT)
    net.add_argument("--allow-origin", action="append", default=[], metavar="ORIGIN",
                     help="admit browser WebSocket handshakes from this exact Origin (repeatable)")
    net.add_argument("--advertised-host", action="append", default=[], metavar="HOST[:PORT]",
                     help="a Host authority clients use to reach this hub, e.g. behind a "
                          "port-forward or reverse proxy (repeatable). On a loopback bind it is "
                          "trusted besides the loopback names; on any other bind the given "
                          "authorities are the only ones trusted. Matched exactly: with a port, "
                          "only that port")
    store = parser.add_argument_group("journal")
    store.add_argument("--db", default=DEFAULT_DB,
                       help=f"SQLite event journal (default: ./{DEFAULT_DB})")
    store.add_argument("--hub-id", metavar="ID",
                       help="stable hub id (default: generated once, then kept in the journal)")
    store.add_argument("--max-history", type=int, default=1000,
                       help="chats kept in memory for history/resume (default 1000)")
    store.add_argument("--snapshot-every", type=int, default=DEFAULT_SNAPSHOT_EVENTS,
                       metavar="EVENTS",
                       help="snapshot the projection once this many events were committed since "
                            "the newest snapshot, so a restart replays only the events after it "
                            f"(default {DEFAULT_SNAPSHOT_EVENTS:,}; 0: never; docs/journal.md)")
    store.add_argument("--snapshot-interval", type=float, metavar="SECONDS",
                       help="at most one snapshot per this many seconds "
                            f"(default {TIMING.snapshot_interval:g})")
    store.add_argument("--snapshot-keep", type=int, default=2, metavar="N",
                       help="snapshots kept beside the journal, the newest (default 2)")
    store.add_argument("--checkpoint-every", type=int, default=DEFAULT_CHECKPOINT_EVENTS,
                       metavar="EVENTS",
                       help="sign the journal's hash-chain head at least once per this many "
                            f"events, and at every snapshot (default {DEFAULT_CHECKPOINT_EVENTS:,};"
                            " 0: only at snapshots; docs/journal.md)")
    auth = parser.add_argument_group("authentication")
    auth.add_argument("--token", help="shared-secret connect token (off by default)")
    auth.add_argument("--token-file", help="read the connect token from this file")
    auth.add_argument("--principals", metavar="FILE",
                      help="principals from this owner-only JSON file, re-read on SIGHUP, "
                           "instead of the journal's (docs/identity.md)")
    auth.add_argument("--open-network", action="store_true",
                      help="with no --token and no principals, admit agents from any address "
                           "(default: loopback only)")
    auth.add_argument("--auth-timeout", type=float, metavar="SECONDS",
                      help="seconds a new socket has to send its first frame "
                           f"(default {TIMING.auth_timeout:g})")
    auth.add_argument("--metrics", action="store_true",
                      help="accepted for compatibility: /health and /metrics are always on")
    auth.add_argument("--metrics-token", help="bearer token required by /health and /metrics")
    auth.add_argument("--metrics-token-file", help="read the metrics token from this file")
    routing = parser.add_argument_group("routing and limits")
    routing.add_argument("--private-directed-messages", action="store_true",
                         help="send a directed chat only to its recipients (and their -rx "
                              "sidecars) instead of to every socket")
    routing.add_argument("--max-msg-kb", type=int, default=1024,
                         help="largest inbound frame in KiB (default 1024)")
    routing.add_argument("--max-clients", type=int, default=4096)
    routing.add_argument("--max-connections-per-host", type=int, default=0,
                         help="sockets admitted per remote host; 0 = no cap (default)")
    routing.add_argument("--durable-ingress-events", type=int, default=DEFAULT_QUOTA_EVENTS,
                         help=f"chats per principal per window (default {DEFAULT_QUOTA_EVENTS})")
    routing.add_argument("--durable-ingress-bytes", type=int, default=DEFAULT_QUOTA_BYTES,
                         help="chat bytes per principal per window (default 64 MiB)")
    routing.add_argument("--durable-ingress-window", type=float, default=DEFAULT_QUOTA_WINDOW,
                         help=f"quota window in seconds (default {DEFAULT_QUOTA_WINDOW:g})")
    routing.add_argument("--no-durable-ingress-quota", action="store_true",
                         help="turn the per-principal ingress quota off")
    receipts = parser.add_argument_group("receipts (docs/receipts.md)")
    stale = receipts.add_mutually_exclusive_group()
    stale.add_argument("--warn-stale-recipients", dest="warn_stale_recipients",
                       action="store_true", default=True,
                       help="judge directed recipients by consume-live liveness: a match with "
                            "no fresh reaction and no live -rx waiter is stale, and a chat "
                            "that reaches only stale ones is no_live_recipient (default)")
    stale.add_argument("--no-warn-stale-recipients", dest="warn_stale_recipients",
                       action="store_false",
                       help="compatibility: every socket match counts as live")
    receipts.add_argument("--recipient-liveness-window", type=float, metavar="SECONDS",
                          help="a recipient is live this long after it registered or sent a "
                               "frame other than a heartbeat "
                               f"(default: {TIMING.reaction_window:g})")
    receipts.add_argument("--waiter-liveness-window", type=float, metavar="SECONDS",
                          help="an -rx waiter vouches for its seat this long after its last "
                               f"frame, keepalives included (default: {TIMING.waiter_window:g})")
    receipts.add_argument("--pending-receipts", type=int, default=PENDING_RECEIPTS,
                          metavar="N", help="negative receipts awaiting a mailbox ack; the "
                          "oldest past N is settled expired and told to its sender "
                          "(default: 4096)")
    receipts.add_argument("--dark-seat-after", type=float, metavar="SECONDS",
                          help="how long a seat owning live work may lack a fresh -rx waiter "
                               f"before its dark_seat_alert (default: {TIMING.dark_seat_after:g})")
    fed = parser.add_argument_group(
        "federation", "Forward chats to seats on peer hubs (PROJECT/seat@HUB) and serve peers. "
        "Same flags and files as the reference hub; see policies/README.md.")
    fed.add_argument("--tls-certfile", help="PEM certificate chain: serve wss:// natively")
    fed.add_argument("--tls-keyfile", help="PEM private key for --tls-certfile")
    fed.add_argument("--multihub-serving-policy", metavar="FILE",
                     help="owner-only v1 serving policy: which peer hubs may forward to this "
                          "hub, for which namespaces (needs --tls-certfile)")
    fed.add_argument("--message-peer", action="append", default=[], metavar="HUB_ID=URI",
                     help="forward chats for PROJECT/seat@HUB_ID to this peer (repeatable)")
    fed.add_argument("--message-peer-pin", action="append", default=[],
                     metavar="HUB_ID=sha256:HEX",
                     help="accept the peer's wss certificate only by this pin (repeatable; "
                          "several per peer for rotation; spki-sha256:HEX also accepted; "
                          "HUB_ID=@FILE reads pins from FILE, one per line, again on SIGHUP)")
    fed.add_argument("--message-peer-token", help="connect token sent to every message peer")
    fed.add_argument("--message-peer-token-file", metavar="PATH",
                     help="read --message-peer-token from this owner-only file")
    fed.add_argument("--multihub-client-certfile", metavar="FILE",
                     help="client certificate this hub presents to its peers")
    fed.add_argument("--multihub-client-keyfile", metavar="FILE",
                     help="private key for --multihub-client-certfile")
    fed.add_argument("--message-forward-ttl", type=float, default=86400.0, metavar="SECONDS",
                     help="retry an unanswered forward this long before it expires "
                          "(default 86400)")
    fed.add_argument("--roster-timeout", type=float, metavar="SECONDS",
                     help="how long a who_request naming a peer waits for the peer's "
                          "roster before it is answered with an error "
                          f"(default {TIMING.roster_timeout:g})")
    leases = parser.add_argument_group("claims and leases")
    leases.add_argument("--max-claims-per-agent", type=int, default=LeaseLimits.max_claims_per_agent,
                        help="most live claims one agent may hold before further claims are "
                             f"refused (default {LeaseLimits.max_claims_per_agent})")
    leases.add_argument("--max-paths-per-claim", type=int, default=LeaseLimits.max_paths_per_claim,
                        help="most distinct paths one claim may declare before its scope widens "
                             f"to the worktree (default {LeaseLimits.max_paths_per_claim})")
    leases.add_argument("--lease-offline-ttl", type=float, default=None, metavar="SECONDS",
                        help="seconds a claim outlives its holder's disconnect before it "
                             "expires; 0 ends it at disconnect (default: it lasts its TTL)")
    leases.add_argument("--lease-min-ttl", type=float, default=LeaseLimits.min_ttl,
                        metavar="SECONDS",
                        help=f"shortest lease a claim may ask for (default {LeaseLimits.min_ttl:g})")
    auth_ = parser.add_argument_group(
        "multi-hub authority", "Each namespace has one owning hub; claims elsewhere are "
        "forwarded to it or refused, and a contested namespace refuses every claim.")
    auth_.add_argument("--namespace-owner", action="append", default=[], metavar="NS=HUB_ID",
                       help="the single hub that grants claims in namespace NS (repeatable); "
                            "with a map, a namespace absent from it grants nothing")
    auth_.add_argument("--multihub-watch", action="append", default=[], metavar="PEER=URI",
                       help="poll this peer hub's event log and watch for namespaces it "
                            "contests (repeatable)")
    auth_.add_argument("--multihub-watch-interval", type=float, metavar="SECONDS",
                       help=f"seconds between watch polls (default {TIMING.watch_interval:g}, "
                            f"floor {WATCH_INTERVAL_FLOOR:g})")
    auth_.add_argument("--multihub-watch-pin", action="append", default=[],
                       metavar="PEER=sha256:HEX", help="pin of a watched peer (or PEER=@FILE)")
    auth_.add_argument("--multihub-watch-token", help="connect token sent to watched peers")
    auth_.add_argument("--claim-peer", action="append", default=[], metavar="HUB_ID=URI",
                       help="route claims in namespaces HUB_ID owns to it (repeatable)")
    auth_.add_argument("--claim-peer-pin", action="append", default=[],
                       metavar="HUB_ID=sha256:HEX", help="pin of a claim peer (or HUB_ID=@FILE)")
    auth_.add_argument("--claim-peer-token", help="connect token sent to claim peers")
    redsyn = parser.add_argument_group(
        "REDSYN", "The HTTP door for agents without a WebSocket (seed 003), under /redsyn/v1 on "
        "this listener; see docs/redsyn.md. Nodes: hubd redsyn login --help.")
    redsyn.add_argument("--no-redsyn", action="store_true", help="do not serve /redsyn/v1")
    redsyn.add_argument("--redsyn-allow-loopback-webhooks", action="store_true",
                        help="admit loopback webhook URLs and addresses (127.0.0.1, [::1], "
                             "localhost; http too), nothing else (for tests; off by default)")
    redsyn.add_argument("--redsyn-webhook-first-retry", type=float, metavar="SECONDS",
                        help="first webhook retry delay, doubling up to an hour (default "
                             f"{TIMING.redsyn_webhook_first_retry:g}, as the seed says; shorter "
                             "for tests)")
    redsyn.add_argument("--redsyn-messages-per-day", type=int,
                        default=RedsynLimits.messages_per_day, metavar="N",
                        help="messages one person may send per UTC day (429 with quota; "
                             f"default {RedsynLimits.messages_per_day})")
    redsyn.add_argument("--redsyn-max-pending-messages", type=int,
                        default=RedsynLimits.pending_messages, metavar="N",
                        help="undelivered messages one person may have waiting (403 with "
                             f"quota; default {RedsynLimits.pending_messages})")
    redsyn.add_argument("--redsyn-max-pending-bytes", type=int,
                        default=RedsynLimits.pending_bytes, metavar="BYTES",
                        help="bytes of undelivered messages one person may have waiting "
                             "(403 with quota; default 512 MiB)")
    broker = parser.add_argument_group(
        "local broker", "Coding-agent CLI sessions on this machine over a Unix socket "
        "(docs/broker.md); a handle H is the seat <namespace>/H.")
    broker.add_argument("--broker-socket", metavar="PATH",
                        help="Unix socket of the broker (default: the journal's path plus "
                             f"{BROKER_SOCKET_SUFFIX}, e.g. ./hubd.db{BROKER_SOCKET_SUFFIX}), "
                             "created with mode 0600")
    broker.add_argument("--broker-token-file", metavar="PATH",
                        help="the broker's token (default: the journal's path plus "
                             f"{BROKER_TOKEN_SUFFIX}); created with mode 0600 and a random "
                             "token when absent")
    broker.add_argument("--no-broker", action="store_true", help="do not serve the broker")
    broker.add_argument("--broker-namespace", default="local", metavar="NS",
                        help="hub namespace of broker handles (default: local)")
    broker.add_argument("--broker-principal", default="broker", metavar="NAME",
                        help="the principal the broker's token maps to: the name its events "
                             "record; it speaks for <namespace>/* (or, when a principal of "
                             "this name exists, for that principal's seats) (default: broker)")
    broker.add_argument("--broker-no-rate-limit", action="store_true",
                        help="lift the 20 sends per 60 s per handle limit (benchmarks only)")
    add_security_flags(parser)
    logging_ = parser.add_argument_group("logging")
    logging_.add_argument("--log-format", choices=("text", "json"), default="text")
    logging_.add_argument("--log-level", default="INFO",
                          choices=("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"))
    # For tests (docs/architecture.md, "The timing profile"): a JSON object of
    # hubd/timing.py fields to shorten, e.g. {"send_stall": 0.5}.
    parser.add_argument("--timing", metavar="FILE", help=argparse.SUPPRESS)
    return parser


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
            claim_peer_pins=args.claim_peer_pin, claim_peer_token=args.claim_peer_token)
    except FederationConfigError as exc:
        problems.append(str(exc))
    positive("max_claims_per_agent", "max_paths_per_claim")
    if args.lease_offline_ttl is not None and args.lease_offline_ttl < 0:
        problems.append("--lease-offline-ttl must not be negative")
    if not 0 < args.lease_min_ttl <= LeaseLimits.default_ttl:
        problems.append(f"--lease-min-ttl must be in (0, {LeaseLimits.default_ttl:g}]")
    positive("redsyn_messages_per_day", "redsyn_max_pending_messages", "redsyn_max_pending_bytes")
    broker = None
    if not args.no_broker:
        broker = _broker_config(args, problems)
    security = security_config(args, token, problems)
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
        redsyn=not args.no_redsyn,
        redsyn_allow_loopback_webhooks=args.redsyn_allow_loopback_webhooks,
        redsyn_limits=redsyn_limits, broker=broker,
        warn_stale_recipients=args.warn_stale_recipients,
        pending_receipts=args.pending_receipts, timing=timing, security=security,
        snapshot_events=args.snapshot_every, snapshot_keep=args.snapshot_keep,
        checkpoint_events=args.checkpoint_every)


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
    from hubd.server import HubServer, StartupError

    log = structlog.get_logger("hubd")
    server = HubServer(config)
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

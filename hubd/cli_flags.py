"""The `hubd` command's flags: the parser, its subcommands, and which flags set
the timing profile. hubd/cli.py turns what they parse into a hub's
configuration and runs it."""

from __future__ import annotations

import argparse

from hubd import __version__
from hubd.config import (BROKER_SOCKET_SUFFIX, BROKER_TOKEN_SUFFIX, DEFAULT_DB, DEFAULT_PORT,
                         DEFAULT_QUOTA_BYTES, DEFAULT_QUOTA_EVENTS, DEFAULT_QUOTA_WINDOW,
                         DEFAULT_SNAPSHOT_EVENTS, DEFAULT_CHECKPOINT_EVENTS)
from hubd.evidence_config import add_evidence_flags
from hubd.security_cli import add_security_flags
from hubd.state.claims import LeaseLimits
from hubd.state.receipts import PENDING_RECEIPTS
from hubd.state.redsyn import Limits as RedsynLimits
from hubd.timing import Timing

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
    "identity": ("hubd.identity_cli", "governed identity recovery: reclaim a pin, enrol or "
                 "revoke an identity key on a running hub; make an identity key"),
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
    receipts.add_argument("--dead-letter-escalation-threshold", type=int, default=0,
                          metavar="N",
                          help="escalate a target every N directed chats that reached nobody: "
                               "journal it and tell every connected agent a "
                               "dead_letter_escalation (0, the default: off)")
    receipts.add_argument("--dead-letter-escalation-window", type=float, default=60.0,
                          metavar="SECONDS",
                          help="at most one escalation per target this often (default 60; "
                               "0: every threshold crossing, as the reference)")
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
    leases.add_argument("--max-offers-per-agent", type=int, default=64,
                        help="most distinct resource offers one agent may hold before new "
                             "offers are refused (default 64)")
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
    auth_.add_argument("--relay-peer", action="append", default=[], metavar="HUB_ID=URI",
                       help="send dead-letter pointers for namespaces HUB_ID owns to it "
                            "(repeatable; needs --namespace-owner)")
    auth_.add_argument("--relay-peer-pin", action="append", default=[],
                       metavar="HUB_ID=sha256:HEX", help="pin of a relay peer (or HUB_ID=@FILE)")
    auth_.add_argument("--relay-peer-token", help="connect token sent to relay peers")
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
    add_evidence_flags(parser)
    logging_ = parser.add_argument_group("logging")
    logging_.add_argument("--log-format", choices=("text", "json"), default="text")
    logging_.add_argument("--log-level", default="INFO",
                          choices=("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"))
    # For tests (docs/architecture.md, "The timing profile"): a JSON object of
    # hubd/timing.py fields to shorten, e.g. {"send_stall": 0.5}.
    parser.add_argument("--timing", metavar="FILE", help=argparse.SUPPRESS)
    return parser

"""Hub configuration: read-only once the hub starts."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from hubd.evidence_config import EvidenceConfig
from hubd.state.claims import LeaseLimits
from hubd.state.message_auth import DEFAULT_CAPACITY, DEFAULT_WINDOW, MacKey
from hubd.state.redsyn import Limits as RedsynLimits
from hubd.state.quota import QuotaLimits
from hubd.state.receipt_rules import LivenessPolicy
from hubd.state.receipts import PENDING_RECEIPTS
from hubd.timing import Timing

DEFAULT_PORT = 8876
DEFAULT_DB = "hubd.db"

# Default ingress quota: a busy team on one host must not trip it by accident
# (the reference's 100 chats/min for a whole open host does), while a runaway
# client is still stopped before the journal balloons.
DEFAULT_QUOTA_EVENTS = 6000
DEFAULT_QUOTA_BYTES = 64 * 1024 * 1024
DEFAULT_QUOTA_WINDOW = 60.0

# A restart replays at most about this many events after the newest snapshot
# (~10 us each): half a second.
DEFAULT_SNAPSHOT_EVENTS = 50_000
# a signed checkpoint of the journal's hash chain at least once per this many
# events (hubd/journal/checkpoints.py): a log pull's page (1,000) holds one
DEFAULT_CHECKPOINT_EVENTS = 1000


# The broker's default socket and token file are named after the journal and
# sit beside it, as SQLite's own -wal and -shm do: two hubs whose journals
# share a folder never share a broker (docs/broker.md, "Connection").
BROKER_SOCKET_SUFFIX = "-bus.sock"
BROKER_TOKEN_SUFFIX = "-bus.token"


def broker_files_beside(journal: Path) -> tuple[Path, Path]:
    """The default (socket, token file) of the broker of the hub whose journal
    is `journal`: one pair per journal file."""
    journal = journal.resolve()
    return (journal.with_name(journal.name + BROKER_SOCKET_SUFFIX),
            journal.with_name(journal.name + BROKER_TOKEN_SUFFIX))


@dataclass(frozen=True)
class BrokerConfig:
    """The local broker door (docs/broker.md). The `hubd` command turns it on by
    default, its files beside the journal (`broker_files_beside`); a HubConfig
    built in code has none unless given."""

    socket_path: Path
    token_file: Path
    namespace: str = "local"
    rate_limit: bool = True  # off only for benchmarks (--broker-no-rate-limit)
    # the principal the door's token maps to (docs/identity.md, "The other
    # doors"): its name is what the broker's events record; its seats are
    # <namespace>/*, or a principal of this name's own seats when the hub's
    # table holds one
    principal: str = "broker"


@dataclass(frozen=True)
class SecurityConfig:
    """The reference hub's identity, ACL, per-message authentication and
    attachment flags (docs/identity.md, "The reference's identity files"),
    so its command line starts hubd unchanged. All off by default."""

    identity_trust: Path | None = None
    capability_card_trust: Path | None = None
    require_identity_binding: bool = False
    acl_policy: Path | None = None
    require_acl: bool = False
    role_grants: Path | None = None
    # the keys of --message-auth-key (secrets: MacKey never prints one); the
    # key file's are read with the other files, at start and on SIGHUP
    message_auth_keys: tuple[MacKey, ...] = ()
    message_auth_key_file: Path | None = None
    require_message_auth: bool = False
    message_auth_window: float = DEFAULT_WINDOW
    message_auth_replay_capacity: int = DEFAULT_CAPACITY
    # --message-auth-sequence-floor-mode (off, compat, strict)
    message_auth_floor_mode: str = "off"
    # --message-auth-replay-db: accepted for the reference's command line;
    # hubd's replay ledger is its journal (docs/identity.md), this is not opened
    message_auth_replay_db: Path | None = None
    attachment_root: Path | None = None
    # hubd's bound on the bytes under the root (committed and reserved)
    attachment_max_bytes: int = 4 * 1024 ** 3
    attachment_recipient_policy: Path | None = None
    # --identity-enrollments FILE turns the enrolment verbs on (hubd keeps the
    # enrolled keys in its journal and does not open the file: docs/identity.md)
    identity_enrollments: Path | None = None
    identity_enrollment_namespaces: tuple[str, ...] = ()
    identity_enrollment_rate: int = 10
    identity_enrollment_window: float = 3600.0


@dataclass(frozen=True)
class HubConfig:
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    db: Path = Path(DEFAULT_DB)
    hub_id: str | None = None
    token: str | None = None
    # --principals FILE: the declarative principals (else the journal's)
    principals_file: Path | None = None
    # an open hub (no token, no principals) admits agents from any address
    open_network: bool = False
    max_msg_bytes: int = 1024 * 1024
    metrics_token: str | None = None
    private_directed: bool = False
    quota: QuotaLimits | None = QuotaLimits(DEFAULT_QUOTA_EVENTS, DEFAULT_QUOTA_BYTES,
                                            DEFAULT_QUOTA_WINDOW)
    max_clients: int = 4096
    max_connections_per_host: int = 0  # 0: no per-host cap
    max_history: int = 1000
    allow_origins: frozenset[str] = field(default_factory=frozenset)
    # (lower-cased host, port or None) pairs from --advertised-host
    advertised_hosts: frozenset[tuple[str, int | None]] = field(default_factory=frozenset)
    log_format: str = "text"
    log_level: str = "INFO"
    # federation.config.FederationConfig, read by the federation plugin (None:
    # its defaults, no peers); the core does not look inside
    federation: object | None = None
    claims: LeaseLimits = field(default_factory=LeaseLimits)
    # distinct resource offers one agent may hold (the reference's flag and default)
    max_offers_per_agent: int = 64
    redsyn: bool = True
    redsyn_allow_loopback_webhooks: bool = False
    redsyn_limits: RedsynLimits = field(default_factory=RedsynLimits)
    broker: BrokerConfig | None = None
    # consume-live receipts (docs/receipts.md): the stale-recipient gate (its
    # windows are timing's) and the pending-receipt window
    warn_stale_recipients: bool = True
    pending_receipts: int = PENDING_RECEIPTS
    # dead-letter escalation (docs/dead-letters.md): every N dead letters to
    # one target (0: off, the reference's default), at most once per target
    # per window seconds
    dead_letter_escalation_threshold: int = 0
    dead_letter_escalation_window: float = 60.0
    # snapshots of the projection (docs/journal.md, "Snapshots"): one is taken
    # once snapshot_events events were committed since the newest (0: never),
    # at most one per timing.snapshot_interval; the newest snapshot_keep are
    # kept, none larger than snapshot_max_bytes
    snapshot_events: int = DEFAULT_SNAPSHOT_EVENTS
    snapshot_keep: int = 2
    snapshot_max_bytes: int = 1 << 30
    # a signed checkpoint of the hash chain's head this often (0: only at snapshots)
    checkpoint_events: int = DEFAULT_CHECKPOINT_EVENTS
    # every deadline, period and back-off of the hub (hubd/timing.py)
    timing: Timing = field(default_factory=Timing)
    security: SecurityConfig = field(default_factory=SecurityConfig)
    # guard_denial's window and the spend ledger (hubd/evidence_config.py)
    evidence: EvidenceConfig = field(default_factory=EvidenceConfig)

    @property
    def liveness(self) -> LivenessPolicy:
        timing = self.timing
        return LivenessPolicy(self.warn_stale_recipients, timing.reaction_window,
                              timing.waiter_window)


def journal_command(sub, name: str, text: str):
    """One subcommand of an operator command that reads or writes a hub's
    journal (hubd principal, hubd redsyn org): its --db and --json."""
    command = sub.add_parser(name, help=text, description=text)
    command.add_argument("--db", default=DEFAULT_DB,
                         help=f"the hub's journal database (default ./{DEFAULT_DB})")
    command.add_argument("--json", action="store_true", help="print JSON")
    return command

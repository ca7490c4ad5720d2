"""Hub metrics: plain counters on the hot path, exported to Prometheus at scrape.

Incrementing a dict entry costs far less than a labelled prometheus-client
child on every frame, so the actors count into `HubMetrics` and a custom
collector turns the counts into metric families when /metrics is read.
Commit batch size and latency are real histograms (one observation per
commit, not per frame).
"""

from __future__ import annotations

from typing import Callable

from prometheus_client import CollectorRegistry, Histogram, disable_created_metrics
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

COMMIT_SECONDS_BUCKETS = (0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
disable_created_metrics()  # the _created series only add noise to every scrape

BATCH_SIZE_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 5000, 20000)


class HubMetrics:
    def __init__(self):
        self.registry = CollectorRegistry(auto_describe=True)
        self.frames_in: dict[str, int] = {}
        self.frames_out: dict[str, int] = {}
        self.frames_in_bytes = 0
        self.chats_routed = 0
        self.dead_letters = 0
        # dead-letter escalation (hubd/handlers/dead_letters.py): escalations
        # told, crossings held back by the per-target window; pointers over
        # relay routes by outcome (sent, unsent, no_route, received, refused_<code>)
        self.dead_letter_escalations = 0
        self.dead_letter_escalations_suppressed = 0
        self.dead_letter_pointers: dict[str, int] = {}
        # chats to a seat on a hub this hub has no route to (refused)
        self.chats_no_route = 0
        # private channels (hubd/handlers/channels.py): requests refused,
        # channel chats routed, observer copies of private directed chats
        self.channel_refusals = 0
        self.resource_refusals = 0
        self.channel_chats = 0
        self.observer_copies = 0
        # consume-live receipts (hubd/handlers/receipts.py): verdicts by kind,
        # liveness warnings, dark-seat alerts, receipts decided unwritten
        # because too many awaited writes
        self.receipts: dict[str, int] = {}
        self.liveness_warnings = 0
        self.dark_seat_alerts = 0
        self.receipt_write_overflows = 0
        self.quota_refusals: dict[str, int] = {}
        self.auth_denied = 0
        self.name_conflicts = 0
        self.send_queue_overflows = 0
        self.send_timeouts = 0
        self.send_aborts = 0
        self.transport_closed_twice = 0  # hubd/loop_errors.py
        self.handler_crashes = 0
        # rebuilds of the Router's state from the journal, by why; their time;
        # every event a replay applied (at start and in rebuilds)
        self.state_rebuilds: dict[str, int] = {}
        self.state_rebuild_seconds = 0.0
        self.replayed_events = 0
        # snapshots of the projection (hubd/actors/snapshotter.py): taken, by
        # outcome (written, current, failed, too_large, refused); their time
        self.snapshots: dict[str, int] = {"written": 0, "failed": 0}
        self.snapshot_seconds = 0.0
        self.suspensions = 0
        self.unstorable_events = 0
        self.rows_refused = 0
        # frames the WebSocket door refused before the Router, by error_code
        self.frames_refused: dict[str, int] = {}
        # frames and registrations the reference's checks refused (identity
        # binding, per-message auth, ACL), by the check's result
        self.signed_refusals: dict[str, int] = {}
        # guard evidence and spend requests refused at a bound (hubd/handlers/evidence.py)
        self.evidence_refusals: dict[str, int] = {}
        self.journal_failures = 0
        self.checkpoints = 0
        self.checkpoint_seconds = 0.0
        self.reloads = 0
        self.reload_failures = 0
        # the local broker door (hubd/doors/broker)
        self.broker_requests: dict[str, int] = {}  # verb -> requests answered
        self.broker_errors: dict[str, int] = {}  # error code -> answers
        self.broker_refused_lines = 0
        self.broker_refused_connections: dict[str, int] = {}  # reason -> connections
        self.broker_bad_tokens = 0
        self.broker_slow_consumers = 0
        self.broker_pushes = 0
        # the REDSYN door's webhook pusher: rounds (one take per agent with a
        # webhook) and POST attempts by whether they got a 2xx
        self.redsyn_webhook_rounds = 0
        self.redsyn_webhook_attempts: dict[bool, int] = {}
        # the REDSYN door's answers by HTTP status, and long polls refused at
        # the per-node bound
        self.redsyn_requests: dict[int, int] = {}
        self.redsyn_polls_refused = 0
        # requests the HTTP listener gave up on before or around a handler
        # (hubd/http/refusals.py), by reason
        self.http_refused: dict[str, int] = {}
        self.commit_batch = Histogram(
            "hubd_journal_commit_batch_events", "Events per journal commit (group commit size).",
            buckets=BATCH_SIZE_BUCKETS, registry=self.registry)
        self.commit_seconds = Histogram(
            "hubd_journal_commit_seconds", "Time to append and fsync one journal commit.",
            buckets=COMMIT_SECONDS_BUCKETS, registry=self.registry)
        # gauges read at scrape time: name -> (help, callable returning a number
        # or a {label_value: number} mapping, label name)
        self.gauges: dict[str, tuple[str, Callable, str | None]] = {}
        self.registry.register(_Collector(self))
        register_process_and_build(self.registry)

    def count_receipt(self, kind: str) -> None:
        self.receipts[kind] = self.receipts.get(kind, 0) + 1

    def count_in(self, type_: str) -> None:
        frames = self.frames_in
        frames[type_] = frames.get(type_, 0) + 1

    def count_signed_refusal(self, check: str, result: str) -> None:
        key = f"{check}:{result}"
        self.signed_refusals[key] = self.signed_refusals.get(key, 0) + 1

    def count_evidence_refusal(self, reason: str) -> None:
        self.evidence_refusals[reason] = self.evidence_refusals.get(reason, 0) + 1

    def count_refused(self, code: str) -> None:
        refused = self.frames_refused
        refused[code] = refused.get(code, 0) + 1

    def observe_commit(self, events: int, seconds: float) -> None:
        self.commit_batch.observe(events)
        self.commit_seconds.observe(seconds)

    def count_rebuild(self, reason: str, seconds: float) -> None:
        self.state_rebuilds[reason] = self.state_rebuilds.get(reason, 0) + 1
        self.state_rebuild_seconds += seconds

    def refuse_quota(self, reason: str) -> None:
        self.quota_refusals[reason] = self.quota_refusals.get(reason, 0) + 1

    def gauge(self, name: str, help_text: str, read: Callable, label: str | None = None) -> None:
        self.gauges[name] = (help_text, read, label)


def register_process_and_build(registry: CollectorRegistry) -> None:
    """process_* (CPU seconds, resident and virtual memory, open and maximum
    file descriptors, start time: prometheus-client's ProcessCollector, read
    from /proc at scrape) and hubd_build_info{version, python, sqlite,
    openssl} = 1, so a dashboard can say which build each hub runs."""
    import platform
    import sqlite3
    import ssl

    from prometheus_client import Info, ProcessCollector

    from hubd import __version__

    ProcessCollector(registry=registry)
    Info("hubd_build", "The running hubd: its version and those of the Python, SQLite and "
         "OpenSSL it runs on.", registry=registry).info({
             "version": __version__, "python": platform.python_version(),
             "sqlite": sqlite3.sqlite_version, "openssl": ssl.OPENSSL_VERSION.split()[1]})


# Only a bounded vocabulary becomes a label value: client-chosen type strings
# would otherwise let any client grow /metrics without limit.
def _bounded_types(counts: dict[str, int], known: frozenset[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for type_, n in counts.items():
        key = type_ if type_ in known else "other"
        out[key] = out.get(key, 0) + n
    return out


_HTTP_CODES = frozenset(str(code) for code in (200, 201, 202, 204, 400, 401, 403, 404, 405,
                                               409, 410, 413, 415, 422, 429, 500, 503))


def _by_label(name: str, help_text: str, label: str, counts: dict[str, int]):
    family = CounterMetricFamily(name, help_text, labels=[label])
    for key, n in sorted(counts.items()):
        family.add_metric([key], n)
    return family


class _Collector:
    def __init__(self, metrics: HubMetrics):
        self.metrics = metrics

    def describe(self):
        return []

    def collect(self):
        from hubd.wire.verbs import KNOWN_TYPES

        m = self.metrics
        yield _by_label("hubd_frames_received", "Frames received from sockets, by type.", "type",
                        _bounded_types(m.frames_in, KNOWN_TYPES | {"invalid"}))
        yield _by_label("hubd_frames_sent", "Frames queued to sockets, by type.", "type",
                        m.frames_out)
        yield CounterMetricFamily("hubd_received_bytes", "Bytes of frames received.",
                                  value=m.frames_in_bytes)
        yield CounterMetricFamily("hubd_chats_routed", "Chats accepted and routed.",
                                  value=m.chats_routed)
        yield CounterMetricFamily("hubd_dead_letters", "Directed chats that reached no live recipient.",
                                  value=m.dead_letters)
        yield CounterMetricFamily("hubd_dead_letter_escalations",
                                  "dead_letter_escalation frames told (journaled first).",
                                  value=m.dead_letter_escalations)
        yield CounterMetricFamily("hubd_dead_letter_escalations_suppressed",
                                  "Threshold crossings not escalated: the target escalated "
                                  "within --dead-letter-escalation-window.",
                                  value=m.dead_letter_escalations_suppressed)
        yield _by_label("hubd_dead_letter_pointers", "Dead-letter pointers over relay routes, "
                        "by outcome.", "outcome", m.dead_letter_pointers)
        yield _by_label("hubd_delivery_receipts", "Journaled receipt verdicts of directed "
                        "chats, by verdict.", "verdict", m.receipts)
        yield CounterMetricFamily("hubd_recipient_liveness_warnings",
                                  "recipient_liveness_warning frames sent to senders.",
                                  value=m.liveness_warnings)
        yield CounterMetricFamily("hubd_dark_seat_alerts", "dark_seat_alert broadcasts.",
                                  value=m.dark_seat_alerts)
        yield CounterMetricFamily("hubd_receipt_write_overflows",
                                  "Receipts decided without waiting for a write because "
                                  "65,536 already waited.", value=m.receipt_write_overflows)
        yield _by_label("hubd_quota_refusals", "Frames refused by the ingress quota.", "reason",
                        m.quota_refusals)
        yield CounterMetricFamily("hubd_redsyn_webhook_rounds",
                                  "REDSYN webhook rounds (one look at an agent's box).",
                                  value=m.redsyn_webhook_rounds)
        # both outcomes from the start, so a failure ratio has a denominator
        yield _by_label("hubd_redsyn_webhook_attempts", "REDSYN webhook POSTs, by outcome.",
                        "outcome", {"ok": m.redsyn_webhook_attempts.get(True, 0),
                                    "failed": m.redsyn_webhook_attempts.get(False, 0)})
        # a status the door never answers (it chooses every one) still counts
        # under its class, so the label vocabulary stays bounded
        yield _by_label("hubd_redsyn_requests", "REDSYN HTTP requests answered, by status code.",
                        "code", _bounded_types({str(code): n for code, n in
                                                m.redsyn_requests.items()}, _HTTP_CODES))
        yield CounterMetricFamily("hubd_redsyn_polls_refused",
                                  "REDSYN long polls refused (429) because the node already "
                                  "held its bound of open polls.", value=m.redsyn_polls_refused)
        yield _by_label("hubd_http_refused", "HTTP requests the listener gave up on, by reason "
                        "(malformed, client_gone, handler_failed).", "reason", m.http_refused)
        yield CounterMetricFamily("hubd_chats_no_route",
                                  "Chats refused because they name a seat on a hub this hub "
                                  "has no route to (not a configured message peer).",
                                  value=m.chats_no_route)
        yield CounterMetricFamily("hubd_resource_refusals",
                                  "Resource offers refused (no kind or name, a field hubd does "
                                  "not take, the per-agent or hub-wide bound).",
                                  value=m.resource_refusals)
        yield CounterMetricFamily("hubd_channel_refusals",
                                  "Channel requests refused (not owner, not invited, a bound "
                                  "such as the channel or member limit).",
                                  value=m.channel_refusals)
        yield CounterMetricFamily("hubd_channel_chats", "Chats routed to a private channel's "
                                  "members.", value=m.channel_chats)
        yield CounterMetricFamily("hubd_observer_copies", "Private directed chats copied to an "
                                  "identity holding the ACL observe grant.",
                                  value=m.observer_copies)
        yield CounterMetricFamily("hubd_auth_denied", "Connections refused for a missing or wrong token.",
                                  value=m.auth_denied)
        yield CounterMetricFamily("hubd_name_conflicts", "Registrations refused with name_conflict.",
                                  value=m.name_conflicts)
        yield CounterMetricFamily("hubd_send_queue_overflows",
                                  "Sockets closed because their send queue was full.",
                                  value=m.send_queue_overflows)
        yield CounterMetricFamily("hubd_send_timeouts",
                                  "Sockets closed because a write could not drain in time.",
                                  value=m.send_timeouts)
        yield CounterMetricFamily("hubd_send_aborts",
                                  "Stalled sockets aborted because even their graceful close "
                                  "did not drain within a second.",
                                  value=m.send_aborts)
        yield CounterMetricFamily("hubd_transport_closed_twice",
                                  "A closed socket's teardown that CPython's asyncio ran a "
                                  "second time (hubd/loop_errors.py); the connection was "
                                  "already gone.", value=m.transport_closed_twice)
        yield CounterMetricFamily("hubd_handler_crashes",
                                  "Connections closed 1011 after an unexpected handler exception.",
                                  value=m.handler_crashes)
        yield _by_label("hubd_state_rebuilds", "Rebuilds of the Router's state from the "
                        "journal, by why: handler_failure, row_refused, journal_failure.",
                        "reason", m.state_rebuilds)
        yield CounterMetricFamily("hubd_state_rebuild_seconds",
                                  "Time spent rebuilding the Router's state from the journal.",
                                  value=m.state_rebuild_seconds)
        yield _by_label("hubd_snapshots", "Snapshots of the projection attempted, by outcome: "
                        "written, current (nothing new), failed, too_large, refused.",
                        "outcome", m.snapshots)
        yield CounterMetricFamily("hubd_snapshot_seconds",
                                  "Time the snapshot worker processes ran.",
                                  value=m.snapshot_seconds)
        yield CounterMetricFamily("hubd_journal_replayed_events",
                                  "Events applied by journal replays, at start and in rebuilds.",
                                  value=m.replayed_events)
        yield CounterMetricFamily("hubd_mutation_suspensions",
                                  "Times a principal's changes were refused for a while because "
                                  "one of its commands made the hub rebuild its state.",
                                  value=m.suspensions)
        yield CounterMetricFamily("hubd_unstorable_events",
                                  "Commands refused because an event they made cannot be a "
                                  "journal row (text that is not valid UTF-8, ...).",
                                  value=m.unstorable_events)
        yield CounterMetricFamily("hubd_journal_rows_refused",
                                  "Events whose row SQLite refused at commit: their command "
                                  "failed alone, a journal_row_refused row holds each seq.",
                                  value=m.rows_refused)
        yield _by_label("hubd_frames_refused", "Frames the WebSocket door refused before the "
                        "Router (typed error, socket kept), by error_code.", "code",
                        m.frames_refused)
        yield _by_label("hubd_evidence_refused", "guard_denial and spend_request refused at a "
                        "bound (the guard-evidence window, the spend ledger's wait or size), "
                        "by reason.", "reason", m.evidence_refusals)
        yield _by_label("hubd_signed_frames_refused", "Registrations and frames refused by "
                        "identity binding, per-message authentication or the ACL, by "
                        "check:result.", "reason", m.signed_refusals)
        yield CounterMetricFamily("hubd_journal_commit_failures", "Journal commits that failed.",
                                  value=m.journal_failures)
        yield CounterMetricFamily("hubd_journal_checkpoints", "WAL checkpoints run beside the writer.",
                                  value=m.checkpoints)
        yield CounterMetricFamily("hubd_journal_checkpoint_seconds",
                                  "Time spent in WAL checkpoints.", value=m.checkpoint_seconds)
        yield CounterMetricFamily("hubd_config_reloads", "SIGHUP reloads applied.",
                                  value=m.reloads)
        yield CounterMetricFamily("hubd_config_reload_failures",
                                  "SIGHUP reloads refused (the old configuration was kept).",
                                  value=m.reload_failures)
        from hubd.wire import broker as broker_wire

        yield _by_label("hubd_broker_requests", "Broker lines answered, by type.", "type",
                        _bounded_types(m.broker_requests, frozenset(broker_wire.VERBS)))
        yield _by_label("hubd_broker_errors", "Broker error answers, by code.", "code",
                        _bounded_types(m.broker_errors, frozenset(broker_wire.ERROR_CODES
                                                                  + broker_wire.HUBD_ERROR_CODES)))
        yield CounterMetricFamily("hubd_broker_refused_lines",
                                  "Broker lines refused before reaching the Router (malformed, "
                                  "over 1 MiB, bad fields).", value=m.broker_refused_lines)
        yield _by_label("hubd_broker_refused_connections", "Broker connections refused or "
                        "displaced at a connection bound, or while closing, by reason.",
                        "reason", m.broker_refused_connections)
        yield CounterMetricFamily("hubd_broker_bad_tokens", "Broker connections with a wrong token.",
                                  value=m.broker_bad_tokens)
        yield CounterMetricFamily("hubd_broker_slow_consumers",
                                  "Broker connections closed because they did not read.",
                                  value=m.broker_slow_consumers)
        yield CounterMetricFamily("hubd_broker_pushes", "Push events written to listening "
                                  "broker connections.", value=m.broker_pushes)
        for name, (help_text, read, label) in m.gauges.items():
            value = read()
            if label is None:
                yield GaugeMetricFamily(name, help_text, value=value)
            else:
                family = GaugeMetricFamily(name, help_text, labels=[label])
                for key, n in sorted(value.items()):
                    family.add_metric([key], n)
                yield family

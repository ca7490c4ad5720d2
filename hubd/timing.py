"""The hub's timing profile: every deadline, period and back-off of a running
hub in one frozen value (docs/architecture.md, "The timing profile").

A hub reads its timers only from `HubConfig.timing`; no module keeps one as a
constant read at call time. The public flags that set a timer
(--auth-timeout, --roster-timeout, --multihub-watch-interval, the receipt
windows, --redsyn-webhook-first-retry) set its field here. Tests shorten the
rest for a hub process with the hidden `--timing FILE` flag: a JSON object of
field overrides (`read_overrides`), refused whole if it names an unknown field or
a value that is not a positive number of seconds.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields, replace
from pathlib import Path

# The most a timing file may hold: a profile is a few dozen numbers.
MAX_FILE_BYTES = 64 * 1024


class TimingError(ValueError):
    """A timing override is unknown or not a positive number of seconds; the
    message says which."""


@dataclass(frozen=True)
class Timing:
    """Seconds, all of them; the defaults are production's."""

    # -- the hub core
    # How often the sweeper runs the Router's timers (lease, delivery and
    # receipt deadlines) and checks for stalled writes: how late they can fire.
    sweep: float = 1.0
    # The per-credential guard_denial evidence window (seed 000: 60 s).
    guard_evidence_window: float = 60.0
    # A write to a client that has not drained for this long closes the client
    # (1013); it also bounds a receipt's wait for that write.
    send_stall: float = 5.0
    # After a stalled client's 1013 close frame, how long it may take to drain
    # before the connection is aborted.
    graceful_close: float = 1.0
    # After the hub's close frame, how long it reads and discards the client's
    # frames waiting for the client's close frame or FIN.
    close_linger: float = 1.0
    # How long the hub's own close waits for the client's close frame.
    close_reply: float = 1.0
    # How long a new WebSocket has to send its first frame (--auth-timeout).
    auth_timeout: float = 10.0
    # On a clean stop, how long the journal writer has to commit what it holds.
    shutdown_drain: float = 5.0
    # After a failed commit, how long mutations are refused at first, doubling
    # while commits keep failing, up to journal_retry_max.
    journal_retry_first: float = 1.0
    journal_retry_max: float = 30.0
    # How often the journal's principal tables are read for changes.
    principals_poll: float = 0.5
    # How often the journal's write-ahead log is checked for a checkpoint.
    wal_checkpoint_poll: float = 0.5

    # -- snapshots of the projection (docs/journal.md)
    # How often the snapshotter compares the committed seq with its snapshot's.
    snapshot_check: float = 1.0
    # At most one snapshot attempt per this many seconds (--snapshot-interval).
    snapshot_interval: float = 30.0
    # A snapshot worker process still running after this long is killed.
    snapshot_worker: float = 600.0

    # -- receipts (docs/receipts.md)
    # A recipient is consume-live this long after it registered or sent a
    # frame other than a heartbeat (--recipient-liveness-window).
    reaction_window: float = 90.0
    # An -rx waiter vouches for its seat this long after its last frame
    # (--waiter-liveness-window).
    waiter_window: float = 20.0
    # How long a seat owning live work may lack a fresh -rx waiter before its
    # dark_seat_alert (--dark-seat-after).
    dark_seat_after: float = 30.0

    # -- the broker door (docs/broker.md)
    # How long a new broker connection has to send its auth line.
    broker_auth: float = 10.0
    # How often pending delivery proofs look at their transcripts.
    broker_proof_check: float = 1.0
    # How long a pushed message's proof is looked for before it stays `sent`.
    broker_proof_window: float = 120.0

    # -- the REDSYN door (docs/redsyn.md)
    # The shortest lease a take may ask for (its `lease` parameter).
    redsyn_min_lease: float = 1.0
    # A waiting poll looks at its box at least this often.
    redsyn_recheck: float = 5.0
    # The webhook pusher looks for ready deliveries at least this often.
    redsyn_webhook_poll: float = 1.0
    # One webhook POST, connect to answer.
    redsyn_webhook_timeout: float = 10.0
    # How long a webhook delivery in flight is leased before it is ready again.
    redsyn_webhook_lease: float = 60.0
    # The first webhook retry's delay, doubling up to an hour
    # (--redsyn-webhook-first-retry).
    redsyn_webhook_first_retry: float = 10.0

    # -- peer links (federation/liveness.py)
    # How often a link pings its peer.
    link_ping: float = 0.5
    # A link that heard nothing from its peer for this long is closed and redialled.
    link_silence: float = 2.0
    # One TCP connect of a dial.
    link_dial: float = 1.0
    # A whole dial: TCP, TLS, the upgrade and the peer's welcome.
    link_connect: float = 5.0
    # The first redial's back-off, doubling up to link_backoff_max.
    link_backoff_first: float = 0.1
    link_backoff_max: float = 0.5
    # A link up this long starts its next redial from link_backoff_first.
    link_stable_after: float = 10.0
    # When this hub ends a link, how long it waits for the peer's close frame.
    link_close_wait: float = 0.5
    # A write to the peer not completed for this long (a peer that stopped
    # reading) cuts the link, as the WebSocket door cuts a slow consumer.
    link_write_stall: float = 5.0

    # -- forwards to peer hubs (federation/outbox.py)
    # How often each peer's outbox looks for lost answers, due retries and
    # expired forwards.
    forward_tick: float = 0.5
    # How long a forward (a chat or a delivery intent) waits for the peer's
    # answer: the seed's ten seconds.
    forward_answer: float = 10.0
    # How long a sender's receipt waits for the peer before it says `pending`.
    forward_first_answer: float = 1.0
    # A refused forward's first retry, doubling up to forward_retry_max.
    forward_retry_first: float = 1.0
    forward_retry_max: float = 300.0
    # A link up this long that still refuses starts the retry schedule over.
    forward_retry_stable_link: float = 30.0
    # Pending forwards, the link up, and none succeeded for this long: stalled.
    stalled_after: float = 10.0
    # How long a who_request naming a peer waits for the peer's roster
    # (--roster-timeout).
    roster_timeout: float = 10.0

    # -- namespace authority (federation/authority.py)
    # How long a claim forwarded to its namespace's owner waits for the answer.
    claim_answer: float = 10.0
    # How often a watched peer's log is pulled (--multihub-watch-interval).
    watch_interval: float = 30.0
    # How long one log pull waits for the peer's answer.
    log_pull_answer: float = 10.0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not math.isfinite(value) or value <= 0:
                raise TimingError(f"timing {f.name} must be a positive number of seconds, "
                                  f"not {value!r}")
        for low, high in (("journal_retry_first", "journal_retry_max"),
                          ("link_backoff_first", "link_backoff_max"),
                          ("forward_retry_first", "forward_retry_max"),
                          ("link_ping", "link_silence")):
            if getattr(self, low) > getattr(self, high):
                raise TimingError(f"timing {low} ({getattr(self, low):g}) must not exceed "
                                  f"{high} ({getattr(self, high):g})")

    def overridden(self, overrides: dict) -> "Timing":
        """This profile with some fields replaced; TimingError names an
        unknown field (and the known ones) or a bad value."""
        known = {f.name for f in fields(self)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise TimingError(f"unknown timing field(s) {', '.join(unknown)}; known: "
                              f"{', '.join(sorted(known))}")
        return replace(self, **overrides)


def read_overrides(path: Path) -> dict:
    """The field overrides in the JSON file at `path` (a JSON object; its
    fields and values are checked by Timing.overridden): TimingError saying
    what is wrong."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise TimingError(f"cannot read it: {exc.strerror}") from exc
    if len(data) > MAX_FILE_BYTES:
        raise TimingError(f"it is over {MAX_FILE_BYTES} bytes")
    try:
        overrides = json.loads(data)
    except ValueError as exc:
        raise TimingError(f"it is not JSON: {exc}") from exc
    if not isinstance(overrides, dict):
        raise TimingError("it must hold a JSON object of field: seconds")
    return overrides

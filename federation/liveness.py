"""Is a peer link alive, and what to tell an operator about it.

A black-holed TCP connection (a cut link, a dropped route, a firewall that
drops rather than refuses) sends no error: without a deadline of its own, the
link would wait out the kernel's retransmission backoff, many seconds after
the network healed. So every link pings its peer every timing.link_ping and
counts anything the peer sends (pongs, answers) as life; a link silent for
timing.link_silence is closed and redialled. Dials are bounded by
timing.link_dial for the TCP connect, so during a cut a fresh SYN leaves at
least every link_dial + link_backoff_max seconds and a healed network is
crossed within about a second (hubd/timing.py has the numbers).

Any sign of life from the peer elsewhere (its own inbound link to this hub,
a forward, a log pull) wakes the link and the sender for that peer at once:
the remaining reconnect backoff and retry backoff are skipped.

The decisions here are pure functions of times and counts (tested in
tests/unit/test_liveness.py); federation/actors/link.py and federation/actors/outbox.py
apply them. Times are seconds; `now` is the caller's clock.
"""

from __future__ import annotations

from dataclasses import dataclass

from hubd.timing import Timing

UP = "up"
CONNECTING = "connecting"
DOWN = "down"


def silent_for(now: float, last_heard: float) -> float:
    return max(0.0, now - last_heard)


def is_dead(now: float, last_heard: float, timing: Timing) -> bool:
    """The link heard nothing (no pong, no answer) for longer than
    timing.link_silence."""
    return silent_for(now, last_heard) > timing.link_silence


def write_stalled(now: float, write_started: float | None, deadline: float) -> bool:
    """A write has been in progress (not drained into the socket) past its
    deadline (timing.link_write_stall)."""
    return write_started is not None and now - write_started > deadline


def next_backoff(backoff: float, up_for: float | None, timing: Timing) -> float:
    """The backoff after a failed or ended connection: doubled up to the cap,
    back to the start after a link that was up long enough to be stable."""
    if up_for is not None and up_for > timing.link_stable_after:
        return timing.link_backoff_first
    return min(backoff * 2, timing.link_backoff_max)


def jittered(backoff: float, unit_random: float) -> float:
    """50-100 % of the backoff (unit_random in [0, 1)), so peers that lost
    each other at the same moment do not redial in lockstep."""
    return backoff * (0.5 + unit_random / 2)


@dataclass(frozen=True)
class Stall:
    stalled: bool
    since: float | None  # wall time progress was last made (or the link came up)


def stall(pending: int, up: bool, up_since: float | None, last_success: float | None,
          now: float, after: float) -> Stall:
    """Pending work, the link up, and no forward succeeded for `after`
    seconds (timing.stalled_after) (counted from the later of the last success and the link coming
    up, so a link that just came back is not called stalled)."""
    if pending <= 0 or not up or up_since is None:
        return Stall(False, None)
    progress = max(up_since, last_success or 0.0)
    return Stall(now - progress > after, progress)

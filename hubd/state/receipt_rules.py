"""Receipt decisions as pure functions: who is consume-live, what an
immediate receipt says, how many pending receipts a new one evicts, and
which seats are dark (docs/receipts.md).

Nothing here reads a clock or a socket: the Router hands in the times it
knows (when a session last reacted, when its -rx waiter was last heard) and
the names whose write completed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

from hubd.state.presence import RX_SUFFIX


@dataclass(frozen=True, slots=True)
class LivenessPolicy:
    # False (--no-warn-stale-recipients): every socket match counts as live,
    # the compatibility behaviour
    enabled: bool
    # the windows (their defaults are the reference hub's, in hubd/timing.py)
    reaction_window: float
    waiter_window: float


@dataclass(frozen=True, slots=True)
class Liveness:
    """What WHO shows in agent_liveness for one seat."""

    proven_live: bool
    has_live_waiter: bool
    last_reaction_age: float | None  # None: the seat itself is not connected

    def as_wire(self) -> dict:
        return {"proven_live": self.proven_live, "has_live_waiter": self.has_live_waiter,
                "last_reaction_age": self.last_reaction_age}


def liveness(reacted_at: float | None, waiter_heard_at: float | None, now: float,
             policy: LivenessPolicy) -> Liveness:
    """A seat is consume-live when it registered or sent a frame other than a
    heartbeat within the reaction window, or its exact -rx waiter sent any
    frame (keepalives count for a waiter) within the waiter window."""
    waiter = waiter_heard_at is not None and now - waiter_heard_at <= policy.waiter_window
    age = None if reacted_at is None else max(0.0, now - reacted_at)
    reacted = age is not None and age <= policy.reaction_window
    return Liveness(reacted or waiter or not policy.enabled, waiter, age)


def seat_liveness(by_name: dict, name: str, now: float, policy: LivenessPolicy) -> Liveness:
    """`name`'s liveness from the connected sessions (`Presence.by_name`):
    its own reactions and its exact -rx waiter's."""
    seat = by_name.get(name)
    waiter = by_name.get(name + RX_SUFFIX)
    return liveness(seat.last_reaction if seat is not None else None,
                    waiter.last_heard if waiter is not None else None, now, policy)


def only_stale(matched: Iterable[str], by_name: dict, now: float, policy: LivenessPolicy,
               connected: Callable[[str], bool]) -> bool:
    """Every match of a directed chat is a connected seat not proven
    consume-live: the seed's dead letter ("matched no live connection"). A
    match served outside presence (not `connected`) counts as live; with
    stale-recipient tracking off no seat is stale."""
    if not policy.enabled:
        return False
    found = False
    for name in matched:
        if not connected(name) or proven_live(by_name, name, now, policy):
            return False
        found = True
    return found


def proven_live(by_name: dict, name: str, now: float, policy: LivenessPolicy) -> bool:
    """`seat_liveness(...).proven_live` for an enabled policy, without making
    the Liveness (every directed chat asks: the routing hot path)."""
    seat = by_name.get(name)
    reacted = seat.last_reaction if seat is not None else None
    if reacted is not None and now - reacted <= policy.reaction_window:
        return True
    waiter = by_name.get(name + RX_SUFFIX)
    heard = waiter.last_heard if waiter is not None else None
    return heard is not None and now - heard <= policy.waiter_window


def partition(matched: Iterable[str], live: Callable[[str], bool]) -> tuple[list[str], list[str]]:
    """(live, stale) among the socket-level matches, each sorted."""
    alive, stale = [], []
    for name in sorted(matched):
        (alive if live(name) else stale).append(name)
    return alive, stale


# immediate verdicts of a directed chat (the receipt kinds in hubd/state/receipt_table.py)
DELIVERED = "immediate_delivered"
NO_ONLINE_RECIPIENT = "pending"  # its kind name predates the others: dead-lettered
NO_LIVE_RECIPIENT = "no_live_recipient"
TRANSPORT_UNAVAILABLE = "recipient_transport_unavailable"
# every negative verdict of a directed chat waits for a mailbox ack (deferred)
NEGATIVE = frozenset({NO_ONLINE_RECIPIENT, NO_LIVE_RECIPIENT, TRANSPORT_UNAVAILABLE})


def immediate_verdict(matched: Iterable[str], stale: Iterable[str],
                      written: Iterable[str]) -> str:
    """What a directed chat's immediate receipt says, from the routing
    evidence and the live names whose write completed. Transport presence
    alone is never a positive verdict."""
    if any(True for _ in written):
        return DELIVERED
    matched = set(matched)
    if not matched:
        return NO_ONLINE_RECIPIENT
    if matched <= set(stale):
        return NO_LIVE_RECIPIENT
    return TRANSPORT_UNAVAILABLE


def evictions(pending: int, limit: int) -> int:
    """How many of the oldest pending receipts a new pending one pushes out
    of a window of `limit` (each is settled expired, in the same commit)."""
    return max(0, pending + 1 - max(1, limit))


@dataclass(frozen=True, slots=True)
class DarkSeat:
    identity: str
    claims: tuple[str, ...]
    tasks: tuple[str, ...]


def owned_work(claims_by_owner: dict, claim_live: Callable[[str], bool],
               board_tasks: Iterable[dict], finished: Iterable[str]) -> dict:
    """identity -> (sorted unexpired claims, sorted non-terminal board tasks it
    is the suggested owner of)."""
    finished = set(finished)
    work: dict[str, tuple[list, list]] = {}
    for owner, task_ids in claims_by_owner.items():
        held = sorted(t for t in task_ids if claim_live(t))
        if held:
            work.setdefault(owner, ([], []))[0].extend(held)
    for task in board_tasks:
        owner = task.get("suggested_owner")
        if owner and task.get("status") not in finished:
            work.setdefault(owner, ([], []))[1].append(task["task_id"])
    return {owner: (tuple(c), tuple(sorted(t))) for owner, (c, t) in work.items()}


def dark_seat_round(episodes: dict, work: dict, has_fresh_waiter: Callable[[str], bool],
                    now: float, after: float) -> tuple[dict, list[tuple[DarkSeat, float]]]:
    """One sweep of the dark-seat watch. `episodes` maps an identity to
    (since, alerted) for each continuing episode; returns the next episodes
    and the alerts to send now, with how long the waiter has been missing.
    An episode ends when the waiter is fresh again or the work is gone, so a
    later regression alerts again; one alert per episode."""
    following: dict = {}
    alerts: list[tuple[DarkSeat, float]] = []
    for identity in sorted(work):
        if has_fresh_waiter(identity):
            continue
        since, alerted = episodes.get(identity, (now, False))
        missing = now - since
        if not alerted and missing >= after:
            claims, tasks = work[identity]
            alerts.append((DarkSeat(identity, claims, tasks), missing))
            alerted = True
        following[identity] = (since, alerted)
    return following, alerts

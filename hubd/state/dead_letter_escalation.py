"""Dead-letter escalation and the cross-hub dead-letter pointer: the decisions.

The dead-letter ledger (hubd/state/chat.py `DeadLetters`) counts, per target,
the directed chats that reached nobody. This module decides, purely:

- when a target's count makes the hub escalate (`escalation_due`): every
  `threshold` new dead letters since the target's last escalation (the
  reference's "exact multiple of the threshold"), but at most once per target
  per `window` seconds (hubd's bound: with threshold 1 the reference
  broadcasts once per dead letter, docs/dead-letters.md);
- what the escalation and the pointer say (`escalation_frame_fields`,
  `pointer`, the reference's one-line texts);
- whether a pointer received from a peer hub is well formed (`decode_pointer`,
  typed codes) and whether one from the same peer for the same target was
  already told within the window (`ReceivedPointers`).

The events (`DEAD_LETTER_ESCALATION`, `DEAD_LETTER_FORWARDING`) are journaled;
their appliers keep the bounded tables that make "once per window" survive a
restart (live state equals a replay of the journal).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from .hub import Appliers, HubState
from .events import Event

# event kinds (journaled; the reference's EventKind names)
DEAD_LETTER_ESCALATION = "dead_letter_escalation"
DEAD_LETTER_FORWARDING = "dead_letter_forwarding"
# a directed chat whose every write to its live matches failed, known once
# the writes reported ({target, sender, chat_seq}; hubd's, counted in the ledger)
DEAD_LETTER_UNWRITTEN = "dead_letter_unwritten"
# the two sides of one forward (the reference's `direction` values)
DIRECTION_OUT = "out"
DIRECTION_IN = "in"

DEFAULT_THRESHOLD = 0  # the reference's default: escalation off
DEFAULT_WINDOW = 60.0  # seconds; hubd's bound on escalations per target
MAX_THRESHOLD = 1_000_000
MAX_WINDOW = 7 * 86_400.0
# received pointers remembered for the window, one per (peer, target)
RECEIVED_POINTERS = 1024
# a pointer's fields: bounds on what a peer may make this hub journal
MAX_TARGET_BYTES = 256
MAX_HUB_ID_BYTES = 64
MAX_COUNT = 2 ** 53

# refusal codes of an inbound pointer (metric labels, log fields, error_code)
NOT_A_PEER = "not_a_peer"
PEER_NOT_AUTHORISED = "peer_not_authorised"
MALFORMED = "malformed"
NOT_OWNED_HERE = "namespace_not_owned_here"
ORIGIN_MISMATCH = "origin_mismatch"
REPEATED = "repeated_within_window"
REFUSAL_CODES = (NOT_A_PEER, PEER_NOT_AUTHORISED, MALFORMED, NOT_OWNED_HERE, ORIGIN_MISMATCH,
                 REPEATED)

# the wire field the pointer is nested under (the reference's FORWARDING_FIELD)
FORWARDING_FIELD = "forwarding"


def flag_problems(threshold: int, window: float) -> list[str]:
    """What is wrong with --dead-letter-escalation-threshold/-window (the cli
    collects every problem before it refuses to start)."""
    problems = []
    if not 0 <= threshold <= MAX_THRESHOLD:
        problems.append(f"--dead-letter-escalation-threshold must be 0 (off) to {MAX_THRESHOLD}")
    if not (window == window and 0 <= window <= MAX_WINDOW):  # NaN fails both
        problems.append(f"--dead-letter-escalation-window must be 0 to {MAX_WINDOW:g} seconds")
    return problems


def escalation_due(count: int, threshold: int, last: tuple[int, float] | None, now: float,
                   window: float) -> bool:
    """Should a target whose ledger count just became `count` escalate now?

    `last` is (count, ts) of the target's previous escalation in this episode
    (None: none since the ledger last cleared it). Due when escalation is on
    (threshold >= 1), at least `threshold` dead letters came since the last
    escalation (the first at `threshold` itself), and the last one is at
    least `window` seconds old. Without suppression this fires exactly at the
    reference's multiples of the threshold; a suppressed crossing is picked
    up by the first dead letter after the window."""
    if threshold < 1 or count < 1:
        return False
    if last is None:
        return count >= threshold
    last_count, last_ts = last
    return count - last_count >= threshold and now - last_ts >= window


def escalation_notice(target: str, count: int, last_sender: str) -> str:
    """The reference's one-line payload of a dead_letter_escalation frame."""
    return (f"dead-letter escalation: {count} directed messages to {target!r} have reached no "
            f"live connection (most recent from {last_sender!r}); nobody is draining that name")


def incoming_notice(target: str, count: int, origin_hub_id: str) -> str:
    """The reference's one-line payload of a received dead_letter_forwarding frame."""
    return (f"dead-letter forwarding: peer hub {origin_hub_id!r} reports {count} directed "
            f"messages to {target!r} — a name this domain owns — reached no live connection "
            f"there; the reader is not draining it on the peer")


def pointer(target: str, count: int, origin_hub_id: str, owner_hub_id: str) -> dict:
    """The content-free pointer: what the ledger holds, never a message body."""
    return {"target": target, "count": count, "origin_hub_id": origin_hub_id,
            "owner_hub_id": owner_hub_id}


@dataclass(frozen=True)
class Pointer:
    target: str
    count: int
    origin_hub_id: str
    owner_hub_id: str


@dataclass(frozen=True)
class PointerRefused:
    code: str
    detail: str


def _text(value, name: str, limit: int) -> str | PointerRefused:
    if not isinstance(value, str) or not value.strip():
        return PointerRefused(MALFORMED, f"forwarding.{name} must be a non-blank string")
    if len(value.encode("utf-8", "surrogatepass")) > limit:
        return PointerRefused(MALFORMED, f"forwarding.{name} must be at most {limit} bytes")
    if any(ord(c) < 0x20 or ord(c) == 0x7f or 0xd800 <= ord(c) <= 0xdfff for c in value):
        return PointerRefused(MALFORMED, f"forwarding.{name} must not hold control characters")
    return value


def decode_pointer(frame: dict) -> Pointer | PointerRefused:
    """The pointer nested in an inbound dead_letter_forwarding frame, checked
    field by field (the reference's rules, bounded), or why not."""
    raw = frame.get(FORWARDING_FIELD)
    if not isinstance(raw, dict):
        return PointerRefused(MALFORMED, "dead_letter_forwarding carries no forwarding object")
    values = []
    for name, limit in (("target", MAX_TARGET_BYTES), ("origin_hub_id", MAX_HUB_ID_BYTES),
                        ("owner_hub_id", MAX_HUB_ID_BYTES)):
        value = _text(raw.get(name), name, limit)
        if isinstance(value, PointerRefused):
            return value
        values.append(value)
    count = raw.get("count")
    if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= MAX_COUNT:
        return PointerRefused(MALFORMED, "forwarding.count must be a non-negative integer")
    target, origin, owner = values
    return Pointer(target, count, origin, owner)


# -- the projection: bounded tables the journaled events keep


@dataclass
class ReceivedPointers:
    """(peer, target) -> when this hub last told its agents of that peer's
    pointer for that target: at most RECEIVED_POINTERS, oldest dropped."""

    told: OrderedDict = field(default_factory=OrderedDict)

    def repeated(self, peer: str, target: str, now: float, window: float) -> bool:
        ts = self.told.get((peer, target))
        return ts is not None and now - ts < window

    def record(self, peer: str, target: str, ts: float) -> None:
        key = (peer, target)
        self.told.pop(key, None)
        self.told[key] = ts
        while len(self.told) > RECEIVED_POINTERS:
            self.told.popitem(last=False)


RECEIVED = "dead_letter_pointers"
PROJECTIONS = {RECEIVED: ReceivedPointers}
appliers = Appliers()


def received_of(state: HubState) -> ReceivedPointers:
    return state.extensions[RECEIVED]


@appliers.applies(DEAD_LETTER_ESCALATION)
def _apply_escalation(state: HubState, event: Event) -> None:
    p = event.payload
    state.chat.dead_letters.escalated_at(p["target"], p["count"], event.ts)


@appliers.applies(DEAD_LETTER_UNWRITTEN)
def _apply_unwritten(state: HubState, event: Event) -> None:
    p = event.payload
    state.chat.dead_letters.record(p["target"], p["sender"], event.ts)


@appliers.applies(DEAD_LETTER_FORWARDING)
def _apply_forwarding(state: HubState, event: Event) -> None:
    p = event.payload
    if p.get("direction") == DIRECTION_IN:
        received_of(state).record(p.get("peer", ""), p["target"], event.ts)

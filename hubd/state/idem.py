"""Durable idempotency for keyed mutations (claim, release, task_update,
handoff, checkpoint, ledger_task, ledger_task_update, ledger_progress).

A keyed mutation that was accepted is remembered under (sender, verb,
idem_key) with the digest of the request and the reply frame it produced.
A retry with the same digest gets that reply again, privately, and changes
nothing; the same key with a different request is refused. Only accepted
outcomes are remembered: a refused request changed nothing, so its retry is
decided afresh (as in the reference hub).

The memory is a journal event, `idempotency`, appended after the mutation's
own events in the same commit; its payload has the reference hub's shape
(`key`, `request_digest`, `response`, `response_sha256`, `first_event_seq`,
`commit_seq`). Replay rebuilds the store, so a retry after a restart, or after
the lease was released, still gets the original verdict.

Bounded: at most PER_SENDER keys per sender and TOTAL keys in all; the oldest
go first. A retry of an evicted key is decided afresh.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from hubd.wire.digests import canonical_sha256

from .events import Event
from .hub import Appliers, HubState

IDEMPOTENCY = "idempotency"
EXTENSION = "idempotency"

PER_SENDER = 1024
TOTAL = 20_000
MAX_KEY_CHARS = 256
CONFLICT_TEXT = "Idempotency key was already used for a different request."
CONFLICT_CODE = "idempotency_conflict"

# Envelope fields that are not part of what a request means.
_NOT_SEMANTIC = ("timestamp", "client_timestamp", "auth", "signature")


def request_digest(frame: dict) -> str:
    """SHA-256 of the request's canonical JSON: sorted keys, compact
    separators, ASCII escapes, without timestamp, client_timestamp, auth and
    signature. The reference client computes the same value over the frame it
    sent and checks it on release_granted."""
    return canonical_sha256({k: v for k, v in frame.items() if k not in _NOT_SEMANTIC})


def idem_key_of(frame: dict) -> str | None:
    """The request's idem_key: a string (an integer is taken as its decimal
    text); absent, empty or any other type means unkeyed."""
    key = frame.get("idem_key")
    if isinstance(key, bool) or key is None:
        return None
    if isinstance(key, int):
        key = str(key)
    if not isinstance(key, str) or not key or "\x00" in key:
        return None
    return key


def operation_key(sender: str, verb: str, key: str) -> str:
    return f"{sender}\x00{verb}\x00{key}"


@dataclass(slots=True)
class Remembered:
    digest: str
    response: dict
    first_event_seq: int
    commit_seq: int


@dataclass
class IdemStore:
    entries: OrderedDict = field(default_factory=OrderedDict)  # operation key -> Remembered
    per_sender: dict = field(default_factory=dict)  # sender -> OrderedDict of keys

    def lookup(self, sender: str, verb: str, key: str) -> Remembered | None:
        return self.entries.get(operation_key(sender, verb, key))

    def remember(self, op_key: str, entry: Remembered) -> None:
        sender = op_key.split("\x00", 1)[0]
        self.entries.pop(op_key, None)
        self.entries[op_key] = entry
        mine = self.per_sender.setdefault(sender, OrderedDict())
        mine.pop(op_key, None)
        mine[op_key] = None
        while len(mine) > PER_SENDER:
            oldest, _ = mine.popitem(last=False)
            self.entries.pop(oldest, None)
        while len(self.entries) > TOTAL:
            oldest, _ = self.entries.popitem(last=False)
            owner = oldest.split("\x00", 1)[0]
            keys = self.per_sender.get(owner)
            if keys is not None:
                keys.pop(oldest, None)
                if not keys:
                    del self.per_sender[owner]


# the projections this module keeps in HubState.extensions, by name
PROJECTIONS = {EXTENSION: IdemStore}
appliers = Appliers()


def store_of(state: HubState) -> IdemStore:
    return state.extensions[EXTENSION]


@appliers.applies(IDEMPOTENCY)
def _apply_idempotency(state: HubState, event: Event) -> None:
    payload = event.payload
    key = payload.get("key")
    response = payload.get("response")
    if not isinstance(key, str) or not isinstance(response, dict):
        return  # a foreign or damaged row remembers nothing
    store_of(state).remember(key, Remembered(
        payload.get("request_digest", ""), response,
        payload.get("first_event_seq", event.seq), payload.get("commit_seq", event.seq)))

"""Session-bound delivery (wire v3): the durable aggregate, projected from the journal.

Every delivery operation is one `Operation` here, built and moved only by the
appliers below, so the state after a restart is the state before it: the same
stages, the same notification ids, the same pending sender notifications.
The decisions (which stage may follow which, what a request may be) are in
hubd/state/delivery_rules.py; the verbs that journal these events are
hubd/handlers/delivery.py.

Events (one command's events commit in one transaction):
  delivery_intent_accepted   the request as admitted (with its selected mode)
  delivery_intent_queued     its durable queue stage and the offer's notification id
  delivery_stage             a recipient report or a hub decision (expired,
                             superseded), with the notification it owes
  delivery_cancel_requested  the sender asked; the stage does not change
  delivery_notified          notifications that reached their audience's socket queue

Bounded: unfinished operations are capped at admission (the caps in the rules
module, and UNFINISHED_TOTAL here); finished ones are kept for status and
retry identity (request ids and idempotency keys alike) up to RETAINED, the
oldest finished going first, its idempotency key free again with it; pending
notifications up to OUTBOX_PER_AUDIENCE per audience and OUTBOX_TOTAL in all,
the oldest going first. Every eviction is counted (the gauges on /metrics).
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from dataclasses import dataclass, field

from . import delivery_rules as rules
from .events import Event
from .hub import Appliers, HubState

ACCEPTED = "delivery_intent_accepted"
QUEUED = "delivery_intent_queued"
STAGE = "delivery_stage"
CANCEL_REQUESTED = "delivery_cancel_requested"
NOTIFIED = "delivery_notified"

EXTENSION = "delivery_intents"

UNFINISHED_TOTAL = 16_384
RETAINED = 50_000
OUTBOX_PER_AUDIENCE = 1024
OUTBOX_TOTAL = 50_000


@dataclass(slots=True)
class Operation:
    key: str
    origin_hub: str
    sender: str
    target: str
    target_incarnation: str
    request_id: str
    idempotency_key: str
    task_id: str
    requested_mode: str
    allowed_fallbacks: tuple
    selected_mode: str
    quality: str
    body: str
    deadline: float
    digest: str
    accepted_seq: int
    stage: str = "accepted"
    cancel_requested: bool = False
    boundary_delivered: bool = False
    acknowledged: bool = False
    outcome_code: str | None = None
    executor_ref: str | None = None
    offer_notification_id: str | None = None
    # accepted report mutation ids -> their content digest (at most one per stage)
    mutations: dict = field(default_factory=dict)
    notifications: int = 0  # the highest notification number issued
    latest_event_seq: int = 0
    # a forwarded operation whose origin hub takes its stage changes back
    origin_takes_notices: bool = False

    @property
    def unfinished(self) -> bool:
        return self.stage in rules.UNFINISHED


@dataclass
class DeliveryState:
    ops: dict = field(default_factory=dict)  # operation key -> Operation
    # (origin hub, sender, idempotency key) -> the operation key it was admitted
    # under, for every retained operation: a key is spent once per sender
    by_idempotency: dict = field(default_factory=dict)
    # unfinished work per recipient incarnation, in admission (journal) order
    by_incarnation: dict = field(default_factory=dict)  # incarnation -> {key: None}
    by_target: dict = field(default_factory=dict)  # recipient name -> {key: None}, unfinished
    unfinished: int = 0
    deadlines: list = field(default_factory=list)  # heap of (deadline, key), unfinished only
    finished: OrderedDict = field(default_factory=OrderedDict)  # key -> None, oldest first
    # audience -> {notification_id: frame}, oldest first
    outbox: dict = field(default_factory=dict)
    outbox_size: int = 0
    evicted_operations: int = 0
    dropped_notifications: int = 0

    # -- reads

    def from_sender(self, incarnation: str, sender: str) -> int:
        keys = self.by_incarnation.get(incarnation, ())
        return sum(1 for k in keys if self.ops[k].sender == sender)

    def queued_for(self, incarnation: str) -> list[Operation]:
        return [self.ops[k] for k in self.by_incarnation.get(incarnation, ())
                if self.ops[k].stage == rules.QUEUED]

    def unfinished_of(self, target: str) -> list[Operation]:
        return [self.ops[k] for k in self.by_target.get(target, ())]

    def due(self, now: float) -> list[Operation]:
        """Unfinished operations whose deadline has passed (stale heap
        entries of finished work are dropped on the way)."""
        out = []
        heap = self.deadlines
        while heap and heap[0][0] <= now:
            _, key = heapq.heappop(heap)
            op = self.ops.get(key)
            if op is not None and op.unfinished:
                out.append(op)
        return out

    def pending_for(self, audience: str) -> list[tuple[str, dict]]:
        return list(self.outbox.get(audience, {}).items())

    # -- changes (appliers only)

    def _index(self, op: Operation) -> None:
        self.by_incarnation.setdefault(op.target_incarnation, {})[op.key] = None
        self.by_target.setdefault(op.target, {})[op.key] = None
        self.unfinished += 1
        heapq.heappush(self.deadlines, (op.deadline, op.key))

    def _finish(self, op: Operation) -> None:
        for table, name in ((self.by_incarnation, op.target_incarnation),
                            (self.by_target, op.target)):
            keys = table.get(name)
            if keys is not None:
                keys.pop(op.key, None)
                if not keys:
                    del table[name]
        self.unfinished -= 1
        self.finished[op.key] = None
        while len(self.finished) > RETAINED:
            old, _ = self.finished.popitem(last=False)
            gone = self.ops.pop(old, None)
            if gone is not None:
                spent = (gone.origin_hub, gone.sender, gone.idempotency_key)
                if self.by_idempotency.get(spent) == old:
                    del self.by_idempotency[spent]
            self.evicted_operations += 1

    def queue_notification(self, audience: str, frame: dict) -> None:
        box = self.outbox.setdefault(audience, OrderedDict())
        box[frame["notification_id"]] = frame
        self.outbox_size += 1
        while len(box) > OUTBOX_PER_AUDIENCE:
            box.popitem(last=False)
            self.outbox_size -= 1
            self.dropped_notifications += 1
        while self.outbox_size > OUTBOX_TOTAL:
            # the audience holding the oldest pending notification loses it;
            # dict order is first-queued, close enough to oldest for a bound
            name = next(iter(self.outbox))
            oldest = self.outbox[name]
            oldest.popitem(last=False)
            self.outbox_size -= 1
            self.dropped_notifications += 1
            if not oldest:
                del self.outbox[name]

    def settle(self, audience: str, ids) -> None:
        box = self.outbox.get(audience)
        if not box:
            return
        for nid in ids:
            if box.pop(nid, None) is not None:
                self.outbox_size -= 1
        if not box:
            del self.outbox[audience]


PROJECTIONS = {EXTENSION: DeliveryState}
appliers = Appliers()


def delivery_of(state: HubState) -> DeliveryState:
    return state.extensions[EXTENSION]


@appliers.applies(ACCEPTED)
def _apply_accepted(state: HubState, event: Event) -> None:
    p = event.payload
    d = delivery_of(state)
    op = Operation(
        p["operation_key"], p["origin_hub"], p["sender"], p["target"], p["target_incarnation"],
        p["request_id"], p["idempotency_key"], p["task_id"], p["requested_mode"],
        tuple(p["allowed_fallbacks"]), p["selected_mode"], p["quality"], p["body"],
        p["deadline"], p["request_digest"], event.seq, latest_event_seq=event.seq,
        origin_takes_notices=p.get("origin_takes_notices") is True)
    d.ops[op.key] = op
    # the first admission keeps the key (a journal from before the key was
    # checked may hold two operations with one key)
    d.by_idempotency.setdefault((op.origin_hub, op.sender, op.idempotency_key), op.key)


@appliers.applies(QUEUED)
def _apply_queued(state: HubState, event: Event) -> None:
    p = event.payload
    d = delivery_of(state)
    op = d.ops.get(p["operation_key"])
    if op is None or op.stage != "accepted":
        return
    op.stage = rules.QUEUED
    op.offer_notification_id = p["notification_id"]
    op.notifications = max(op.notifications, p.get("notification_number", 1))
    op.latest_event_seq = event.seq
    d._index(op)


def _note(d: DeliveryState, op: Operation, event: Event) -> None:
    note = event.payload.get("notification")
    if isinstance(note, dict):
        # a forwarded requester never registers here: its notification is
        # queued only for an origin that takes it back over the link
        # (federation/delivery_notice_rules.py)
        if "@" not in note["audience"] or event.payload.get("relay_to"):
            d.queue_notification(note["audience"], note)
        op.notifications = max(op.notifications, event.payload.get("notification_number", 0))
    op.latest_event_seq = event.seq


@appliers.applies(STAGE)
def _apply_stage(state: HubState, event: Event) -> None:
    p = event.payload
    d = delivery_of(state)
    op = d.ops.get(p["operation_key"])
    if op is None or not op.unfinished:
        return  # evicted, or a replay of a row the live hub would have refused
    stage = p["stage"]
    op.stage = stage
    if stage == rules.BOUNDARY_DELIVERED:
        op.boundary_delivered = True
    elif stage == rules.ACKNOWLEDGED:
        op.acknowledged = True
    evidence = p.get("evidence") or {}
    if stage in rules.OUTCOME_STAGES:
        op.outcome_code = evidence.get("outcome_code")
        op.executor_ref = evidence.get("executor_ref")
    if p.get("mutation_id") is not None:
        op.mutations[p["mutation_id"]] = p.get("report_digest")
    _note(d, op, event)
    if stage in rules.TERMINAL:
        d._finish(op)


@appliers.applies(CANCEL_REQUESTED)
def _apply_cancel(state: HubState, event: Event) -> None:
    d = delivery_of(state)
    op = d.ops.get(event.payload["operation_key"])
    if op is None or not op.unfinished:
        return
    op.cancel_requested = True
    _note(d, op, event)


@appliers.applies(NOTIFIED)
def _apply_notified(state: HubState, event: Event) -> None:
    delivery_of(state).settle(event.payload["audience"], event.payload["notification_ids"])

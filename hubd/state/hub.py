"""The hub's coordination state and the one function that changes it.

`apply(state, event)` is used both live (right after the Router decides an
event) and on restart (replaying the journal), so the projection after a
restart is the projection before it. Which appliers run is fixed when the
state is made (`HubState.fresh`, from the hub's installed plugins), so a
replay never depends on which modules happen to be imported.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from hubd.wire.targets import parse_target

from . import events as ev
from .chat import AgentsSeen, ChatState, Remembered, is_directed
from .events import Event
from .mailbox import MailboxState
from .principals import ACL_DENIAL
from .receipts import PendingReceipt, ReceiptState


@dataclass
class HubState:
    last_seq: int = 0
    chat: ChatState = field(default_factory=ChatState)
    mailbox: MailboxState = field(default_factory=MailboxState)
    receipts: ReceiptState = field(default_factory=ReceiptState)
    agents: AgentsSeen = field(default_factory=AgentsSeen)
    extensions: dict = field(default_factory=dict)  # projections of other modules, by name
    # kind -> the appliers that project it (how the state changes, not what it is)
    appliers: dict = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def fresh(cls, appliers: dict, projections: dict,
              history_limit: int = 1000, pending_receipts: int | None = None) -> "HubState":
        """An empty state projected by `appliers` (kind -> functions, in
        order), with an empty projection from each factory in `projections`."""
        state = cls(appliers=appliers)
        state.chat.history_limit = history_limit
        if pending_receipts is not None:
            state.receipts.pending_limit = pending_receipts
        for name, factory in projections.items():
            state.extensions[name] = factory()
        return state


Applier = Callable[[HubState, Event], None]


class Appliers(dict):
    """One module's appliers: event kind -> functions, in declaration order.
    The hub's plugins name them; HubState.fresh gets the merged table."""

    def applies(self, *kinds: str):
        def declare(fn: Applier) -> Applier:
            for kind in kinds:
                self.setdefault(kind, []).append(fn)
            return fn
        return declare

    def records(self, *kinds: str) -> None:
        """Kinds journaled for audit only (claim denials, grant refusals): known
        to the hub, they keep their seq but change no projection."""
        for kind in kinds:
            self.setdefault(kind, [])


appliers = Appliers()
appliers.records(ev.DELIVERY_RECEIPT_REQUESTED, ev.JOURNAL_ROW_REFUSED, ACL_DENIAL)


def apply(state: HubState, event: Event) -> None:
    """Project one event. A kind the hub's appliers do not name is applied as
    an audit row would be; replay counts such kinds (Hub.load_state) and the
    Router never makes one (Router.event)."""
    if event.seq <= state.last_seq:
        raise ValueError(f"event seq {event.seq} does not follow {state.last_seq}")
    for applier in state.appliers.get(event.kind, ()):
        applier(state, event)
    state.last_seq = event.seq


@appliers.applies(ev.CHAT)
def _apply_chat(state: HubState, event: Event) -> None:
    frame = event.payload
    route = event.route or {}
    chat = state.chat
    sender = frame.get("sender", "")
    msg_id = frame.get("msg_id", 0)
    if msg_id > chat.last_msg_id:
        chat.last_msg_id = msg_id
    chat.append_history(frame)
    state.agents.touch(sender, event.ts)

    target = parse_target(frame.get("target", ""))
    remote = "@" in target.raw
    directed = is_directed(frame, target)
    recipients = route.get("recipients", ())
    if directed:
        state.mailbox.index(event.seq, sender, target)
        if not recipients or route.get("stale_only"):
            chat.dead_letters.record(target.raw, sender, event.ts)
        # a chat routed with the receipt aggregate (route "receipt") waits
        # for its delivery_receipt_immediate; older journals seeded here
        if not recipients and frame.get("receipt_requested") is True and "receipt" not in route:
            state.receipts.await_deferred(event.seq, PendingReceipt(
                sender, target.raw, frame.get("client_msg_id"), msg_id))
    if route.get("retry") and (recipients or remote):
        chat.retry.remember(sender, frame["client_msg_id"], Remembered(
            frame, msg_id, event.seq, event.ts, frame.get("forward_id") if remote else None))


@appliers.applies(ev.MAILBOX_WATERMARK)
def _apply_watermark(state: HubState, event: Event) -> None:
    state.mailbox.advance(event.payload["identity"], event.payload["seq"])


@appliers.applies(ev.DELIVERY_RECEIPT_IMMEDIATE)
def _apply_receipt_immediate(state: HubState, event: Event) -> None:
    """A verdict after the write (or its absence): its outbox row, and a
    negative one joins the pending window (restart re-seeds it from here)."""
    payload = event.payload
    frame = payload["receipt"]
    state.receipts.queue_notification(frame["target"], frame["receipt_notification_id"], frame)
    if payload.get("pending"):
        state.receipts.await_deferred(payload["chat_seq"], PendingReceipt(
            frame["target"], frame["message_target"], frame.get("client_msg_id"),
            frame["message_id"]))
    if payload.get("pending") or payload.get("retryable"):  # retryable: a channel chat's
        client_msg_id = frame.get("client_msg_id")
        if client_msg_id is not None:
            # it reached no live recipient: a retry is a redelivery attempt
            state.chat.retry.forget(frame["target"], client_msg_id)


@appliers.applies(ev.DELIVERY_RECEIPT_DEFERRED, ev.RECEIPT_DEFERRED,
                  ev.DELIVERY_RECEIPT_EXPIRED)
def _apply_receipt_settled(state: HubState, event: Event) -> None:
    payload = event.payload
    state.receipts.pending.pop(payload["chat_seq"], None)
    frame = payload["receipt"]
    state.receipts.queue_notification(frame["target"], frame["receipt_notification_id"], frame)


@appliers.applies(ev.RECEIPT_NOTIFIED)
def _apply_receipt_notified(state: HubState, event: Event) -> None:
    state.receipts.settle(event.payload["sender"], event.payload["notification_ids"])


@appliers.applies(ev.DEAD_LETTERS_CLEARED)
def _apply_dead_letters_cleared(state: HubState, event: Event) -> None:
    state.chat.dead_letters.clear(event.payload["target"])

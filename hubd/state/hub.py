"""The hub's coordination state and the one function that changes it.

`apply(state, event)` is used both live (right after the Router decides an
event) and on restart (replaying the journal), so the projection after a
restart is the projection before it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from hubd.wire.targets import parse_target

from . import events as ev
from .chat import AgentsSeen, ChatState, Remembered
from .events import Event
from .mailbox import MailboxState
from .receipts import PendingReceipt, ReceiptState


@dataclass
class HubState:
    last_seq: int = 0
    chat: ChatState = field(default_factory=ChatState)
    mailbox: MailboxState = field(default_factory=MailboxState)
    receipts: ReceiptState = field(default_factory=ReceiptState)
    agents: AgentsSeen = field(default_factory=AgentsSeen)
    extensions: dict = field(default_factory=dict)  # projections added by other modules

    @classmethod
    def fresh(cls, history_limit: int = 1000) -> "HubState":
        state = cls()
        state.chat.history_limit = history_limit
        for name, factory in EXTENSIONS.items():
            state.extensions[name] = factory()
        return state


Applier = Callable[[HubState, Event], None]
# kind -> appliers, in registration order (the core's first; modules that keep
# their own projection of the same events add theirs after)
APPLIERS: dict[str, list[Applier]] = {}
# name -> factory of an extra projection kept in HubState.extensions
EXTENSIONS: dict[str, Callable[[], object]] = {}


def applies(kind: str):
    def register(fn: Applier) -> Applier:
        APPLIERS.setdefault(kind, []).append(fn)
        return fn
    return register


def apply(state: HubState, event: Event) -> None:
    if event.seq <= state.last_seq:
        raise ValueError(f"event seq {event.seq} does not follow {state.last_seq}")
    for applier in APPLIERS.get(event.kind, ()):
        applier(state, event)
    # Kinds without an applier are audit-only rows (claim denials, partition
    # evidence): they keep their seq but change no projection.
    state.last_seq = event.seq


@applies(ev.CHAT)
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
    directed = not target.is_broadcast and not frame.get("channel") and "forward" not in route
    recipients = route.get("recipients", ())
    if directed:
        state.mailbox.index(event.seq, sender, target)
        if not recipients:
            chat.dead_letters.record(target.raw, sender, event.ts)
            if frame.get("receipt_requested") is True:
                state.receipts.await_deferred(event.seq, PendingReceipt(
                    sender, target.raw, frame.get("client_msg_id"), msg_id))
    if route.get("retry") and (recipients or "forward" in route):
        chat.retry.remember(sender, frame["client_msg_id"], Remembered(
            frame, msg_id, event.seq, event.ts,
            route["forward"]["forward_id"] if "forward" in route else None))


@applies(ev.MAILBOX_WATERMARK)
def _apply_watermark(state: HubState, event: Event) -> None:
    state.mailbox.advance(event.payload["identity"], event.payload["seq"])


@applies(ev.RECEIPT_DEFERRED)
def _apply_receipt_deferred(state: HubState, event: Event) -> None:
    payload = event.payload
    state.receipts.pending.pop(payload["chat_seq"], None)
    frame = payload["receipt"]
    state.receipts.queue_notification(frame["target"], frame["receipt_notification_id"], frame)


@applies(ev.RECEIPT_NOTIFIED)
def _apply_receipt_notified(state: HubState, event: Event) -> None:
    state.receipts.settle(event.payload["sender"], event.payload["notification_ids"])


@applies(ev.DEAD_LETTERS_CLEARED)
def _apply_dead_letters_cleared(state: HubState, event: Event) -> None:
    state.chat.dead_letters.clear(event.payload["target"])

"""Receipt projection: directed chats whose immediate receipt was negative,
awaiting a deferred receipt (the bounded pending window), and the per-sender
outbox of receipt notifications not yet written to the sender.

The window is bounded; the handler settles the oldest entry expired (a
journaled delivery_receipt_expired, told to its sender) before a new one would
overflow it, so `await_deferred` never drops one silently on a live hub. Only
a journal written before that rule can overflow here on replay (counted in
`dropped`)."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

PENDING_RECEIPTS = 4096
OUTBOX_PER_SENDER = 1000
OUTBOX_SENDERS = 4096


@dataclass(slots=True, frozen=True)
class PendingReceipt:
    sender: str
    target: str
    client_msg_id: str | None
    msg_id: int


@dataclass
class ReceiptState:
    # chat seq -> PendingReceipt, oldest first
    pending: OrderedDict = field(default_factory=OrderedDict)
    # sender -> OrderedDict(notification_id -> receipt frame)
    outbox: OrderedDict = field(default_factory=OrderedDict)
    pending_limit: int = PENDING_RECEIPTS
    dropped: int = 0

    def await_deferred(self, seq: int, receipt: PendingReceipt) -> None:
        self.pending[seq] = receipt
        while len(self.pending) > self.pending_limit:
            self.pending.popitem(last=False)
            self.dropped += 1

    def queue_notification(self, sender: str, notification_id: str, frame: dict) -> None:
        queue = self.outbox.get(sender)
        if queue is None:
            queue = self.outbox[sender] = OrderedDict()
            while len(self.outbox) > OUTBOX_SENDERS:
                self.outbox.popitem(last=False)
        queue[notification_id] = frame
        while len(queue) > OUTBOX_PER_SENDER:
            queue.popitem(last=False)

    def settle(self, sender: str, notification_ids) -> None:
        queue = self.outbox.get(sender)
        if queue is None:
            return
        for notification_id in notification_ids:
            queue.pop(notification_id, None)
        if not queue:
            del self.outbox[sender]

    def notifications_for(self, sender: str) -> list[tuple[str, dict]]:
        return list(self.outbox.get(sender, {}).items())

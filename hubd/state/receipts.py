"""Receipt projection: dead-lettered chats awaiting a deferred receipt, and the
per-sender outbox of receipt notifications not yet handed to the sender."""

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
    # chat seq -> PendingReceipt, oldest first; the oldest is dropped when full
    pending: OrderedDict = field(default_factory=OrderedDict)
    # sender -> OrderedDict(notification_id -> receipt frame)
    outbox: OrderedDict = field(default_factory=OrderedDict)

    def await_deferred(self, seq: int, receipt: PendingReceipt) -> None:
        self.pending[seq] = receipt
        while len(self.pending) > PENDING_RECEIPTS:
            self.pending.popitem(last=False)

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

"""Journal events: the only way coordination state changes.

An event is `(seq, ts, kind, payload, route)`, stored with the name of the
principal whose connection caused it. `payload` is what the event says
(for a chat, the frame as relayed); `route` holds the hub's own routing facts
decided when the event was made (who was online to receive a chat), which
replay must reuse rather than recompute.
"""

from __future__ import annotations

from dataclasses import dataclass

from hubd.wire.codec import encode

# kinds
CHAT = "chat"
MAILBOX_WATERMARK = "mailbox_watermark"
# the durable receipt aggregate (seed: "Durable receipt aggregate and
# outbox"): a receipt-requested directed chat commits with _REQUESTED; each
# verdict commits with its sender-notification outbox row
DELIVERY_RECEIPT_REQUESTED = "delivery_receipt_requested"
DELIVERY_RECEIPT_IMMEDIATE = "delivery_receipt_immediate"
DELIVERY_RECEIPT_DEFERRED = "delivery_receipt_deferred"
DELIVERY_RECEIPT_EXPIRED = "delivery_receipt_expired"
# journals written before the aggregate named the deferred verdict so
RECEIPT_DEFERRED = "receipt_deferred"
RECEIPT_NOTIFIED = "receipt_notified"
DEAD_LETTERS_CLEARED = "dead_letters_cleared"


@dataclass(slots=True)
class Event:
    seq: int
    ts: float
    kind: str
    payload: dict
    route: dict | None = None
    # The payload already encoded, when the hub had to encode it anyway (a
    # chat frame is encoded once for its recipients and reused for the journal).
    payload_text: bytes | str | None = None
    # the principal whose connection caused it (docs/identity.md); None for
    # the hub's own events (lease expiry, forward settlement)
    principal: str | None = None

    def row(self) -> tuple:
        payload = self.payload_text if self.payload_text is not None else encode(self.payload)
        if type(payload) is bytes:
            payload = payload.decode()
        return (self.seq, self.ts, self.kind, payload,
                encode(self.route).decode() if self.route is not None else None,
                self.principal)

    def same_content(self, other: "Event") -> bool:
        return (self.seq, self.ts, self.kind, self.payload, self.route) == (
            other.seq, other.ts, other.kind, other.payload, other.route)

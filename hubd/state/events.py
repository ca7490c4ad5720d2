"""Journal events: the only way coordination state changes.

An event is `(seq, ts, kind, payload, route)`, stored with the name of the
principal whose connection caused it. `payload` is what the event says
(for a chat, the frame as relayed); `route` holds the hub's own routing facts
decided when the event was made (who was online to receive a chat), which
replay must reuse rather than recompute.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

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
# what the journal holds at the seq of an event whose row SQLite refused
# (hubd/actors/journal_writer.py): the seq stays taken, the log contiguous
JOURNAL_ROW_REFUSED = "journal_row_refused"


class UnstorableEvent(ValueError):
    """The event cannot be written as a journal row (text that is not valid
    UTF-8, such as a lone surrogate; a number JSON cannot hold)."""

    error_code = "unstorable_event"  # what its sender is told (Router.refuse_command)


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
    # its journal row, made once (Router.event makes it before applying)
    stored: tuple | None = field(default=None, compare=False, repr=False)

    def row(self) -> tuple:
        """(seq, ts, kind, payload, route, principal) as the journal stores them;
        UnstorableEvent if SQLite could not store one of them as text."""
        if self.stored is None:
            payload = self.payload_text if self.payload_text is not None \
                else encode_payload(self.kind, self.payload)
            route = encode_payload(self.kind, self.route).decode() \
                if self.route is not None else None
            payload = payload.decode() if type(payload) is bytes else _utf8(payload, self.kind)
            self.stored = (self.seq, self.ts, self.kind, payload, route,
                           _utf8(self.principal, self.kind) if self.principal is not None else None)
        return self.stored

    def same_content(self, other: "Event") -> bool:
        return (self.seq, self.ts, self.kind, self.payload, self.route) == (
            other.seq, other.ts, other.kind, other.payload, other.route)


def refused_row(event: Event, error: BaseException) -> tuple:
    """The row that holds the seq of `event` when SQLite refused its own: the
    kind it had and why, as text that can be stored (the log stays contiguous)."""
    def safe(text: str) -> str:
        return text.encode("utf-8", "backslashreplace").decode()
    payload = {"kind": safe(str(event.kind))[:128], "error": safe(str(error))[:512]}
    ts = event.ts if isinstance(event.ts, float) and math.isfinite(event.ts) else time.time()
    return (event.seq, ts, JOURNAL_ROW_REFUSED, encode(payload).decode(), None,
            safe(event.principal) if isinstance(event.principal, str) else None)


def encode_payload(kind: str, payload: dict) -> bytes:
    """A payload's JSON (made once by a handler that also sends it, a chat);
    UnstorableEvent if it cannot be made."""
    try:
        return encode(payload)
    except TypeError as exc:  # orjson: lone surrogates, non-str keys, ints past 64 bits
        raise UnstorableEvent(f"{kind} event: {exc}") from None


def _utf8(text: str, kind: str) -> str:
    """text, if SQLite can store it (orjson's bytes always are)."""
    if not text.isascii():
        try:
            text.encode()
        except UnicodeEncodeError as exc:
            raise UnstorableEvent(f"{kind} event: text that is not valid UTF-8 "
                                  f"({exc.reason})") from None
    return text

"""The receipts a sender can be told, as a table, and the one receipt builder.

Every `delivery_receipt` a sender that asked (receipt_requested) can get, for
a local chat or a forwarded one (its settled states: hubd/state/forward_table.py),
and its fields: the chat, mailbox and forwarding code all build theirs with
`receipt`. Nothing here does IO or keeps state.
"""

from __future__ import annotations

from dataclasses import dataclass

from hubd.state.forward_table import ACCEPTED, DUPLICATE, EXPIRED, REFUSED

# -- receipts: what a sender that asked (receipt_requested) is told
#
# A local directed chat gets one receipt at once: immediate_delivered when a
# recipient was online, or `pending` (dead-lettered: nobody online; it waits in
# the mailbox) followed by `deferred` when a recipient reads it and acks. A
# broadcast that reached nobody is immediate_undelivered. A forwarded chat gets
# its settled receipt (forward-accepted/-duplicate/-refused/-expired), or
# forward-pending first when the peer has not answered within a second, and
# the settled one later through the durable notification outbox.


@dataclass(frozen=True, slots=True)
class ReceiptKind:
    notification: str  # the receipt_notification_id suffix
    delivered: bool | None  # None: as the peer's result says
    deferred: bool | None  # None: whether the sender was told `pending` before
    reason: str | None  # None: as the peer's result says
    forward_state: str | None  # set on receipts of forwarded chats


IMMEDIATE_DELIVERED = "immediate_delivered"
IMMEDIATE_UNDELIVERED = "immediate_undelivered"
DEAD_LETTERED = "pending"
DEFERRED = "deferred"
FORWARD_PENDING = "forward-pending"
FORWARD_ACCEPTED = "forward-accepted"
FORWARD_DUPLICATE = "forward-duplicate"
FORWARD_REFUSED = "forward-refused"
FORWARD_EXPIRED = "forward-expired"
NO_ONLINE_RECIPIENT = "no_online_recipient"
# consume-live receipts (hubd/state/receipt_rules.py, docs/receipts.md): the
# kind names are receipt_rules' verdicts; each negative one waits for a
# mailbox ack, so its notification is `pending` like a dead letter's
NO_LIVE = "no_live_recipient"
TRANSPORT_UNAVAILABLE = "recipient_transport_unavailable"
# a pending receipt pushed out of the bounded window: settled, and told
RECEIPT_EXPIRED = "expired"
# a forwarded chat's duplicate answered by a receiving hub that restarted
# before deciding the first acceptance's verdict (federation/state.py)
DELIVERY_UNCONFIRMED = "delivery_unconfirmed"

RECEIPTS: dict[str, ReceiptKind] = {
    IMMEDIATE_DELIVERED: ReceiptKind(IMMEDIATE_DELIVERED, True, False, "", None),
    IMMEDIATE_UNDELIVERED: ReceiptKind(IMMEDIATE_UNDELIVERED, False, False, "", None),
    DEAD_LETTERED: ReceiptKind(DEAD_LETTERED, False, False, NO_ONLINE_RECIPIENT, None),
    NO_LIVE: ReceiptKind(DEAD_LETTERED, False, False, NO_LIVE, None),
    TRANSPORT_UNAVAILABLE: ReceiptKind(DEAD_LETTERED, False, False, TRANSPORT_UNAVAILABLE, None),
    DEFERRED: ReceiptKind(DEFERRED, True, True, "", None),
    RECEIPT_EXPIRED: ReceiptKind(RECEIPT_EXPIRED, False, True, "receipt_expired", None),
    FORWARD_PENDING: ReceiptKind(FORWARD_PENDING, False, True, "forward_pending", "pending"),
    FORWARD_ACCEPTED: ReceiptKind(FORWARD_ACCEPTED, None, None, None, ACCEPTED),
    FORWARD_DUPLICATE: ReceiptKind(FORWARD_DUPLICATE, None, None, None, DUPLICATE),
    FORWARD_REFUSED: ReceiptKind(FORWARD_REFUSED, False, None, "forward_refused", REFUSED),
    FORWARD_EXPIRED: ReceiptKind(FORWARD_EXPIRED, False, None, "forward_expired", EXPIRED),
}
SETTLED_RECEIPT = {ACCEPTED: FORWARD_ACCEPTED, DUPLICATE: FORWARD_DUPLICATE,
                   REFUSED: FORWARD_REFUSED, EXPIRED: FORWARD_EXPIRED}


@dataclass(frozen=True, slots=True)
class ChatRef:
    """The chat a receipt is about, as its sender knows it."""

    sender: str
    seq: int
    msg_id: int
    target: str
    client_msg_id: str | None


@dataclass(frozen=True, slots=True)
class ForwardFacts:
    """What a receipt of a forwarded chat adds: where it went and what came back."""

    peer: str
    forward_id: str
    target_seat: str
    reason_code: str = ""  # the peer's (or the outbox's) refusal code
    detail: str = ""
    result: dict | None = None  # the peer's `result` for an accepted forward
    told_pending: bool = False


def receipt(kind: str, chat: ChatRef, recipients: list[str] = (), *,
            forward: ForwardFacts | None = None,
            wake: dict | None = None, matched: list[str] | None = None,
            stale: list[str] = ()) -> tuple[str, dict]:
    """The one delivery_receipt builder: (payload text, fields) for `kind`.

    `recipients` are the names the chat reached (local kinds); a forwarded
    chat's recipients come from the peer's result, qualified with @peer.
    `matched` and `stale` are a local chat's routing evidence (the socket
    matches, and those of them that were not consume-live); `matched`
    defaults to the recipients.
    """
    row = RECEIPTS[kind]
    delivered, deferred, reason = row.delivered, row.deferred, row.reason
    dead_lettered = row.notification == DEAD_LETTERED or kind == RECEIPT_EXPIRED
    extra: dict = {}
    if row.forward_state is None:
        names = list(recipients)
        matched = names if matched is None else list(matched)
        stale = list(stale)
        text = _local_text(kind, names, chat.target, stale)
    else:
        assert forward is not None, "a forward receipt needs its ForwardFacts"
        peer = forward.peer
        result = forward.result or {}
        names = _qualified(result.get("recipients"), peer)
        if delivered is None:
            delivered = result.get("delivered") is True
            dead_lettered = result.get("dead_lettered") is True
            reason = str(result.get("reason") or "")
        if deferred is None:
            deferred = forward.told_pending
        # the peer's consume-live evidence, as the reference reports it
        matched = (_qualified(result["matched_recipients"], peer)
                   if "matched_recipients" in result else names)
        stale = _qualified(result.get("stale_recipients"), peer)
        text = _forward_text(row.forward_state, peer, names, delivered, forward, reason)
        extra = {"forward_id": forward.forward_id, "forwarded_to": peer,
                 "forward_state": row.forward_state,
                 "refusal_code": forward.reason_code if row.forward_state == REFUSED else ""}
    fields = {"client_msg_id": chat.client_msg_id, "delivered": delivered, "deferred": deferred,
              "dead_lettered": dead_lettered, "reason": reason, "recipients": names,
              "matched_recipients": matched, "stale_recipients": stale,
              "message_id": chat.msg_id,
              "message_seq": chat.seq, "message_target": chat.target, **extra,
              "receipt_notification_id": f"delivery-receipt:{chat.seq}:{row.notification}"}
    if wake is not None:
        fields["recipient_wake_capabilities"] = wake
    return text, fields


def _local_text(kind: str, names: list[str], target: str, stale: list[str]) -> str:
    if kind == IMMEDIATE_DELIVERED:
        return "delivered to " + ", ".join(names)
    if kind == DEAD_LETTERED:
        return f"delivery failed: no online recipient matched {target}"
    if kind == NO_LIVE:
        return (f"delivery failed: no live recipient matched {target}; stale sockets: "
                + ", ".join(stale))
    if kind == TRANSPORT_UNAVAILABLE:
        return (f"delivery failed: no write to a live recipient of {target} completed "
                "(recipient transport unavailable); retry with the same client_msg_id")
    if kind == RECEIPT_EXPIRED:
        return (f"delivery unconfirmed: the pending receipt for {target} left the bounded "
                "pending window before any recipient acknowledged it")
    if kind == DEFERRED:
        return f"delivered to {', '.join(names)} on reconnect"
    return "delivered to nobody: no other agent is online"


def _qualified(names, peer: str) -> list[str]:
    if not isinstance(names, list):
        return []
    return [f"{n}@{peer}" for n in names if isinstance(n, str)]


def _forward_text(state: str, peer: str, names: list[str], delivered: bool,
                  forward: ForwardFacts, reason: str | None) -> str:
    if state in (ACCEPTED, DUPLICATE):
        if delivered:
            return f"delivered to {', '.join(names)} (forwarded to {peer})"
        if reason == NO_LIVE:
            return (f"accepted by {peer}; no live recipient matched {forward.target_seat} "
                    "there, it waits in that hub's mailbox")
        if reason == DELIVERY_UNCONFIRMED:
            return (f"accepted by {peer} before it restarted; delivery to "
                    f"{forward.target_seat} is unconfirmed, it waits in that hub's mailbox")
        if reason == TRANSPORT_UNAVAILABLE:
            return (f"accepted by {peer}; no write to {forward.target_seat} completed there "
                    "(recipient transport unavailable), it waits in that hub's mailbox")
        return (f"accepted by {peer}; {forward.target_seat} is not online there, it waits in "
                "that hub's mailbox")
    if state == "pending":
        return f"forward to {peer} pending ({forward.detail}); retrying"
    detail = f" ({forward.reason_code}: {forward.detail})" if forward.detail else ""
    return f"forward to {peer} {state}{detail}"

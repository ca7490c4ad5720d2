"""Forwarding projections, kept in HubState.extensions and rebuilt by replay.

- the forward outbox: chats this hub journaled for a peer that are not settled
  yet. A row is the chat event itself (its route names the peer and the
  forward_id), so the chat and its outbox row commit together.
- the forward inbox: forward_ids this hub accepted from peers, with a digest of
  what was accepted and the result it answered, so a retry gets `duplicate`
  and the same id with other content gets `forward_id_conflict`.

Settlement (`forward_settled`) removes a row and, when the sender asked for a
receipt after it was told "pending", queues the final receipt in the durable
sender-notification outbox.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass, field

from hubd.state.events import Event
from hubd.state.hub import Appliers, HubState

from hubd.wire.codec import encode

FORWARD_SETTLED = "forward_settled"
OUTBOX = "forward_outbox"
INBOX = "forward_inbox"

# Accepted forward ids remembered for deduplication. The origin retries a
# forward until it is answered (an answer lost in a cut link is retried within
# seconds of the link returning), so the window that matters is minutes to
# hours of traffic; 200,000 compact entries (~40 MB) covers that at the rates
# this hub sustains, and the bound keeps memory fixed.
INBOX_IDS = 200_000


@dataclass(slots=True)
class PendingForward:
    forward_id: str
    peer: str
    seq: int  # the origin chat's seq
    created: float
    expires_at: float
    sender: str
    sender_seat: str
    target_seat: str
    body: dict
    receipt_requested: bool
    client_msg_id: str | None
    msg_id: int
    target: str  # as the sender wrote it: seat@peer

    def frame(self, origin_hub: str) -> dict:
        frame = self.entry()
        frame.update(sender=origin_hub, target="System", type="multihub_message_forward",
                     payload="")
        return frame

    def entry(self) -> dict:
        """The forward as one entry of a batch (the batch frame carries the envelope)."""
        return {"forward_id": self.forward_id, "kind": "chat", "sender_seat": self.sender_seat,
                "target_seat": self.target_seat, "body": self.body}


@dataclass
class ForwardOutbox:
    pending: OrderedDict = field(default_factory=OrderedDict)  # forward_id -> PendingForward

    def for_peer(self, peer: str) -> list[PendingForward]:
        return [p for p in self.pending.values() if p.peer == peer]


@dataclass(slots=True, frozen=True)
class Accepted:
    """What a forward_id was bound to, and enough to answer its duplicates."""

    digest: str
    origin: str
    seq: int
    msg_id: int
    recipients: tuple

    @property
    def result(self) -> dict:
        return _result(self.seq, self.msg_id, self.recipients)


@dataclass
class ForwardInbox:
    accepted: OrderedDict = field(default_factory=OrderedDict)  # forward_id -> Accepted

    def remember(self, forward_id: str, entry: Accepted) -> None:
        self.accepted[forward_id] = entry
        while len(self.accepted) > INBOX_IDS:
            self.accepted.popitem(last=False)


# the projections this module keeps in HubState.extensions, by name
PROJECTIONS = {OUTBOX: ForwardOutbox, INBOX: ForwardInbox}
appliers = Appliers()


def outbox_of(state: HubState) -> ForwardOutbox:
    return state.extensions[OUTBOX]


def inbox_of(state: HubState) -> ForwardInbox:
    return state.extensions[INBOX]


def forward_digest(sender_seat: str, target_seat: str, kind: str, body: dict) -> str:
    """What a forward_id is bound to: any change, even origin_timestamp, is a conflict."""
    canonical = encode({"kind": kind, "sender_seat": sender_seat, "target_seat": target_seat,
                        "body": body})
    return hashlib.sha256(canonical).hexdigest()


def forward_body(frame: dict) -> dict:
    """The part of a chat that crosses to the peer."""
    body = {"payload": frame.get("payload"), "origin_msg_id": frame["msg_id"],
            "origin_timestamp": frame["timestamp"]}
    for name in ("client_msg_id", "metadata", "priority", "reply_to"):
        if name in frame:
            body[name] = frame[name]
    return body


@appliers.applies("chat")
def _apply_forwarding(state: HubState, event: Event) -> None:
    route = event.route
    if not route:
        return
    outgoing = route.get("forward")
    if outgoing is not None:
        frame = event.payload
        outbox_of(state).pending[outgoing["forward_id"]] = PendingForward(
            forward_id=outgoing["forward_id"], peer=outgoing["peer"], seq=event.seq,
            created=event.ts, expires_at=outgoing["expires_at"], sender=frame["sender"],
            sender_seat=frame["sender"], target_seat=outgoing["seat"],
            body=forward_body(frame), receipt_requested=frame.get("receipt_requested") is True,
            client_msg_id=frame.get("client_msg_id"), msg_id=frame["msg_id"],
            target=frame.get("target", ""))
        return
    incoming = route.get("forwarded")
    if incoming is not None:
        inbox_of(state).remember(incoming["forward_id"], Accepted(
            incoming["digest"], incoming["origin"], event.seq, event.payload.get("msg_id"),
            tuple(route.get("recipients", ()))))


def result_of(event: Event, recipients: list[str]) -> dict:
    """The `result` a receiving hub answers for an accepted forwarded chat."""
    return _result(event.seq, event.payload.get("msg_id"), recipients)


def _result(seq: int, msg_id, recipients) -> dict:
    delivered = bool(recipients)
    return {"seq": seq, "msg_id": msg_id, "delivered": delivered,
            "recipients": list(recipients), "matched_recipients": list(recipients),
            "stale_recipients": [], "reason": "" if delivered else "no_online_recipient",
            "dead_lettered": not delivered}


@appliers.applies(FORWARD_SETTLED)
def _apply_settled(state: HubState, event: Event) -> None:
    """One event settles every forward answered in one Router round: the ones
    the peer accepted with no receipt owed by id, the rest with their details."""
    pending = outbox_of(state).pending
    for forward_id in event.payload.get("accepted", ()):
        pending.pop(forward_id, None)
    for settled in event.payload["settled"]:
        pending.pop(settled["forward_id"], None)
        receipt = settled.get("receipt")
        if receipt is not None:
            state.receipts.queue_notification(receipt["target"],
                                              receipt["receipt_notification_id"], receipt)

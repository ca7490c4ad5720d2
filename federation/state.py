"""Forwarding projections, kept in HubState.extensions and rebuilt by replay.

- the forward outbox: chats this hub journaled for a peer that are not settled
  yet. A row is the chat event itself (its route names the peer and the
  forward_id), so the chat and its outbox row commit together. The projection
  is only the index (forward_id -> the chat's seq, per peer, oldest first):
  the forward itself, its body and attempts, is held once, by the peer's
  ForwardOutbox actor (federation/actors/outbox.py), or left in the journal when the
  actor has no room for it (it reads it back by seq: `pending_from_event`).
- the forward inbox: forward_ids this hub accepted from peers, with a digest of
  what was accepted and the result it answered, so a retry gets `duplicate`
  and the same id with other content gets `forward_id_conflict`.

Settlement (`forward_settled`) removes a row and, when the sender asked for a
receipt after it was told "pending", queues the final receipt in the durable
sender-notification outbox.

- the retry schedules: per peer, the attempt count and due time its outbox's
  backoff last reached (`forward_retry`, federation/clock.py PeerRetry), read
  by the outbox when it starts, so a restart keeps holding a refusing peer's
  backlog (docs/federation.md, "Retries across a restart").
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import NamedTuple

from federation.clock import PeerRetry
from hubd.state import receipt_rules, receipt_table
from hubd.state.events import Event
from hubd.state.hub import Appliers, HubState

from hubd.wire.codec import encode

FORWARD_SETTLED = "forward_settled"
FORWARD_RETRY = "forward_retry"
OUTBOX = "forward_outbox"
INBOX = "forward_inbox"
RETRIES = "forward_retries"

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


class PendingRef(NamedTuple):
    seq: int  # the chat's
    created: float


@dataclass
class ForwardOutbox:
    """Unsettled forwards: per peer, forward_id -> PendingRef in seq order."""

    by_peer: dict = field(default_factory=dict)  # peer -> OrderedDict
    peer_of: dict = field(default_factory=dict)  # forward_id -> peer

    def add(self, peer: str, forward_id: str, ref: PendingRef) -> None:
        rows = self.by_peer.get(peer)
        if rows is None:
            rows = self.by_peer[peer] = OrderedDict()
        rows[forward_id] = ref
        self.peer_of[forward_id] = peer

    def settle(self, forward_id: str) -> None:
        peer = self.peer_of.pop(forward_id, None)
        if peer is not None:
            del self.by_peer[peer][forward_id]

    def is_pending(self, forward_id: str) -> bool:
        return forward_id in self.peer_of

    def count(self, peer: str) -> int:
        return len(self.by_peer.get(peer, ()))

    def oldest(self, peer: str) -> PendingRef | None:
        rows = self.by_peer.get(peer)
        return next(iter(rows.values())) if rows else None

    def oldest_seq(self) -> int | None:
        """The oldest unsettled forward's chat: the sender reads it back by seq."""
        oldest = [next(iter(rows.values())).seq for rows in self.by_peer.values() if rows]
        return min(oldest) if oldest else None

    def after(self, peer: str, after_seq: int, limit: int) -> list[int]:
        """The seqs of up to `limit` unsettled forwards to `peer` after `after_seq`."""
        seqs: list[int] = []
        for ref in self.by_peer.get(peer, {}).values():
            if ref.seq > after_seq:
                seqs.append(ref.seq)
                if len(seqs) == limit:
                    break
        return seqs


@dataclass(slots=True, frozen=True)
class Accepted:
    """What a forward_id was bound to, and enough to answer its duplicates."""

    digest: str
    origin: str
    seq: int
    msg_id: int
    recipients: tuple

    @property
    def unconfirmed_result(self) -> dict:
        """The answer to a duplicate when the live verdict is gone (a restart)."""
        return _unconfirmed_result(self.seq, self.msg_id, self.recipients)


@dataclass
class ForwardInbox:
    accepted: OrderedDict = field(default_factory=OrderedDict)  # forward_id -> Accepted

    def remember(self, forward_id: str, entry: Accepted) -> None:
        self.accepted[forward_id] = entry
        while len(self.accepted) > INBOX_IDS:
            self.accepted.popitem(last=False)


@dataclass
class RetrySchedules:
    """Each peer's journaled retry schedule (a peer with none is not backing off)."""

    by_peer: dict = field(default_factory=dict)  # peer -> PeerRetry


# the projections this module keeps in HubState.extensions, by name
PROJECTIONS = {OUTBOX: ForwardOutbox, INBOX: ForwardInbox, RETRIES: RetrySchedules}
appliers = Appliers()


def retries_of(state: HubState) -> RetrySchedules:
    return state.extensions[RETRIES]


def retry_payload(peer: str, retry: PeerRetry | None) -> dict:
    """A forward_retry event: the peer's new schedule, or attempts 0 when it
    answered again and nothing waits any more."""
    if retry is None:
        return {"peer": peer, "attempts": 0, "retry_at": None, "refused": False}
    return {"peer": peer, "attempts": retry.attempts, "retry_at": retry.retry_at,
            "refused": retry.refused}


@appliers.applies(FORWARD_RETRY)
def _apply_retry(state: HubState, event: Event) -> None:
    p = event.payload
    schedules = retries_of(state).by_peer
    if p["attempts"] > 0:
        schedules[p["peer"]] = PeerRetry(p["attempts"], p["retry_at"], p["refused"])
    else:
        schedules.pop(p["peer"], None)


def outbox_of(state: HubState) -> ForwardOutbox:
    return state.extensions[OUTBOX]


def inbox_of(state: HubState) -> ForwardInbox:
    return state.extensions[INBOX]


def forward_digest(sender_seat: str, target_seat: str, kind: str, body: dict) -> str:
    """What a forward_id is bound to: any change, even origin_timestamp, is a conflict."""
    canonical = encode({"kind": kind, "sender_seat": sender_seat, "target_seat": target_seat,
                        "body": body})
    return hashlib.sha256(canonical).hexdigest()


# a chat's fields that cross to the peer beside its payload (`redsyn`: what a
# REDSYN message or link change says, for the peer's REDSYN boxes and links)
FORWARDED_FIELDS = ("client_msg_id", "metadata", "priority", "reply_to", "redsyn")


def forward_body(frame: dict) -> dict:
    """The part of a chat that crosses to the peer."""
    body = {"payload": frame.get("payload"), "origin_msg_id": frame["msg_id"],
            "origin_timestamp": frame["timestamp"]}
    for name in FORWARDED_FIELDS:
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
        outbox_of(state).add(outgoing["peer"], outgoing["forward_id"],
                             PendingRef(event.seq, event.ts))
        return
    incoming = route.get("forwarded")
    if incoming is not None:
        inbox_of(state).remember(incoming["forward_id"], Accepted(
            incoming["digest"], incoming["origin"], event.seq, event.payload.get("msg_id"),
            tuple(route.get("recipients", ()))))


def pending_from_event(event: Event) -> PendingForward | None:
    """The forward a journaled chat carries, or None if it carries none."""
    outgoing = (event.route or {}).get("forward") if event.kind == "chat" else None
    if outgoing is None:
        return None
    frame = event.payload
    return PendingForward(
        forward_id=outgoing["forward_id"], peer=outgoing["peer"], seq=event.seq,
        created=event.ts, expires_at=outgoing["expires_at"], sender=frame["sender"],
        sender_seat=frame["sender"], target_seat=outgoing["seat"],
        body=forward_body(frame), receipt_requested=frame.get("receipt_requested") is True,
        client_msg_id=frame.get("client_msg_id"), msg_id=frame["msg_id"],
        target=frame.get("target", ""))


def verdict_result(seq: int, msg_id, matched: list[str], stale: list[str],
                   written: list[str]) -> dict:
    """The `result` a receiving hub answers for an accepted forwarded chat:
    the consume-live verdict of the local receipts (hubd/state/receipt_rules.py),
    decided once the writes to its live matches have reported. Names are this
    hub's own; the origin qualifies them with @HUB."""
    verdict = receipt_rules.immediate_verdict(matched, stale, written)
    delivered = verdict == receipt_rules.DELIVERED
    return {"seq": seq, "msg_id": msg_id, "delivered": delivered,
            "recipients": list(written), "matched_recipients": list(matched),
            "stale_recipients": list(stale), "reason": receipt_table.RECEIPTS[verdict].reason,
            "dead_lettered": not delivered}


def _unconfirmed_result(seq: int, msg_id, matched) -> dict:
    """A duplicate whose first acceptance's verdict this process never decided
    (accepted before a restart): the chat is journaled and waits in the
    mailbox, but no completed write can be claimed for it."""
    return {"seq": seq, "msg_id": msg_id, "delivered": False, "recipients": [],
            "matched_recipients": list(matched), "stale_recipients": [],
            "reason": receipt_table.DELIVERY_UNCONFIRMED if matched
            else receipt_table.NO_ONLINE_RECIPIENT,
            "dead_lettered": True}


@appliers.applies(FORWARD_SETTLED)
def _apply_settled(state: HubState, event: Event) -> None:
    """One event settles every forward answered in one Router round: the ones
    the peer accepted with no receipt owed by id, the rest with their details."""
    outbox = outbox_of(state)
    for forward_id in event.payload.get("accepted", ()):
        outbox.settle(forward_id)
    for settled in event.payload["settled"]:
        outbox.settle(settled["forward_id"])
        receipt = settled.get("receipt")
        if receipt is not None:
            state.receipts.queue_notification(receipt["target"],
                                              receipt["receipt_notification_id"], receipt)

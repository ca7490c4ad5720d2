"""Receipts that tell the truth (seed: "Consume-live immediate receipts",
"Recipient transport failure", "Durable receipt aggregate and outbox";
docs/receipts.md).

A receipt-requested directed chat commits with its delivery_receipt_requested
aggregate. Its socket matches are split into consume-live and stale ones
(hubd/state/receipt_rules.py). With no live match the verdict is known at once
and commits in the same transaction; otherwise the hub waits, after the chat's
release, for each live match's write (the recipient's socket and its -rx
waiter's) to complete or fail (its endpoint's when_written: the WebSocket
door's drain deadline, timing.send_stall, bounds it), then commits
delivery_receipt_immediate.
Every verdict is an outbox row: the sender gets it after the commit, and the
row is settled (receipt_notified) only once the write to the sender
completed; a crash in between sends it again when the sender next registers.

The in-flight bookkeeping is the Router's live `ReceiptDesk` (like presence:
not journaled, gone with the process; an aggregate left at `requested` by a
crash stays honestly there). Write results reach it from the endpoints'
callbacks and are handled in one Router round per burst (`WritesReported`).
"""

from __future__ import annotations

from typing import Callable, Iterable, NamedTuple

import structlog

from hubd.actors.router import Router
from hubd.handlers import routing
from hubd.state import receipt_table
from hubd.state import events as ev
from hubd.state import receipt_rules as rules
from hubd.state.channels import chat_channel
from hubd.state.presence import RX_SUFFIX, Presence, Session
from hubd.wire.targets import parse_target

log = structlog.get_logger("hubd.receipts")

# chats (receipt-requested, or forwarded from a peer) whose verdict waits for
# writes; past it a new one is decided at once as if no write completed
# (negative, never a false positive)
MAX_AWAITING_WRITES = 65_536


class Awaiting:
    """One chat whose verdict waits for its live matches' writes; `decided`
    is called in a Router round with the names whose write completed."""

    __slots__ = ("decided", "outstanding", "written")

    def __init__(self, decided: Callable[[Router, list[str]], None], outstanding: int,
                 written: Iterable[str]):
        self.decided = decided
        self.outstanding = outstanding
        self.written: set[str] = set(written)


class WritesReported(NamedTuple):
    """The desk holds write results to decide (posted once per burst)."""


WRITES_REPORTED = WritesReported()


class ReceiptDesk:
    """The Router's live receipt bookkeeping: chats awaiting writes, write
    results not yet decided, and sender notifications in flight per endpoint.
    Results arrive from endpoint callbacks and are handled in one Router
    control round per burst."""

    def __init__(self, router: Router):
        self.router = router
        self.awaiting: dict[int, Awaiting] = {}
        self.results: list[tuple[int, str, bool]] = []  # (chat seq, name, written)
        self.sent: list[tuple[str, int, str, bool]] = []  # (sender, endpoint, id, written)
        self.in_flight: dict[int, set[str]] = {}  # sender endpoint -> notification ids
        self._posted = False
        self.overflows = 0
        metrics = router.metrics
        if "hubd_receipts_awaiting_write" not in metrics.gauges:
            metrics.gauge("hubd_receipts_awaiting_write",
                          "Receipt-requested or forwarded chats whose verdict waits for a "
                          "recipient write.",
                          lambda: len(self.awaiting))

    def _post(self) -> None:
        if not self._posted:
            self._posted = True
            self.router.post_control(WRITES_REPORTED)

    def write_result(self, seq: int, name: str, ok: bool) -> None:
        self.results.append((seq, name, ok))
        self._post()

    def notification_written(self, sender: str, endpoint: int, notification_id: str,
                             ok: bool) -> None:
        self.sent.append((sender, endpoint, notification_id, ok))
        self._post()

    def round(self, router: Router) -> None:
        """Decide every chat whose writes have all reported, and settle every
        notification whose write completed: one round, one batch."""
        self._posted = False
        if router.mutations_refused():
            # the journal is refusing writes: keep the results; the once-a-
            # second sweep tries again (an aggregate never skips its verdict)
            return
        results, self.results = self.results, []
        sent, self.sent = self.sent, []
        for seq, name, ok in results:
            entry = self.awaiting.get(seq)
            if entry is None:
                continue
            if ok:
                entry.written.add(name)
            entry.outstanding -= 1
            if entry.outstanding <= 0:
                del self.awaiting[seq]
                entry.decided(router, sorted(entry.written))
        settled: dict[str, list[str]] = {}
        for sender, endpoint, notification_id, ok in sent:
            ids = self.in_flight.get(endpoint)
            if ids is not None:
                ids.discard(notification_id)
            if ok:
                settled.setdefault(sender, []).append(notification_id)
        for sender, ids in settled.items():
            outbox = router.state.receipts.outbox.get(sender, {})
            still = [i for i in ids if i in outbox]
            if still:
                router.event(ev.RECEIPT_NOTIFIED, {"sender": sender, "notification_ids": still})

    def retry(self) -> None:
        """From the sweep: results held back while the journal refused writes."""
        if self.results or self.sent:
            self._post()

    def forget_endpoint(self, endpoint: int) -> None:
        self.in_flight.pop(endpoint, None)


def desk(router: Router) -> ReceiptDesk:
    return router.live_of(ReceiptDesk)


def writes_reported(router: Router, command: WritesReported) -> None:
    desk(router).round(router)


class DarkSeats:
    """The dark-seat watch's open episodes: identity -> (since, alerted)."""

    def __init__(self, router: Router):
        self.episodes: dict = {}


def policy(router: Router) -> rules.LivenessPolicy:
    return router.config.liveness


def agent_liveness(router: Router) -> dict:
    """who_snapshot.agent_liveness: every connected seat (waiters are shown
    through their seat's has_live_waiter, as the reference does)."""
    presence, now, pol = router.presence, router.now, policy(router)
    return {name: rules.seat_liveness(presence.by_name, name, now, pol).as_wire()
            for name in presence.by_name if not name.endswith(RX_SUFFIX)}


def wake_of(presence: Presence, names) -> dict:
    by_name = presence.by_name
    wake = {}
    for name in names:
        peer = by_name.get(name)
        wake[name] = (peer.wake_capability if peer is not None and peer.wake_capability
                      else "unknown")
    return wake


def request(router: Router, session: Session, frame: dict, seq: int,
            recipients: list[str], directed: bool) -> None:
    """The sender asked for a receipt on the chat just routed as `seq`."""
    presence = router.presence
    chat_ref = receipt_table.ChatRef(session.name, seq, frame["msg_id"],
                                     frame.get("target") or "all", frame.get("client_msg_id"))
    if not directed:
        # a broadcast's receipt names who was online to get it (the seed's
        # completed-write rule is for directed chat)
        kind = receipt_table.IMMEDIATE_DELIVERED if recipients else \
            receipt_table.IMMEDIATE_UNDELIVERED
        text, fields = receipt_table.receipt(kind, chat_ref, recipients,
                                        wake=wake_of(presence, recipients))
        router.reply(session, "delivery_receipt", text, **fields)
        return
    served, live, stale = consume_live_partition(router, recipients)
    wake = wake_of(presence, recipients)
    router.event(ev.DELIVERY_RECEIPT_REQUESTED, {
        "chat_seq": seq, "sender": session.name, "target": chat_ref.target,
        "client_msg_id": chat_ref.client_msg_id, "msg_id": chat_ref.msg_id,
        "matched_recipients": recipients, "stale_recipients": stale})
    await_writes(router, seq, served, live,
                 lambda router, written: settle_immediate(router, chat_ref, written, recipients,
                                                          stale, wake))


def request_channel(router: Router, session: Session, frame: dict, seq: int,
                    recipients: list[str]) -> None:
    """The sender asked for a receipt on a private-channel chat: the
    completed-write rule over the members' own sockets (no -rx waiter, no
    consume-liveness partition: the audience is exact membership). A positive
    receipt lists only the members whose write completed; a negative one is
    not dead-lettered and never waits for a deferred verdict (a channel has no
    mailbox). `message_target` is the channel (the reference's)."""
    channel = chat_channel(frame)
    chat_ref = receipt_table.ChatRef(session.name, seq, frame["msg_id"], channel,
                                     frame.get("client_msg_id"))
    wake = wake_of(router.presence, recipients)
    router.event(ev.DELIVERY_RECEIPT_REQUESTED, {
        "chat_seq": seq, "sender": session.name, "target": channel, "channel": channel,
        "client_msg_id": chat_ref.client_msg_id, "msg_id": chat_ref.msg_id,
        "matched_recipients": recipients, "stale_recipients": []})
    await_writes(router, seq, [], recipients,
                 lambda router, written: settle_immediate(router, chat_ref, written, recipients,
                                                          [], wake, channel=True),
                 waiters=False)


def consume_live_partition(router: Router, recipients: list[str]
                           ) -> tuple[list[str], list[str], list[str]]:
    """(served, live, stale) among a directed chat's socket-level matches:
    seats a plugin serves outside presence (the broker's: that door's
    delivery at the commit is the write), and the connected ones split by
    consume-liveness."""
    presence, now, pol = router.presence, router.now, policy(router)
    served = [n for n in recipients if not presence.live(n)]
    live, stale = rules.partition(
        (n for n in recipients if presence.live(n)),
        lambda n: rules.seat_liveness(presence.by_name, n, now, pol).proven_live)
    return served, live, stale


def await_writes(router: Router, seq: int, served: list[str], live: list[str],
                 decided: Callable[[Router, list[str]], None], waiters: bool = True) -> None:
    """Call `decided(router, written)` once the writes of the chat `seq` to
    every live name's socket and -rx waiter have reported (after its
    release; the door's drain deadline bounds the wait), `written` being the
    names with a completed write plus `served`. With no live name, or too
    many chats already waiting, it is called at once, in this round, with
    `served` alone (never a false positive). Local receipts and forwarded
    chats' answers (federation/handlers/receiver.py) both decide through this.
    `waiters=False` (a channel chat, sent to members' own sockets only)
    waits for those sockets alone."""
    if not live:
        decided(router, list(served))
        return
    endpoints = []
    by_name = router.presence.by_name
    for name in live:
        waiter = by_name.get(name + RX_SUFFIX) if waiters else None
        for sess in (by_name.get(name), waiter):
            if sess is not None:
                endpoints.append((name, sess.endpoint))
    the_desk = desk(router)
    if len(the_desk.awaiting) >= MAX_AWAITING_WRITES:
        the_desk.overflows += 1
        router.metrics.receipt_write_overflows += 1
        log.warning("too many chats await writes; deciding this one unwritten",
                    seq=seq, awaiting=len(the_desk.awaiting))
        decided(router, list(served))
        return
    the_desk.awaiting[seq] = Awaiting(decided, len(endpoints), served)
    hub_endpoints = router.endpoints

    def track() -> None:
        for name, endpoint in endpoints:
            hub_endpoints.when_written(
                endpoint, lambda ok, name=name: the_desk.write_result(seq, name, ok))
    # if the chat's commit fails, `track` never runs; `rebuilt` drops the entry
    router.after_release(track)


def settle_immediate(router: Router, chat_ref: receipt_table.ChatRef,
                     written: list[str], matched: list[str], stale: list[str],
                     wake: dict, channel: bool = False) -> None:
    """Journal the immediate verdict with its outbox row (and, for a negative
    one that would overflow the pending window, the oldest pending receipt's
    expiry first, in the same commit), then tell whoever is online. A
    channel chat's negative verdict is final: not pending, not dead-lettered."""
    verdict = rules.immediate_verdict(matched, stale, written)
    pending = verdict in rules.NEGATIVE and not channel
    notify = {chat_ref.sender}
    if pending:
        notify.update(expire_oldest(router))
    text, fields = receipt_table.receipt(verdict, chat_ref, written, wake=wake,
                                         matched=matched, stale=stale)
    if channel:
        fields["dead_lettered"] = False
    receipt = router.frame("delivery_receipt", chat_ref.sender, text, **fields)
    immediate = {"chat_seq": chat_ref.seq, "verdict": verdict, "pending": pending,
                 "receipt": receipt}
    if channel and verdict in rules.NEGATIVE:
        immediate["retryable"] = True  # it reached no member: a retry routes again
    router.event(ev.DELIVERY_RECEIPT_IMMEDIATE, immediate)
    router.metrics.count_receipt(verdict)
    if verdict == rules.TRANSPORT_UNAVAILABLE and not channel:
        routing.dead_letter_unwritten(router, parse_target(chat_ref.target).raw,
                                      chat_ref.sender, chat_ref.seq)
    for name in sorted(notify):
        session = router.presence.session_of(name)
        if session is not None:
            deliver_notifications(router, session)
    if stale:
        sender = router.presence.session_of(chat_ref.sender)
        if sender is not None:
            warn_stale(router, sender, chat_ref, fields, wake)


def expire_oldest(router: Router) -> set[str]:
    """Settle as expired the pending receipts a new one pushes out; their senders."""
    receipts = router.state.receipts
    senders = set()
    for _ in range(rules.evictions(len(receipts.pending), receipts.pending_limit)):
        seq, oldest = next(iter(receipts.pending.items()))
        chat_ref = receipt_table.ChatRef(oldest.sender, seq, oldest.msg_id, oldest.target,
                                         oldest.client_msg_id)
        text, fields = receipt_table.receipt(receipt_table.RECEIPT_EXPIRED, chat_ref, [])
        receipt = router.frame("delivery_receipt", oldest.sender, text, **fields)
        router.event(ev.DELIVERY_RECEIPT_EXPIRED, {"chat_seq": seq, "reason": "evicted",
                                                   "receipt": receipt})
        router.metrics.count_receipt(receipt_table.RECEIPT_EXPIRED)
        log.info("pending receipt evicted from the bounded window; settled expired",
                 seq=seq, sender=oldest.sender, limit=receipts.pending_limit)
        senders.add(oldest.sender)
    return senders


def warn_stale(router: Router, sender: Session, chat_ref: receipt_table.ChatRef,
               fields: dict, wake: dict) -> None:
    """The private recipient_liveness_warning beside a receipt with stale matches."""
    stale = fields["stale_recipients"]
    negative = not fields["delivered"]
    text = (", ".join(stale) + " present but not proven live \u2014 no armed waiter and no "
            "recent reaction; ")
    if negative:
        text += f"delivery classified {fields['reason']} and dead-lettered; "
    text += "a directed message may sit unread"
    router.reply(sender, "recipient_liveness_warning", text,
                 message_target=chat_ref.target, message_id=chat_ref.msg_id,
                 delivered=fields["delivered"], dead_lettered=fields["dead_lettered"],
                 reason=fields["reason"], matched_recipients=fields["matched_recipients"],
                 stale_recipients=stale, passive_recipients=[],
                 recipient_wake_capabilities=wake)
    router.metrics.liveness_warnings += 1


def deliver_notifications(router: Router, session: Session) -> None:
    """Send this sender's waiting receipts that are not already on their way
    to this endpoint; each is settled once its write completed (a crash or a
    failed write before that sends it again: at least once)."""
    name = session.name
    waiting = router.state.receipts.notifications_for(name)
    if not waiting:
        return
    the_desk = desk(router)
    endpoint = session.endpoint
    in_flight = the_desk.in_flight.setdefault(endpoint, set())
    fresh = [(i, frame) for i, frame in waiting if i not in in_flight]
    if not fresh:
        return
    for notification_id, frame in fresh:
        router.send(endpoint, frame)
        in_flight.add(notification_id)
    ids = [notification_id for notification_id, _ in fresh]
    hub_endpoints = router.endpoints

    def track() -> None:
        hub_endpoints.when_written(endpoint, lambda ok: [
            the_desk.notification_written(name, endpoint, i, ok) for i in ids])
    router.after_release(track)


def rebuilt(router: Router) -> None:
    """The state was rebuilt from the journal: chats that never committed
    (a failed commit) will never report writes."""
    found = desk(router)
    last = router.state.last_seq
    for seq in [s for s in found.awaiting if s > last]:
        del found.awaiting[seq]


def on_unregister(router: Router, session: Session) -> None:
    desk(router).forget_endpoint(session.endpoint)


def sweep(router: Router) -> None:
    """Once a second: write results held back by a refusing journal, and the
    dark-seat watch."""
    desk(router).retry()
    dark_seat_sweep(router)


def dark_seat_sweep(router: Router) -> None:
    """A seat that owns an unexpired claim or is the suggested
    owner of an unfinished board task, without a fresh exact-identity -rx
    waiter for --dark-seat-after seconds, gets one dark_seat_alert broadcast
    per continuous episode. It changes no claim or board authority."""
    from hubd.state.board import FINISHED, board_of
    from hubd.state.claims import claims_of

    now = router.now
    claims = claims_of(router.state)
    work = rules.owned_work(claims.by_owner, lambda t: claims.live(t, now) is not None,
                            board_of(router.state).tasks.values(), FINISHED)
    by_name, pol = router.presence.by_name, policy(router)

    def fresh_waiter(identity: str) -> bool:
        waiter = by_name.get(identity + RX_SUFFIX)
        return waiter is not None and now - waiter.last_heard <= pol.waiter_window

    watch = router.live_of(DarkSeats)
    episodes, alerts = rules.dark_seat_round(watch.episodes, work, fresh_waiter, now,
                                             router.config.timing.dark_seat_after)
    watch.episodes = episodes
    for seat, missing in alerts:
        router.metrics.dark_seat_alerts += 1
        log.warning("dark seat: owns live work without a fresh -rx waiter",
                    identity=seat.identity, claims=list(seat.claims), tasks=list(seat.tasks))
        router.broadcast(router.frame(
            "dark_seat_alert", "all",
            f"Dark seat: {seat.identity} owns live work without a fresh -rx waiter.",
            identity=seat.identity, claims=list(seat.claims), tasks=list(seat.tasks),
            missing_for_seconds=round(missing, 3),
            remedy=(f"arm a permanent waiter: synapse arm --name={seat.identity} "
                    f"--for={seat.identity} --directed-only")))

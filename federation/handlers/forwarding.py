"""Forwarding, the Router's side: a chat to PROJECT/seat@HUB, from the sender's frame to its receipts.

Everything here runs inside Router commands (so it may make events); the
sending is the peers' ForwardOutbox actors' (federation/actors/outbox.py), one
per message peer, which this object starts and posts to:
- forward_from: journal the chat with its outbox row (one event), echo it
  locally, and post the row to the peer's outbox once committed;
- reports: what the outboxes reported since the Router last read them (the
  ReadOutboxReports command: settlements, "still pending" notices, changed
  retry schedules, roster answers) becomes one `forward_settled` event, the
  `forward_retry` events and the receipts the senders asked for;
- _load: the Router's index of unsettled rows (asked by a LoadBacklog
  command) and the journal's copy of them, for an outbox that reads the rest
  of its backlog from the journal.

The sender normally gets one receipt: the settled one, if the peer answers
within a second (timing.forward_first_answer). Otherwise it gets `pending`
first and the settled receipt later, through the durable notification
outbox (at once if it is online, else when it next registers).
"""

from __future__ import annotations

import asyncio
import secrets
import time
from dataclasses import dataclass

import structlog

from federation import liveness
from federation import state as fstate
from federation.actors.outbox import ForwardOutbox
from federation.actors.outbox_messages import (Backlog, PeerAlive, Resync, RetrySchedule,
                                               Roster, RosterAnswer, Settled, StillPending)
from federation.actors.peers import PeerLinks
from federation.config import FederationConfig
from federation.metrics import ForwardMetrics
from federation.state import (PendingForward, outbox_of, pending_from_event, retries_of,
                              retry_payload)
from hubd.actors.router import Router
from hubd.handlers.routing import no_route, route_chat
from hubd.handlers.mailbox import deliver_notifications
from hubd.state import forward_table, receipt_table
from hubd.state.forward_table import ACCEPTED, DUPLICATE
from hubd.state.presence import Session
from hubd.wire.targets import RemoteSeat

log = structlog.get_logger("hubd.federation")

MAX_PENDING_PER_PEER = 200_000


# -- the commands the outboxes' side posts to the Router (federation/plugin.py
# registers them with their handlers below)


@dataclass(frozen=True, slots=True)
class ReadOutboxReports:
    """The outboxes reported since the Router last read: read them all in one round."""


READ_OUTBOX_REPORTS = ReadOutboxReports()


@dataclass(frozen=True, slots=True)
class LoadBacklog:
    """An outbox asks for the seqs of up to `limit` unsettled forwards to
    `peer` after `after_seq`, and the peer's journaled retry schedule."""

    peer: str
    after_seq: int
    limit: int
    reply: asyncio.Future  # gets (seqs, PeerRetry | None)


def read_outbox_reports(router: Router, command: ReadOutboxReports) -> None:
    router.hub.federation.forwarding.read_reports(router)


def load_backlog(router: Router, command: LoadBacklog) -> None:
    reply = command.reply
    try:
        found = (outbox_of(router.state).after(command.peer, command.after_seq, command.limit),
                 retries_of(router.state).by_peer.get(command.peer))
    except BaseException as exc:
        if not reply.done():
            reply.set_exception(exc)  # the outbox hears it; the Router logs it
        raise
    if not reply.done():
        reply.set_result(found)


class Forwarding:
    def __init__(self, hub, config: FederationConfig, peers: PeerLinks):
        self.hub = hub
        self.config = config
        self.peers = peers
        self.outboxes: dict[str, ForwardOutbox] = {}
        self.metrics = ForwardMetrics(hub.metrics.registry, self)
        # forwards whose sender was told "pending" (in memory: after a restart
        # every settlement goes through the durable notification outbox)
        self._told_pending: set[str] = set()
        self._unread_reports: list = []  # from the outboxes, for the Router's next round
        self._group: asyncio.TaskGroup | None = None

    def knows(self, hub_id: str) -> bool:
        return hub_id in self.config.message_peers

    # -- lifetime

    def start(self, router: Router, group: asyncio.TaskGroup) -> None:
        self._group = group
        for peer in self.config.message_peers:
            self._add_outbox(peer)

    def reconfigure(self, config: FederationConfig) -> None:
        """New message peers after SIGHUP (PeerLinks has rerouted the links: a
        link whose live peer certificate no longer matches its pins is closed;
        it reconnects and is checked against the new pins like any new one)."""
        self.config = config
        for peer in config.message_peers:
            if peer not in self.outboxes:
                self._add_outbox(peer)
        for peer in set(self.outboxes) - set(config.message_peers):
            log.warning("message peer removed by reload; its unsettled forwards wait for "
                        "their TTL", peer=peer)

    def _add_outbox(self, peer: str) -> None:
        outbox = ForwardOutbox(self.hub.hub_id, peer, self.peers.link(peer),
                               lambda **events: self.peers.subscribe(peer, **events),
                               self.metrics, self._reported, self._load,
                               timing=self.hub.config.timing)
        self.outboxes[peer] = outbox
        self._group.create_task(outbox.run(), name=f"forward-outbox-{peer}")

    def resync(self, router: Router) -> None:
        """After the Router rebuilt its state: the outboxes read their rows again."""
        for outbox in self.outboxes.values():
            outbox.mailbox.post(Resync())

    def peer_seen(self, peer: str) -> None:
        """A sign of life from `peer` outside this hub's link to it (its own
        link to us, a forward, a log pull): its outbox wakes the link and resends."""
        outbox = self.outboxes.get(peer)
        if outbox is not None:
            outbox.mailbox.post(PeerAlive())

    # -- what the outboxes ask and tell (outside the Router: as messages to it)

    def _reported(self, reports: list) -> None:
        """From an outbox: kept for the Router's next control round, where the
        reports of every outbox since the last one make one event. Posting
        each report on its own made the Router end its rounds early and
        journal one forward_settled per report (more, smaller commits)."""
        if not self._unread_reports:
            self.hub.router.post_control(READ_OUTBOX_REPORTS)
        self._unread_reports.extend(reports)

    def read_reports(self, router: Router) -> None:
        """In a Router command: every outbox's reports since the last read."""
        reports, self._unread_reports = self._unread_reports, []
        self.reports(router, reports)

    async def _load(self, peer: str, after_seq: int, limit: int) -> Backlog:
        """The next unsettled rows for `peer`: their seqs from the Router's
        index, their bodies from the journal. Complete when the index had no
        more: a row the journal does not have yet is not committed, and the
        Router posts it to the outbox once it is (after this read)."""
        reply = asyncio.get_running_loop().create_future()
        self.hub.router.post_control(LoadBacklog(peer, after_seq, max(limit, 0), reply))
        seqs, retry = await reply
        events = await self.hub.read_journal("events_at", seqs) if seqs else []
        rows = []
        for seq, event in zip(seqs, events):
            if event.seq != seq:
                break  # not committed yet
            rows.append(pending_from_event(event))
        return Backlog(rows, limit > 0 and len(seqs) < limit, retry)

    def stall(self, router: Router, peer: str) -> liveness.Stall:
        link = self.outboxes[peer].link
        return liveness.stall(outbox_of(router.state).count(peer), link.up, link.up_at,
                              self.outboxes[peer].last_success, time.time(),
                              self.hub.config.timing.stalled_after)

    # -- Router side

    def forward_chat(self, router: Router, session: Session, frame: dict, remote: RemoteSeat,
                     retry: bool) -> None:
        refused = self.refusal(router, remote.hub, session.name)
        if refused is not None:
            router.error(session, refused, client_msg_id=frame.get("client_msg_id"))
            return
        self.forward_from(router, session.name, frame, remote, retry)
        router.fail_privately(session, "Chat was not journalled; it was not forwarded. Retry "
                                       "with the same client_msg_id.",
                              client_msg_id=frame.get("client_msg_id"))

    def refusal(self, router: Router, peer: str, sender: str | None) -> str | None:
        """Why a chat from `sender` to `peer` cannot be accepted now, or None."""
        if not self.knows(peer):
            return no_route(router, peer, sender)
        backlog = outbox_of(router.state).count(peer)
        if backlog >= MAX_PENDING_PER_PEER:
            router.metrics.refuse_quota("forward_backlog")
            return (f"The forward backlog to '{peer}' is full ({backlog} unsettled); the "
                    "chat was not accepted.")
        return None

    def forward_from(self, router: Router, sender: str, frame: dict, remote: RemoteSeat,
                     retry: bool) -> None:
        """Journal a chat from `sender` with its outbox row and post the row to
        the peer's outbox once committed (any door: a WebSocket session, REDSYN)."""
        peer = remote.hub
        forward_id = secrets.token_hex(16)
        frame["forward_id"] = forward_id
        route = {"forward": {"peer": peer, "forward_id": forward_id, "seat": remote.seat,
                             "expires_at": router.now + self.config.forward_ttl}}
        if retry:
            route["retry"] = 1
        event, _, _ = route_chat(router, frame, sender, route)
        item = pending_from_event(event)
        outbox = self.outboxes[peer]
        router.after_release(lambda: outbox.mailbox.post_rows([item]))

    def reports(self, router: Router, reports: list) -> None:
        """What an outbox learned: settlements as one event, then the notices
        and roster answers."""
        settled = [r for r in reports if type(r) is Settled]
        if settled:
            self.settle(router, settled)
        retries = {r.peer: r.retry for r in reports if type(r) is RetrySchedule}
        if retries:
            self.record_retries(router, retries)
        for report in reports:
            kind = type(report)
            if kind is StillPending:
                self.pending(router, report.item, report.why)
            elif kind is RosterAnswer:
                fields = report.fields
                asker = router.presence.sessions.get(report.reply_to)
                if "delivery_sessions" in fields and (
                        asker is None or (asker.protocol_version or 0) < 3):
                    # as on this hub's own who: older clients never see the field
                    fields = {k: v for k, v in fields.items() if k != "delivery_sessions"}
                router.send(report.reply_to, router.frame(report.type, report.name, report.text,
                                                          **fields))

    def settle(self, router: Router, batch: list[Settled]) -> None:
        """Journal what the peers answered, as one event, and send the receipts."""
        index = outbox_of(router.state)
        accepted, settled, receipts = [], [], []
        for item, state, reason, detail, result in batch:
            if not index.is_pending(item.forward_id):
                continue  # settled already (a late duplicate answer)
            told_pending = item.forward_id in self._told_pending
            self._told_pending.discard(item.forward_id)
            if state in (ACCEPTED, DUPLICATE) and not item.receipt_requested:
                accepted.append(item.forward_id)  # the common case, journaled by id alone
                continue
            entry = {"forward_id": item.forward_id, "peer": item.peer, "state": state,
                     "reason_code": reason, "detail": detail, "chat_seq": item.seq}
            if item.receipt_requested:
                sender = router.presence.session_of(item.sender)
                receipt = self.receipt(router, item, state, reason, detail, result,
                                       deferred=told_pending)
                if told_pending or sender is None:
                    entry["receipt"] = receipt  # durable: queued for the sender
                receipts.append((sender, receipt, "receipt" in entry))
            settled.append(entry)
            if state in (forward_table.REFUSED, forward_table.EXPIRED):
                log.warning("forward settled without delivery", peer=item.peer,
                            forward_id=item.forward_id, state=state, reason=reason,
                            detail=detail)
        if not settled and not accepted:
            return
        router.event(fstate.FORWARD_SETTLED, {"accepted": accepted, "settled": settled})
        queued_for: dict[str, Session] = {}  # by name: sessions are not hashable
        for sender, receipt, durable in receipts:
            if sender is None:
                continue
            if durable:
                queued_for[sender.name] = sender
            else:
                router.send(sender.endpoint, receipt)
        for sender in queued_for.values():
            deliver_notifications(router, sender)

    def record_retries(self, router: Router, retries: dict) -> None:
        """Journal each peer's latest retry schedule (the last change of the
        round counts). While the journal refuses writes it is not recorded: a
        restart then sends that peer's backlog at once, as before any was."""
        if router.mutations_refused():
            log.warning("forward retry schedule not journaled: the journal refuses writes",
                        peers=sorted(retries))
            return
        for peer, retry in retries.items():
            router.event(fstate.FORWARD_RETRY, retry_payload(peer, retry))

    def pending(self, router: Router, item: PendingForward, why: str) -> None:
        if item.forward_id in self._told_pending or \
                not outbox_of(router.state).is_pending(item.forward_id):
            return
        self._told_pending.add(item.forward_id)
        sender = router.presence.session_of(item.sender)
        if sender is not None:
            router.send(sender.endpoint, self.receipt(router, item, "pending", "forward_pending",
                                                      why, {}, deferred=True))

    def receipt(self, router: Router, item: PendingForward, state: str, reason: str,
                detail: str, result: dict, deferred: bool) -> dict:
        kind = receipt_table.FORWARD_PENDING if state == "pending" else \
            receipt_table.SETTLED_RECEIPT[state]
        chat_ref = receipt_table.ChatRef(item.sender, item.seq, item.msg_id, item.target,
                                         item.client_msg_id)
        facts = receipt_table.ForwardFacts(item.peer, item.forward_id, item.target_seat, reason,
                                           detail, result, told_pending=deferred)
        # the recipient's wake capability is the peer's to know: {} as the reference
        text, fields = receipt_table.receipt(kind, chat_ref, forward=facts, wake={})
        return router.frame("delivery_receipt", item.sender, text, **fields)

    def remote_who(self, router: Router, session: Session, frame: dict, hub_id: str) -> None:
        """who_request naming a peer: its outbox asks over the link and reports the answer."""
        outbox = self.outboxes.get(hub_id)
        too_old = outbox.link.versions.refusal("roster") if outbox is not None else None
        if outbox is None:
            router.error(session, f"Hub '{hub_id}' is not a configured message peer of this hub.")
        elif too_old is not None:  # the negotiated wire version (federation/versions.py)
            router.error(session, too_old.text, reason_code=too_old.reason_code)
        elif not outbox.mailbox.post(Roster(session.endpoint, session.name)):
            router.error(session, f"Hub '{hub_id}' has too many requests waiting; ask again "
                                  "later.")

    # -- observability (figures from the Router's index and the outboxes)

    def health(self) -> dict:
        index = outbox_of(self.hub.router.state)
        out = {}
        for peer, outbox in self.outboxes.items():
            oldest = index.oldest(peer)
            age = max(time.time() - oldest.created, 0.0) if oldest is not None else 0.0
            entry = {"pending": index.count(peer), "oldest_pending_seconds": round(age, 3),
                     "held_in_memory": len(outbox.items)}
            entry.update(outbox.link.health())
            entry["last_success"] = outbox.last_success
            retry = retries_of(self.hub.router.state).by_peer.get(peer)
            entry["retry"] = None if retry is None else {
                "attempts": retry.attempts, "retry_at": retry.retry_at, "refused": retry.refused}
            stall = self.stall(self.hub.router, peer)
            entry["stalled"] = stall.stalled
            entry["stalled_since"] = stall.since if stall.stalled else None
            out[peer] = entry
        return out

"""Forwarding: a chat to PROJECT/seat@HUB, from the sender's frame to its receipts.

Router side (runs inside Router commands, so it may make events):
- forward_chat: journal the chat with its outbox row (one event), echo it
  locally, and hand the row to the ForwardOutbox once committed;
- settle / pending: turn what the outbox learned into a `forward_settled`
  event and the receipts the sender asked for.

The sender normally gets one receipt: the settled one, if the peer answers
within FIRST_ANSWER. Otherwise it gets `pending` first and the settled receipt
later, through the durable notification outbox (at once if it is online, else
when it next registers).
"""

from __future__ import annotations

import asyncio
import secrets
import time

import structlog

from federation import liveness
from federation import state as fstate
from federation.config import FederationConfig
from federation.link import LinkError, PeerLink
from federation.metrics import ForwardMetrics
from federation.peers import PeerLinks
from federation.outbox import ACCEPTED, DUPLICATE, EXPIRED, REFUSED, ForwardOutbox
from federation.state import PendingForward, outbox_of
from hubd.actors.router import Router
from hubd.handlers.chat import route_chat
from hubd.handlers.mailbox import deliver_notifications
from hubd.state import delivery
from hubd.state.presence import Session
from hubd.wire.targets import RemoteSeat

log = structlog.get_logger("hubd.federation")

FIRST_ANSWER = 1.0  # seconds a sender's receipt waits for the peer before "pending"
MAX_PENDING_PER_PEER = 200_000


class Forwarding:
    def __init__(self, hub, config: FederationConfig, peers: PeerLinks):
        self.hub = hub
        self.config = config
        self.peers = peers
        self.links: dict[str, PeerLink] = {}  # the message peers' (shared) links
        self.metrics = ForwardMetrics(hub.metrics.registry, self)
        self.outbox: ForwardOutbox | None = None
        # forwards whose sender was told "pending" (in memory: after a restart
        # every settlement goes through the durable notification outbox)
        self._told_pending: set[str] = set()
        self._first_answer_due: dict[str, float] = {}
        # settlements reported since the Router last ran them (one event per round)
        self._settlements: list = []
        self._group: asyncio.TaskGroup | None = None

    def knows(self, hub_id: str) -> bool:
        return hub_id in self.config.message_peers

    # -- lifetime

    def start(self, router: Router, group: asyncio.TaskGroup) -> None:
        self.outbox = ForwardOutbox(self.hub.hub_id, self.links, self.metrics,
                                    settle=self._settle_later, pending_notice=self._pending_later)
        self._group = group
        for peer in self.config.message_peers:
            self._add_link(peer)
        self.outbox.load(list(outbox_of(router.state).pending.values()))
        group.create_task(self.outbox.sweep(), name="forward-outbox-sweep")
        group.create_task(self._first_answer_sweep(), name="forward-first-answer")

    def reconfigure(self, config: FederationConfig) -> None:
        """New message peers after SIGHUP (PeerLinks has rerouted the links: a
        link whose live peer certificate no longer matches its pins is closed;
        it reconnects and is checked against the new pins like any new one)."""
        self.config = config
        for peer in config.message_peers:
            if peer not in self.links:
                self._add_link(peer)
        for peer in set(self.links) - set(config.message_peers):
            log.warning("message peer removed by reload; its unsettled forwards wait for "
                        "their TTL", peer=peer)

    def _add_link(self, peer: str) -> None:
        self.links[peer] = self.peers.subscribe(
            peer, on_up=self._link_up, on_down=self._link_down, on_result=self._on_result,
            on_rejected=self._on_rejected)
        if self.outbox is not None:
            self.outbox.add_peer(peer)
        if self._group is not None:
            self._group.create_task(self.outbox.run_peer(peer), name=f"forward-outbox-{peer}")

    def resync(self, router: Router) -> None:
        """After the Router rebuilt its state: rows the outbox may have missed."""
        if self.outbox is not None:
            self.outbox.load(list(outbox_of(router.state).pending.values()))

    # -- link callbacks (event loop, outside the Router)

    def peer_seen(self, peer: str) -> None:
        """A sign of life from `peer` outside this hub's link to it (its own
        link to us, a forward, a log pull): wake the link and the sender."""
        link = self.links.get(peer)
        if link is None:
            return
        link.wake()
        if self.outbox is not None:
            self.outbox.peer_alive(peer)

    def stall(self, peer: str) -> liveness.Stall:
        link = self.links[peer]
        count = len(self.outbox.queues[peer].items) if self.outbox else 0
        success = self.outbox.queues[peer].last_success if self.outbox else None
        return liveness.stall(count, link.up, link.up_at, success, time.time())

    def _link_up(self, peer: str) -> None:
        self.outbox.link_up(peer)

    def _link_down(self, peer: str, cause: str) -> None:
        self.outbox.link_down(peer, cause)

    def _on_result(self, peer: str, frame: dict) -> None:
        self.outbox.on_result(peer, frame)

    def _on_rejected(self, peer: str, text: str) -> None:
        log.error("peer does not speak wire v5 forwarding; refusing its forwards", peer=peer,
                  answer=text)
        self.outbox.peer_rejected(peer, text)

    def _settle_later(self, item: PendingForward, state: str, reason: str, detail: str,
                      result: dict) -> None:
        if not self._settlements:
            self.hub.router.post_control(self._settle_all)
        self._settlements.append((item, state, reason, detail, result))

    def _settle_all(self, router: Router) -> None:
        batch, self._settlements = self._settlements, []
        self.settle(router, batch)

    def _pending_later(self, item: PendingForward, why: str) -> None:
        if item.receipt_requested and item.forward_id not in self._told_pending:
            self.hub.router.post_control(lambda router: self.pending(router, item, why))

    async def _first_answer_sweep(self) -> None:
        while True:
            await asyncio.sleep(FIRST_ANSWER / 4)
            now = time.monotonic()
            late = [fid for fid, due in self._first_answer_due.items() if due <= now]
            for forward_id in late:
                del self._first_answer_due[forward_id]
                item = outbox_of(self.hub.router.state).pending.get(forward_id)
                if item is not None:
                    peer = item.peer
                    link = self.links[peer]
                    why = "no answer yet" if link.up else (
                        f"link to {peer} is down ({link.last_error['cause']})"
                        if link.last_error else f"link to {peer} is down")
                    self._pending_later(item, why)

    # -- Router side

    def forward_chat(self, router: Router, session: Session, frame: dict, remote: RemoteSeat,
                     retry: bool) -> None:
        refused = self.refusal(router, remote.hub)
        if refused is not None:
            router.error(session, refused, client_msg_id=frame.get("client_msg_id"))
            return
        self.forward_from(router, session.name, frame, remote, retry)
        router.fail_privately(session, "Chat was not journalled; it was not forwarded. Retry "
                                       "with the same client_msg_id.",
                              client_msg_id=frame.get("client_msg_id"))

    def refusal(self, router: Router, peer: str) -> str | None:
        """Why a chat to `peer` cannot be accepted now, or None."""
        if self.outbox is not None:
            backlog = len(self.outbox.queues[peer].items)
            if backlog >= MAX_PENDING_PER_PEER:
                router.metrics.refuse_quota("forward_backlog")
                return (f"The forward backlog to '{peer}' is full ({backlog} unsettled); the "
                        "chat was not accepted.")
        return None

    def forward_from(self, router: Router, sender: str, frame: dict, remote: RemoteSeat,
                     retry: bool) -> None:
        """Journal a chat from `sender` with its outbox row and hand the row to
        the outbox once committed (any door: a WebSocket session, REDSYN)."""
        outbox = outbox_of(router.state)
        peer = remote.hub
        forward_id = secrets.token_hex(16)
        frame["forward_id"] = forward_id
        route = {"forward": {"peer": peer, "forward_id": forward_id, "seat": remote.seat,
                             "expires_at": router.now + self.config.forward_ttl}}
        if retry:
            route["retry"] = 1
        route_chat(router, frame, sender, route)
        item = outbox.pending[forward_id]
        if item.receipt_requested:
            self._first_answer_due[forward_id] = time.monotonic() + FIRST_ANSWER
        router.after_release(lambda: self.outbox.submit(item))

    def settle(self, router: Router, batch: list) -> None:
        """Journal what the peers answered, as one event, and send the receipts."""
        pending = outbox_of(router.state).pending
        accepted, settled, receipts = [], [], []
        for item, state, reason, detail, result in batch:
            if item.forward_id not in pending:
                continue  # settled already (a late duplicate answer)
            self._first_answer_due.pop(item.forward_id, None)
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
            if state in (REFUSED, EXPIRED):
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

    def pending(self, router: Router, item: PendingForward, why: str) -> None:
        if item.forward_id in self._told_pending or \
                item.forward_id not in outbox_of(router.state).pending:
            return
        self._told_pending.add(item.forward_id)
        self._first_answer_due.pop(item.forward_id, None)
        sender = router.presence.session_of(item.sender)
        if sender is not None:
            router.send(sender.endpoint, self.receipt(router, item, "pending", "forward_pending", why,
                                                  {}, deferred=True))

    def receipt(self, router: Router, item: PendingForward, state: str, reason: str,
                detail: str, result: dict, deferred: bool) -> dict:
        kind = delivery.FORWARD_PENDING if state == "pending" else delivery.SETTLED_RECEIPT[state]
        chat_ref = delivery.ChatRef(item.sender, item.seq, item.msg_id, item.target,
                                    item.client_msg_id)
        facts = delivery.ForwardFacts(item.peer, item.forward_id, item.target_seat, reason,
                                      detail, result, told_pending=deferred)
        text, fields = delivery.receipt(kind, chat_ref, forward=facts)
        return router.frame("delivery_receipt", item.sender, text, **fields)

    def remote_who(self, router: Router, session: Session, frame: dict, hub_id: str) -> None:
        """who_request naming a peer: asked over the link, answered when it replies."""
        link = self.links.get(hub_id)
        if link is None:
            router.error(session, f"Hub '{hub_id}' is not a configured message peer of this hub.")
            return
        endpoint, name = session.endpoint, session.name
        request = {"sender": self.hub.hub_id, "target": "System", "type": "multihub_message_forward",
                   "payload": "", "forward_id": secrets.token_hex(16), "kind": "who",
                   "sender_seat": name}

        async def ask() -> None:
            try:
                answer = await link.request(request, 5.0, key=request["forward_id"])
            except LinkError as exc:
                reply = ("error", f"Hub '{hub_id}' did not answer the roster request: {exc}", {})
            else:
                result = answer.get("result") if isinstance(answer.get("result"), dict) else {}
                if answer.get("disposition") != ACCEPTED:
                    reply = ("error", (f"Hub '{hub_id}' refused the roster request: "
                                       f"{answer.get('reason_code')} "
                                       f"{answer.get('detail', '')}").strip(), {})
                else:
                    seats = sorted(f"{s}@{hub_id}" for s in result.get("online_agents", [])
                                   if isinstance(s, str))
                    reply = ("who_snapshot", "Who snapshot",
                             {"remote_hub": hub_id, "online_agents": seats,
                              "connected_clients": len(seats)})
            type_, text, fields = reply
            self.hub.router.post_control(
                lambda r: r.send(endpoint, r.frame(type_, name, text, **fields)))

        self.hub.track(asyncio.get_running_loop().create_task(ask()))

    # -- observability

    def health(self) -> dict:
        out = {}
        for peer, link in self.links.items():
            count, age = self.outbox.backlog(peer) if self.outbox else (0, 0.0)
            entry = {"pending": count, "oldest_pending_seconds": round(age, 3)}
            entry.update(link.health())
            success = self.outbox.queues[peer].last_success if self.outbox else None
            entry["last_success"] = success
            stall = self.stall(peer)
            entry["stalled"] = stall.stalled
            entry["stalled_since"] = stall.since if stall.stalled else None
            out[peer] = entry
        return out

"""Stage changes of forwarded delivery operations, carried back to the origin
(issue 24 item 9; the model and decisions: federation/delivery_notice_rules.py;
docs/delivery.md, "Stage changes across hubs").

Recipient hub side (inside Router commands):
- `peer_registered`: a peer's link registers (receiver.claim_peer_link); if its
  heartbeat lists FEATURE it takes notices (live, nothing journaled: a
  registration must not write the served hub's journal; never taken back: a
  connection of the peer without the feature is another door of it, not a
  downgrade), and everything still queued for its requesters is pushed at once.
  An operation the peer forwards while it takes notices says so in its
  admission's row (`takes_notices`, asked by hubd/handlers/delivery.py), so
  its stage changes are queued for the peer across restarts.
- `notice_peer` / `push_notices` (the core's RemoteHubs hooks, from
  hubd/handlers/delivery.py `_transition`): whether a notification is relayed,
  and the push over the peer's link, released after the transition's commit.
- the `multihub_delivery_notices_ack` verb: the origin settles what it
  journaled (`delivery_notified`).

Origin side: the push arrives on this hub's own PeerLink to the recipient's
hub (federation/actors/link.py hands it to on_push) and becomes a
NoticesArrived command: each notice is checked against the journaled route,
new ones journaled and queued in the delivery outbox for the local seat (sent
at once if it is online, else on its next registration, like a local
notification), and every notice that was read is acknowledged after the commit.
"""

from __future__ import annotations

from typing import NamedTuple

import structlog

from federation import delivery_notice_rules as nr
from federation.delivery_forward_rules import routes_of
from hubd.actors.router import Router
from hubd.core.plugin import Verbs
from hubd.handlers import delivery as dh
from hubd.state import delivery_intents as di
from hubd.state.presence import Session

log = structlog.get_logger("hubd.federation.delivery_notices")

verbs = Verbs()


class NoticeLinks:
    """Live: which endpoint carries each notice-taking peer's link, and counts."""

    def __init__(self, router: Router):
        self.by_peer: dict[str, int] = {}  # also: the peers that said they take notices
        self.pushed = 0  # notices pushed to origins (recipient side)
        self.settled = 0  # notices an origin acknowledged (recipient side)
        self.relayed = 0  # notices journaled for a local sender (origin side)
        self.duplicates = 0  # notices pushed again and already taken (origin side)
        self.refused = 0  # notices that name no route of the peer (origin side)


# -- the recipient hub's side


def peer_registered(router: Router, session: Session, frame: dict) -> None:
    peer = session.peer_hub
    features = frame.get("hubd_features")
    takes = isinstance(features, list) and nr.FEATURE in features
    if not takes:
        return  # another connection of the peer (a hand-written one, a reference hub's)
    router.live_of(NoticeLinks).by_peer[peer] = session.endpoint  # nothing journaled
    pending = nr.pending_for_peer(di.delivery_of(router.state).outbox, peer)
    if pending:
        log.info("pushing delivery notices an origin has not acknowledged", peer=peer,
                 notices=len(pending))
        push_notices(router, peer, pending)


def takes_notices(router: Router, peer: str) -> bool:
    return peer in router.live_of(NoticeLinks).by_peer


def notice_peer(router: Router, audience: str, origin_hub: str,
                taker_at_admission: bool) -> str | None:
    return nr.relay_to(audience, origin_hub, taker_at_admission,
                       router.live_of(NoticeLinks).by_peer.keys(),
                       nr.notices_of(router.state).takers)


def push_notices(router: Router, peer: str, notes: list) -> None:
    """Over the peer's inbound link, if it is up (else they wait, durable,
    for its next registration)."""
    live = router.live_of(NoticeLinks)
    endpoint = live.by_peer.get(peer)
    session = router.presence.sessions.get(endpoint) if endpoint is not None else None
    if session is None or session.peer_hub != peer:
        return
    for chunk in nr.chunks(notes):
        live.pushed += len(chunk)
        router.send(endpoint, router.frame(nr.PUSH, peer, "", notices=chunk))


@verbs.handles(nr.ACK, peers=True)
def acked(router: Router, session: Session, frame: dict, size: int) -> None:
    peer = session.peer_hub
    if peer is None:
        router.error(session, f"{nr.ACK} is a hub-to-hub verb.")
        return
    acks = nr.read_acks(frame.get("acks"), peer)
    if acks is None:
        log.warning("malformed delivery notice acknowledgement", peer=peer)
        router.error(session, f"Malformed {nr.ACK}.")
        return
    if router.mutations_refused():
        return  # not settled: pushed again at the peer's next registration
    outbox = di.delivery_of(router.state).outbox
    live = router.live_of(NoticeLinks)
    for audience, ids in acks.items():
        box = outbox.get(audience) or {}
        still = [nid for nid in ids if nid in box]
        if still:
            live.settled += len(still)
            router.event(di.NOTIFIED, {"audience": audience, "notification_ids": still})


# -- the origin's side


class NoticesArrived(NamedTuple):
    """A recipient hub pushed notices over this hub's link to it."""

    peer: str
    notices: object


def on_notices(router: Router, command: NoticesArrived) -> None:
    peer, raw = command.peer, command.notices
    if not isinstance(raw, list):
        log.warning("malformed delivery notices from a peer", peer=peer)
        return
    if router.mutations_refused():
        return  # not acknowledged: the peer pushes them again
    live = router.live_of(NoticeLinks)
    state = nr.notices_of(router.state)
    routes = routes_of(router.state)
    acks = []
    for item in raw[:nr.MAX_PER_FRAME]:
        if isinstance(item, dict) and isinstance(item.get("audience"), str) and \
                isinstance(item.get("notification_id"), str):
            acks.append({"audience": item["audience"],
                         "notification_id": item["notification_id"]})
        got = nr.read_notice(item, peer, router.hub_id, routes)
        if isinstance(got, str):
            live.refused += 1
            log.warning("delivery notice not taken", peer=peer, reason=got)
            continue
        seat, note = got
        nid = note["notification_id"]
        if nid in state.received:
            live.duplicates += 1
            continue
        router.event(nr.RELAYED, {"peer": peer, "audience": seat, "notification": note})
        live.relayed += 1
        online = dh._v3_session(router, seat)
        if online is not None:
            router.send(online.endpoint, note)
            dh._settle_once_released(router, seat, [nid])
    if not acks:
        return
    link = router.hub.federation.peer_links.links.get(peer)
    if link is None:
        return
    ack = {"sender": router.hub_id, "target": "System", "type": nr.ACK, "payload": "",
           "acks": acks}
    router.after_release(lambda: link.send(ack))


COMMANDS = {NoticesArrived: on_notices}


def figures(router: Router) -> dict:
    live = router.live_of(NoticeLinks)
    outbox = di.delivery_of(router.state).outbox
    takers = nr.notices_of(router.state).takers | live.by_peer.keys()
    waiting = {peer: len(nr.pending_for_peer(outbox, peer)) for peer in sorted(takers)}
    return {"waiting": waiting, "pushed": live.pushed, "settled": live.settled, "relayed": live.relayed,
            "duplicates": live.duplicates, "refused": live.refused,
            "takers": sorted(takers),
            "remembered": len(nr.notices_of(router.state).received),
            "evicted": nr.notices_of(router.state).evicted}

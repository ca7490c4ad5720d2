"""The cross-hub dead-letter pointer over a relay route (seed 002).

Origin side (`escalated`, called by hubd/handlers/dead_letters.py through
`Federation.dead_letter_escalated` when a target escalates): when this hub's
namespace-owner map says a peer owns the target's namespace (uncontested) and
`--relay-peer OWNER=URI` gives a route to it, the hub journals
`dead_letter_forwarding` {target, count, origin_hub_id, owner_hub_id,
direction: "out"} in the chat's command and, once that is committed, writes
one `dead_letter_forwarding` frame with the pointer under `forwarding` on its
pinned mTLS link to the owner. The pointer holds what the ledger holds (names
and a count), never a message body. Fire-and-forget, as the reference: a link
that is down or full leaves the pointer "recorded, not delivered" (the
journaled row, hubd_dead_letter_pointers_total{outcome="unsent"}, a log
line); the next escalation of the target sends a fresh one.

Owner side (`pointer_in`, a hub-to-hub verb): a frame from a peer link whose
pinned certificate the serving policy authorises, for a target in a namespace
this hub owns (uncontested), whose origin_hub_id is that peer and whose
owner_hub_id is this hub, is journaled (direction "in", with the verified
peer) and told to every agent connected here as a `dead_letter_forwarding`
frame (the reference's fields and text). The same peer's pointer for the same
target is told at most once per --dead-letter-escalation-window (the table is
the journal's projection, hubd/state/dead_letter_escalation.py). Anything
else changes nothing: a typed error goes back to the sender (a local agent,
or the peer, whose link logs it), with a bounded log line and a metric.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import structlog

from federation.handlers.receiver import authorise_peer, seat_problem
from federation.ownership import LOCAL, REMOTE
from hubd.actors.router import Router
from hubd.core.plugin import Verbs
from hubd.logs import LimitedLog
from hubd.state import dead_letter_escalation as rules
from hubd.state.presence import Session

log = structlog.get_logger("hubd.federation.dead_letters")

verbs = Verbs()

VERB = "dead_letter_forwarding"
ERROR_CODE = "dead_letter_forwarding_refused"
UNSENT_PER_PEER = 256  # pointers kept for a relay link that is down, the newest per target


class PointerLog:
    """The refusals' log budget (a peer sending junk in a loop writes a
    bounded number of lines)."""

    def __init__(self, router: Router):
        self.line = LimitedLog(log, "warning")


@dataclass(frozen=True, slots=True)
class PointerUnsent:
    """A committed pointer the relay link could not take (posted after release)."""

    peer: str
    frame: dict


@dataclass(frozen=True, slots=True)
class RelayLinkUp:
    """A relay route's link came up: what it could not take is sent now."""

    peer: str


class UnsentPointers:
    """Per relay peer, the pointers its link could not take, the newest per
    target (a later count supersedes an earlier one), at most UNSENT_PER_PEER
    (the oldest dropped, counted `outcome="dropped"`). Live only: a restart
    forgets them (their journaled rows stay; the target's next escalation
    sends a fresh pointer)."""

    def __init__(self, router: Router):
        self.by_peer: dict[str, OrderedDict] = {}

    def keep(self, router: Router, peer: str, frame: dict) -> None:
        held = self.by_peer.setdefault(peer, OrderedDict())
        target = frame[rules.FORWARDING_FIELD]["target"]
        held.pop(target, None)
        held[target] = frame
        while len(held) > UNSENT_PER_PEER:
            held.popitem(last=False)
            _count(router, "dropped")


def pointer_unsent(router: Router, unsent: PointerUnsent) -> None:
    router.live_of(UnsentPointers).keep(router, unsent.peer, unsent.frame)
    if router.hub.federation.peer_links.link(unsent.peer).up:
        relay_link_up(router, RelayLinkUp(unsent.peer))  # it came up in between


def relay_link_up(router: Router, up: RelayLinkUp) -> None:
    """Send what waited for this link, oldest first, while it takes them."""
    held = router.live_of(UnsentPointers).by_peer.get(up.peer)
    if not held:
        return
    link = router.hub.federation.peer_links.link(up.peer)
    while held:
        target, frame = next(iter(held.items()))
        if not link.send(frame):
            return  # down again or full: the rest waits for the next up
        del held[target]
        _count(router, "resent")
    log.info("dead-letter pointers held for a relay link were sent", peer=up.peer)


COMMANDS = {PointerUnsent: pointer_unsent, RelayLinkUp: relay_link_up}


def _count(router: Router, outcome: str) -> None:
    pointers = router.metrics.dead_letter_pointers
    pointers[outcome] = pointers.get(outcome, 0) + 1


# -- origin side


def escalated(router: Router, target: str, count: int) -> None:
    """A target escalated on this hub: forward the pointer to its namespace's
    owner when a relay route leads there (inside the escalating command)."""
    federation = router.hub.federation
    config = federation.config
    authority = federation.authority
    if not config.relay_peers or authority is None:
        return
    resolution = authority.resolve(target)
    if seat_problem(target, "target") is not None:
        return  # a list, glob or role: no one namespace owns it
    if resolution.kind != REMOTE or resolution.owner_hub_id is None:
        return  # owned here, ungoverned or contested: the local escalation covers it
    owner = resolution.owner_hub_id
    if owner not in config.relay_peers:
        _count(router, "no_route")
        return
    notice = rules.pointer(target, count, router.hub_id, owner)
    router.event(rules.DEAD_LETTER_FORWARDING, {**notice, "direction": rules.DIRECTION_OUT})
    frame = {"sender": router.hub_id, "target": "all", "type": VERB, "payload": "",
             "timestamp": router.now, rules.FORWARDING_FIELD: notice}
    link = federation.peer_links.link(owner)
    metrics = router.metrics
    post = router.post_control

    def send() -> None:
        # after the commit: the journaled row is the origin's record of it
        outcome = "sent" if link.send(frame) else "unsent"
        pointers = metrics.dead_letter_pointers
        pointers[outcome] = pointers.get(outcome, 0) + 1
        if outcome == "unsent":
            log.warning("dead-letter pointer recorded, not yet delivered: the relay link cannot "
                        "take it now; it is sent when the link is up", peer=owner,
                        target=target, count=count)
            post(PointerUnsent(owner, frame))
    router.after_release(send)


# -- owner side


def _refuse(router: Router, session: Session, code: str, detail: str) -> None:
    _count(router, f"refused_{code}")
    router.live_of(PointerLog).line("dead-letter pointer refused", code=code, detail=detail,
                                    peer=session.peer_hub, sender=session.name)
    router.error(session, f"Dead-letter pointer refused ({code}): {detail}",
                 error_code=ERROR_CODE, reason_code=code)


@verbs.handles(VERB, peers=True)
def pointer_in(router: Router, session: Session, frame: dict, size: int) -> None:
    peer = session.peer_hub
    if peer is None:
        _refuse(router, session, rules.NOT_A_PEER,
                "dead_letter_forwarding is a hub-to-hub verb; only a peer hub's link may send it")
        return
    decision = authorise_peer(router, session, peer, None)
    if decision is None or not decision.allowed:
        _refuse(router, session, rules.PEER_NOT_AUTHORISED,
                f"the serving policy does not authorise {peer!r}")
        return
    pointer = rules.decode_pointer(frame)
    if isinstance(pointer, rules.PointerRefused):
        _refuse(router, session, pointer.code, pointer.detail)
        return
    if pointer.origin_hub_id != peer:
        _refuse(router, session, rules.ORIGIN_MISMATCH,
                f"origin_hub_id {pointer.origin_hub_id!r} is not the sending peer {peer!r}")
        return
    authority = router.hub.federation.authority
    resolution = authority.resolve(pointer.target) if authority is not None else None
    if resolution is None or resolution.kind != LOCAL or pointer.owner_hub_id != router.hub_id:
        _refuse(router, session, rules.NOT_OWNED_HERE,
                f"{pointer.target!r} is not in a namespace this hub ({router.hub_id}) owns")
        return
    window = router.config.dead_letter_escalation_window
    if rules.received_of(router.state).repeated(peer, pointer.target, router.now, window):
        _count(router, "repeated")
        return
    router.event(rules.DEAD_LETTER_FORWARDING, {
        **rules.pointer(pointer.target, pointer.count, pointer.origin_hub_id,
                        pointer.owner_hub_id),
        "direction": rules.DIRECTION_IN, "peer": peer})
    _count(router, "received")
    log.warning("dead-letter pointer from a peer hub: a name this hub owns reaches nobody there",
                peer=peer, target=pointer.target, count=pointer.count)
    router.broadcast(router.frame(
        VERB, "all", rules.incoming_notice(pointer.target, pointer.count, pointer.origin_hub_id),
        forwarding_target=pointer.target, forwarding_count=pointer.count,
        origin_hub_id=pointer.origin_hub_id))

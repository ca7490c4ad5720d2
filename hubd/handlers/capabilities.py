"""Capability cards: advertise and manifest_request (discovery metadata only,
never authorization). Decisions and shapes in hubd.state.capabilities.

Live cards are kept on the Router (presence-like, gone with their socket);
persistent registrations are journaled (`capability_registered`).
"""

from __future__ import annotations

from hubd.actors.router import Router
from hubd.core.plugin import Verbs
from hubd.state import capabilities as cap
from hubd.state import card_trust
from hubd.state.presence import Session

# this module's verbs (its plugin installs them)
verbs = Verbs()

class LiveCards:
    """Cards advertised without persist: agent -> (card, endpoint that advertised it)."""

    def __init__(self, router: Router):
        self.cards: dict = {}


def _live(router: Router) -> dict:
    return router.live_of(LiveCards).cards


@verbs.handles("advertise")
def advertise(router: Router, session: Session, frame: dict, size: int) -> None:
    advert = cap.read_advert(frame, session.name)
    if isinstance(advert, str):
        router.error(session, advert)
        return
    card = cap.card(frame, advert.agent, router.now)
    verdict = card_trust.verify_card(card, router.hub.identity.signed.card_keys,
                                     card_trust.history_of(router.state), router.now,
                                     advert.agent, card["project"])
    card["verification"] = verdict.verification
    if verdict.remember is not None:  # a signed card's sequence, kept across restarts
        router.event(card_trust.CARD_ACCEPTED, verdict.remember)
    shown = dict(card)
    if advert.persist:
        router.event(cap.CAPABILITY_REGISTERED, {
            "agent": advert.agent, "card": card, "dispatchable": advert.dispatchable,
            "registered_at": router.now, "registered_by": session.name})
        shown["persistent"] = True
        shown["dispatchable"] = advert.dispatchable
        router.fail_privately(session, "Capability registration was not journalled; it was "
                                       "not registered. Retry.")
    else:
        _live(router)[advert.agent] = (card, session.endpoint)
    router.broadcast(router.frame("capability_advertised", "all",
                                  f"Capability advertised by {advert.agent}",
                                  agent=advert.agent, card=shown))


@verbs.handles("manifest_request")
def manifest_request(router: Router, session: Session, frame: dict, size: int) -> None:
    live = _live(router)
    registrations = cap.capabilities_of(router.state).current(router.now)
    manifest = []
    for agent in sorted(set(live) | set(registrations)):
        entry = cap.projected(live[agent][0] if agent in live else None,
                              registrations.get(agent))
        if entry is not None:
            manifest.append(entry)
    router.reply(session, "manifest_snapshot", "Manifest snapshot", manifest=manifest)


def on_unregister(router: Router, session: Session) -> None:
    live = _live(router)
    if not live:
        return
    for agent in [a for a, (_, endpoint) in live.items() if endpoint == session.endpoint]:
        del live[agent]


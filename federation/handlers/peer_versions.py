"""The inbound side of wire-version negotiation: a peer hub that registers its
link with this hub (receiver.claim_peer_link) says its protocol_version in the
registering heartbeat. The same decisions as an outbound link's welcome
(federation/versions.py): the lowest common version, one operator warning per
(peer, relation, advertised version), shown on /health `peer_versions_inbound`
and /metrics. What a peer may ask is gated on it where it matters (a
cross-hub attachment read needs 6: federation/handlers/attachment_reads.py).
"""

from __future__ import annotations

from hubd.actors.router import Router
from hubd.wire.envelope import PROTOCOL_VERSION

from federation import versions

MAX_PEERS = 1024  # peers remembered (the serving policy bounds who registers at all)


class InboundVersions:
    """Live: each registered peer's negotiation."""

    def __init__(self, router: Router):
        self.by_peer: dict[str, versions.LinkVersions] = {}


def registered(router: Router, peer: str, advertised) -> versions.Negotiation:
    table = router.live_of(InboundVersions).by_peer
    entry = table.get(peer)
    if entry is None:
        if len(table) >= MAX_PEERS:
            del table[next(iter(table))]
        entry = table[peer] = versions.LinkVersions(peer, PROTOCOL_VERSION, inbound=True)
    return entry.welcomed(advertised)


def health(router: Router) -> dict | None:
    table = router.live_of(InboundVersions).by_peer
    return {peer: entry.health() for peer, entry in sorted(table.items())} if table else None

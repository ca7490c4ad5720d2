"""Forwarding figures for /metrics and /health.

The backlog gauges keep the reference hub's names
(synapse_message_forward_pending, synapse_message_forward_oldest_pending_seconds)
so dashboards built for it keep working; the rest are hubd's own.
"""

from __future__ import annotations

import time

from prometheus_client import Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from federation.state import outbox_of

LATENCY_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class ForwardMetrics:
    def __init__(self, registry, forwarding):
        self.forwarding = forwarding
        self.outcomes: dict[tuple[str, str], int] = {}
        self.latency = Histogram("hubd_forward_latency_seconds",
                                 "Time from sending a forward to the peer's answer.",
                                 ["peer"], buckets=LATENCY_BUCKETS, registry=registry)
        self._latency_children: dict = {}
        registry.register(self)

    def forward_outcome(self, peer: str, outcome: str) -> None:
        key = (peer, outcome)
        self.outcomes[key] = self.outcomes.get(key, 0) + 1

    def forward_latency(self, peer: str, seconds: float) -> None:
        child = self._latency_children.get(peer)
        if child is None:
            child = self._latency_children[peer] = self.latency.labels(peer)
        child.observe(seconds)

    def describe(self):
        return []

    def collect(self):
        fwd = self.forwarding
        pending = GaugeMetricFamily("synapse_message_forward_pending",
                                    "Forwards journaled for a peer and not yet settled.",
                                    labels=["peer"])
        oldest = GaugeMetricFamily("synapse_message_forward_oldest_pending_seconds",
                                   "Age of the oldest unsettled forward per peer.",
                                   labels=["peer"])
        up = GaugeMetricFamily("hubd_peer_link_up", "1 while the link to the peer is up.",
                               labels=["peer"])
        last = GaugeMetricFamily("hubd_forward_last_success_timestamp_seconds",
                                 "When the peer last accepted a forward (Unix time).",
                                 labels=["peer"])
        inbound = GaugeMetricFamily("hubd_peer_last_inbound_timestamp_seconds",
                                    "When anything last arrived from the peer: on this hub's "
                                    "link to it (answers, pongs) or from it (its link, forwards, "
                                    "log pulls) (Unix time, 0 = never).", labels=["peer"])
        stalled = GaugeMetricFamily("hubd_peer_link_stalled",
                                    "1 while forwards are pending, the link is up, and none "
                                    "succeeded for 10 s.", labels=["peer"])
        silences = CounterMetricFamily("hubd_peer_link_silence_closes",
                                       "Links closed because the peer answered no ping within "
                                       "the deadline.", labels=["peer"])
        held = GaugeMetricFamily("hubd_forward_held",
                                 "Unsettled forwards the peer's outbox holds in memory (the "
                                 "rest of the backlog waits in the journal).", labels=["peer"])
        dropped = CounterMetricFamily("hubd_forward_outbox_dropped",
                                      "What the peer's outbox mailbox had no room for, by kind: "
                                      "row (read back from the journal), answer (the forward "
                                      "goes again), roster (refused).", labels=["peer", "kind"])
        router = fwd.hub.router
        index = outbox_of(router.state) if router is not None else None
        now = time.time()
        for peer in sorted(fwd.outboxes):
            outbox = fwd.outboxes[peer]
            link = outbox.link
            oldest_row = index.oldest(peer) if index is not None else None
            pending.add_metric([peer], index.count(peer) if index is not None else 0)
            oldest.add_metric([peer], max(now - oldest_row.created, 0.0) if oldest_row else 0.0)
            held.add_metric([peer], len(outbox.items))
            for kind, n in sorted(outbox.mailbox.dropped.items()):
                dropped.add_metric([peer, kind], n)
            up.add_metric([peer], 1 if link.up else 0)
            last.add_metric([peer], outbox.last_success or 0)
            inbound.add_metric([peer], link.last_inbound or 0)
            stalled.add_metric([peer], 1 if router is not None and
                               fwd.stall(router, peer).stalled else 0)
            silences.add_metric([peer], link.silence_closes)
        yield pending
        yield held
        yield dropped
        yield oldest
        yield up
        yield last
        yield inbound
        yield stalled
        yield silences
        total = CounterMetricFamily("hubd_forward", "Forward attempts by peer and outcome.",
                                    labels=["peer", "outcome"])
        for (peer, outcome), n in sorted(self.outcomes.items()):
            total.add_metric([peer, outcome], n)
        yield total


class PeerVersionFigures:
    """Wire-version negotiation per peer link (federation/versions.py): every
    link, whichever role (message peer, claim route, watched peer) made it."""

    def __init__(self, registry, federation):
        self.federation = federation  # its peer links; its hub's inbound registrations
        registry.register(self)

    def describe(self):
        return []

    def collect(self):
        negotiated = GaugeMetricFamily(
            "hubd_peer_negotiated_version", "The lowest common wire version with the peer, "
            "from its last welcome (0 = never came up).", labels=["peer"])
        advertised = GaugeMetricFamily(
            "hubd_peer_advertised_version", "The wire version the peer's last welcome "
            "advertised (0 = none usable, or never came up).", labels=["peer"])
        warnings = CounterMetricFamily(
            "hubd_peer_version_warnings", "Operator warnings that a peer's wire version is "
            "older, newer or missing (once per peer and advertised version).",
            labels=["peer", "relation"])
        inbound = GaugeMetricFamily(
            "hubd_peer_inbound_negotiated_version", "The lowest common wire version with a "
            "peer hub that registered its link with this hub.", labels=["peer"])
        inbound_warnings = CounterMetricFamily(
            "hubd_peer_inbound_version_warnings", "Operator warnings that a peer registering "
            "with this hub speaks an older, newer or no wire version.",
            labels=["peer", "relation"])
        links = self.federation.peer_links.links if self.federation.peer_links else {}
        for peer, link in sorted(links.items()):
            n = link.versions.negotiation
            negotiated.add_metric([peer], n.effective if n is not None else 0)
            advertised.add_metric([peer], (n.advertised or 0) if n is not None else 0)
            for relation, count in sorted(link.versions.warnings.items()):
                warnings.add_metric([peer, relation], count)
        router = self.federation.hub.router if self.federation.hub is not None else None
        if router is not None:
            from federation.handlers.peer_versions import InboundVersions

            for peer, entry in sorted(router.live_of(InboundVersions).by_peer.items()):
                inbound.add_metric([peer], entry.effective or 0)
                for relation, count in sorted(entry.warnings.items()):
                    inbound_warnings.add_metric([peer, relation], count)
        yield negotiated
        yield advertised
        yield warnings
        yield inbound
        yield inbound_warnings

"""Namespace authority: who may grant a claim, and what this hub sees its peers do.

One Authority per hub, with three parts:
- the ownership map and the PartitionDetector (pure decisions, federation/
  ownership.py and partition.py), consulted on the claim path inside Router
  commands and changed only there;
- a WatchFollower actor per `--multihub-watch` peer (federation/actors/watch.py): it
  pulls the peer's event log, merges and folds it, and tells the Router what
  the peer asserts; the Router journals partition and heal transitions and
  equivocation evidence (observed, record_equivocation below);
- claim routes (`--claim-peer`): a claim-family verb in a namespace a peer owns
  goes to the ClaimForwarder actor (federation/actors/claim_forwarder.py), which asks
  the owner and hands the verdict back to the Router.

Journaled rows (partition, heal, equivocation, recovery) are kept by a small
projection, so a restart restores the refusing set and the quarantines from the
journal with the same replay as everything else.
"""

from __future__ import annotations

import asyncio
import secrets
from dataclasses import dataclass, field

import structlog
from prometheus_client import Counter

from federation.actors.claim_forwarder import ClaimForwarder, ClaimVerdict
from federation.config import FederationConfig
from federation.actors.link import PeerLink
from federation.log_model import Equivocation
from federation.actors.peers import PeerLinks
from federation.ownership import NamespaceOwnership
from federation.partition import MULTIHUB_HEAL, MULTIHUB_PARTITION, PartitionDetector
from federation.quarantine import (MULTIHUB_EQUIVOCATION, MULTIHUB_EQUIVOCATION_RECOVERY,
                                   active_quarantines, equivocation_payload)
from federation.actors.watch import (Equivocated, Observed, SetQuarantine, WatchFollower,
                                    WatchStatus)
from hubd.state.events import Event
from hubd.state.hub import Appliers, HubState

log = structlog.get_logger("hubd.federation.authority")

ROWS = "authority_rows"
ROW_KINDS = (MULTIHUB_PARTITION, MULTIHUB_HEAL, MULTIHUB_EQUIVOCATION,
             MULTIHUB_EQUIVOCATION_RECOVERY)
MAX_ROWS = 10_000


@dataclass
class AuthorityRows:
    """The journaled authority evidence, in journal order (rare rows; bounded)."""

    rows: list = field(default_factory=list)  # (kind, payload)


# the projections this module keeps in HubState.extensions, by name
PROJECTIONS = {ROWS: AuthorityRows}
appliers = Appliers()


def _keep_row(state: HubState, event: Event) -> None:
    rows = state.extensions[ROWS].rows
    rows.append((event.kind, event.payload))
    if len(rows) > MAX_ROWS:
        del rows[: len(rows) - MAX_ROWS]


for _kind in ROW_KINDS:
    appliers.applies(_kind)(_keep_row)


class Authority:
    def __init__(self, hub, config: FederationConfig, peers: PeerLinks):
        self.hub = hub
        self.config = config
        self.peers = peers
        self.ownership = NamespaceOwnership.from_flags(
            [f"{ns}={owner}" for ns, owner in config.namespace_owners.items()], hub.hub_id)
        self.detector = PartitionDetector(hub.hub_id, self.ownership,
                                          watched=set(config.watches))
        self.followers: dict[str, WatchFollower] = {}
        self.watch_status: dict[str, WatchStatus] = {}  # the followers' latest reports
        self.claim_links: dict[str, PeerLink] = {}
        self.watch_links: dict[str, PeerLink] = {}
        self.claim_forwarder = ClaimForwarder(self.claim_links, self._verdict,
                                              timeout=hub.config.timing.claim_answer)
        self.quarantined: set[str] = set()
        metrics = hub.metrics
        self.refusals = Counter("hubd_watch_quarantines",
                                "Watched peers quarantined, by why: conflicting_offer, "
                                "chain_broken, checkpoint_equivocation.",
                                ["peer", "reason"], registry=metrics.registry)
        metrics.gauge("hubd_namespace_partitioned",
                      "1 while a governed namespace refuses claims as contested, else 0.",
                      lambda: {ns: int(ns in self.detector.partitioned())
                               for ns in set(self.ownership.governed())
                               | self.detector.partitioned()}, "namespace")
        metrics.gauge("hubd_peer_quarantined",
                      "1 for each watched peer quarantined after equivocation.",
                      lambda: {p: int(p in self.quarantined) for p in self.config.watches}, "peer")
        metrics.gauge("hubd_watch_lag_events",
                      "Events a watched peer has journaled that this hub has not pulled yet.",
                      lambda: {p: s.lag for p, s in self.watch_status.items()
                               if s.lag is not None}, "peer")
        metrics.gauge("hubd_watch_last_success_timestamp_seconds",
                      "When a watched peer's log was last pulled successfully (Unix time).",
                      lambda: {p: s.last_success or 0 for p, s in self.watch_status.items()},
                      "peer")

    @property
    def configured(self) -> bool:
        return self.ownership.configured

    # -- restart and rebuild

    def restore(self, state: HubState) -> None:
        rows = state.extensions[ROWS].rows
        self.detector.restore(rows)
        self.quarantined = set(active_quarantines(rows))
        for peer, follower in self.followers.items():
            follower.post(SetQuarantine(peer in self.quarantined))
        if self.detector.partitioned():
            log.warning("restored contested namespaces from the journal; claims in them are "
                        "refused until a refresh proves them uncontested",
                        namespaces=sorted(self.detector.partitioned()))

    # -- lifetime

    def start(self, router, group: asyncio.TaskGroup) -> None:
        config = self.config
        for peer in config.watches:
            follower = WatchFollower(peer, self.peers.link(peer), self.hub.config.timing,
                                     self._observation, self.hub.hub_id,
                                     quarantined=peer in self.quarantined)
            self.watch_links[peer] = self.peers.subscribe(peer, on_up=follower.link_up)
            self.followers[peer] = follower
            self.watch_status[peer] = follower.snapshot()
            group.create_task(follower.run(), name=f"watch-{peer}")
        for peer in config.claim_peers:
            self.claim_links[peer] = self.peers.link(peer)
        group.create_task(self.claim_forwarder.run(), name="claim-forwarder")

    def _verdict(self, verdict: ClaimVerdict) -> None:
        """The ClaimForwarder's message, on to the Router as it is."""
        self.hub.router.post_control(verdict)

    def _observation(self, observation: Observed | Equivocated) -> None:
        """A WatchFollower's message: its status is kept for /health, the
        message goes on to the Router as it is."""
        self.watch_status[observation.peer] = observation.status
        self.hub.router.post_control(observation)

    # -- Router side: observations become journaled transitions

    def observed(self, router, peer: str, asserting, refreshed_ok: bool, non_empty: bool) -> None:
        if peer in self.quarantined:
            return
        for transition in self.detector.observe(peer, asserting, refreshed_ok, non_empty):
            router.event(transition.kind, transition.payload)
            log.warning("namespace ownership changed", kind=transition.kind,
                        **{k: v for k, v in transition.payload.items() if k != "local_hub_id"})

    def record_equivocation(self, router, peer: str, error: Equivocation) -> None:
        if peer in self.quarantined:
            return
        self.quarantined.add(peer)
        self.refusals.labels(peer, error.reason).inc()
        router.event(MULTIHUB_EQUIVOCATION,
                     equivocation_payload(error, self.hub.hub_id, router.now))

    # -- the claim path

    def resolve(self, identity: str):
        return self.ownership.resolve_identity(identity, self.detector.partitioned())

    def health(self) -> dict:
        return {"namespace_owners": dict(self.config.namespace_owners),
                "partitioned": sorted(self.detector.partitioned()),
                "quarantined": sorted(self.quarantined),
                "watches": {peer: status.to_json(self.watch_links[peer])
                            for peer, status in self.watch_status.items()},
                "claim_routes": {peer: link.health() for peer, link in self.claim_links.items()},
                "claim_forwarder": self.claim_forwarder.health()}

    def new_request_id(self) -> str:
        return secrets.token_hex(12)


# -- the Router's handlers of the watch followers' messages (federation/plugin.py
# registers them by type)


def on_observed(router, observed: Observed) -> None:
    router.hub.federation.authority.observed(router, observed.peer, observed.asserting,
                                             observed.refreshed_ok, observed.non_empty)


def on_equivocated(router, equivocated: Equivocated) -> None:
    router.hub.federation.authority.record_equivocation(router, equivocated.peer,
                                                        equivocated.error)

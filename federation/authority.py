"""Namespace authority: who may grant a claim, and what this hub sees its peers do.

One Authority per hub, with three parts:
- the ownership map and the PartitionDetector (pure decisions, federation/
  ownership.py and partition.py), consulted on the claim path inside Router
  commands and changed only there;
- a WatchFollower per `--multihub-watch` peer: it pulls the peer's event log
  over a PeerLink, merges it (federation/merge.py), folds it (fold.py) and hands
  the Router what the peer asserts; the Router journals partition and heal
  transitions and equivocation evidence;
- claim routes (`--claim-peer`): a claim in a namespace a peer owns is sent to
  it (ClaimForwarder) and its verdict relayed.

Journaled rows (partition, heal, equivocation, recovery) are kept by a small
projection, so a restart restores the refusing set and the quarantines from the
journal with the same replay as everything else.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from dataclasses import dataclass, field

import structlog

from federation.config import FederationConfig
from federation.fold import FOLDED_KINDS, asserting_hubs, fold
from federation.link import LinkError, PeerLink
from federation.merge import Equivocation, MergedLog, MergeError, decode_snapshot
from federation.ownership import NamespaceOwnership
from federation.partition import MULTIHUB_HEAL, MULTIHUB_PARTITION, PartitionDetector
from federation.quarantine import (MULTIHUB_EQUIVOCATION, MULTIHUB_EQUIVOCATION_RECOVERY,
                                   active_quarantines, equivocation_payload)
from hubd.state.events import Event
from hubd.state.hub import Appliers, HubState

log = structlog.get_logger("hubd.federation.authority")

ROWS = "authority_rows"
ROW_KINDS = (MULTIHUB_PARTITION, MULTIHUB_HEAL, MULTIHUB_EQUIVOCATION,
             MULTIHUB_EQUIVOCATION_RECOVERY)
MAX_ROWS = 10_000
PAGE = 1000  # events per pull request
# Every poll re-reads this many already-accepted events: a peer that rewrote
# its recent history (a restore from another backup, a tampered journal) is
# caught as equivocation instead of going unnoticed behind the cursor.
OVERLAP = 64
# Fingerprints of events the fold does not need are kept only this far back.
FINGERPRINT_WINDOW = 4 * OVERLAP
MAX_PAGES = 50  # per poll round; the rest waits for the next round
PULL_TIMEOUT = 10.0


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


@dataclass
class WatchStatus:
    peer: str
    cursor: int = 0
    log_end: int | None = None
    last_success: float | None = None
    last_error: str | None = None
    quarantined: bool = False
    polls: int = 0

    @property
    def lag(self) -> int | None:
        return (self.log_end - self.cursor) if self.log_end is not None else None

    def to_json(self, link: PeerLink) -> dict:
        return {"cursor": self.cursor, "log_end_seq": self.log_end, "lag_events": self.lag,
                "last_success": self.last_success, "last_error": self.last_error,
                "quarantined": self.quarantined, "polls": self.polls,
                "clock_skew_seconds": round(link.clock_skew, 3)
                if link.clock_skew is not None else None, "link": "up" if link.up else "down",
                # why the link is down (pin_mismatch, tls, ...): a poll only says "link down"
                "link_error": link.last_error}


class WatchFollower:
    """Polls one peer's event log; never grants anything (observe-only)."""

    def __init__(self, authority: "Authority", peer: str, link: PeerLink, interval: float):
        self.authority = authority
        self.peer = peer
        self.link = link
        self.interval = interval
        self.merged = MergedLog(retain=FOLDED_KINDS.__contains__)
        self.status = WatchStatus(peer)
        self.wake = asyncio.Event()

    async def run(self) -> None:
        while True:
            if not self.status.quarantined:
                await self.poll_once()
            self.wake.clear()
            try:
                await asyncio.wait_for(self.wake.wait(), self.interval)
            except TimeoutError:
                pass

    async def poll_once(self) -> None:
        """Pull until caught up (bounded), then report what the peer asserts.
        A failed poll reports a failure: the last good observation stands."""
        hub = self.authority.hub
        status = self.status
        status.polls += 1
        result = None
        try:
            first = True
            for _ in range(MAX_PAGES):
                after = self.merged.cursor(self.peer)
                if first:
                    after = max(0, after - OVERLAP)
                    first = False
                answer = await self.link.request(
                    {"sender": hub.hub_id, "target": "all", "type": "multihub_log_request",
                     "payload": "", "after_seq": after, "limit": PAGE},
                    PULL_TIMEOUT, reply_type="multihub_log_snapshot")
                snapshot = decode_snapshot(answer)
                result = self.merged.accept(self.peer, after, snapshot.events,
                                            snapshot.next_cursor, snapshot.log_end_seq)
                if result.refused or result.caught_up:
                    break
        except Equivocation as exc:
            status.quarantined = True
            status.last_error = f"equivocation at seq {exc.seq}"
            log.error("peer equivocated; quarantined until an operator recovers it",
                      peer=self.peer, seq=exc.seq, accepted=exc.accepted_fingerprint,
                      offered=exc.offered_fingerprint)
            # `exc` is unbound when the except block ends: hand the lambda its own
            hub.router.post_control(
                lambda r, error=exc: self.authority.record_equivocation(r, self.peer, error))
            return
        except (LinkError, MergeError) as exc:
            status.last_error = str(exc)
            log.warning("watch poll failed; keeping the last good observation", peer=self.peer,
                        error=str(exc))
            hub.router.post_control(
                lambda r: self.authority.observed(r, self.peer, None, False, False))
            return
        status.cursor = self.merged.cursor(self.peer)
        status.log_end = self.merged.log_end(self.peer)
        self.merged.compact(self.peer, status.cursor - FINGERPRINT_WINDOW)
        if result is None or result.refused:
            status.last_error = "the peer refused the pull (empty answer, log_end_seq null)"
            hub.router.post_control(
                lambda r: self.authority.observed(r, self.peer, None, False, False))
            return
        status.last_success = time.time()
        status.last_error = None
        asserting = asserting_hubs(fold(self.merged.ordered()), time.time(), hub=self.peer)
        complete = result.complete
        hub.router.post_control(
            lambda r: self.authority.observed(r, self.peer, asserting, True, complete))


class Authority:
    def __init__(self, hub, config: FederationConfig):
        self.hub = hub
        self.config = config
        self.ownership = NamespaceOwnership.from_flags(
            [f"{ns}={owner}" for ns, owner in config.namespace_owners.items()], hub.hub_id)
        self.detector = PartitionDetector(hub.hub_id, self.ownership,
                                          watched=set(config.watches))
        self.followers: dict[str, WatchFollower] = {}
        self.claim_links: dict[str, PeerLink] = {}
        self.quarantined: set[str] = set()
        metrics = hub.metrics
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
                      lambda: {p: f.status.lag for p, f in self.followers.items()
                               if f.status.lag is not None}, "peer")
        metrics.gauge("hubd_watch_last_success_timestamp_seconds",
                      "When a watched peer's log was last pulled successfully (Unix time).",
                      lambda: {p: f.status.last_success or 0 for p, f in self.followers.items()},
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
            follower.status.quarantined = peer in self.quarantined
        if self.detector.partitioned():
            log.warning("restored contested namespaces from the journal; claims in them are "
                        "refused until a refresh proves them uncontested",
                        namespaces=sorted(self.detector.partitioned()))

    # -- lifetime

    def start(self, router, group: asyncio.TaskGroup) -> None:
        config = self.config
        context = config.client_context() if any(
            r.secure for r in list(config.watches.values()) + list(config.claim_peers.values())
        ) else None
        for peer, route in config.watches.items():
            link = PeerLink(route, self.hub.hub_id, context)
            follower = self.followers[peer] = WatchFollower(self, peer, link,
                                                            config.watch_interval)
            follower.status.quarantined = peer in self.quarantined
            group.create_task(link.run(), name=f"watch-link-{peer}")
            group.create_task(follower.run(), name=f"watch-{peer}")
        for peer, route in config.claim_peers.items():
            link = self.claim_links[peer] = PeerLink(route, self.hub.hub_id, context)
            group.create_task(link.run(), name=f"claim-link-{peer}")

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
        router.event(MULTIHUB_EQUIVOCATION,
                     equivocation_payload(error, self.hub.hub_id, router.now))

    # -- the claim path

    def resolve(self, identity: str):
        return self.ownership.resolve_identity(identity, self.detector.partitioned())

    def health(self) -> dict:
        return {"namespace_owners": dict(self.config.namespace_owners),
                "partitioned": sorted(self.detector.partitioned()),
                "quarantined": sorted(self.quarantined),
                "watches": {peer: f.status.to_json(f.link) for peer, f in self.followers.items()},
                "claim_routes": {peer: link.health() for peer, link in self.claim_links.items()}}

    def new_request_id(self) -> str:
        return secrets.token_hex(12)

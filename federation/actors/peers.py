"""PeerLinks: one PeerLink per peer hub, shared by everyone who talks to it.

A peer can be a message peer (the ForwardOutbox), a claim route (the
ClaimForwarder) and a watched peer (its WatchFollower) at once; all three
ride one pinned mTLS WebSocket, registered once. Each user subscribes to the
link events it needs (up, down, forward results, a peer too old for
forwarding); the link calls every subscriber in subscription order, in its
own task.

One link per peer needs one route per peer: a hub named by several of
--message-peer, --claim-peer and --multihub-watch must be given the same URI
and pins in each (checked with the flags, federation/config.py), and at most
one distinct token.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Callable

import structlog

from federation.actors.link import PeerLink
from federation.config import FederationConfig, PeerRoute, merged_routes
from hubd.timing import Timing

log = structlog.get_logger("hubd.federation.peers")


@dataclass
class Subscribers:
    """Who hears one link's events (up, down, forward results nobody asked
    for, a peer too old for forwarding): the link calls these in its own
    task, and each calls every subscriber in subscription order."""

    up: list[Callable[[str], None]] = field(default_factory=list)
    down: list[Callable[[str, str], None]] = field(default_factory=list)
    result: list[Callable[[str, dict], None]] = field(default_factory=list)
    rejected: list[Callable[[str, str], None]] = field(default_factory=list)
    push: list[Callable[[str, dict], None]] = field(default_factory=list)

    def add(self, *, on_up=None, on_down=None, on_result=None, on_rejected=None,
            on_push=None) -> None:
        for fn, into in ((on_up, self.up), (on_down, self.down), (on_result, self.result),
                         (on_rejected, self.rejected), (on_push, self.push)):
            if fn is not None:
                into.append(fn)

    def on_up(self, peer: str) -> None:
        for fn in self.up:
            fn(peer)

    def on_down(self, peer: str, cause: str) -> None:
        for fn in self.down:
            fn(peer, cause)

    def on_result(self, peer: str, frame: dict) -> None:
        for fn in self.result:
            fn(peer, frame)

    def on_rejected(self, peer: str, text: str) -> None:
        for fn in self.rejected:
            fn(peer, text)

    def on_push(self, peer: str, frame: dict) -> None:
        for fn in self.push:
            fn(peer, frame)


class PeerLinks:
    def __init__(self, hub_id: str, config: FederationConfig, timing: Timing):
        self.hub_id = hub_id
        self.timing = timing
        self.routes: dict[str, PeerRoute] = merged_routes(config)
        self._context = _context(config, self.routes)
        self.links: dict[str, PeerLink] = {}
        self._subscribers: dict[str, Subscribers] = {}
        self._group: asyncio.TaskGroup | None = None

    def link(self, peer: str) -> PeerLink:
        """The peer's one link (made on first use; it runs once start() ran)."""
        link = self.links.get(peer)
        if link is None:
            subscribers = self._subscribers[peer] = Subscribers()
            link = self.links[peer] = PeerLink(
                self.routes[peer], self.hub_id, self._context, self.timing,
                on_up=subscribers.on_up,
                on_down=subscribers.on_down, on_result=subscribers.on_result,
                on_rejected=subscribers.on_rejected, on_push=subscribers.on_push)
            if self._group is not None:
                self._run(peer, link)
        return link

    def subscribe(self, peer: str, **events) -> PeerLink:
        """The peer's link, with `events` (on_up, on_down, ...) subscribed to it."""
        link = self.link(peer)
        self._subscribers[peer].add(**events)
        on_up = events.get("on_up")
        if on_up is not None and link.up:
            on_up(peer)  # subscribed late: the link is already up
        return link

    def start(self, group: asyncio.TaskGroup) -> None:
        self._group = group
        for peer, link in self.links.items():
            self._run(peer, link)

    def _run(self, peer: str, link: PeerLink) -> None:
        self._group.create_task(link.run(), name=f"peer-link-{peer}")

    def reconfigure(self, config: FederationConfig) -> list[str]:
        """New pins, URIs or tokens after SIGHUP (the config was checked whole).
        Returns the peers no role names any more; their links are stopped."""
        routes = merged_routes(config)
        self._context = _context(config, routes)
        self.routes = routes
        for peer, link in self.links.items():
            if peer in routes:
                link.reroute(routes[peer], self._context)
        gone = [peer for peer in self.links if peer not in routes]
        for peer in gone:
            self.links[peer].stop()
        return gone

    def health(self) -> dict:
        return {peer: link.health() for peer, link in self.links.items()}


def _context(config: FederationConfig, routes: dict[str, PeerRoute]):
    return config.client_context() if any(r.secure for r in routes.values()) else None

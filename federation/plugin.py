"""Federation as one plugin: what the composition root (hubd/composition.py)
installs for a hub that forwards chats, serves peers or takes part in
namespace authority.

The plugin brings federation's verbs (receiving forwards, log pulls, claim
requests from peers), its projections and appliers (forward outbox and
inbox, authority rows), its hooks into the core (a peer hub's first frame,
the claim gate, targets on peer hubs), its actors (peer links, the forward
outboxes, the delivery senders, the claim forwarder, watch followers), the
typed commands those post to the Router (COMMANDS), its /health sections
and its reload.
The core never imports this package; federation's modules find their
runtime as `hub.federation` (this object), put there when the hub is built.
"""

from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple

import structlog

from hubd.core.plugin import Plugin
from hubd.handlers import routing

from federation import delivery_forward_rules, delivery_notice_rules, remote_leases
from federation import state as forward_state
from federation.actors.claim_forwarder import ClaimVerdict
from federation.actors.delivery_sender import DeliveryAnswered
from federation.actors.watch import Equivocated, Observed
from federation.state import outbox_of
from federation.config import FederationConfig
from federation.handlers import authority as authority_state
from federation.handlers import (attachment_reads, claims, dead_letter_pointer,
                                 delivery_forward, delivery_notices, forwarding, logpull,
                                 peer_versions, receiver, spend_relay)
from federation.health_problems import federation_problems

log = structlog.get_logger("hubd.federation")


# What federation's actors tell the Router, each a frozen message handled by
# type (hubd/core/plugin.py `commands`): no closure crosses to the Router.
COMMANDS = {
    forwarding.ReadOutboxReports: forwarding.read_outbox_reports,
    forwarding.LoadBacklog: forwarding.load_backlog,
    ClaimVerdict: claims.relay_verdict,
    Observed: authority_state.on_observed,
    Equivocated: authority_state.on_equivocated,
    DeliveryAnswered: delivery_forward.on_answered,
    receiver.PeerPolicyReloaded: receiver.recheck_peer_sessions,
}


class Federation:
    def __init__(self, config: FederationConfig):
        self.config = config
        self.hub = None
        self.forwarding = None  # federation.handlers.forwarding.Forwarding, with message peers
        self.delivery = None  # federation.handlers.delivery_forward.DeliveryForwarder, likewise
        self.authority = None  # federation.handlers.authority.Authority, with a namespace-owner map
        self.serving_policy = None  # federation.policy.ServingPolicy, when serving peers
        self.peer_links = None  # federation.actors.peers.PeerLinks: one link per peer hub
        self.server_ssl = None  # the listener's SSLContext (its certificate reloads on SIGHUP)
        # log pulls admitted: each one's task, or its ticket until the task starts
        # (handlers/logpull.py bounds them)
        self.log_pulls: set = set()
        self.pulls_noted: dict[str, int] = {}  # peer -> the after_seq last noted in the journal

    def plugin(self) -> Plugin:
        verbs: dict = {}
        for module in (receiver, logpull, claims, attachment_reads, dead_letter_pointer,
                       delivery_notices):
            verbs.update(module.verbs)
        appliers: dict[str, list] = {}
        for module in (forward_state, authority_state, remote_leases, delivery_forward_rules,
                       delivery_notice_rules):
            for kind, fns in module.appliers.items():
                appliers.setdefault(kind, []).extend(fns)
        return Plugin(
            "federation",
            verbs=verbs,
            appliers=appliers,
            projections={**forward_state.PROJECTIONS, **authority_state.PROJECTIONS,
                         **remote_leases.PROJECTIONS, **delivery_forward_rules.PROJECTIONS,
                         **delivery_notice_rules.PROJECTIONS},
            peer_claims=(receiver.claim_peer_link,),
            live=(receiver.ForwardVerdicts, attachment_reads.PeerAsks,
                  dead_letter_pointer.PointerLog, dead_letter_pointer.UnsentPointers,
                  delivery_notices.NoticeLinks, peer_versions.InboundVersions,
                  spend_relay.SpendAsks),
            claim_gate=claims.gate,
            # the claimant's snapshot lists its leases on other hubs' namespaces
            replaces_state_sections={"active_claims": claims.active_claims_with_remote},
            remote_hubs=self,
            commands={**COMMANDS, **attachment_reads.COMMANDS, **dead_letter_pointer.COMMANDS,
                      **delivery_notices.COMMANDS, **spend_relay.COMMANDS},
            health_sections={"message_forward": self._health_forwarding,
                             "multihub": self._health_authority,
                             "peer_versions": self._health_versions,
                             "peer_versions_inbound": lambda hub: peer_versions.health(hub.router)
                             if hub.router is not None else None,
                             "delivery_notices": self._health_notices},
            health_problems=(federation_problems,),
            bind=self.bind,
            restored=self.restored,
            journal_needs=lambda state: outbox_of(state).oldest_seq(),
            rebuilt=self.rebuilt,
            start=self.start,
            reload=self.reload,
            listener_ssl=self.listener_ssl,
        )

    def relay_spend(self, router, session, owner: str, action: str, document: dict) -> None:
        """An agent's spend_request for pool owner hub `owner`, over its link
        (hubd/handlers/evidence.py calls this; federation/handlers/spend_relay.py)."""
        spend_relay.relay(router, session, owner, action, document)

    # -- lifetime

    def bind(self, hub) -> None:
        """Serving policy, message peers and the namespace-owner map
        (PolicyError, FederationConfigError: ValueErrors)."""
        self.hub = hub
        hub.federation = self
        config = self.config
        if config.serving_policy_path is not None:
            from federation.policy_loading import load_serving_policy

            self.serving_policy = load_serving_policy(config.serving_policy_path)
        if config.message_peers or config.watches or config.claim_peers or config.relay_peers:
            from federation.actors.peers import PeerLinks

            self.peer_links = PeerLinks(hub.hub_id, config, hub.config.timing)
            for peer in config.relay_peers:
                self.peer_links.link(peer)  # dead-letter pointers ride it (started with the rest)
        if self.peer_links is not None or self.serving_policy is not None:
            from federation.metrics import PeerVersionFigures

            PeerVersionFigures(hub.metrics.registry, self)
        if config.message_peers:
            from federation.handlers.forwarding import Forwarding

            self.forwarding = Forwarding(hub, config, self.peer_links)
            self.delivery = delivery_forward.DeliveryForwarder(hub, self.forwarding,
                                                               self.peer_links)
        if config.namespace_owners:
            from federation.handlers.authority import Authority

            self.authority = Authority(hub, config, self.peer_links)

    def _relay_link_up(self, peer: str) -> None:
        """A relay route's link is up (in the link's task): on to the Router."""
        self.hub.router.post_control(dead_letter_pointer.RelayLinkUp(peer))

    def listener_ssl(self):
        """The listener's TLS context, with --tls-certfile (TlsConfigError)."""
        config = self.config
        if config.tls_certfile is None:
            return None
        from federation.tls import server_context

        policy = self.serving_policy
        self.server_ssl = server_context(config.tls_certfile, config.tls_keyfile,
                                         client_ca_pem=policy.client_ca_pem if policy else None)
        return self.server_ssl

    def restored(self, state) -> None:
        if self.authority is not None:
            self.authority.restore(state)

    def rebuilt(self, router) -> None:
        if self.forwarding is not None:
            self.forwarding.resync(router)

    def start(self, router, group) -> None:
        if self.forwarding is not None:
            self.forwarding.start(router, group)
            self.delivery.start(group)
        if self.authority is not None:
            self.authority.start(router, group)
        if self.peer_links is not None:
            for peer in self.config.relay_peers:
                self.peer_links.subscribe(peer, on_up=self._relay_link_up)
            self.peer_links.start(group)

    def reload(self, hub, proposed) -> dict:
        """SIGHUP: read pins, peers, the serving policy, the federation store
        and certificate files again, as `proposed` (a HubConfig) names them.
        Everything is checked before anything is swapped (ValueError/OSError:
        nothing changes). Local agents stay connected; a peer link whose
        certificate no longer matches is closed."""
        old = self.config
        config = (proposed.federation or FederationConfig()).rebuild()
        policy = None
        if config.serving_policy_path is not None:
            from federation.policy_loading import load_serving_policy

            policy = load_serving_policy(config.serving_policy_path)
        if config.tls_certfile is not None:
            from federation.tls import server_context

            server_context(config.tls_certfile, config.tls_keyfile,
                           client_ca_pem=policy.client_ca_pem if policy else None)
        if config.message_peers:
            config.client_context()
        if bool(config.message_peers) != (self.forwarding is not None) or \
                (config.tls_certfile is None) != (old.tls_certfile is None):
            raise ValueError("turning forwarding or native TLS on or off needs a restart")
        self.config = config
        hub.config = replace(hub.config, federation=config)
        self.serving_policy = policy
        if self.server_ssl is not None:
            self.server_ssl.load_cert_chain(config.tls_certfile, config.tls_keyfile)
            if policy is not None:
                self.server_ssl.load_verify_locations(cadata=policy.client_ca_pem)
        if hub.router is not None:
            hub.router.post_control(receiver.PeerPolicyReloaded(policy))
        if self.peer_links is not None:
            self.peer_links.reconfigure(config)
        if self.forwarding is not None:
            self.forwarding.reconfigure(config)
            self.delivery.reconfigure()
        return {"peers": sorted(config.message_peers),
                "serving_policy": str(config.serving_policy_path or "")}

    # -- targets on peer hubs (the core's RemoteHubs)

    def knows(self, hub_id: str) -> bool:
        return self.forwarding is not None and self.forwarding.knows(hub_id)

    def forward_chat(self, router, session, frame: dict, remote, retry: bool) -> None:
        if self.forwarding is None:
            router.error(session, routing.no_route(router, remote.hub, session.name),
                         client_msg_id=frame.get("client_msg_id"))
            return
        self.forwarding.forward_chat(router, session, frame, remote, retry)

    def refusal(self, router, hub_id: str, sender: str | None) -> str | None:
        if self.forwarding is None:
            return routing.no_route(router, hub_id, sender)
        return self.forwarding.refusal(router, hub_id, sender)

    def forward_from(self, router, sender: str, frame: dict, remote, retry: bool) -> None:
        self.forwarding.forward_from(router, sender, frame, remote, retry)

    def seat_on_owner(self, address: str) -> str | None:
        owner = self.config.namespace_owners.get(address.split("/", 1)[0])
        if owner is not None and owner != self.hub.hub_id and self.knows(owner):
            return f"{address}@{owner}"
        return None

    def dead_letter_escalated(self, router, target: str, count: int) -> None:
        """A target escalated here (hubd/handlers/dead_letters.py): its
        pointer goes to the namespace's owner over a relay route, if any."""
        dead_letter_pointer.escalated(router, target, count)

    def forward_delivery(self, router, session, frame: dict) -> None:
        """A delivery_request to PROJECT/seat@HUB (hubd/handlers/delivery.py)."""
        if self.delivery is None:
            from hubd.handlers.delivery import refuse
            from hubd.state import delivery_rules as rules

            rid = rules.bounded_text(frame.get("request_id"), "request_id")
            refuse(router, session, rules.Refusal(
                rules.UNKNOWN_HUB, "this hub has no message peers",
                rid if isinstance(rid, str) else ""))
            return
        self.delivery.request(router, session, frame)

    def routed_delivery(self, router, session, frame: dict, key: str) -> bool:
        """A status request or cancel for an operation routed to a peer: asked
        there (True), or not routed (False: the local verb answers)."""
        if self.delivery is None:
            route = delivery_forward_rules.routes_of(router.state).by_key.get(key)
            if route is None:
                return False
            from hubd.handlers.delivery import refuse
            from hubd.state import delivery_rules as rules

            refuse(router, session, rules.Refusal(
                rules.UNKNOWN_HUB, f"hub '{route.peer}' is not a configured message peer"))
            return True
        return self.delivery.follow_up(router, session, frame, key)

    def takes_notices(self, router, peer: str) -> bool:
        return delivery_notices.takes_notices(router, peer)

    def notice_peer(self, router, audience: str, origin_hub: str,
                    taker_at_admission: bool) -> str | None:
        return delivery_notices.notice_peer(router, audience, origin_hub, taker_at_admission)

    def push_notices(self, router, peer: str, notes: list) -> None:
        delivery_notices.push_notices(router, peer, notes)

    def remote_who(self, router, session, frame: dict, hub_id: str) -> None:
        if self.forwarding is None:
            router.error(session, f"Hub '{hub_id}' is not a configured message peer of this hub.")
            return
        self.forwarding.remote_who(router, session, frame, hub_id)

    # -- /health

    def _health_forwarding(self, hub) -> dict:
        return self.forwarding.health() if self.forwarding is not None else {}

    def _health_notices(self, hub) -> dict | None:
        """Forwarded delivery stage changes pushed and relayed (delivery_notices.py)."""
        if hub.router is None or (self.serving_policy is None and self.delivery is None):
            return None
        return delivery_notices.figures(hub.router)

    def _health_versions(self, hub) -> dict | None:
        """Each peer link's negotiated wire version (federation/versions.py)."""
        if self.peer_links is None:
            return None
        return {peer: link.versions.health() for peer, link in self.peer_links.links.items()}

    def _health_authority(self, hub) -> dict | None:
        if self.authority is None:
            return None
        health = self.authority.health()
        if self.config.relay_peers:  # the dead-letter pointers' routes
            health["relay_routes"] = {peer: self.peer_links.link(peer).health()
                                      for peer in self.config.relay_peers}
        return health

"""Plugins: how a part of the hub adds its verbs, projections, hooks, actors
and health sections — installed explicitly by the composition root, never by
importing a module for its side effects.

A module declares its own tables (`verbs = Verbs()`, and in the state layer
`appliers = Appliers()`)
and a Plugin names the tables of a whole part (the core in
hubd/handlers/__init__.py, federation in federation/plugin.py). `Installed`
merges the plugins of one hub, in order, and refuses two plugins that claim
the same verb or hook. Journal replay uses the installed appliers, so what a
replay builds depends on what the hub installs, not on what was imported.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import (TYPE_CHECKING, Any, Awaitable, Callable, Iterable, Mapping, Protocol,
                    Sequence)

if TYPE_CHECKING:  # the annotations only: plugins sit below the actors that run them
    import asyncio

    from hubd.actors.router import Router
    from hubd.state.hub import HubState
    from hubd.state.presence import Session

    Handler = Callable[[Router, Session, dict, int], None]


@dataclass(frozen=True, slots=True)
class Verb:
    handler: "Handler"
    # hub-to-hub: the only verbs a peer hub's link may use
    peers: bool = False


class Verbs(dict):
    """One module's verbs: type -> Verb. (A verb that only reads needs no
    mark: every mutation passes Router.event(), which refuses it, before
    anything is applied, while the journal cannot be written; a verb that
    mutates only sometimes, a non-persistent advertise or a claim forwarded
    to its owner, is served as far as it reads.)"""

    def handles(self, *types: str, peers: bool = False):
        def declare(fn):
            for type_ in types:
                if type_ in self:
                    raise ValueError(f"verb {type_!r} declared twice")
                self[type_] = Verb(fn, peers)
            return fn
        return declare


@dataclass(frozen=True)
class Dialect:
    """What the shared verbs mean on the endpoints of one door (the door an
    endpoint named in its Opened): each fn(router, session, command). A verb
    a dialect leaves out is refused to that door; a door with no dialect of
    its own speaks the core's (its Register takes a seat, its Send is a chat
    from that seat: hubd/handlers/dialects.py)."""

    # the endpoint was opened / went away
    opened: Callable | None = None
    closed: Callable | None = None
    register: Callable | None = None
    send: Callable | None = None
    take: Callable | None = None
    ack: Callable | None = None
    # the door's own verbs (Requests by name): only its endpoints may ask them
    requests: Mapping[str, Callable] = field(default_factory=dict)


@dataclass(frozen=True)
class Mailbox:
    """A kind of box a chat can land in besides a seat's (a REDSYN agent's,
    a broker handle's), declared by its plugin. The routing service
    (hubd/handlers/routing.py) asks each, once per directed chat, which of
    the target's addresses it holds (`plan`, a decision made before the chat
    is journaled) and journals the answer in the chat's route
    (`route["boxes"][kind]`); the mailbox's applier reads its own entries
    from there, and `delivered` makes the live effects (pushes, wake-ups)
    inside the same command."""

    kind: str
    # the projection (HubState.extensions) its plan decides on
    projection: str
    # fn(router, projection, frame, sender, target, route_extra) -> Planned | None
    plan: Callable
    # fn(router, event, entries)
    delivered: Callable
    # asked only for a target with an item in this namespace (`<namespace>/...`)
    namespace: str | None = None


class RemoteHubs(Protocol):
    """What the core asks about a target on a peer hub (`PROJECT/seat@HUB`)."""

    def knows(self, hub_id: str) -> bool:
        """Is hub_id a peer this hub may address?"""

    def forward_chat(self, router: "Router", session: "Session", frame: dict, remote,
                     retry: bool) -> None:
        """Route a chat to a seat on that peer (inside the Router's command)."""

    def remote_who(self, router: "Router", session: "Session", frame: dict,
                   hub_id: str) -> None:
        """Answer a who_request about that peer's seats."""

    def refusal(self, router: "Router", hub_id: str, sender: str | None) -> str | None:
        """Why a chat from `sender` to that peer cannot be accepted now (no
        route: routing.no_route; a full backlog), or None."""

    def forward_from(self, router: "Router", sender: str, frame: dict, remote,
                     retry: bool) -> None:
        """Route a chat from `sender` (any door) to a seat on that peer."""

    def seat_on_owner(self, address: str) -> str | None:
        """`address@HUB` when a peer owns the address's namespace, else None."""

    def dead_letter_escalated(self, router: "Router", target: str, count: int) -> None:
        """A target escalated on this hub (hubd/handlers/dead_letters.py): tell
        the peer that owns its namespace, when a relay route leads there."""

    def forward_delivery(self, router: "Router", session: "Session", frame: dict) -> None:
        """A delivery_request to `PROJECT/seat@HUB`: forwarded, or refused typed."""

    def routed_delivery(self, router: "Router", session: "Session", frame: dict,
                        key: str) -> bool:
        """A delivery status request or cancel: True if `key` is an operation
        routed to a peer (then it was asked there or refused), else False."""

    def takes_notices(self, router: "Router", peer: str) -> bool:
        """Whether `peer` says it takes delivery notifications back (asked
        when an operation it forwarded is admitted, and journaled with it)."""

    def notice_peer(self, router: "Router", audience: str, origin_hub: str,
                    taker_at_admission: bool) -> str | None:
        """The peer hub a forwarded requester's delivery notification goes
        back to (it takes them), or None."""

    def push_notices(self, router: "Router", peer: str, notes: list) -> None:
        """Send journaled notifications to that peer (released after the commit)."""


@dataclass
class Plugin:
    name: str
    verbs: Mapping[str, Verb] = field(default_factory=dict)
    appliers: Mapping[str, Sequence[Callable]] = field(default_factory=dict)
    # name -> factory of a projection kept in HubState.extensions
    projections: Mapping[str, Callable[[], object]] = field(default_factory=dict)
    # when an endpoint registers a name (after the presence broadcast)
    on_register: Sequence[Callable[["Router", "Session", dict], None]] = ()
    # when a registered endpoint goes away
    on_unregister: Sequence[Callable[["Router", "Session"], None]] = ()
    # run as ordinary Router commands once a second (lease expiry and the like)
    periodic: Sequence[Callable[["Router"], None]] = ()
    # the hub wire's session rules (exactly one plugin: the core's,
    # hubd/handlers/sessions.py SESSIONS): register(router, session, frame)
    # at an endpoint's first frame, refuse_name_switch(router, session, sender)
    sessions: Any = None
    # asked at an endpoint's first frame: is this a peer hub's link?
    peer_claims: Sequence[Callable[["Router", "Session", dict], bool]] = ()
    # asked before an agent's registration binds its name: True when the gate
    # refused it (and answered and closed the endpoint itself)
    registration_gates: Sequence[Callable[["Router", "Session", dict], bool]] = ()
    # asked before a registered agent's frame reaches its verb (in plugin
    # order): True when the gate refused it (and answered it itself); nothing
    # of the frame is applied then
    frame_gates: Sequence[Callable[["Router", "Session", dict, str], bool]] = ()
    # state_request sections: name -> fn(router, session, query)
    state_sections: Mapping[str, Callable] = field(default_factory=dict)
    # sections of an earlier plugin this one replaces, each named on purpose
    # (federation's active_claims adds the leases its agents hold on other
    # hubs to the core's): replacing one nobody declared is an error, and two
    # plugins declaring the same section without this is still refused
    replaces_state_sections: Mapping[str, Callable] = field(default_factory=dict)
    # /health sections: name -> fn(hub)
    health_sections: Mapping[str, Callable[[Any], object]] = field(default_factory=dict)
    # why /health says degraded: pure checks of the document, each returning
    # its reasons (hubd/health.py)
    health_problems: Sequence[Callable[[dict], list[str]]] = ()
    # boxes a chat can land in besides a seat's (see Mailbox), in the order
    # they are asked
    mailboxes: Sequence[Mailbox] = ()
    # door name -> what the shared verbs mean on that door's endpoints
    dialects: Mapping[str, Dialect] = field(default_factory=dict)
    # the plugin's own commands (typed messages its actors and timers post to
    # the Router): command type -> fn(router, command), run as an ordinary command
    commands: Mapping[type, Callable[["Router", Any], None]] = field(default_factory=dict)
    # Request verbs any endpoint (or none) may ask: name -> fn(router, session
    # or None, request); a door's own are its dialect's
    requests: Mapping[str, Callable] = field(default_factory=dict)
    # the plugin's live (not journaled) bookkeeping, one typed home each:
    # classes the Router makes once, `cls(router)`, found with router.live_of(cls)
    live: Sequence[type] = ()
    # claim-family verbs first pass here; True when it handled the frame
    claim_gate: Callable[["Router", "Session", dict, str], bool] | None = None
    # targets on peer hubs
    remote_hubs: RemoteHubs | None = None
    # the hub is built (before the journal is opened): the plugin may keep it
    bind: Callable[[Any], None] | None = None
    # a state was replayed from the journal, at start or after a rebuild
    restored: Callable[["HubState"], None] | None = None
    # the oldest seq this plugin's state still reads back from the journal
    # (None: none); `hubd journal compact` never drops it or what follows
    journal_needs: Callable[["HubState"], int | None] | None = None
    # the Router rebuilt its state from the journal (not at start)
    rebuilt: Callable[["Router"], None] | None = None
    # after the replay, before the hub runs: open what the plugin serves on its
    # own (a socket); raise OSError or ValueError to refuse to start
    opening: Callable[[Any], Awaitable[None]] | None = None
    # the hub is stopping: close what `opening` opened (before the endpoints close)
    closing: Callable[[], Awaitable[None]] | None = None
    # the hub's HTTP application is being built: add this plugin's routes
    # (before the WebSocket door's catch-all)
    http_routes: Callable[[Any], None] | None = None
    # the plugin's actors, in the hub's TaskGroup
    start: Callable[["Router", "asyncio.TaskGroup"], None] | None = None
    # SIGHUP: re-read files, as the proposed HubConfig (second argument)
    # names them; raise ValueError/OSError to keep the running configuration
    # (nothing swapped), return a description for the log
    reload: Callable[[Any, Any], dict] | None = None
    # the listener's TLS context, if this plugin serves TLS
    listener_ssl: Callable[[], Any] | None = None


class Installed:
    """The plugins of one hub, merged: what the Router, the replay and the
    hub's lifetime consult."""

    def __init__(self, plugins: Iterable[Plugin]):
        self.plugins: tuple[Plugin, ...] = tuple(plugins)
        verbs: dict[str, Verb] = {}
        appliers: dict[str, list] = {}
        projections: dict[str, Callable[[], object]] = {}
        state_sections: dict = {}
        health_sections: dict = {}
        commands: dict = {}
        requests: dict = {}
        live: dict = {}
        dialects: dict = {}
        for plugin in self.plugins:
            _merge_unique(commands, plugin.commands, f"command (plugin {plugin.name})")
            _merge_unique(requests, plugin.requests, f"request verb (plugin {plugin.name})")
            _merge_unique(live, {cls: None for cls in plugin.live},
                          f"live home (plugin {plugin.name})")
            _merge_unique(dialects, plugin.dialects, f"dialect (plugin {plugin.name})")
            _merge_unique(verbs, plugin.verbs, f"verb (plugin {plugin.name})")
            _merge_unique(projections, plugin.projections, f"projection (plugin {plugin.name})")
            _merge_unique(state_sections, plugin.state_sections,
                          f"state section (plugin {plugin.name})")
            for key, section in plugin.replaces_state_sections.items():
                if key not in state_sections:
                    raise ValueError(f"state section {key!r} (plugin {plugin.name}) replaces "
                                     "a section no earlier plugin declares")
                state_sections[key] = section
            _merge_unique(health_sections, plugin.health_sections,
                          f"health section (plugin {plugin.name})")
            for kind, fns in plugin.appliers.items():
                appliers.setdefault(kind, []).extend(fns)
        self.verbs = verbs
        self.handlers: dict[str, Callable] = {t: v.handler for t, v in verbs.items()}
        self.peer_verbs = frozenset(t for t, v in verbs.items() if v.peers)
        self.appliers = {kind: tuple(fns) for kind, fns in appliers.items()}
        self.projections = projections
        self.state_sections = state_sections
        self.health_sections = health_sections
        self.commands = commands
        self.requests = requests
        self.live = tuple(live)
        self.dialects = dialects
        self.on_register = self._all("on_register")
        self.on_unregister = self._all("on_unregister")
        self.periodic = self._all("periodic")
        self.peer_claims = self._all("peer_claims")
        self.health_problems = self._all("health_problems")
        self.registration_gates = self._all("registration_gates")
        self.frame_gates = self._all("frame_gates")
        self.mailboxes = self._all("mailboxes")
        self.claim_gate = self._one("claim_gate")
        self.remote_hubs = self._one("remote_hubs")
        self.sessions = self._one("sessions")

    def _all(self, name: str) -> tuple:
        return tuple(fn for plugin in self.plugins for fn in getattr(plugin, name))

    def _one(self, name: str):
        found = [(p.name, getattr(p, name)) for p in self.plugins if getattr(p, name) is not None]
        if len(found) > 1:
            raise ValueError(f"plugins {', '.join(n for n, _ in found)} all set {name}")
        return found[0][1] if found else None

    def hooks(self, name: str) -> list:
        """Every installed plugin's `name` hook that is set, in plugin order."""
        return [getattr(p, name) for p in self.plugins if getattr(p, name) is not None]


def _merge_unique(into: dict, items: Mapping, what: str) -> None:
    for key, value in items.items():
        if key in into:
            raise ValueError(f"{what} {key!r} is declared by two plugins")
        into[key] = value

"""Presence: which endpoints are open, on which door, and whom they serve.

One presence for every door. Presence is live state, not journaled: it is
rebuilt by clients coming back. Endpoints are ids; a session records the
door it came through (`door`, whose dialect its commands speak) and what it
serves:
- a hub seat (`name`, with roles): the hub wire's registration, or any door
  speaking only the shared vocabulary; `by_name` is the seats' index, what
  `who` lists and what a chat's recipients are resolved among;
- an identity of a door's own (`serves`: a broker handle), with the
  endpoint that listens for its pushes, if any, and a push-only endpoint (the
  broker's native socket);
- agents heard without a connection of their own (REDSYN agents, heard on
  each take): when, and through what (their node).
Mailboxes, receipts and the notification outbox know names and endpoint ids
only, so they work alike whichever door an agent came through.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from hubd.wire.envelope import HUB_WIRE

RX_SUFFIX = "-rx"
MAX_HEARD = 100_000


@dataclass(slots=True)
class Session:
    # the endpoint serving this session (its id in the hub's Endpoints)
    endpoint: int
    # the principal's name: what the ingress quota charges and the journal
    # records (open-host:<address> on an open hub)
    principal: str = ""
    peer_host: str = ""
    # the DER client certificate presented over TLS, if any
    peer_cert: bytes | None = None
    # the digest of the token the door checked (None on an open hub)
    credential: str | None = None
    name: str | None = None
    roles: tuple[str, ...] = ()
    wake_capability: str | None = None
    protocol_version: int | None = None
    registered_at: float = 0.0
    # registration or the last frame other than a heartbeat: a seat's
    # consume-live evidence (hubd/state/receipt_rules.py)
    last_reaction: float = 0.0
    # the last frame of any type: an -rx waiter's (keepalives count for it)
    last_heard: float = 0.0
    # a peer hub's link: its identity comes from its certificate, not a name
    peer_hub: str | None = None
    # recent serving-policy decisions for this connection's certificate:
    # (policy, origin, namespace) -> (decision, valid until)
    authorised: dict = field(default_factory=dict)
    # the door whose dialect this endpoint speaks
    door: str = HUB_WIRE
    # an identity of the door's own this endpoint serves (a broker handle),
    # and the one it acts through (a broker connection's session, its via)
    serves: str | None = None
    via: str | None = None
    # it gets the pushes of what it serves (when closed: it did, until then)
    listening: bool = False


@dataclass
class Presence:
    sessions: dict = field(default_factory=dict)  # endpoint id -> Session
    by_name: dict = field(default_factory=dict)  # seat name -> Session
    by_role: dict = field(default_factory=dict)  # role -> set of names
    # every open, admitted endpoint of a local agent on a door without a
    # dialect of its own (not a peer hub), as a tuple of ids for broadcast
    # fan-out; rebuilt when endpoints come and go, shared by every message
    # in between
    endpoints: tuple = ()
    # (door, identity) -> endpoint ids serving it, oldest first
    served: dict = field(default_factory=dict)
    # (door, identity) -> the endpoint that gets its pushes
    listeners: dict = field(default_factory=dict)
    # (door, identity) -> a push-only endpoint (no session of its own)
    push_only: dict = field(default_factory=dict)
    # (door, identity) -> (last heard, through what): agents without a connection
    heard: OrderedDict = field(default_factory=OrderedDict)

    def open(self, endpoint: int, principal: str, peer_host: str,
             peer_cert: bytes | None, credential: str | None = None,
             door: str = HUB_WIRE, broadcast: bool = True) -> Session:
        session = self.sessions[endpoint] = Session(endpoint, principal, peer_host, peer_cert,
                                                    credential, door=door)
        if broadcast:
            self.endpoints = self.endpoints + (endpoint,)
        return session

    def close(self, endpoint: int) -> Session | None:
        session = self.sessions.pop(endpoint, None)
        if session is None:
            return None
        if endpoint in self.endpoints:
            self.endpoints = tuple(e for e in self.endpoints if e != endpoint)
        self.unbind(session)
        self._drop_serving(session)  # its fields still say what it served
        return session

    # -- hub seats

    def bind(self, session: Session, name: str, roles: tuple[str, ...], now: float) -> None:
        session.name = name
        session.roles = roles
        session.registered_at = now
        session.last_reaction = now
        session.last_heard = now
        self.by_name[name] = session
        for role in roles:
            self.by_role.setdefault(role, set()).add(name)

    def unbind(self, session: Session) -> None:
        """Free the session's name (its socket closed, or a takeover replaced it)."""
        name = session.name
        if name is None or self.by_name.get(name) is not session:
            return
        del self.by_name[name]
        for role in session.roles:
            holders = self.by_role.get(role)
            if holders is not None:
                holders.discard(name)
                if not holders:
                    del self.by_role[role]

    def mark_peer(self, session: Session, hub_id: str) -> None:
        """This endpoint is a peer hub's link: it speaks only hub-to-hub verbs
        and gets none of the local agents' traffic."""
        session.peer_hub = hub_id
        self.endpoints = tuple(e for e in self.endpoints if e != session.endpoint)

    def online(self) -> list[str]:
        return sorted(self.by_name)

    def session_of(self, name: str) -> Session | None:
        return self.by_name.get(name)

    def roles_of(self, name: str) -> tuple[str, ...]:
        session = self.by_name.get(name)
        return session.roles if session is not None else ()

    def live(self, name: str) -> bool:
        """A name counts as reachable when it, or its -rx wake sidecar, is online."""
        return name in self.by_name or (name + RX_SUFFIX) in self.by_name

    # -- identities a door serves itself

    def serve(self, session: Session, identity: str, via: str | None = None) -> None:
        """The session serves `identity` (of its door) from now on, acting
        through `via`; what it served before, it no longer does."""
        if session.serves != identity:
            self.unserve(session)
            session.serves = identity
            self.served.setdefault((session.door, identity), []).append(session.endpoint)
        session.via = via if via != identity else None

    def unserve(self, session: Session) -> None:
        """The (still open) session serves nothing any more."""
        self._drop_serving(session)
        session.serves = session.via = None
        session.listening = False

    def _drop_serving(self, session: Session) -> None:
        identity = session.serves
        if identity is None:
            return
        key = (session.door, identity)
        endpoints = self.served.get(key)
        if endpoints is not None:
            if session.endpoint in endpoints:
                endpoints.remove(session.endpoint)
            if not endpoints:
                del self.served[key]
        session.listening = self.listeners.get(key) == session.endpoint
        if session.listening:
            del self.listeners[key]

    def listen(self, session: Session) -> None:
        """The session gets the pushes of the identity it serves (the one that
        did before no longer does)."""
        key = (session.door, session.serves)
        previous = self.listeners.get(key)
        if previous is not None and previous != session.endpoint:
            self.sessions[previous].listening = False
        self.listeners[key] = session.endpoint
        session.listening = True

    def serving(self, door: str, identity: str) -> list[int]:
        return self.served.get((door, identity), [])

    def listener(self, door: str, identity: str) -> int | None:
        return self.listeners.get((door, identity))

    def identities_served(self, door: str) -> "ServedBy":
        """The identities of `door` that an endpoint serves (a container)."""
        return ServedBy(self.served, door)

    def identities_listening(self, door: str) -> "ServedBy":
        """The identities of `door` whose pushes an endpoint listens for."""
        return ServedBy(self.listeners, door)

    def rename(self, door: str, old: str, new: str) -> None:
        """A door's identity changed its name: its endpoints serve the new one."""
        for table in (self.served, self.listeners, self.push_only):
            if (door, old) in table:
                table[(door, new)] = table.pop((door, old))
        for endpoint in self.served.get((door, new), ()):
            self.sessions[endpoint].serves = new
        for session in self.sessions.values():
            if session.door == door and session.via == old:
                session.via = new

    def push_only_endpoint(self, door: str, identity: str) -> int | None:
        return self.push_only.get((door, identity))

    def set_push_only(self, door: str, identity: str, endpoint: int | None) -> int | None:
        """The identity's push-only endpoint is now `endpoint` (None: none);
        the one it replaces, if any."""
        old = self.push_only.pop((door, identity), None)
        if endpoint is not None:
            self.push_only[(door, identity)] = endpoint
        return old if old != endpoint else None

    # -- who is online, door by door (the status page's)

    def online_by_door(self, limit: int) -> dict[str, dict]:
        """door -> {"count": how many, "listed": up to `limit` of them, by
        name}: the seats (of whatever door registered them), the identities
        a door serves itself (broker handles), the agents heard without a
        connection (REDSYN: the latest heard, with when and through what),
        and the peer hubs' links (under "peer-hubs")."""
        found: dict[str, list] = {}
        for session in self.sessions.values():
            if session.peer_hub is not None:
                door, entry = "peer-hubs", {"name": session.peer_hub,
                                            "peer_host": session.peer_host}
            elif session.name is not None:
                door, entry = session.door, {"name": session.name,
                                             "peer_host": session.peer_host,
                                             "since": session.registered_at}
            elif session.serves is not None:
                door, entry = session.door, {"name": session.serves,
                                             "listening": session.listening}
            else:
                continue  # opened, not registered yet (or a door's own endpoint)
            found.setdefault(door, []).append(entry)
        heard_count: dict[str, int] = {}
        for (door, identity), (when, through) in reversed(self.heard.items()):
            heard_count[door] = heard_count.get(door, 0) + 1
            if heard_count[door] <= limit:  # the latest heard; the rest counted
                found.setdefault(door, []).append({"name": identity, "last_heard": when,
                                                   "through": through})
        return {door: {"count": len(entries) + max(heard_count.get(door, 0) - limit, 0),
                       "listed": sorted(entries, key=lambda e: e["name"])[:limit]}
                for door, entries in sorted(found.items())}

    # -- agents heard without a connection

    def hear(self, door: str, identity: str, through: str, now: float) -> None:
        heard = self.heard
        key = (door, identity)
        heard.pop(key, None)
        heard[key] = (now, through)
        while len(heard) > MAX_HEARD:
            heard.popitem(last=False)

    def last_heard(self, door: str, identity: str) -> tuple[float, str] | None:
        return self.heard.get((door, identity))


class ServedBy:
    """A read-only view: the identities of one door in a (door, identity) table."""

    __slots__ = ("_table", "_door")

    def __init__(self, table: dict, door: str):
        self._table, self._door = table, door

    def __contains__(self, identity) -> bool:
        return (self._door, identity) in self._table

    def __iter__(self):
        door = self._door
        return (identity for d, identity in self._table if d == door)

    def __len__(self) -> int:
        return sum(1 for _ in self)

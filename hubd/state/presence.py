"""Presence: which sockets are open and which names they are bound to.

Presence is live state, not journaled: it is rebuilt by clients reconnecting.
Connections are opaque handles here (anything hashable with an `id`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

RX_SUFFIX = "-rx"


@dataclass(slots=True)
class Session:
    conn: object
    name: str | None = None
    roles: tuple[str, ...] = ()
    wake_capability: str | None = None
    protocol_version: int | None = None
    registered_at: float = 0.0
    last_reaction: float = 0.0
    # a peer hub's link: its identity comes from its certificate, not a name
    peer_hub: str | None = None
    # recent serving-policy decisions for this connection's certificate:
    # (policy, origin, namespace) -> (decision, valid until)
    authorised: dict = field(default_factory=dict)


@dataclass
class Presence:
    sessions: dict = field(default_factory=dict)  # conn -> Session
    by_name: dict = field(default_factory=dict)  # name -> Session
    by_role: dict = field(default_factory=dict)  # role -> set of names
    # every open, authenticated socket, as a tuple for broadcast fan-out;
    # rebuilt when sockets come and go, shared by every frame in between
    sockets: tuple = ()

    def open(self, conn) -> Session:
        session = self.sessions[conn] = Session(conn)
        self.sockets = self.sockets + (conn,)
        return session

    def close(self, conn) -> Session | None:
        session = self.sessions.pop(conn, None)
        if session is None:
            return None
        self.sockets = tuple(c for c in self.sockets if c is not conn)
        self.unbind(session)
        return session

    def bind(self, session: Session, name: str, roles: tuple[str, ...], now: float) -> None:
        session.name = name
        session.roles = roles
        session.registered_at = now
        session.last_reaction = now
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
        """This socket is a peer hub's link: it speaks only hub-to-hub verbs
        and gets none of the local agents' traffic."""
        session.peer_hub = hub_id
        self.sockets = tuple(c for c in self.sockets if c is not session.conn)

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

"""Presence: which endpoints are open and which names they are bound to.

Presence is live state, not journaled: it is rebuilt by clients reconnecting.
Endpoints are ids here; which door serves one is the door's business, so
presence, mailboxes and receipts work alike for every door.
"""

from __future__ import annotations

from dataclasses import dataclass, field

RX_SUFFIX = "-rx"


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


@dataclass
class Presence:
    sessions: dict = field(default_factory=dict)  # endpoint id -> Session
    by_name: dict = field(default_factory=dict)  # name -> Session
    by_role: dict = field(default_factory=dict)  # role -> set of names
    # every open, admitted endpoint of a local agent (not a peer hub), as a
    # tuple of ids for broadcast fan-out; rebuilt when endpoints come and go,
    # shared by every message in between
    endpoints: tuple = ()

    def open(self, endpoint: int, principal: str, peer_host: str,
             peer_cert: bytes | None, credential: str | None = None) -> Session:
        session = self.sessions[endpoint] = Session(endpoint, principal, peer_host, peer_cert,
                                                    credential)
        self.endpoints = self.endpoints + (endpoint,)
        return session

    def close(self, endpoint: int) -> Session | None:
        session = self.sessions.pop(endpoint, None)
        if session is None:
            return None
        self.endpoints = tuple(e for e in self.endpoints if e != endpoint)
        self.unbind(session)
        return session

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

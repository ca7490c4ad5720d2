"""Sessions, as endpoints open and end: the welcome, registration (the first
hub-wire frame with a sender binds the name), name conflicts, presence
announcements, a token proved late (Credit), and the re-check when the
principals change. Which door an endpoint came through does not matter here,
except that a door with a dialect of its own welcomes its endpoints itself.

The core plugin installs these: the commands by type (Opened, Closed,
Credit, PrincipalsChanged) and, for the Router's hub-wire path, `SESSIONS`
(a first frame registers; a frame naming another sender is refused).
"""

from __future__ import annotations

from types import SimpleNamespace

from hubd.actors.router import Router
from hubd.core.commands import Closed, Credit, Opened, PrincipalsChanged
from hubd.core.message import CLOSE_AUTH, CLOSE_CAPACITY, CLOSE_NAME_CONFLICT, CLOSE_PER_HOST
from hubd.state.presence import Session
from hubd.state.principals import (admission_refusal, session_refusal, speak_refusal,
                                   takeover_refusal)
from hubd.wire.envelope import PROTOCOL_VERSION, reserved_name_reason, strict_int

WELCOME_TEXT = "Welcome to hubd"
# hubd extensions a peer hub may use on this connection (the reference ignores
# unknown welcome fields): batched forwards, one result frame per batch; and
# forwarded delivery intents (federation/handlers/delivery_forward.py), which a hubd peer
# sends only to a hub that lists them, whatever its protocol_version says.
HUB_FEATURES = ["forward_batch", "delivery_forward"]


def opened(router: Router, command: Opened) -> None:
    """A door's endpoint opens. One of a door with a dialect of its own (the
    broker's connections, the REDSYN door) is that dialect's to welcome; any
    other is an agent's: bounded by the hub's capacity and per-host limits,
    welcomed, and reached by broadcasts."""
    presence = router.presence
    config = router.config
    endpoint, host = command.endpoint, command.peer_host
    dialect = router.installed.dialects.get(command.door)
    session = presence.open(endpoint, command.principal, host, command.peer_cert,
                            command.credential, command.door, broadcast=dialect is None)
    if dialect is not None:
        if dialect.opened is not None:
            dialect.opened(router, session, command)
        return
    if len(presence.endpoints) > config.max_clients:
        router.send(endpoint, router.frame("error", "self", "Hub at capacity."))
        router.close(endpoint, CLOSE_CAPACITY, "hub at capacity")
        return
    per_host = config.max_connections_per_host
    sessions = presence.sessions
    if per_host and sum(1 for e in presence.endpoints
                        if sessions[e].peer_host == host) > per_host:
        router.send(endpoint, router.frame("error", "self",
                                           "Too many connections from this host."))
        router.close(endpoint, CLOSE_PER_HOST, "too many connections from host")
        return
    # online_agents lists registered names; the newcomer is not one yet.
    router.send(endpoint, router.frame(
        "welcome", "self", WELCOME_TEXT, connected_clients=len(presence.endpoints),
        online_agents=presence.online(),
        protocol_version=PROTOCOL_VERSION,
        hubd_features=HUB_FEATURES))



def closed(router: Router, command: Closed) -> None:
    session = router.presence.close(command.endpoint)
    if session is None:
        return
    dialect = router.installed.dialects.get(session.door)
    if dialect is not None and dialect.closed is not None:
        dialect.closed(router, session)
    if session.name is None:
        return
    for hook in router.installed.on_unregister:
        hook(router, session)
    if router.presence.by_name.get(session.name) is None:
        announce_presence(router, "left", session.name)


def _name_conflict(router: Router, session: Session, name: str, text: str, reason: str) -> None:
    router.metrics.name_conflicts += 1
    router.send(session.endpoint, router.frame("name_conflict", name, text))
    router.close(session.endpoint, CLOSE_NAME_CONFLICT, reason)


def _auth_denied(router: Router, session: Session, name: str, reason: str) -> None:
    router.metrics.auth_denied += 1
    router.hub.auth_denials.denied(session.door, reason, peer=session.peer_host,
                                   principal=session.principal, seat=name)
    router.send(session.endpoint, router.frame("auth_denied", name, reason))
    router.close(session.endpoint, CLOSE_AUTH, "auth denied")


def register(router: Router, session: Session, frame: dict) -> bool:
    """Bind the frame's sender to this endpoint, or refuse and close it."""
    name = frame.get("sender") or f"anon-{session.endpoint}"
    reserved = reserved_name_reason(name)
    if reserved is not None:
        _name_conflict(router, session, name, reserved, "reserved identity")
        return False
    table = router.hub.identity.table
    refused = (admission_refusal(table, session.credential, session.peer_host,
                                 router.config.open_network, name)
               or speak_refusal(table, table.credential(session.credential), name))
    if refused is not None:
        _auth_denied(router, session, name, refused)
        return False
    for gate in router.installed.registration_gates:
        if gate(router, session, frame):
            return False
    presence = router.presence
    holder = presence.by_name.get(name)
    if holder is not None:
        if frame.get("takeover") is not True:
            _name_conflict(router, session, name,
                           f"Name '{name}' is already online from another session. "
                           "Use a unique --name.", "name conflict")
            return False
        refused = table.enforcing and takeover_refusal(holder.principal, session.principal, name)
        if refused:
            _auth_denied(router, session, name, refused)
            return False
        presence.unbind(holder)
        router.close(holder.endpoint, CLOSE_AUTH, "superseded")
    roles = frame.get("roles")
    roles = tuple(r for r in roles if isinstance(r, str) and r) if isinstance(roles, list) else ()
    presence.bind(session, name, roles, router.now)
    wake = frame.get("wake_capability")
    session.wake_capability = wake if isinstance(wake, str) else None
    session.protocol_version = strict_int(frame.get("protocol_version"))
    for hook in router.installed.on_register:
        hook(router, session, frame)
    announce_presence(router, "joined", name)
    return True


def credit(router: Router, command: Credit) -> None:
    """An endpoint admitted without a token at connect (a hub without --token
    welcomes every connection, as an open hub does) proved a token in its
    first frame: its session speaks as that principal from its registration
    on, which comes next on the same inbox."""
    session = router.presence.sessions.get(command.endpoint)
    if session is not None and session.name is None:
        session.principal, session.credential = command.principal, command.credential


def revalidate(router: Router, command: PrincipalsChanged) -> None:
    """The principals changed: close every session they no longer admit (a
    revoked token, a seat its principal lost, an open session once the hub
    requires a token)."""
    table = router.hub.identity.table
    router.identity_changed()
    for session in list(router.presence.sessions.values()):
        if session.peer_hub is not None:
            continue  # a peer hub's link answers to the serving policy
        refused = session_refusal(table, session.credential, session.name)
        if refused is not None:  # logged as an auth denial, with who and why
            _auth_denied(router, session, session.name or "unknown", refused)


def refuse_name_switch(router: Router, session: Session, sender: str) -> None:
    name = session.name or session.peer_hub
    _name_conflict(router, session, name,
                   f"Sender name switch denied: '{name}' -> '{sender}'. "
                   "One socket speaks for one name.", "name switch")


def announce_presence(router: Router, event: str, name: str) -> None:
    router.broadcast(router.frame("presence_update", "all", "Presence update",
                                  online_agents=router.presence.online(), event=event, agent=name))


# the Router's session commands, and its hub-wire path's rules
COMMANDS = {Opened: opened, Closed: closed, Credit: credit, PrincipalsChanged: revalidate}
SESSIONS = SimpleNamespace(register=register, refuse_name_switch=refuse_name_switch)

"""The shared verbs, handed to the dialect of the door an endpoint came through.

Register, Send, Take and Ack mean one thing to every door (an endpoint speaks
for an identity, a message goes from it to a target, a box is taken from and
acknowledged); what they carry beyond that is a door's dialect
(`Plugin.dialects`, by the door named in the endpoint's Opened: REDSYN's
announce and envelope, the broker's handles and threads). A door with no
dialect of its own speaks the hub's: its Register takes a seat and its Send
is a chat from that seat, exactly as the hub wire's first frame and `chat`
verb (they are turned into those frames and handled by the same verbs), so a
new door needs no handler of its own. A Request is looked up by name in the
installed request tables, like a hub-wire verb.
"""

from __future__ import annotations

from hubd.actors.router import Router
from hubd.core.commands import Ack, Register, Request, Send, Take
from hubd.core.refusals import CommandRefused
from hubd.wire import codec

NOT_OPEN = "endpoint_not_open"
UNKNOWN_VERB = "unknown_verb"


def _refuse(command, code: str, text: str) -> None:
    reply = command.reply
    if reply is not None and not reply.done():
        reply.set_exception(CommandRefused(code, text))


def _dispatch(router: Router, command, verb: str) -> None:
    session = router.presence.sessions.get(command.endpoint)
    if session is None:
        _refuse(command, NOT_OPEN, f"endpoint {command.endpoint} is not open on this hub")
        return
    dialect = router.installed.dialects.get(session.door)
    if dialect is None:
        _HUB_DIALECT[verb](router, session, command)
        return
    handler = getattr(dialect, verb)
    if handler is None:
        _refuse(command, UNKNOWN_VERB, f"the {session.door} door has no {verb} verb")
        return
    handler(router, session, command)


def register(router: Router, command: Register) -> None:
    _dispatch(router, command, "register")


def send(router: Router, command: Send) -> None:
    _dispatch(router, command, "send")


def take(router: Router, command: Take) -> None:
    _dispatch(router, command, "take")


def ack(router: Router, command: Ack) -> None:
    _dispatch(router, command, "ack")


def request(router: Router, command: Request) -> None:
    """A door's own verb (its dialect's: only its endpoints may ask it), or one
    any endpoint may ask (the installed request table: `hub.health`...)."""
    session = router.presence.sessions.get(command.endpoint) \
        if command.endpoint is not None else None
    dialect = router.installed.dialects.get(session.door) if session is not None else None
    handler = dialect.requests.get(command.verb) if dialect is not None else None
    if handler is None:
        handler = router.requests.get(command.verb)
    if handler is None:
        _refuse(command, UNKNOWN_VERB, f"this hub has no {command.verb!r} verb for "
                                       f"{'that endpoint' if session else 'a caller without one'}")
        return
    handler(router, session, command)


# -- the hub's own dialect: a seat and its chats

def _as_frame(router: Router, session, frame: dict) -> None:
    size = len(codec.encode(frame))
    router.acting = session.principal
    try:
        router.inbound(session, frame, size)
    finally:
        router.acting = None


def _hub_register(router: Router, session, command: Register) -> None:
    """The first frame of the hub wire: a heartbeat that names the sender (and
    roles, wake capability, takeover, mailbox from `fields`)."""
    _as_frame(router, session, {**command.fields, "type": "heartbeat",
                                "sender": command.identity})
    router.answer(command.reply, {"identity": command.identity,
                                  "registered": session.name == command.identity})


def _hub_send(router: Router, session, command: Send) -> None:
    """The hub wire's chat from the seat the endpoint registered."""
    frame = {**command.fields, "type": "chat", "sender": command.sender,
             "target": command.target, "payload": command.body}
    _as_frame(router, session, frame)
    router.answer(command.reply, {"msg_id": frame.get("msg_id"), "seq": frame.get("seq")})


def _no_box(router: Router, session, command) -> None:
    _refuse(command, UNKNOWN_VERB, "a hub seat has no box to take from: its mail comes to "
                                   "its endpoint (and its mailbox replays on registration)")


_HUB_DIALECT = {"register": _hub_register, "send": _hub_send, "take": _no_box, "ack": _no_box}

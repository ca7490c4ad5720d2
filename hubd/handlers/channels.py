"""Private-channel verbs: channel_create, channel_invite, channel_join,
channel_leave, channel_list_request, channel_history_request (docs/channels.md).

Each answer is private to the requester, in the reference's shapes:
`channel_result {channel, ok, members}` (the roster only when the request was
granted and the requester is a member afterwards, so a refusal never leaks
it), `channel_list {channels}`, `channel_history {channel, messages,
retention}`. The decisions are hubd/state/channels.py's; a granted request is
one journaled event, a refused one changes nothing. How a chat with a
`channel` is routed is the routing service's (hubd/handlers/routing.py).
"""

from __future__ import annotations

import structlog

from hubd.actors.router import Router
from hubd.core.plugin import Verbs
from hubd.state import channels as ch
from hubd.state.presence import Session

log = structlog.get_logger("hubd.channels")

verbs = Verbs()


def _answer(router: Router, session: Session, channel_id, decision: ch.Decision) -> None:
    name = session.name
    book = ch.channels_of(router.state)
    cid = ch.requested_id(channel_id)
    if decision.ok:
        kind, payload = decision.event
        router.event(kind, payload)
        router.fail_privately(session, f"The hub could not journal this channel change; "
                                       f"'{cid}' is unchanged. Retry.", channel=cid)
        cid = payload["channel"]
    else:
        router.metrics.channel_refusals += 1
    members = sorted(book.members(cid)) if decision.ok and book.is_member(cid, name) else []
    router.reply(session, "channel_result", decision.text, channel=cid, ok=decision.ok,
                 members=members)


@verbs.handles("channel_create")
def channel_create(router: Router, session: Session, frame: dict, size: int) -> None:
    channel_id = frame.get("channel")
    decision = ch.decide_create(ch.channels_of(router.state), channel_id, session.name,
                                frame.get("label"))
    if not decision.ok and decision.text == "channel registry is full":
        log.warning("channel registry is full; create refused", limit=ch.MAX_CHANNELS,
                    sender=session.name)
    _answer(router, session, channel_id, decision)


@verbs.handles("channel_invite")
def channel_invite(router: Router, session: Session, frame: dict, size: int) -> None:
    channel_id = frame.get("channel")
    _answer(router, session, channel_id,
            ch.decide_invite(ch.channels_of(router.state), channel_id, session.name,
                             frame.get("invitee")))


@verbs.handles("channel_join")
def channel_join(router: Router, session: Session, frame: dict, size: int) -> None:
    channel_id = frame.get("channel")
    _answer(router, session, channel_id,
            ch.decide_join(ch.channels_of(router.state), channel_id, session.name))


@verbs.handles("channel_leave")
def channel_leave(router: Router, session: Session, frame: dict, size: int) -> None:
    channel_id = frame.get("channel")
    _answer(router, session, channel_id,
            ch.decide_leave(ch.channels_of(router.state), channel_id, session.name))


@verbs.handles("channel_list_request")
def channel_list_request(router: Router, session: Session, frame: dict, size: int) -> None:
    router.reply(session, "channel_list", "channel list",
                 channels=ch.channels_of(router.state).channels_for(session.name))


@verbs.handles("channel_history_request")
def channel_history_request(router: Router, session: Session, frame: dict, size: int) -> None:
    channel_id = frame.get("channel")
    book = ch.channels_of(router.state)
    cid = ch.requested_id(channel_id)
    if not book.is_member(channel_id, session.name):
        router.metrics.channel_refusals += 1
        router.reply(session, "channel_result", ch.not_a_member(channel_id), channel=cid,
                     ok=False, members=[])
        return
    router.reply(session, "channel_history", "channel history", channel=cid,
                 messages=book.history_for(channel_id, session.name,
                                           ch.history_limit(frame.get("limit", 20))),
                 retention={"max_messages": ch.HISTORY_LIMIT})

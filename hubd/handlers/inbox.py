"""history_request with an inbox_query: one page of an identity's durable
inbox, read from the journal (docs/inbox.md). The decisions are
hubd.state.inbox's; this module asks them and reads the rows off the Router's
thread, after the release, so the page reports only committed chats."""

from __future__ import annotations

import asyncio

from hubd.actors.router import Router
from hubd.core.message import Message
from hubd.state import inbox
from hubd.state.presence import Session
from hubd.wire import codec

PAYLOAD = "Durable inbox page"


def _page_fields(router: Router, identity: str, cursor: int, messages: list, has_more: bool,
                 error: str | None = None) -> dict:
    page = {"version": inbox.VERSION, "available": error is None, "identity": identity,
            "hub_id": router.hub_id, "cursor": cursor, "messages": messages,
            "has_more": has_more}
    if error is not None:
        page["error"] = error
    return page


def serve(router: Router, session: Session, frame: dict) -> None:
    fields = {}
    request_id = frame.get("request_id")
    if isinstance(request_id, str) and 1 <= len(request_id) <= 128:
        fields["request_id"] = request_id
    query = inbox.read_query(frame.get("inbox_query"), session.name or "", router.hub_id,
                             router.state.last_seq)
    if isinstance(query, inbox.Refused):
        router.reply(session, "history_snapshot", PAYLOAD, **fields, inbox_page=_page_fields(
            router, query.identity, query.cursor, [], False, query.error))
        return
    roles = (session.roles if query.identity == session.name
             else router.presence.roles_of(query.identity))
    reply = router.frame("history_snapshot", session.name, PAYLOAD, **fields)
    identity_page = _page_fields(router, query.identity, query.since_seq, [], False)
    endpoint, hub = session.endpoint, router.hub
    # every seq up to last_seq is committed once this command is released
    router.after_release(lambda: hub.track(asyncio.get_running_loop().create_task(
        _send_page(hub, endpoint, reply, identity_page, query, roles))))


async def _send_page(hub, endpoint: int, reply: dict, page_fields: dict, query: inbox.Query,
                     roles) -> None:
    rows = await hub.read_journal("inbox_rows", query.since_seq, inbox.SCAN_ROWS + 1)
    page = inbox.page(rows, query, roles, lambda message: len(codec.encode(message)))
    if page.error is not None:
        page_fields = dict(page_fields, available=False, error=page.error)
    else:
        page_fields = dict(page_fields, cursor=page.cursor, messages=page.messages,
                           has_more=page.has_more)
    hub.endpoints.deliver(endpoint, Message(dict(reply, inbox_page=page_fields)))
    frames_out = hub.metrics.frames_out
    frames_out["history_snapshot"] = frames_out.get("history_snapshot", 0) + 1

"""The requesting half of shared-pool reservations: an agent of this hub
asks a pool owner hub (its configured message peer) with
`spend_request {owner_hub, spend_action, spend}`; this hub sends the request
over its mTLS peer link as itself (the owner scopes the reservation to this
hub's id) and relays the owner's `spend_result` back to the agent only
(docs/guard-evidence-and-spend.md).

No answer in time, a link that is down or unknown, too many asks in flight,
or an answer that does not answer this action: the action's uniform
not-admitted refusal. Nothing is journaled on either side.
"""

from __future__ import annotations

import asyncio
from typing import NamedTuple

from hubd.actors.router import Router
from hubd.state import spend_ledger as spend
from hubd.state.presence import Session

from federation.actors.link import Ask

MAX_ASKS = 64
ASK_SECONDS = 15.0


class SpendAnswered(NamedTuple):
    endpoint: int
    target: str
    action: str
    result: dict


class SpendAsks:
    def __init__(self, router: Router):
        self.waiting = 0


def _answer(router: Router, endpoint: int, target: str, action: str, result: dict) -> None:
    router.send(endpoint, router.frame(spend.RESULT, target, spend.RESULT_TEXT,
                                       spend_action=action, spend_result=dict(result)))


def relay(router: Router, session: Session, owner: str, action: str, document: dict) -> None:
    links = getattr(getattr(router.hub, "federation", None), "peer_links", None)
    asks = router.live_of(SpendAsks)
    if links is None or owner not in links.routes or asks.waiting >= MAX_ASKS:
        _answer(router, session.endpoint, session.name, action, spend.REFUSALS[action])
        return
    out = {"sender": router.hub_id, "target": "SynapseHub", "type": "spend_request",
           "payload": "", "timestamp": router.now, "spend_action": action, "spend": document}
    loop = asyncio.get_running_loop()
    reply = loop.create_future()
    timer = loop.call_later(ASK_SECONDS, lambda: reply.done() or reply.cancel())
    endpoint, name = session.endpoint, session.name
    asks.waiting += 1

    def answered(future: asyncio.Future) -> None:
        timer.cancel()
        got = None if future.cancelled() or future.exception() is not None else future.result()
        result = got.get("spend_result") if isinstance(got, dict) else None
        if (not isinstance(got, dict) or got.get("spend_action") != action
                or not isinstance(result, dict)):
            result = spend.REFUSALS[action]
        router.post_control(SpendAnswered(endpoint, name, action, result))

    reply.add_done_callback(answered)
    links.link(owner).post(Ask(out, None, spend.RESULT, reply))


def answered(router: Router, command: SpendAnswered) -> None:
    router.live_of(SpendAsks).waiting -= 1
    _answer(router, command.endpoint, command.target, command.action, command.result)


COMMANDS = {SpendAnswered: answered}

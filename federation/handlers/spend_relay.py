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

from typing import NamedTuple

from hubd.actors.router import Router
from hubd.state import spend_ledger as spend
from hubd.state.presence import Session

from federation.actors.peer_ask import ask_peer

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
    endpoint, name = session.endpoint, session.name
    asks.waiting += 1

    def answered(got: dict | None) -> None:
        result = got.get("spend_result") if isinstance(got, dict) else None
        if (not isinstance(got, dict) or got.get("spend_action") != action
                or not isinstance(result, dict)):
            result = spend.REFUSALS[action]
        router.post_control(SpendAnswered(endpoint, name, action, result))

    ask_peer(links.link(owner), out, spend.RESULT, ASK_SECONDS, answered)


def answered(router: Router, command: SpendAnswered) -> None:
    router.live_of(SpendAsks).waiting -= 1
    _answer(router, command.endpoint, command.target, command.action, command.result)


COMMANDS = {SpendAnswered: answered}

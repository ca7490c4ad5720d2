"""REDSYN decisions about boxes: take (a lease), ack, cancel, subscribe, give
up what is due (the sweep), a webhook's failed attempt, a message's files.

Each reads the state it is given and the clock it is passed and returns
events or a `Decision` (or raises RedsynError, having changed nothing).
"""

from __future__ import annotations

import heapq

from hubd.state.redsyn_nodes import Node, forbidden, speaks_for
from hubd.wire.redsyn.envelope import DEFAULT_TTL, RedsynError, parse_address, parse_topic
from hubd.wire.redsyn.webhook import MAX_ATTEMPTS as WEBHOOK_ATTEMPTS, retry_delay

from .agents import own_agent
from .links import error_chat, link_between, message_refusal, org_of
from .model import (ACK, CANCEL, DEFAULT_LEASE, MAX_LEASE, MAX_SUBSCRIBERS, MAX_TAKES, SUBSCRIBE,
                    TAKE, UNDELIVERABLE, WEBHOOK_FAILED, Decision, Delivery, MESSAGE, RedsynState,
                    request_asker)
from .posting import _session


def _undeliverable(state: RedsynState, agent: str, id_: str, reason: str, ts: float,
                   chats: list | None = None) -> list:
    """Give a delivery up; the sender hears it (not for events or error
    replies). One a REDSYN agent on a peer hub sent is answered with a chat
    there (into `chats`, when the caller routes chats)."""
    events = [(UNDELIVERABLE, {"agent": agent, "id": id_, "reason": reason})]
    message = state.messages[id_]
    original = message.envelope
    remote = original.get("remote")
    if remote is not None and chats is not None and not remote["error"]:
        chats.append(error_chat(agent, original["from"], remote["id"], reason))
        return events
    if original["kind"] == "event" or original["error"] or original.get("via") == "websocket":
        # no error replies for events or for error replies; a WebSocket sender
        # is not told either (not built: an error chat back to its seat)
        return events
    delivery = state.boxes[agent][id_]
    error_id = f"undelivered.{id_}"
    if error_id in state.messages:
        return events
    back = parse_address(original["from"])
    envelope = {
        "v": 1, "id": error_id, "kind": "reply", "from": f"{agent}#{delivery.session}",
        "to": str(back), "thread": original["thread"], "reply_to": id_, "ts": int(ts),
        "ttl": DEFAULT_TTL, "expires": int(ts) + DEFAULT_TTL,
        "body": {"type": "text/plain", "text": f"not delivered: {reason}"}, "refs": [],
        "error": True, "signed": False,
    }
    payload = {"envelope": envelope, "person": back.person, "node": "hub",
               "digest": "", "size": 0,
               "deliveries": [{"agent": back.agent_address, "session": back.session,
                               "thread": original["thread"]}]}
    if original["kind"] == "request" and not message.closed:
        payload["closes"] = {"id": id_, "agent": agent}
    events.append((MESSAGE, payload))
    return events


def _due(state: RedsynState, agent: str, id_: str, delivery: Delivery, now: float):
    """Why a delivery that is not leased must be given up now, or None."""
    message = state.messages[id_]
    if now >= message.expires:
        if delivery.attempts == 0:
            return f"it expired before {agent} took it"
        return f"it expired before {agent} confirmed it"
    if delivery.webhook_failures >= WEBHOOK_ATTEMPTS:
        return f"{agent}'s webhook did not take it in {WEBHOOK_ATTEMPTS} attempts"
    if delivery.attempts >= MAX_TAKES:
        return f"{agent} took it {MAX_TAKES} times and never confirmed it"
    return None


def decide_take(state: RedsynState, node: Node, address: str, lease: float, limit: int,
                now: float, agent_checked: bool = False) -> Decision:
    """GET /inbox: lease what is ready, in order per session. The answer is
    the delivered envelopes (empty: the door may wait and ask again)."""
    agent = address if agent_checked else own_agent(node, address).agent_address
    box = state.boxes.get(agent)
    if not box:
        return Decision([], [])
    events: list = []
    ids: list = []
    items: list = []
    chats: list = []
    blocked: set = set()
    lease_until = now + lease
    for id_, delivery in box.items():
        if len(ids) >= limit:
            break
        if delivery.session in blocked:
            continue
        if delivery.reserved_node is not None and delivery.reserved_node != node.id:
            continue  # sealed for another machine of this agent; it does not hold the order
        if delivery.lease_until > now or delivery.not_before > now:
            blocked.add(delivery.session)
            continue
        reason = _due(state, agent, id_, delivery, now) or _link_refusal(state, agent, id_)
        if reason is not None:
            events.extend(_undeliverable(state, agent, id_, reason, now, chats))
            continue
        ids.append(id_)
        items.append(delivered(state, agent, delivery, delivery.attempts + 1))
    if ids:
        events.append((TAKE, {"agent": agent, "node": node.id, "ids": ids,
                              "lease_until": lease_until}))
    return Decision(events, items, chats)


def _link_refusal(state: RedsynState, agent: str, id_: str) -> str | None:
    """Checked again as it is handed out: the link it crossed may no longer
    admit it (docs/redsyn.md, "Organizations and links")."""
    message = state.messages[id_]
    sender_org = org_of(message.envelope["from"])
    link = link_between(state, sender_org, org_of(agent))
    return message_refusal(message, agent, link)


def give_up_refused(state: RedsynState, link: dict, now: float,
                    chats: list | None = None) -> list:
    """What waits between the link's two organizations that `link` (as it is
    about to be) no longer admits: given up now, each sender told (a sender
    on a peer hub by a chat added to `chats`)."""
    events: list = []
    orgs = set(link["orgs"])
    for agent, box in state.boxes.items():
        if org_of(agent) not in orgs:
            continue
        for id_ in box:
            message = state.messages[id_]
            if org_of(message.envelope["from"]) not in orgs:
                continue
            reason = message_refusal(message, agent, link)
            if reason is not None:
                events.extend(_undeliverable(state, agent, id_, reason, now, chats))
    return events


def next_ready(state: RedsynState, node: Node, agent: str, now: float) -> float | None:
    """The earliest time after `now` at which a delivery in `agent`'s box that
    `node` may take stops waiting on a lease or a back-off, or None. A take
    that found nothing waits until then (a lapsed lease is handed out again
    at once), not for the door's whole recheck period."""
    box = state.boxes.get(agent)
    if not box:
        return None
    return min((ready for delivery in box.values()
                if delivery.reserved_node in (None, node.id)
                and (ready := max(delivery.lease_until, delivery.not_before)) > now),
               default=None)


def decide_poll(state: RedsynState, node: Node, agent: str, lease: float, limit: int,
                now: float) -> Decision:
    """One look of a long poll (the door has checked the agent): decide_take,
    answering (items, next_ready) so an empty look knows when to look again."""
    take = decide_take(state, node, agent, lease, limit, now, agent_checked=True)
    ready_at = None if take.answer else next_ready(state, node, agent, now)
    return Decision(take.events, (take.answer, ready_at), take.chats)


def delivered(state: RedsynState, agent: str, delivery: Delivery, attempts: int) -> dict:
    envelope = state.messages[delivery.message_id].envelope
    out = dict(envelope)
    out["to"] = f"{agent}#{delivery.session}"
    out["attempts"] = attempts
    if "files" in envelope:
        out["files"] = {**envelope["files"],
                        "url": f"/redsyn/v1/messages/{delivery.message_id}/files"}
    return out


def ack_ids(doc) -> list[str]:
    """The ids an ack document names (400 unless {"ids": [id, ...]}, at most 1000)."""
    if not isinstance(doc, dict) or not isinstance(doc.get("ids"), list) or \
            not all(isinstance(i, str) for i in doc["ids"]) or len(doc["ids"]) > 1000:
        raise RedsynError(400, "an ack is {\"ids\": [id, ...]} (at most 1000)")
    return doc["ids"]


def decide_ack(state: RedsynState, node: Node, address: str, doc) -> Decision:
    agent = own_agent(node, address).agent_address
    ids = ack_ids(doc)
    box = state.boxes.get(agent, {})
    held = [i for i in dict.fromkeys(ids) if i in box and box[i].attempts > 0]
    unknown = [i for i in ids if i not in box]
    events = [(ACK, {"agent": agent, "ids": held})] if held else []
    return Decision(events, {"acked": held, "unknown": unknown})


def decide_cancel(state: RedsynState, node: Node, id_: str) -> Decision:
    message = state.messages.get(id_)
    if message is None or message.cancelled:
        raise RedsynError(404, f"no message {id_}")
    if message.person != node.person or not speaks_for(node, request_asker(message)):
        raise forbidden(f"message {id_} was sent by an agent this node does not speak for")
    if message.envelope["kind"] != "request":
        raise RedsynError(409, f"only a request can be taken back; {id_} is a "
                               f"{message.envelope['kind']}")
    if message.taken_by or not message.owed:
        raise RedsynError(409, f"request {id_} has already been taken; it cannot be "
                               "taken back")
    return Decision([(CANCEL, {"id": id_})], {"id": id_, "cancelled": True})


def decide_subscribe(state: RedsynState, node: Node, topic_text: str, doc) -> Decision:
    topic = parse_topic(topic_text)
    if not isinstance(doc, dict):
        raise RedsynError(400, "a subscription is {\"agent\": \"org/team/user/agent\"}")
    agent = own_agent(node, doc.get("agent") if isinstance(doc.get("agent"), str) else "")
    if topic.org != agent.org:
        raise forbidden(f"{topic} belongs to {topic.org}")
    subscribe = doc.get("subscribe", True)
    if not isinstance(subscribe, bool):
        raise RedsynError(400, "subscribe must be true or false")
    key = str(topic)
    subscribers = state.topics.get(key, {})
    if subscribe and agent.agent_address not in subscribers and \
            len(subscribers) >= MAX_SUBSCRIBERS:
        raise forbidden(f"{key} has {MAX_SUBSCRIBERS} subscribers, the most it may have",
                        quota=True)
    payload = {"agent": agent.agent_address, "topic": key, "subscribe": subscribe}
    answer = {"topic": key, "agent": agent.agent_address, "subscribed": subscribe}
    if subscribe:
        planned: dict = {}
        payload["session"] = _session(state, agent.agent_address, key, planned)
        answer["session"] = f"{agent.agent_address}#{payload['session']}"
    return Decision([(SUBSCRIBE, payload)], answer)


def sweep(state: RedsynState, now: float, limit: int = 1000) -> list:
    """Give up what is due: expired, taken ten times, or a webhook out of
    attempts. Returns events; deadlines popped here are consumed. Entries not
    due are pushed back."""
    events: list = []
    seen: set = set()
    while state.deadlines and state.deadlines[0][0] <= now and len(events) < limit:
        _, agent, id_ = heapq.heappop(state.deadlines)
        if (agent, id_) in seen:
            continue
        seen.add((agent, id_))
        delivery = state.boxes.get(agent, {}).get(id_)
        if delivery is None or delivery.lease_until > now or delivery.not_before > now:
            continue
        reason = _due(state, agent, id_, delivery, now)
        if reason is not None:
            events.extend(_undeliverable(state, agent, id_, reason, now))
    return events


def webhook_failed(state: RedsynState, agent: str, id_: str, now: float,
                   first_retry: float = 10.0) -> list:
    delivery = state.boxes[agent][id_]
    failures = delivery.webhook_failures + 1
    delay = retry_delay(failures, first_retry)
    events = [(WEBHOOK_FAILED, {"agent": agent, "id": id_, "failures": failures,
                                "next_at": now + (delay if delay is not None else 0)})]
    return events


def files_of(state: RedsynState, node: Node, id_: str) -> bytes:
    from hubd.wire.redsyn.envelope import b64url_decode

    message = state.messages.get(id_)
    if message is None:
        raise RedsynError(404, f"no message {id_}")
    allowed = (message.person == node.person and speaks_for(node, request_asker(message))) \
        or any(speaks_for(node, agent) for agent in message.recipients)
    if not allowed:
        raise forbidden(f"message {id_} is neither from nor for an agent this node speaks for")
    if "files" not in message.envelope:
        raise RedsynError(404, f"message {id_} has no files")
    if message.files is None:
        raise RedsynError(410, f"the files of {id_} were deleted once it was delivered")
    return b64url_decode(message.files, "files")



def check_lease(value, shortest: float) -> float:
    """A take's lease: `shortest` (timing.redsyn_min_lease, 1 s) to MAX_LEASE seconds."""
    try:
        lease = float(value) if value is not None else DEFAULT_LEASE
    except ValueError:
        raise RedsynError(400, "lease is seconds, a number") from None
    if not shortest <= lease <= MAX_LEASE:
        raise RedsynError(400, f"lease must be {shortest:g} to {MAX_LEASE} seconds")
    return lease

"""The REDSYN mailbox as a projection of the hub's journal.

Like hubd/state/hub.py, `apply` is the only thing that changes the state,
used live right after a decision and again when the journal is replayed, so
the state after a restart is the state before it. Time is never read here:
apply uses the event's ts.

Chats land in REDSYN boxes through the chat event itself: the routing
service journals the deliveries in the chat's route (`chat_delivery`,
`apply_chat`).
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from itertools import islice

from hubd.state.chat import Planned
from hubd.state.events import CHAT
from hubd.state.hub import Appliers
from hubd.wire.redsyn.envelope import DEFAULT_TTL, parse_address

from .links import apply_link, crossing_refusal, seat_address
from .model import (ACK, ANNOUNCE, CANCEL, KEY, KINDS, LINK, MESSAGE, REMEMBERED_FINISHED,
                    SUBSCRIBE, TAKE, UNDELIVERABLE, WEBHOOK_FAILED, Agent, Delivery, Message,
                    RedsynState, known_here, request_asker)

def apply(state: RedsynState, kind: str, payload: dict, ts: float) -> None:
    _APPLY[kind](state, payload, ts)


def _apply_key(state: RedsynState, p: dict, ts: float) -> None:
    state.keys[p["node"]] = {"public_key": p["public_key"], "enc_key": p.get("enc_key"),
                             "enc_sig": p.get("enc_sig")}


def _apply_announce(state: RedsynState, p: dict, ts: float) -> None:
    agent = state.agents.setdefault(p["agent"], Agent())
    agent.listening = p["listening"]
    if "description" in p:
        agent.description = p["description"]
    if "policy" in p:
        agent.policy = p["policy"]
    if "webhook" in p:
        agent.webhook = p["webhook"]
    if p["listening"]:
        agent.node = p["node"]


def _session_for(state: RedsynState, agent: str, thread: str, session: str) -> None:
    state.sessions[(agent, thread)] = session
    number = int(session[1:])
    if number > state.session_counts.get(agent, 0):
        state.session_counts[agent] = number


def _apply_message(state: RedsynState, p: dict, ts: float) -> None:
    env = p["envelope"]
    thread = env["thread"]
    if "from_seat" not in p:
        sender = parse_address(env["from"])
        _session_for(state, sender.agent_address, thread, sender.session)
    message = Message(env, p["person"], p["node"], p["digest"], p["size"], env["expires"],
                      p.get("files"), p.get("files_sha256", ""), client=p.get("client"))
    state.messages[env["id"]] = message
    for target in p["deliveries"]:
        agent, session = target["agent"], target["session"]
        _session_for(state, agent, target.get("thread", thread), session)
        state.order += 1
        box = state.boxes.setdefault(agent, OrderedDict())
        box[env["id"]] = Delivery(env["id"], session, state.order,
                                  reserved_node=target.get("reserved_node"))
        message.owed.add(agent)
        message.recipients.add(agent)
        heapq.heappush(state.deadlines, (message.expires, agent, env["id"]))
    closes = p.get("closes")
    if closes is not None:
        request = state.messages.get(closes["id"])
        if request is not None:
            request.closed = True
            _finish(state, closes["agent"], closes["id"])
            asked = state.seat_requests.get((closes["agent"], request_asker(request)))
            if asked and closes["id"] in asked:
                asked.remove(closes["id"])
                if not asked:
                    del state.seat_requests[(closes["agent"], request_asker(request))]
    seat = p.get("to_seat")
    if seat is not None and env["kind"] == "request":
        asker = parse_address(env["from"]).agent_address
        state.seat_requests.setdefault((seat, asker), []).append(env["id"])
    day = int(ts // 86400)
    previous_day, count = state.day_counts.get(p["person"], (day, 0))
    state.day_counts[p["person"]] = (day, (count if previous_day == day else 0) + 1)
    if message.owed:
        usage = state.pending.setdefault(p["person"], [0, 0])
        usage[0] += 1
        usage[1] += message.size
    else:
        message.files = None
    _forget_finished(state)


def _apply_take(state: RedsynState, p: dict, ts: float) -> None:
    box = state.boxes.get(p["agent"], {})
    for id_ in p["ids"]:
        delivery = box.get(id_)
        if delivery is None:
            continue
        delivery.attempts += 1
        delivery.lease_until = p["lease_until"]
        delivery.lease_node = p["node"]
        state.messages[id_].taken_by.add(p["agent"])
        heapq.heappush(state.deadlines, (p["lease_until"], p["agent"], id_))
    if p["ids"] and p.get("node"):
        state.agents.setdefault(p["agent"], Agent()).node = p["node"]


def _finish(state: RedsynState, agent: str, id_: str) -> None:
    """A delivery is over (acked, replied to, given up, cancelled)."""
    box = state.boxes.get(agent)
    if box is None or box.pop(id_, None) is None:
        return
    if not box:
        del state.boxes[agent]
    message = state.messages[id_]
    message.owed.discard(agent)
    if not message.owed:
        message.files = None
        usage = state.pending[message.person]
        usage[0] -= 1
        usage[1] -= message.size
        if usage == [0, 0]:
            del state.pending[message.person]


def _apply_ack(state: RedsynState, p: dict, ts: float) -> None:
    for id_ in p["ids"]:
        _finish(state, p["agent"], id_)
    _forget_finished(state)


def _apply_undeliverable(state: RedsynState, p: dict, ts: float) -> None:
    _finish(state, p["agent"], p["id"])


def _apply_cancel(state: RedsynState, p: dict, ts: float) -> None:
    message = state.messages[p["id"]]
    message.cancelled = True
    for agent in sorted(message.owed):
        _finish(state, agent, p["id"])


def _apply_subscribe(state: RedsynState, p: dict, ts: float) -> None:
    subscribers = state.topics.setdefault(p["topic"], {})
    if p["subscribe"]:
        subscribers[p["agent"]] = True
        if "session" in p:
            _session_for(state, p["agent"], p["topic"], p["session"])
    else:
        subscribers.pop(p["agent"], None)


def _apply_webhook_failed(state: RedsynState, p: dict, ts: float) -> None:
    delivery = state.boxes.get(p["agent"], {}).get(p["id"])
    if delivery is None:
        return
    delivery.webhook_failures = p["failures"]
    delivery.lease_until = 0.0
    delivery.lease_node = None
    delivery.not_before = p["next_at"]
    heapq.heappush(state.deadlines, (p["next_at"], p["agent"], p["id"]))


def _forget_finished(state: RedsynState) -> None:
    """Keep at most REMEMBERED_FINISHED finished messages; a bounded scan from
    the oldest, so one event never costs more than a few steps."""
    messages = state.messages
    excess = len(messages) - REMEMBERED_FINISHED
    if excess <= 0:
        return
    old = [i for i, m in islice(messages.items(), excess * 2 + 16) if not m.owed][:excess]
    for id_ in old:
        del messages[id_]


def chat_body(payload) -> dict:
    if isinstance(payload, str):
        return {"type": "text/plain", "text": payload}
    return {"type": "application/json", "json": payload}


def chat_delivery(state: RedsynState, frame: dict, route: dict, seq: int) -> dict | None:
    """Where a directed chat from a seat lands in the REDSYN boxes: its target
    when that is one REDSYN agent (`known_here`), as the route entry that
    records it (agent, session, thread, kind, reply_to), else None. It
    answers the oldest request that agent sent to that seat and that is still
    open (a reply, which closes it); otherwise it is a request of its own, in
    a new session. Chats the REDSYN door made itself (route["redsyn"]) are not
    taken back. The routing service asks this before the chat is journaled
    (hubd/handlers/redsyn/mailbox.py); a replay of a route from before it
    asks it again, on the same state."""
    if "redsyn" in route or "forward" in route or frame.get("channel"):
        return None
    target = frame.get("target")
    if not isinstance(target, str) or not known_here(state, target):
        return None
    sender = frame.get("sender")
    if not isinstance(sender, str) or not sender or sender == target:
        return None
    # a peer hub's REDSYN message: the receiver's route says it was forwarded
    redsyn = frame.get("redsyn") if "forwarded" in route else None
    redsyn = redsyn if isinstance(redsyn, dict) else None
    open_requests = state.seat_requests.get((sender, target)) or []
    # the request a peer's answer names, else the oldest still open
    named = redsyn.get("reply_to") if redsyn is not None else None
    request_id = named if named in open_requests else (open_requests or [None])[0]
    request = state.messages.get(request_id) if request_id is not None else None
    if request is not None:
        entry = {"agent": target, "session": request.envelope["from"].partition("#")[2],
                 "thread": request.envelope["thread"], "kind": "reply",
                 "reply_to": request.envelope["id"]}
    else:  # a new thread: a new session
        entry = {"agent": target, "session": f"s{state.session_counts.get(target, 0) + 1}",
                 "thread": f"chat.{seq}", "kind": "request", "reply_to": None}
    if redsyn is not None:
        _check_remote(state, entry, sender, redsyn)
    return entry


def _check_remote(state: RedsynState, entry: dict, sender: str, redsyn: dict) -> None:
    """A REDSYN agent's message forwarded by a peer hub: this hub enforces the
    link too, on what the peer says of it (signed, the client address its
    door saw). Refused, it is recorded as such and not delivered; the
    mailbox answers the sender (hubd/handlers/redsyn/mailbox.py)."""
    client = redsyn.get("client")
    entry["remote"] = {"signed": redsyn.get("signed") is True,
                       "client": client if isinstance(client, str) else None,
                       "id": redsyn.get("id") if isinstance(redsyn.get("id"), str) else None,
                       "error": redsyn.get("error") is True}
    if entry["remote"]["error"]:
        return  # the seed's error reply, made by the peer hub
    reason = crossing_refusal(
        state, seat_address(sender), entry["agent"],
        answering=entry["kind"] == "reply" or redsyn.get("kind") in ("reply", "progress"),
        signed=entry["remote"]["signed"], client=entry["remote"]["client"])
    if reason is not None:
        entry["refused"] = reason


def plan_chat(router, state: RedsynState, frame: dict, sender: str, target,
              route_extra: dict | None, peer_link=None) -> Planned | None:
    """The REDSYN boxes as a mailbox of the routing service (hubd/core/plugin.py
    Mailbox.plan): a pure decision on this projection and the chat (the
    Router is not read). A link change a peer hub forwarded is `peer_link`'s
    (hubd/handlers/redsyn/mailbox.py: it asks the Router who owns what)."""
    redsyn = frame.get("redsyn")
    if isinstance(redsyn, dict) and "link" in redsyn:
        return peer_link(router, state, redsyn["link"], route_extra) if peer_link else None
    entry = chat_delivery(state, frame, route_extra or _NO_ROUTE, frame["seq"])
    return Planned([entry]) if entry is not None else None


_NO_ROUTE: dict = {}


def apply_chat(state: RedsynState, frame: dict, route: dict | None, seq: int,
               ts: float) -> None:
    """A chat event's part in the REDSYN boxes: the deliveries its route
    records (`boxes.redsyn`); a route written before the routing service
    journaled them (no `boxes`) is read as those hubs decided it, by
    `chat_delivery` on the state as it is now, the same state they saw."""
    route = route or {}
    boxes = route.get("boxes")
    if boxes is not None:
        for entry in boxes.get("redsyn", ()):
            if "link" in entry:  # a link change a peer hub forwarded
                apply_link(state, entry["link"], ts)
            elif "refused" not in entry:
                apply_chat_delivery(state, frame, entry, seq, ts)
        return
    entry = chat_delivery(state, frame, route, seq)
    if entry is not None and "refused" not in entry:
        apply_chat_delivery(state, frame, entry, seq, ts)


def apply_chat_delivery(state: RedsynState, frame: dict, entry: dict, seq: int,
                        ts: float) -> None:
    """A chat from a WebSocket agent in a REDSYN agent's inbox, as an envelope
    whose `from` is the chat's sender."""
    sender, target = frame["sender"], entry["agent"]
    reply_to, thread, to_session = entry["reply_to"], entry["thread"], entry["session"]
    ttl = DEFAULT_TTL
    envelope = {
        "v": 1, "id": f"chat.{seq}", "kind": entry["kind"], "from": sender,
        "to": f"{target}#{to_session}", "thread": thread, "reply_to": reply_to, "ts": int(ts),
        "ttl": ttl, "expires": int(ts) + ttl, "body": chat_body(frame.get("payload", "")),
        "refs": [], "error": False, "signed": False, "via": "websocket",
        "chat": {"msg_id": frame.get("msg_id"), "seq": seq},
    }
    remote = entry.get("remote")
    if remote is not None:  # from a REDSYN agent on a peer hub
        envelope["remote"] = remote
        envelope["error"] = remote["error"]
    payload = {"envelope": envelope, "person": "", "node": "websocket", "digest": "",
               "size": 0, "from_seat": sender,
               "deliveries": [{"agent": target, "session": to_session, "thread": thread}]}
    if reply_to is not None:
        payload["closes"] = {"id": reply_to, "agent": sender}
    _apply_message(state, payload, ts)


_APPLY = {KEY: _apply_key, ANNOUNCE: _apply_announce, MESSAGE: _apply_message,
          TAKE: _apply_take, ACK: _apply_ack, UNDELIVERABLE: _apply_undeliverable,
          CANCEL: _apply_cancel, SUBSCRIBE: _apply_subscribe,
          WEBHOOK_FAILED: _apply_webhook_failed, LINK: apply_link}


# -- the hub's projection of REDSYN events and of chats that land in REDSYN
# boxes (the REDSYN mailbox plugin, hubd/handlers/redsyn/, installs them)

PROJECTIONS = {"redsyn": RedsynState}
appliers = Appliers()


def _apply_event(state, event) -> None:
    apply(state.extensions["redsyn"], event.kind, event.payload, event.ts)


def _apply_chat_event(state, event) -> None:
    route = event.route
    if route is not None:
        boxes = route.get("boxes")
        if boxes is not None and "redsyn" not in boxes:
            return  # the routing service put it in no REDSYN box (most chats)
    apply_chat(state.extensions["redsyn"], event.payload, route, event.seq, event.ts)


for _kind in KINDS:
    appliers.applies(_kind)(_apply_event)
appliers.applies(CHAT)(_apply_chat_event)

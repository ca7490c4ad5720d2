"""POST /messages decided: who may send what to whom, the sessions a message
opens, the sender's quota, and the envelope that is stored.

`decide_post` reads the state it is given and returns a `Decision` (or raises
RedsynError, having changed nothing). A message to a hub seat (the caller's
`seat_of` says which addresses are seats) comes back as a chat for the
routing service.
"""

from __future__ import annotations

from hubd.state.redsyn_nodes import Node, check_speaks_for, forbidden
from hubd.wire.redsyn.envelope import (DEFAULT_TTL, Address, Incoming, RedsynError, Topic, b64url,
                                       parse_address)
from hubd.wire.redsyn.signing import fingerprint, verify_arrival

from .agents import _prefix_allows
from .links import check_crossing, org_of, seat_address
from .model import MESSAGE, Decision, Limits, RedsynState


def _enforce_policy(state: RedsynState, incoming: Incoming, to: Address, signed: bool) -> None:
    agent = state.agents.get(to.agent_address)
    policy = agent.policy if agent is not None and agent.listening else {}
    sender = incoming.sender
    prefixes = policy.get("requests_from")
    # across organizations the link has admitted the sender already
    if prefixes is not None and incoming.kind == "request" and \
            not _prefix_allows(prefixes, sender):
        raise forbidden(f"{to.agent_address} takes requests only from "
                        f"{', '.join(prefixes) or 'nobody'}")
    if incoming.kind == "request" and policy.get("encrypted_only") and not incoming.encrypted:
        raise forbidden(f"{to.agent_address} takes only encrypted requests")
    if policy.get("signed_only") and not signed:
        raise forbidden(f"{to.agent_address} takes only signed messages")


def _new_session(state: RedsynState, agent: str, planned: dict) -> str:
    count = planned.get(agent, state.session_counts.get(agent, 0)) + 1
    planned[agent] = count
    return f"s{count}"


def _session(state: RedsynState, agent: str, thread: str, planned: dict,
             force_new: bool = False) -> str:
    if not force_new:
        existing = planned.get((agent, thread)) or state.sessions.get((agent, thread))
        if existing is not None:
            return existing
    session = _new_session(state, agent, planned)
    planned[(agent, thread)] = session
    return session


def decide_post(state: RedsynState, node: Node, incoming: Incoming, now: float,
                limits: Limits = Limits(), new_id=None, seat_of=None,
                client: str | None = None) -> Decision:
    """POST /messages: validate against the state, resolve, and store.

    `seat_of(address)` names the hub seat a WebSocket agent holds for an
    address that is not a REDSYN agent, or None. A message to such a seat is
    stored (so its reply can close it) and handed to the chat path as
    Decision.chats: the door routes each as a chat from the sender.
    Across organizations the link between them must admit it (links.py);
    `client` is the address the door saw the call come from."""
    check_speaks_for(node, incoming.sender)
    fields = incoming.fields
    id_ = fields.get("id")
    digest = incoming.digest
    if id_ is not None and id_ in state.messages:
        known = state.messages[id_]
        if known.person == node.person and known.digest == digest:
            return Decision([], _post_answer(known.envelope, duplicate=True))
        raise RedsynError(409, f"id {id_} is already taken by another message")
    if id_ is None:
        id_ = new_id()
    signed_payload = None
    if "sig" in fields:
        key = state.keys.get(node.id)
        signed_payload = verify_arrival(fields, incoming.files_sha256,
                                        key["public_key"] if key else None, now)
    _check_quota(state, node.person, incoming.size, now, limits)

    planned: dict = {}
    sender = incoming.sender
    kind = incoming.kind
    closes = None
    request = None
    if kind in ("reply", "progress"):
        request = state.messages.get(fields["reply_to"])
        if request is None or request.cancelled:
            raise RedsynError(404, f"no request {fields['reply_to']} to answer")
        if request.envelope["kind"] != "request":
            raise RedsynError(409, f"{fields['reply_to']} is a {request.envelope['kind']}, "
                                   "not a request")
        asked = parse_address(request.envelope["to"])
        if asked.agent_address != sender.agent_address:
            raise forbidden(f"only {asked.agent_address} answers request {fields['reply_to']}")
        if request.closed:
            raise RedsynError(409, f"request {fields['reply_to']} already has its reply")
        thread = request.envelope["thread"]
        if fields.get("thread") not in (None, "", thread):
            raise RedsynError(400, f"a {kind} stays in its request's thread {thread}")
        sender_session = asked.session
        asker = request.envelope["from"]
        if request.envelope.get("via") == "websocket":
            if incoming.to is not None and str(incoming.to) != asker:
                raise RedsynError(400, f"a {kind} goes back to {asker}, who asked")
            to = asker  # a WebSocket seat: the answer goes out as a chat
        else:
            to = incoming.to if incoming.to is not None else parse_address(asker)
            if to.agent_address != parse_address(asker).agent_address:
                raise RedsynError(400, f"a {kind} goes back to {asker}, who asked")
            if to.session is None:
                to = parse_address(asker)
        if kind == "reply":
            closes = {"id": request.envelope["id"], "agent": sender.agent_address}
    else:
        thread = fields.get("thread") or id_
        sender_session = sender.session if sender.session not in (None, "new") else None
        if sender_session is None:
            sender_session = _session(state, sender.agent_address, thread, planned,
                                      force_new=sender.session == "new")
        else:
            planned[(sender.agent_address, thread)] = sender_session
        to = incoming.to

    deliveries = []
    topic = None
    seat = None
    if isinstance(to, Topic):
        topic = str(to)
        if to.org != sender.org:
            raise forbidden(f"{topic} belongs to {to.org}; only its organization publishes there")
        for agent in state.topics.get(topic, {}):
            if agent == sender.agent_address:
                continue
            deliveries.append({"agent": agent, "thread": topic,
                               "session": _session(state, agent, topic, planned)})
        delivered_to = topic
    elif isinstance(to, str) or (request is None and seat_of is not None
                                 and seat_of(to.agent_address, state) is not None):
        seat = to if isinstance(to, str) else seat_of(to.agent_address, state)
        # not an answer to a WebSocket seat's own request (its chat came in
        # under the hub's principals, not a link); a REDSYN agent's on a peer
        # hub (`remote`) is checked like any other
        if not isinstance(to, str) or request.envelope.get("remote") is not None:
            check_crossing(state, sender.agent_address, seat_address(seat),
                           answering=request is not None, signed=signed_payload is not None,
                           client=client)
        delivered_to = seat
    else:
        check_crossing(state, sender.agent_address, to.agent_address,
                       answering=request is not None, signed=signed_payload is not None,
                       client=client)
        _enforce_policy(state, incoming, to, signed_payload is not None) \
            if request is None else None
        if request is None or to.session is None:
            session = to.session or _session(state, to.agent_address, thread, planned)
        else:
            session = to.session
        reserved = None
        if incoming.encrypted:
            if request is not None:
                reserved = request.node
            else:
                holder = state.agents.get(to.agent_address)
                if holder is not None and holder.node is not None and \
                        (state.keys.get(holder.node) or {}).get("enc_key"):
                    reserved = holder.node
        deliveries.append({"agent": to.agent_address, "session": session, "thread": thread,
                           **({"reserved_node": reserved} if reserved else {})})
        delivered_to = f"{to.agent_address}#{session}"

    ts = fields.get("ts")
    stamped = int(now) if ts is None else ts
    ttl = fields.get("ttl") or DEFAULT_TTL
    envelope = {
        "v": 1, "id": id_, "kind": kind,
        "from": f"{sender.agent_address}#{sender_session}", "to": delivered_to,
        "thread": thread, "reply_to": fields.get("reply_to") or None, "ts": stamped,
        "ttl": ttl, "expires": stamped + ttl, "body": fields["body"], "refs": fields["refs"],
        "error": fields["error"], "signed": signed_payload is not None,
    }
    if topic is not None:
        envelope["topic"] = topic
    if incoming.files is not None:
        envelope["files"] = {"sha256": incoming.files_sha256, "size": len(incoming.files)}
    if signed_payload is not None:
        sig = fields["sig"]
        envelope["sig"] = {"alg": "ed25519", "key": sig["key"], "value": sig["value"],
                           "payload": signed_payload, "node": node.id,
                           "fingerprint": fingerprint(sig["key"])}
    payload = {"envelope": envelope, "person": node.person, "node": node.id, "digest": digest,
               "size": incoming.size, "deliveries": deliveries}
    if client is not None and sender.org != org_of(seat_address(delivered_to).removeprefix(
            "topic:")):
        payload["client"] = client  # re-checked against the link's allow-list at hand-out
    if incoming.files is not None:
        payload["files"] = b64url(incoming.files)
        payload["files_sha256"] = incoming.files_sha256
    if closes is not None:
        payload["closes"] = closes
    chats = []
    if seat is not None:
        payload["to_seat"] = seat
        chats.append({"sender": sender.agent_address, "frame": {
            "type": "chat", "target": seat, "payload": chat_payload(envelope),
            "redsyn": {k: envelope[k] for k in (
                "id", "kind", "from", "thread", "reply_to", "ts", "error", "refs", "signed")
                if envelope.get(k) is not None} | (
                {"client": payload["client"]} if "client" in payload else {})}})
    return Decision([(MESSAGE, payload)], _post_answer(envelope, duplicate=False), chats)


def chat_payload(envelope: dict):
    """What a WebSocket agent reads: the text of a text/plain body, else the body."""
    body = envelope["body"]
    return body["text"] if body.get("type") == "text/plain" else body


def _post_answer(envelope: dict, duplicate: bool) -> dict:
    return {"id": envelope["id"], "from": envelope["from"], "to": envelope["to"],
            "thread": envelope["thread"], "expires": envelope["expires"],
            "duplicate": duplicate}


def _check_quota(state: RedsynState, person: str, size: int, now: float, limits: Limits) -> None:
    day, count = state.day_counts.get(person, (None, 0))
    if day == int(now // 86400) and count >= limits.messages_per_day:
        raise RedsynError(429, f"{person} has sent its {limits.messages_per_day} messages for "
                               "today; they come back at 00:00 UTC", quota=True)
    messages, used = state.pending.get(person, (0, 0))
    if messages >= limits.pending_messages:
        raise forbidden(f"{person} has {messages} messages waiting to be delivered, the most "
                        "it may have", quota=True)
    if used + size > limits.pending_bytes:
        raise forbidden(f"{person}'s waiting messages would pass {limits.pending_bytes} bytes",
                        quota=True)

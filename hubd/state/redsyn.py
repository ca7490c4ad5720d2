"""REDSYN (seed 003) mailbox: a projection of the hub's journal, and the decisions
that produce its events.

Like hubd/state/hub.py, `apply(state, event)` is the only thing that changes
the state, used live right after a decision and again when the journal is
replayed, so the state after a restart is the state before it. Decisions
(`decide_*`, `sweep`) read the state and the clock they are given and return
`Decision(events, answer)`: they change nothing themselves, so a refused call
(RedsynError) has changed nothing.

Time is never read here: a decision gets `now`; apply uses the event's ts.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from itertools import islice
from dataclasses import dataclass, field

from hubd.state.events import CHAT
from hubd.state.hub import Appliers
from hubd.state.redsyn_nodes import Node, check_speaks_for, forbidden, speaks_for
from hubd.wire.redsyn.envelope import (DEFAULT_TTL, Address, Incoming, RedsynError, Topic, b64url,
                       parse_address, parse_topic)
from hubd.wire.redsyn.signing import fingerprint, verify_arrival
from hubd.wire.redsyn.webhook import MAX_ATTEMPTS as WEBHOOK_ATTEMPTS, retry_delay

# journal event kinds
KEY = "redsyn_key"
ANNOUNCE = "redsyn_announce"
MESSAGE = "redsyn_message"
TAKE = "redsyn_take"
ACK = "redsyn_ack"
UNDELIVERABLE = "redsyn_undeliverable"
CANCEL = "redsyn_cancel"
SUBSCRIBE = "redsyn_subscribe"
WEBHOOK_FAILED = "redsyn_webhook_failed"
KINDS = (KEY, ANNOUNCE, MESSAGE, TAKE, ACK, UNDELIVERABLE, CANCEL, SUBSCRIBE, WEBHOOK_FAILED)

DEFAULT_LEASE = 900
MAX_LEASE = 3600
MAX_TAKES = 10
MAX_ITEMS_PER_TAKE = 100
PRESENCE_SECONDS = 60
# Finished messages are remembered (for duplicate ids and late replies) in a
# bounded window; messages still owed to someone are always kept.
REMEMBERED_FINISHED = 100_000
MAX_SUBSCRIBERS = 10_000
MAX_DESCRIPTION = 1024
MAX_WOKEN = 10_000


@dataclass(frozen=True)
class Limits:
    """Per person (docs/redsyn.md, "Limits")."""
    messages_per_day: int = 100_000
    pending_messages: int = 10_000
    pending_bytes: int = 512 * 1024 * 1024


@dataclass
class Delivery:
    message_id: str
    session: str
    order: int
    attempts: int = 0
    lease_until: float = 0.0
    lease_node: str | None = None
    not_before: float = 0.0      # webhook retry back-off
    webhook_failures: int = 0
    reserved_node: str | None = None


@dataclass
class Message:
    envelope: dict               # as stored: from/to with sessions, sig with payload
    person: str
    node: str
    digest: str
    size: int
    expires: float
    files: str | None            # base64url of the zip, until delivered
    files_sha256: str
    owed: set = field(default_factory=set)      # agents it still waits on
    recipients: set = field(default_factory=set)  # every agent it was for
    taken_by: set = field(default_factory=set)  # agents that took it at least once
    closed: bool = False         # a request that has its reply
    cancelled: bool = False


@dataclass
class Agent:
    listening: bool = False
    description: str = ""
    policy: dict = field(default_factory=dict)
    webhook: dict | None = None
    node: str | None = None      # the node that last listened for it


@dataclass
class Decision:
    events: list              # [(kind, payload)]
    answer: object = None
    chats: list = field(default_factory=list)  # [{"sender", "frame"}] for the chat path


@dataclass
class RedsynState:
    keys: dict = field(default_factory=dict)         # node -> {public_key, enc_key, enc_sig}
    agents: dict = field(default_factory=dict)       # agent address -> Agent
    sessions: dict = field(default_factory=dict)     # (agent, thread) -> "sN"
    session_counts: dict = field(default_factory=dict)  # agent -> last N
    messages: OrderedDict = field(default_factory=OrderedDict)  # id -> Message
    boxes: dict = field(default_factory=dict)        # agent -> OrderedDict(id -> Delivery)
    topics: dict = field(default_factory=dict)       # topic -> {agent: True} (ordered)
    day_counts: dict = field(default_factory=dict)   # person -> (day, count)
    pending: dict = field(default_factory=dict)      # person -> [messages, bytes]
    order: int = 0
    # REDSYN requests sent to a WebSocket seat, still waiting for its answer:
    # (seat, asking agent) -> [request ids], oldest first
    seat_requests: dict = field(default_factory=dict)
    # agents that got a message from a chat since the door last looked (not
    # part of the projection: which long polls to wake after the commit)
    woken: list = field(default_factory=list)
    # (deadline, agent, id): when a delivery may need the sweeper (lease or
    # expiry); stale entries are skipped when popped.
    deadlines: list = field(default_factory=list)

    def snapshot(self) -> dict:
        """Everything that matters, as plain data (the projection property)."""
        return {
            "keys": self.keys, "sessions": self.sessions, "session_counts": self.session_counts,
            "agents": {a: vars(r) for a, r in self.agents.items()},
            "messages": {i: {**vars(m), "owed": sorted(m.owed), "taken_by": sorted(m.taken_by),
                             "recipients": sorted(m.recipients)}
                         for i, m in self.messages.items()},
            "boxes": {a: {i: vars(d) for i, d in box.items()} for a, box in self.boxes.items()},
            "topics": {t: list(s) for t, s in self.topics.items()},
            "day_counts": self.day_counts, "pending": self.pending, "order": self.order,
            "seat_requests": {f"{k[0]} {k[1]}": v for k, v in self.seat_requests.items()},
        }


# -- apply


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
                      p.get("files"), p.get("files_sha256", ""))
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


def request_asker(request: Message) -> str:
    return request.envelope["from"].partition("#")[0]


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


def apply_chat(state: RedsynState, frame: dict, route: dict | None, seq: int,
               ts: float) -> None:
    """A chat from a WebSocket agent to a REDSYN agent (`known_here`) lands in its inbox as
    an envelope whose `from` is the chat's sender. It answers the oldest
    request that agent sent to that seat and that is still open (a reply,
    which closes it); otherwise it is a request of its own. Chats the REDSYN
    door made itself (route["redsyn"]) are not taken back."""
    route = route or {}
    if "redsyn" in route or "forward" in route or frame.get("channel"):
        return
    target = frame.get("target")
    if not isinstance(target, str) or not known_here(state, target):
        return
    sender = frame.get("sender")
    if not isinstance(sender, str) or not sender or sender == target:
        return
    id_ = f"chat.{seq}"
    open_requests = state.seat_requests.get((sender, target))
    request = state.messages.get(open_requests[0]) if open_requests else None
    if request is not None:
        kind, reply_to, thread = "reply", request.envelope["id"], request.envelope["thread"]
        to_session = request.envelope["from"].partition("#")[2]
    else:  # a new thread: a new session
        kind, reply_to, thread = "request", None, id_
        to_session = f"s{state.session_counts.get(target, 0) + 1}"
    ttl = DEFAULT_TTL
    envelope = {
        "v": 1, "id": id_, "kind": kind, "from": sender, "to": f"{target}#{to_session}",
        "thread": thread, "reply_to": reply_to, "ts": int(ts), "ttl": ttl,
        "expires": int(ts) + ttl, "body": chat_body(frame.get("payload", "")), "refs": [],
        "error": False, "signed": False, "via": "websocket",
        "chat": {"msg_id": frame.get("msg_id"), "seq": seq},
    }
    payload = {"envelope": envelope, "person": "", "node": "websocket", "digest": "",
               "size": 0, "from_seat": sender,
               "deliveries": [{"agent": target, "session": to_session, "thread": thread}]}
    if request is not None:
        payload["closes"] = {"id": reply_to, "agent": sender}
    _apply_message(state, payload, ts)
    if len(state.woken) < MAX_WOKEN:  # a hint; waiting polls look again every few seconds
        state.woken.append(target)


_APPLY = {KEY: _apply_key, ANNOUNCE: _apply_announce, MESSAGE: _apply_message,
          TAKE: _apply_take, ACK: _apply_ack, UNDELIVERABLE: _apply_undeliverable,
          CANCEL: _apply_cancel, SUBSCRIBE: _apply_subscribe,
          WEBHOOK_FAILED: _apply_webhook_failed}


# -- decisions


def own_agent(node: Node, address: str) -> Address:
    agent = parse_address(address, what="agent address")
    if agent.session is not None:
        raise RedsynError(400, "an agent address here has no #session")
    check_speaks_for(node, agent)
    return agent


def decide_key(state: RedsynState, node: Node, doc: dict) -> Decision:
    from hubd.wire.redsyn.signing import parse_public_key, verify_enc_sig

    if not isinstance(doc, dict) or "public_key" not in doc:
        raise RedsynError(400, "PUT /nodes/key takes {\"public_key\": ..., "
                               "\"rotate\"?, \"enc_key\"?, \"enc_sig\"?}")
    parse_public_key(doc["public_key"])
    current = state.keys.get(node.id)
    if current is not None and current["public_key"] != doc["public_key"] \
            and doc.get("rotate") is not True:
        raise RedsynError(409, "this node already has a signing key; replacing it takes "
                               "\"rotate\": true")
    payload = {"node": node.id, "public_key": doc["public_key"]}
    if doc.get("enc_key") is not None or doc.get("enc_sig") is not None:
        from hubd.wire.redsyn.envelope import b64url_decode

        enc_key, enc_sig = doc.get("enc_key"), doc.get("enc_sig")
        if not isinstance(enc_key, str) or not isinstance(enc_sig, str):
            raise RedsynError(400, "enc_key and enc_sig come together")
        raw = b64url_decode(enc_key, "enc_key")
        if len(raw) != 65 or raw[0] != 4:
            raise RedsynError(400, "enc_key must be an uncompressed P-256 point "
                                   "(65 bytes), base64url")
        from cryptography.hazmat.primitives.asymmetric import ec
        try:
            ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), raw)
        except ValueError:
            raise RedsynError(400, "enc_key is not a point on P-256") from None
        if not verify_enc_sig(doc["public_key"], enc_key, enc_sig):
            raise RedsynError(401, "enc_sig is not the signing key's signature of "
                                   "'redsyn-enc-v1:' + enc_key")
        payload.update(enc_key=enc_key, enc_sig=enc_sig)
    elif current is not None and current["public_key"] == doc["public_key"]:
        payload.update(enc_key=current["enc_key"], enc_sig=current["enc_sig"])
    return Decision([(KEY, payload)], {"node": node.id, "fingerprint":
                                       fingerprint(doc["public_key"]),
                                       "encryption": "enc_key" in payload
                                       and payload["enc_key"] is not None})


POLICY_FIELDS = {"requests_from", "encrypted_only", "signed_only"}


def check_policy(policy) -> dict:
    if not isinstance(policy, dict) or not set(policy) <= POLICY_FIELDS:
        raise RedsynError(400, "policy is {\"requests_from\": [prefix, ...], "
                               "\"encrypted_only\": bool, \"signed_only\": bool}")
    prefixes = policy.get("requests_from")
    if prefixes is not None:
        if not isinstance(prefixes, list) or len(prefixes) > 256:
            raise RedsynError(400, "policy.requests_from is a list of at most 256 prefixes")
        for prefix in prefixes:
            parts = prefix.split("/") if isinstance(prefix, str) else []
            if not 1 <= len(parts) <= 4 or not all(parts):
                raise RedsynError(400, f"policy.requests_from: {prefix!r} is not org[/team"
                                       "[/user[/agent]]]")
    for flag in ("encrypted_only", "signed_only"):
        if not isinstance(policy.get(flag, False), bool):
            raise RedsynError(400, f"policy.{flag} must be true or false")
    return policy


def decide_announce(state: RedsynState, node: Node, address: str, doc,
                    allow_loopback_webhooks: bool = False) -> Decision:
    from hubd.wire.redsyn.webhook import check_webhook

    agent = own_agent(node, address)
    if not isinstance(doc, dict):
        raise RedsynError(400, "an announce is a JSON object")
    listening = doc.get("listening", False)
    if not isinstance(listening, bool):
        raise RedsynError(400, "listening must be true or false")
    payload = {"agent": agent.agent_address, "node": node.id, "listening": listening}
    if "description" in doc:
        if not isinstance(doc["description"], str) or len(doc["description"]) > MAX_DESCRIPTION:
            raise RedsynError(400, f"description is a string of at most {MAX_DESCRIPTION}")
        payload["description"] = doc["description"]
    if "policy" in doc:
        if not listening:
            raise RedsynError(400, "a policy comes only with an announce that has "
                                   "listening: true")
        payload["policy"] = check_policy(doc["policy"])
    if "webhook" in doc:
        payload["webhook"] = None if doc["webhook"] is None else \
            check_webhook(doc["webhook"], allow_loopback_webhooks)
    return Decision([(ANNOUNCE, payload)], {"agent": agent.agent_address,
                                            "listening": listening})


def _prefix_allows(prefixes, sender: Address) -> bool:
    parts = sender.agent_address.split("/")
    return any(parts[: len(p.split("/"))] == p.split("/") for p in prefixes)


def _enforce_policy(state: RedsynState, incoming: Incoming, to: Address, signed: bool) -> None:
    agent = state.agents.get(to.agent_address)
    policy = agent.policy if agent is not None and agent.listening else {}
    sender = incoming.sender
    prefixes = policy.get("requests_from")
    if prefixes is None:
        if sender.org != to.org:
            raise forbidden(f"{to.agent_address} takes nothing from outside {to.org} "
                            "(its policy names no other organization)")
    elif incoming.kind == "request" and not _prefix_allows(prefixes, sender):
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
                limits: Limits = Limits(), new_id=None, seat_of=None) -> Decision:
    """POST /messages: validate against the state, resolve, and store.

    `seat_of(address)` names the hub seat a WebSocket agent holds for an
    address that is not a REDSYN agent, or None. A message to such a seat is
    stored (so its reply can close it) and handed to the chat path as
    Decision.chats: the door routes each as a chat from the sender."""
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
        delivered_to = seat
    else:
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
                if envelope.get(k) is not None}}})
    return Decision([(MESSAGE, payload)], _post_answer(envelope, duplicate=False), chats)


def known_here(state: RedsynState, address: str) -> bool:
    """A REDSYN agent: it announced, or REDSYN messages were delivered to it."""
    return address in state.agents or address in state.session_counts


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


def _undeliverable(state: RedsynState, agent: str, id_: str, reason: str, ts: float) -> list:
    """Give a delivery up; the sender hears it (not for events or error replies)."""
    events = [(UNDELIVERABLE, {"agent": agent, "id": id_, "reason": reason})]
    message = state.messages[id_]
    original = message.envelope
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
        reason = _due(state, agent, id_, delivery, now)
        if reason is not None:
            events.extend(_undeliverable(state, agent, id_, reason, now))
            continue
        ids.append(id_)
        items.append(delivered(state, agent, delivery, delivery.attempts + 1))
    if ids:
        events.append((TAKE, {"agent": agent, "node": node.id, "ids": ids,
                              "lease_until": lease_until}))
    return Decision(events, items)


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


def decide_ack(state: RedsynState, node: Node, address: str, doc) -> Decision:
    agent = own_agent(node, address).agent_address
    if not isinstance(doc, dict) or not isinstance(doc.get("ids"), list) or \
            not all(isinstance(i, str) for i in doc["ids"]) or len(doc["ids"]) > 1000:
        raise RedsynError(400, "an ack is {\"ids\": [id, ...]} (at most 1000)")
    box = state.boxes.get(agent, {})
    held = [i for i in dict.fromkeys(doc["ids"]) if i in box and box[i].attempts > 0]
    unknown = [i for i in doc["ids"] if i not in box]
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


def key_of(state: RedsynState, node: Node, address: str, online_node: str | None = None) -> dict:
    agent = parse_address(address, what="agent address")
    record = state.agents.get(agent.agent_address)
    if agent.org != node.person.split("/")[0] and not (
            record is not None and record.listening and _prefix_allows(
                record.policy.get("requests_from") or [],
                Address(*node.person.split("/"), "_"))):
        raise forbidden(f"{agent.agent_address} is not visible outside {agent.org}")
    holder = online_node or (record.node if record is not None else None)
    key = state.keys.get(holder) if holder is not None else None
    if key is None or not key.get("enc_key"):
        raise RedsynError(404, f"{agent.agent_address} has no encryption key")
    return {"node": holder, "signing_key": key["public_key"], "enc_key": key["enc_key"],
            "enc_sig": key["enc_sig"], "fingerprint": fingerprint(key["public_key"])}


def check_lease(value, shortest: float) -> float:
    """A take's lease: `shortest` (timing.redsyn_min_lease, 1 s) to MAX_LEASE seconds."""
    try:
        lease = float(value) if value is not None else DEFAULT_LEASE
    except ValueError:
        raise RedsynError(400, "lease is seconds, a number") from None
    if not shortest <= lease <= MAX_LEASE:
        raise RedsynError(400, f"lease must be {shortest:g} to {MAX_LEASE} seconds")
    return lease


# -- the hub's projection of REDSYN events and of chats bridged to REDSYN
# agents (the REDSYN plugin, hubd/doors/redsyn/install.py, installs them)

PROJECTIONS = {"redsyn": RedsynState}
appliers = Appliers()


def _apply_event(state, event) -> None:
    apply(state.extensions["redsyn"], event.kind, event.payload, event.ts)


def _apply_chat_event(state, event) -> None:
    apply_chat(state.extensions["redsyn"], event.payload, event.route, event.seq, event.ts)


for _kind in KINDS:
    appliers.applies(_kind)(_apply_event)
appliers.applies(CHAT)(_apply_chat_event)

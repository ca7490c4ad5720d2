"""The local broker's decisions: pure functions of the state and a request.

Each `decide_*` either raises `Refusal` (an error code and a sentence; nothing
was decided) or returns a `Decision`: the events to journal, in order, and the
result the client gets. Nothing here applies an event or does IO; live facts
(which handles have a listening connection, which hub targets exist) come in as
arguments, so every rule is tested without sockets.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Callable, Container, Iterable

from hubd.wire import broker as wire

from . import broker as bs
from .broker import BrokerState, Message, first_line

_SLUG_RUNS = re.compile(r"[^a-z0-9]+")


class Refusal(Exception):
    """A request the broker answers with an error and changes nothing for."""

    def __init__(self, code: str, message: str, **extra):
        super().__init__(message)
        self.code = code
        self.message = message
        self.extra = extra


@dataclass
class Decision:
    events: list = field(default_factory=list)  # (kind, payload, route)
    result: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Limits:
    """The seed's limits; a benchmark may lift the send rate (--broker-no-rate-limit)."""

    rate_sends: int | None = bs.RATE_SENDS
    rate_window: float = bs.RATE_WINDOW_SECONDS
    duplicate_window: float = bs.DUPLICATE_WINDOW_SECONDS
    thread_cap: int = bs.THREAD_CAP
    unread_cap: int = bs.UNREAD_CAP


DEFAULT_LIMITS = Limits()


def slug(title: str) -> str:
    """Lowercase, runs of other characters as one hyphen, at most 48 characters."""
    text = _SLUG_RUNS.sub("-", title.lower()).strip("-")
    return text[:48].rstrip("-")


def valid_handle(name: str) -> bool:
    return bool(wire.HANDLE_RE.match(name))


def automatic_handle(state: BrokerState, base: str) -> str:
    """`<base>-<n>` with the smallest n whose name is free."""
    base = slug(base)[:40] or "peer"
    if len(base) < 2:
        base = base + "x"
    n = 1
    while state.name_taken(f"{base}-{n}"):
        n += 1
    return f"{base}-{n}"


def resolve_via(state: BrokerState, ancestors: Iterable[int]) -> str | None:
    """The nearest live session among the ancestor pids (nearest first)."""
    live_by_pid: dict[int, bs.CliSession] = {}
    for session in state.sessions.values():
        if session.state == "offline":
            continue
        pid = session.host.get("hostPid")
        known = live_by_pid.get(pid)
        if known is None or session.updated >= known.updated:
            live_by_pid[pid] = session
    for pid in ancestors:
        session = live_by_pid.get(pid)
        if session is not None:
            return session.handle
    return None


# -- register and session

def decide_register(state: BrokerState, fields: dict, now: float) -> Decision:
    owner = fields.get("owner") is True
    handle = fields.get("handle")
    if owner:
        if state.owner is not None and handle is not None and handle != state.owner:
            raise Refusal(wire.BAD_REQUEST, f"The owner of this broker is '{state.owner}'; "
                                            f"'{handle}' cannot register as owner.")
        handle = handle or state.owner or "owner"
    elif handle is None:
        handle = automatic_handle(state, fields.get("client") or fields["clientKind"])
    if handle in state.groups:
        raise Refusal(wire.BAD_REQUEST, f"'{handle}' is a group name, not a handle.")
    payload = {"handle": handle, "display": fields.get("display"), "role": fields.get("role"),
               "clientKind": fields["clientKind"], "client": fields.get("client"),
               "cwd": fields.get("cwd"), "owner": owner, "host": fields.get("host")}
    decision = Decision(result={"handle": handle, "owner": owner or state.owner == handle})
    peer = state.peers.get(handle)
    if peer is None or _peer_changes(peer, payload):
        decision.events.append((bs.PEER, payload, None))
    return decision


def _peer_changes(peer: bs.Peer, p: dict) -> bool:
    for attr, key in (("display", "display"), ("role", "role"), ("client_kind", "clientKind"),
                      ("client", "client"), ("cwd", "cwd"), ("host", "host")):
        if p.get(key) is not None and getattr(peer, attr) != p[key]:
            return True
    return bool(p.get("owner")) and not peer.owner


def decide_session(state: BrokerState, fields: dict, now: float) -> Decision:
    client, cli_id, host = fields["client"], fields["cliSessionId"], fields["host"]
    key = (client, cli_id)
    session = state.sessions.get(key)
    replaces = None
    if session is None:
        # /clear: the same CLI process starts a new session id; keep its handle
        for other in state.sessions.values():
            if other.client == client and other.state != "offline" and \
                    other.host.get("hostPid") == host["hostPid"] and \
                    other.host.get("hostStart") == host.get("hostStart"):
                session, replaces = other, other.cli_session_id
                break
    asked = fields.get("handle")
    if asked is not None:
        handle, pinned = asked, True
        holder = state.session_of(asked)
        if holder is not None and holder is not session and holder.state != "offline":
            raise Refusal(wire.BAD_REQUEST, f"Handle '{asked}' belongs to another live session.")
        if asked in state.groups:
            raise Refusal(wire.BAD_REQUEST, f"'{asked}' is a group name, not a handle.")
    elif session is not None:
        handle, pinned = session.handle, session.pinned
    else:
        handle, pinned = automatic_handle(state, client), False
    old_handle = session.handle if session is not None else None
    title = fields.get("title")
    if title is None and session is not None:
        title = session.title
    display = title if title else (session.display if session is not None else None)
    if title and not pinned:
        wanted = slug(title)
        if valid_handle(wanted) and wanted != handle and not state.name_taken(wanted):
            handle = wanted
    payload = {"client": client, "cliSessionId": cli_id, "handle": handle, "display": display,
               "title": title, "host": host,
               "transcriptPath": fields.get("transcriptPath",
                                            session.transcript_path if session else None),
               "cwd": fields.get("cwd", session.cwd if session else None), "pinned": pinned,
               "state": bs.SESSION_STATE_BY_EVENT[fields["event"]]}
    if old_handle is not None and old_handle != handle and handle not in state.peers:
        # a rename: what named the old handle follows it (an explicit handle that
        # is already a peer just takes the session over)
        payload["renamedFrom"] = old_handle
    if replaces is not None:
        payload["replaces"] = replaces
    return Decision([(bs.SESSION, payload, None)], {"handle": handle})


# -- messages

HubTargetCheck = Callable[[str], "str | None"]  # None: deliverable; else why not


def _no_hub_targets(target: str) -> str | None:
    return f"Hub target '{target}' cannot be reached from this broker."


def resolve_recipients(state: BrokerState, to, sender: str, namespace: str,
                       hub_target: HubTargetCheck) -> list[str]:
    items = [to] if isinstance(to, str) else list(to)
    found: dict[str, None] = {}
    for item in items:
        if "/" in item:
            head, _, rest = item.partition("/")
            if head == namespace and "@" not in rest:
                if rest not in state.peers:
                    raise Refusal(wire.UNKNOWN_HANDLE, f"No handle '{rest}' on this broker.")
                found.setdefault(rest, None)
                continue
            problem = hub_target(item)
            if problem is not None:
                raise Refusal(wire.UNKNOWN_HANDLE, problem)
            found.setdefault(item, None)
        elif item in state.peers:
            found.setdefault(item, None)
        elif item in state.groups:
            for member in state.groups[item]:
                found.setdefault(member, None)
        else:
            raise Refusal(wire.UNKNOWN_HANDLE, f"No handle or group '{item}' on this broker.")
    found.pop(sender, None)
    return list(found)


def _fingerprint(*parts) -> str:
    digest = hashlib.blake2b(digest_size=12)
    for part in parts:
        digest.update(repr(part).encode("utf-8", "surrogatepass"))
        digest.update(b"\x00")
    return digest.hexdigest()


def _check_limits(state: BrokerState, sender: str, fingerprint: str | None,
                  local_recipients: list[str], thread: bs.Thread | None, now: float,
                  limits: Limits) -> None:
    if thread is not None and len(thread.messages) >= limits.thread_cap:
        raise Refusal(wire.CAP_THREAD, f"Thread {thread.id} holds {limits.thread_cap} messages, "
                                       "its cap; start a new thread.")
    if limits.rate_sends is not None:
        window = state.recent.get(sender, ())
        # the window holds the sender's latest hub times, oldest first: it is
        # full when the rate_sends-th latest is still inside the window
        if len(window) >= limits.rate_sends and \
                window[-limits.rate_sends] > now - limits.rate_window:
            raise Refusal(wire.RATE_LIMITED,
                          f"'{sender}' sent {limits.rate_sends} messages in the last "
                          f"{limits.rate_window:g} s; retry later.")
    if fingerprint is not None:
        seen = state.fingerprints.get((sender, fingerprint))
        if seen is not None and seen[0] > now - limits.duplicate_window:
            raise Refusal(wire.DUPLICATE, f"The same message was sent as m{seen[1]} "
                                          f"{now - seen[0]:.0f} s ago; it was not sent again.",
                          messageId=seen[1])
    for recipient in local_recipients:
        if state.unread_of(recipient) >= limits.unread_cap:
            raise Refusal(wire.CAP_INBOX, f"'{recipient}' has {limits.unread_cap} unacknowledged "
                                          "messages, its cap; nothing was sent.")


def _initial_states(recipients: list[str], local: set, mode: str,
                    listening: Container[str]) -> dict:
    states = {}
    for recipient in recipients:
        if recipient in local:
            states[recipient] = "sent" if mode != "silent" and recipient in listening else "queued"
        else:
            states[recipient] = "sent"  # handed to the hub: a chat to its seat
    return states


def _references(state: BrokerState, refs) -> list[int]:
    for ref in refs or ():
        if ref not in state.messages:
            raise Refusal(wire.UNKNOWN_MESSAGE, f"Referenced message m{ref} does not exist.")
    return list(refs or ())


def _cut(body: str) -> str:
    return body[:bs.BODY_DELIVERED_CHARS]


def decide_send(state: BrokerState, sender: str, via: str | None, fields: dict, now: float,
                listening: Container[str] = (), namespace: str = "local",
                hub_target: HubTargetCheck = _no_hub_targets,
                limits: Limits = DEFAULT_LIMITS) -> Decision:
    thread_id = fields.get("threadId")
    thread = None
    if thread_id is not None:
        thread = state.threads.get(thread_id)
        if thread is None:
            raise Refusal(wire.UNKNOWN_THREAD, f"No thread {thread_id}.")
    recipients = resolve_recipients(state, fields["to"], sender, namespace, hub_target)
    if not recipients:
        raise Refusal(wire.BAD_REQUEST, "send: no recipient besides the sender.")
    references = _references(state, fields.get("references"))
    mode = fields.get("mode") or (thread.mode if thread is not None else "push")
    body = fields["body"]
    local = {r for r in recipients if r in state.peers}
    fingerprint = _fingerprint("send", thread_id, sorted(recipients), body, mode)
    _check_limits(state, sender, fingerprint, [r for r in recipients if r in local], thread,
                  now, limits)
    message_id = state.last_message_id + 1
    if thread is None:
        thread_id, seq = state.last_thread_id + 1, 1
    else:
        seq = len(thread.messages) + 1
    states = _initial_states(recipients, local, mode, listening)
    payload = {"id": message_id, "threadId": thread_id, "seq": seq, "from": sender, "via": via,
               "to": recipients, "body": _cut(body), "bodyLength": len(body), "verdict": None,
               "references": references, "mode": mode, "replyTo": None,
               "subject": first_line(body) if thread is None else None,
               "fingerprint": fingerprint}
    result = {"messageId": message_id, "threadId": thread_id, "seq": seq, "via": via,
              "deliveries": [{"to": r, "state": states[r]} for r in recipients]}
    return Decision([(bs.MESSAGE, payload, {"states": states})], result)


def reply_recipients(state: BrokerState, thread: bs.Thread, replier: str) -> list[str]:
    """Every sender, recipient and via of the thread, minus the replier."""
    return [name for name in thread.participants() if name != replier]


def decide_reply(state: BrokerState, sender: str, via: str | None, fields: dict, now: float,
                 listening: Container[str] = (), limits: Limits = DEFAULT_LIMITS,
                 from_hub: bool = False) -> Decision:
    """A reply from a handle, or (from_hub) from a hub seat answering over chat:
    a seat is not rate-counted here (the hub's ingress quota covers it)."""
    original: Message | None = state.messages.get(fields["messageId"])
    if original is None:
        raise Refusal(wire.UNKNOWN_MESSAGE, f"No message m{fields['messageId']}.")
    thread = state.threads[original.thread_id]
    recipients = reply_recipients(state, thread, sender)
    references = _references(state, fields.get("references"))
    body = fields["body"]
    verdict = fields.get("verdict")
    local = {r for r in recipients if r in state.peers}
    fingerprint = None if from_hub else _fingerprint("reply", original.id, body, verdict)
    _check_limits(state, sender, fingerprint, [r for r in recipients if r in local], thread,
                  now, limits if not from_hub else Limits(rate_sends=None))
    message_id = state.last_message_id + 1
    seq = len(thread.messages) + 1
    states = _initial_states(recipients, local, thread.mode, listening)
    payload = {"id": message_id, "threadId": thread.id, "seq": seq, "from": sender, "via": via,
               "to": recipients, "body": _cut(body), "bodyLength": len(body), "verdict": verdict,
               "references": references, "mode": thread.mode, "replyTo": original.id,
               "subject": None, "fingerprint": fingerprint}
    if from_hub:
        payload["counted"] = False
    result = {"messageId": message_id, "threadId": thread.id, "seq": seq}
    return Decision([(bs.MESSAGE, payload, {"states": states})], result)


def decide_hub_chat(state: BrokerState, seat: str, handle: str, body: str, now: float,
                    listening: Container[str] = (), limits: Limits = DEFAULT_LIMITS,
                    earlier: dict | None = None) -> Decision:
    """A chat from the hub side (a WebSocket seat, or seat@HUB) to local/<handle>
    that is not a reply: a new thread from the seat to the handle. `earlier`
    counts the new threads this same chat opens before this one, by handle
    (one chat to several handles opens one thread each, in order, all
    decided before it is journaled)."""
    earlier = earlier or {}
    if handle not in state.peers:
        raise Refusal(wire.UNKNOWN_HANDLE, f"No handle '{handle}' on this broker.")
    cap = limits.unread_cap
    _check_limits(state, seat, None, [handle], None, now, Limits(rate_sends=None,
                                                                 unread_cap=cap))
    if state.unread_of(handle) + earlier.get(handle, 0) >= cap:
        raise Refusal(wire.CAP_INBOX, f"'{handle}' has {cap} unacknowledged messages, its "
                                      "cap; nothing was sent.")
    ordinal = sum(earlier.values())
    message_id = state.last_message_id + 1 + ordinal
    thread_id = state.last_thread_id + 1 + ordinal
    states = _initial_states([handle], {handle}, "push", listening)
    payload = {"id": message_id, "threadId": thread_id, "seq": 1, "from": seat, "via": None,
               "to": [handle], "body": _cut(body), "bodyLength": len(body), "verdict": None,
               "references": [], "mode": "push", "replyTo": None, "subject": first_line(body),
               "fingerprint": None, "counted": False}
    return Decision([(bs.MESSAGE, payload, {"states": states})],
                    {"messageId": message_id, "threadId": thread_id, "seq": 1})


# -- delivery states

def _own_deliveries(state: BrokerState, handle: str, ids: list[int]) -> dict:
    table = state.deliveries.get(handle, {})
    missing = [i for i in ids if i not in table]
    if missing:
        raise Refusal(wire.UNKNOWN_MESSAGE, f"No delivery of m{missing[0]} to '{handle}'.")
    return table


def decide_advance(state: BrokerState, handle: str, ids: list[int], target: str) -> Decision:
    """delivered / ack: the handle's own deliveries move forward (never back)."""
    table = _own_deliveries(state, handle, ids)
    ids = list(dict.fromkeys(ids))
    moving = [i for i in ids if bs.STATE_ORDER[table[i]] < bs.STATE_ORDER[target]]
    decision = Decision()
    if moving:
        decision.events.append((bs.DELIVERIES, {"handle": handle, "ids": moving,
                                                "state": target}, None))
    return decision


def decide_read(state: BrokerState, handle: str | None, ids: list[int]) -> Decision:
    missing = [i for i in ids if i not in state.messages]
    if missing:
        raise Refusal(wire.UNKNOWN_MESSAGE, f"No message m{missing[0]}.")
    decision = Decision()
    if handle is not None:
        table = state.deliveries.get(handle, {})
        moving = [i for i in dict.fromkeys(ids)
                  if i in table and bs.STATE_ORDER[table[i]] < bs.STATE_ORDER["delivered"]]
        if moving:
            decision.events.append((bs.DELIVERIES, {"handle": handle, "ids": moving,
                                                    "state": "delivered"}, None))
    return decision


def pending_pushes(state: BrokerState, handle: str, limit: int,
                   states: tuple = ("queued",)) -> list[int]:
    """The handle's deliveries in `states`, oldest first, that a push would carry
    (silent messages stay in the inbox)."""
    out = []
    for message_id, current in state.deliveries.get(handle, {}).items():
        if current in states and state.messages[message_id].mode != "silent":
            out.append(message_id)
            if len(out) >= limit:
                break
    return out


# -- groups and prune

def decide_groups(state: BrokerState, fields: dict) -> Decision:
    action, name = fields["action"], fields.get("name")
    if action == "list":
        return Decision(result={"groups": [{"name": n, "members": list(m)}
                                           for n, m in sorted(state.groups.items())]})
    if name is None:
        raise Refusal(wire.BAD_REQUEST, f"groups {action}: field 'name' is required.")
    members = list(dict.fromkeys(fields.get("members") or ()))
    if action == "create":
        if name in state.groups:
            raise Refusal(wire.BAD_REQUEST, f"Group '{name}' exists.")
        if name in state.peers:
            raise Refusal(wire.BAD_REQUEST, f"'{name}' is a handle; a group needs its own name.")
    elif name not in state.groups:
        raise Refusal(wire.UNKNOWN_GROUP, f"No group '{name}'.")
    if action in ("add", "remove") and not members:
        raise Refusal(wire.BAD_REQUEST, f"groups {action}: field 'members' is required.")
    if action in ("create", "add"):
        for member in members:
            if member not in state.peers:
                raise Refusal(wire.UNKNOWN_HANDLE, f"No handle '{member}' on this broker.")
    payload = {"action": action, "name": name, "members": members}
    if action == "delete":
        return Decision([(bs.GROUP, payload, None)], {"deleted": name})
    if action == "create":
        after = members
    elif action == "add":
        after = state.groups[name] + [m for m in members if m not in state.groups[name]]
    else:
        after = [m for m in state.groups[name] if m not in set(members)]
    return Decision([(bs.GROUP, payload, None)], {"group": {"name": name, "members": after}})


def prunable(state: BrokerState, connected: Container[str]) -> list[str]:
    """Peers that are not the owner and have no session, sent message, delivery,
    group membership or live connection."""
    with_session = {s.handle for s in state.sessions.values()}
    return sorted(handle for handle, peer in state.peers.items()
                  if not peer.owner and handle != state.owner and handle not in with_session
                  and not state.sent_by.get(handle) and not state.deliveries.get(handle)
                  and not state.member_of_group(handle) and handle not in connected)


def decide_prune(state: BrokerState, connected: Container[str]) -> Decision:
    removed = prunable(state, connected)
    events = [(bs.PRUNE, {"handles": removed}, None)] if removed else []
    return Decision(events, {"removed": removed})


# -- chats from the hub side to local/<handle>

_REPLY_PREFIX = re.compile(r"^\s*m(\d{1,15})(?:\s+(agree|disagree|info))?\s*:\s?", re.S)


@dataclass(frozen=True)
class HubReply:
    message_id: int
    verdict: str | None
    body: str


def parse_hub_reply(frame: dict, body: str) -> HubReply | None:
    """Does a hub chat name a thread's message (docs/broker.md, "local/H")?

    `reply_to` of "m12" or 12, or a payload starting `m12:` / `m12 agree:`
    (the prefix is removed). The verdict is the prefix's, else metadata.verdict.
    """
    reply_to = frame.get("reply_to")
    message_id = None
    if type(reply_to) is int and reply_to > 0:
        message_id = reply_to
    elif isinstance(reply_to, str) and re.fullmatch(r"m?\d{1,15}", reply_to):
        message_id = int(reply_to.lstrip("m"))
    verdict = None
    match = _REPLY_PREFIX.match(body)
    if match is not None and (message_id is None or int(match.group(1)) == message_id):
        message_id = int(match.group(1))
        verdict = match.group(2)
        body = body[match.end():]
    if message_id is None:
        return None
    if verdict is None:
        metadata = frame.get("metadata")
        candidate = metadata.get("verdict") if isinstance(metadata, dict) else None
        verdict = candidate if candidate in wire.VERDICTS else None
    return HubReply(message_id, verdict, body if body.strip() else "(empty reply)")

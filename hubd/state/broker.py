"""The local broker's state (seed 004): a projection of the hub's journal.

Peers (handles), CLI sessions, messages, threads, deliveries and their states,
verdicts (on replies), groups, and the windows the limits are counted in. The
only way it changes is `BrokerState.apply(event)` with one of the `broker_*`
events below; the decisions that make those events are in
`hubd/state/broker_rules.py`, the text a session sees in `broker_text.py`.

Events (payload fields; `ts` is the event's hub time):
- broker_peer      {handle, display, role, clientKind, client, cwd, owner, host}
                   a peer registered (or re-registered with new facts)
- broker_session   {client, cliSessionId, handle, display, title, host,
                    transcriptPath, cwd, pinned, state, renamedFrom?, replaces?}
                   a CLI session found or created, its lifecycle event applied;
                   `replaces` is the cliSessionId it took over (a /clear),
                   `renamedFrom` the handle it had before a title rename
- broker_message   {id, threadId, seq, from, via, to, body, bodyLength,
                    verdict, references, mode, replyTo, subject}
                   route {"states": {recipient: "sent"|"queued"}} as decided at
                   send time (who had a listening connection)
- broker_deliveries {handle, ids, state}  deliveries advanced (never backwards)
- broker_group     {action: create|add|remove|delete, name, members}
- broker_prune     {handles}

A chat from the hub side to local/<handle> carries the broker messages it
makes in its own route (`boxes.broker`: [{message, states}], each a
broker_message payload and its route states), decided by the routing
service before the chat was journaled; the chat event applies them here.
(Hubs before that journaled each as a broker_message event after the chat.)
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from hubd.state.events import CHAT
from hubd.state.hub import Appliers

PEER = "broker_peer"
SESSION = "broker_session"
MESSAGE = "broker_message"
DELIVERIES = "broker_deliveries"
GROUP = "broker_group"
PRUNE = "broker_prune"
KINDS = (PEER, SESSION, MESSAGE, DELIVERIES, GROUP, PRUNE)

# constants (seed 004)
BODY_DELIVERED_CHARS = 4000
RATE_SENDS = 20
RATE_WINDOW_SECONDS = 60.0
DUPLICATE_WINDOW_SECONDS = 60.0
THREAD_CAP = 500
UNREAD_CAP = 200
NOTIFICATION_BATCH_SECONDS = 60.0
WAIT_DEFAULT_MS = 120_000
WAIT_MAX_MS = 300_000
FIRST_LINE_CHARS = 120

STATE_ORDER = {"queued": 0, "sent": 1, "delivered": 2, "acknowledged": 3, "replied": 4}
UNREAD_STATES = frozenset(("queued", "sent", "delivered"))
SESSION_STATE_BY_EVENT = {"session-start": "online", "prompt": "busy", "stop": "idle",
                          "session-end": "offline"}


@dataclass
class Peer:
    handle: str
    display: str | None = None
    role: str | None = None
    client_kind: str | None = None
    client: str | None = None
    cwd: str | None = None
    owner: bool = False
    host: dict | None = None
    created: float = 0.0
    seen: float = 0.0


@dataclass
class CliSession:
    client: str
    cli_session_id: str
    handle: str
    display: str | None
    title: str | None
    host: dict
    transcript_path: str | None
    cwd: str | None
    pinned: bool
    state: str  # online | busy | idle | offline (ended)
    started: float
    updated: float


@dataclass
class Message:
    id: int
    thread_id: int
    seq: int
    sender: str  # a handle, or a hub seat for a chat from the hub side
    via: str | None
    to: tuple  # recipients as resolved: handles and hub targets
    body: str  # as delivered: cut to BODY_DELIVERED_CHARS
    body_length: int  # as sent
    verdict: str | None
    references: tuple
    mode: str
    reply_to: int | None
    ts: float


@dataclass
class Thread:
    id: int
    subject: str
    created: float
    mode: str
    ask_id: int
    messages: list = field(default_factory=list)  # message ids, seq order
    # participants, each an insertion-ordered set (dict keys)
    senders: dict = field(default_factory=dict)
    recipients: dict = field(default_factory=dict)
    vias: dict = field(default_factory=dict)
    ask_recipients: list = field(default_factory=list)

    def participants(self) -> list[str]:
        seen: dict = {}
        for group in (self.senders, self.recipients, self.vias):
            for name in group:
                seen.setdefault(name, None)
        return list(seen)


def first_line(body: str) -> str:
    for line in body.splitlines():
        if line.strip():
            return line.strip()[:FIRST_LINE_CHARS]
    return ""


@dataclass
class BrokerState:
    peers: dict = field(default_factory=dict)  # handle -> Peer
    owner: str | None = None
    sessions: dict = field(default_factory=dict)  # (client, cliSessionId) -> CliSession
    # handle -> key of its most recently updated session
    session_keys: dict = field(default_factory=dict)
    messages: dict = field(default_factory=dict)  # id -> Message
    threads: dict = field(default_factory=dict)  # id -> Thread
    # recipient -> {message id: state}, in delivery order
    deliveries: dict = field(default_factory=dict)
    unread: dict = field(default_factory=dict)  # recipient -> deliveries not yet acknowledged
    sent_by: dict = field(default_factory=dict)  # sender -> messages sent
    groups: dict = field(default_factory=dict)  # name -> [handles]
    # sender -> hub times of its last RATE_SENDS messages (the rate window)
    recent: dict = field(default_factory=dict)
    # (sender, key) -> (ts, message id): the duplicate window, oldest first
    fingerprints: dict = field(default_factory=dict)
    last_message_id: int = 0
    last_thread_id: int = 0

    # -- the projection

    def apply(self, kind: str, payload: dict, route: dict | None, ts: float) -> None:
        applier = _APPLIERS.get(kind)
        if applier is None:
            raise ValueError(f"not a broker event: {kind}")
        applier(self, payload, route or {}, ts)

    # -- queries the rules and views use

    def session_of(self, handle: str) -> CliSession | None:
        """The handle's most recently updated session, if it has one."""
        key = self.session_keys.get(handle)
        session = self.sessions.get(key) if key is not None else None
        return session if session is not None and session.handle == handle else None

    def unread_of(self, recipient: str) -> int:
        return self.unread.get(recipient, 0)

    def delivery_state(self, recipient: str, message_id: int) -> str | None:
        return self.deliveries.get(recipient, {}).get(message_id)

    def member_of_group(self, handle: str) -> bool:
        return any(handle in members for members in self.groups.values())

    def name_taken(self, name: str) -> bool:
        return name in self.peers or name in self.groups


# -- appliers

def _apply_peer(state: BrokerState, p: dict, route: dict, ts: float) -> None:
    handle = p["handle"]
    peer = state.peers.get(handle)
    if peer is None:
        peer = state.peers[handle] = Peer(handle, created=ts)
    for attr, key in (("display", "display"), ("role", "role"), ("client_kind", "clientKind"),
                      ("client", "client"), ("cwd", "cwd"), ("host", "host")):
        if p.get(key) is not None:
            setattr(peer, attr, p[key])
    if p.get("owner"):
        peer.owner = True
        state.owner = handle
    peer.seen = ts


def _apply_session(state: BrokerState, p: dict, route: dict, ts: float) -> None:
    handle = p["handle"]
    old = p.get("renamedFrom")
    if old is not None and old != handle:
        _rename(state, old, handle)
    replaces = p.get("replaces")
    previous = None
    if replaces is not None:
        previous = state.sessions.pop((p["client"], replaces), None)
    key = (p["client"], p["cliSessionId"])
    session = state.sessions.get(key)
    if session is None:
        started = previous.started if previous is not None else ts
        session = state.sessions[key] = CliSession(
            p["client"], p["cliSessionId"], handle, None, None, p["host"], None, None, False,
            "online", started, ts)
    if session.handle != handle and state.session_keys.get(session.handle) == key:
        del state.session_keys[session.handle]  # the session moved to another handle
    session.handle = handle
    session.display = p.get("display")
    session.title = p.get("title")
    session.host = p["host"]
    session.transcript_path = p.get("transcriptPath")
    session.cwd = p.get("cwd")
    session.pinned = bool(p.get("pinned"))
    session.state = p["state"]
    session.updated = ts
    state.session_keys[handle] = key
    peer = state.peers.get(handle)
    if peer is None:
        peer = state.peers[handle] = Peer(handle, client_kind="adapter", created=ts)
    peer.client = p["client"]
    if p.get("display") is not None:
        peer.display = p["display"]
    if p.get("cwd") is not None:
        peer.cwd = p["cwd"]
    peer.host = p["host"]
    peer.seen = ts


def _rename(state: BrokerState, old: str, new: str) -> None:
    """A title rename: everything that names the old handle names the new one.
    Messages keep the name they were sent under (history is not rewritten)."""
    peer = state.peers.pop(old, None)
    if peer is not None:
        peer.handle = new
        state.peers[new] = peer
    if state.owner == old:
        state.owner = new
    for session in state.sessions.values():
        if session.handle == old:
            session.handle = new
    if old in state.session_keys:
        state.session_keys[new] = state.session_keys.pop(old)
    for table in (state.deliveries, state.unread, state.sent_by, state.recent):
        if old in table:
            table[new] = table.pop(old)
    for name, members in state.groups.items():
        state.groups[name] = [new if m == old else m for m in members]
    for thread in state.threads.values():
        for group in (thread.senders, thread.recipients, thread.vias):
            if old in group:
                # keep the position: rebuild the ordered set
                items = [(new if k == old else k) for k in group]
                group.clear()
                group.update(dict.fromkeys(items))
        thread.ask_recipients = [new if r == old else r for r in thread.ask_recipients]


def _advance(state: BrokerState, recipient: str, message_id: int, target: str) -> bool:
    table = state.deliveries.get(recipient)
    if table is None:
        return False
    current = table.get(message_id)
    if current is None or STATE_ORDER[target] <= STATE_ORDER[current]:
        return False
    table[message_id] = target
    if current in UNREAD_STATES and target not in UNREAD_STATES:
        state.unread[recipient] -= 1
    return True


def _apply_message(state: BrokerState, p: dict, route: dict, ts: float) -> None:
    message = Message(p["id"], p["threadId"], p["seq"], p["from"], p.get("via"),
                      tuple(p["to"]), p["body"], p["bodyLength"], p.get("verdict"),
                      tuple(p.get("references") or ()), p["mode"], p.get("replyTo"), ts)
    state.messages[message.id] = message
    state.last_message_id = max(state.last_message_id, message.id)
    thread = state.threads.get(message.thread_id)
    if thread is None:
        thread = state.threads[message.thread_id] = Thread(
            message.thread_id, p.get("subject") or first_line(message.body), ts, message.mode,
            message.id, ask_recipients=list(message.to))
        state.last_thread_id = max(state.last_thread_id, message.thread_id)
    thread.messages.append(message.id)
    thread.senders.setdefault(message.sender, None)
    for recipient in message.to:
        thread.recipients.setdefault(recipient, None)
    if message.via is not None:
        thread.vias.setdefault(message.via, None)
    if message.reply_to is not None:
        # a reply answers every delivery its sender had in the thread
        table = state.deliveries.get(message.sender)
        if table is not None:
            for earlier in thread.messages[:-1]:
                _advance(state, message.sender, earlier, "replied")
    states = route.get("states", {})
    for recipient in message.to:
        table = state.deliveries.setdefault(recipient, {})
        table[message.id] = states.get(recipient, "queued")
        state.unread[recipient] = state.unread.get(recipient, 0) + 1
    state.sent_by[message.sender] = state.sent_by.get(message.sender, 0) + 1
    if p.get("counted", True):
        window = state.recent.get(message.sender)
        if window is None:
            window = state.recent[message.sender] = deque(maxlen=RATE_SENDS)
        window.append(ts)
        fingerprint = p.get("fingerprint")
        if fingerprint is not None:
            _remember_fingerprint(state, message.sender, fingerprint, ts, message.id)


def _remember_fingerprint(state: BrokerState, sender: str, fingerprint: str, ts: float,
                          message_id: int) -> None:
    prints = state.fingerprints
    # oldest first: drop what has left the window (bounded by the send rate)
    while prints:
        oldest = next(iter(prints))
        if prints[oldest][0] > ts - DUPLICATE_WINDOW_SECONDS:
            break
        del prints[oldest]
    key = (sender, fingerprint)
    prints.pop(key, None)
    prints[key] = (ts, message_id)


def _apply_deliveries(state: BrokerState, p: dict, route: dict, ts: float) -> None:
    for message_id in p["ids"]:
        _advance(state, p["handle"], message_id, p["state"])


def _apply_group(state: BrokerState, p: dict, route: dict, ts: float) -> None:
    action, name = p["action"], p["name"]
    if action == "create":
        state.groups[name] = list(dict.fromkeys(p.get("members") or ()))
    elif action == "add":
        members = state.groups[name]
        for member in p["members"]:
            if member not in members:
                members.append(member)
    elif action == "remove":
        drop = set(p["members"])
        state.groups[name] = [m for m in state.groups[name] if m not in drop]
    elif action == "delete":
        del state.groups[name]
    else:
        raise ValueError(f"unknown group action {action!r}")


def _apply_prune(state: BrokerState, p: dict, route: dict, ts: float) -> None:
    for handle in p["handles"]:
        state.peers.pop(handle, None)
        state.recent.pop(handle, None)


_APPLIERS = {PEER: _apply_peer, SESSION: _apply_session, MESSAGE: _apply_message,
             DELIVERIES: _apply_deliveries, GROUP: _apply_group, PRUNE: _apply_prune}


# -- the hub's projection of broker events (the broker plugin,
# hubd/doors/broker/install.py, installs it whether or not the door serves)

PROJECTIONS = {"broker": BrokerState}
appliers = Appliers()


def of(hub_state) -> BrokerState:
    """The broker's projection inside the hub's state."""
    return hub_state.extensions["broker"]


def _apply_event(hub_state, event) -> None:
    hub_state.extensions["broker"].apply(event.kind, event.payload, event.route, event.ts)


def _apply_chat_event(hub_state, event) -> None:
    """The broker messages a chat to local/<handle> made (see above)."""
    boxes = (event.route or {}).get("boxes")
    if boxes:
        state = hub_state.extensions["broker"]
        for entry in boxes.get("broker", ()):
            _apply_message(state, entry["message"], {"states": entry["states"]}, event.ts)


for _kind in KINDS:
    appliers.applies(_kind)(_apply_event)
appliers.applies(CHAT)(_apply_chat_event)

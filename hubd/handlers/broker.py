"""The local broker's verbs inside the Router (docs/broker.md).

The broker door (hubd/doors/broker/) hands each request line to the Router as
a `Call` running `handle(router, request, endpoint)`. Here the request is
decided by the pure rules (hubd/state/broker_rules.py), its events are
journaled and applied like every other event, and its answer goes out as a
message to the asking endpoint, released only after the commit (commit before
publish: a send answered ok is durable). Pushes to listening endpoints,
notification batches, waits and the hub side (chats to and from local/H) are
decided here too.

Live bookkeeping (which endpoint is bound to which handle, who listens, the
pending waits, notification batches) is `BrokerLive`, the broker's live home
on the Router (`router.live_of(BrokerLive)`), touched only by Router commands.
A wait's timeout is a Router timer (`WaitExpired`), not a loop handle.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import structlog

from hubd.actors.router import REFUSALS, Router
from hubd.core.message import Message
from hubd.state import broker as bs
from hubd.state import broker_rules as rules
from hubd.state import broker_views as views
from hubd.state.broker_rules import Limits, Refusal
from hubd.state.broker_seats import BrokerSeats
from hubd.state.events import UnstorableEvent
from hubd.wire import broker as wire
from hubd.wire.targets import RemoteTargetError, parse_remote

log = structlog.get_logger("hubd.broker")

# listening connections: a share of the door's 256 connections, so listeners
# can never crowd out the connections of one-shot CLI commands
MAX_LISTENERS = 128
HOOK_MESSAGES = 20
ANSWER = "broker_answer"
PUSH = "broker_push"
NOTIFICATION = "broker_notification"


@dataclass
class Waiter:
    endpoint: int
    request_id: int
    thread_id: int
    until: str
    timer: int | None = None  # the Router timer (key) that ends the wait


class WaitExpired(NamedTuple):
    """A Router timer: this wait's timeout is over."""

    waiter: Waiter


class BrokerLive:
    def __init__(self, router: Router):
        config = router.config.broker
        self.namespace: str = config.namespace if config else "local"
        self.limits: Limits = Limits() if config is None or config.rate_limit else \
            Limits(rate_sends=None)
        # the principal the door's token maps to: its name is what every event
        # a broker request causes records (docs/identity.md)
        self.principal: str = config.principal if config else "broker"
        self.bindings: dict = {}  # endpoint id -> [handle, via]
        self.connected: dict = {}  # handle -> endpoints bound to it
        self.listeners: dict = {}  # handle -> endpoint id
        self.natives: dict = {}  # handle -> NativeEndpoint (door object)
        self.waiters: dict = {}  # thread id -> [Waiter]
        self.batcher = views.NotificationBatcher()
        self.request_id = 0  # the request being handled (a wait answers it later)
        # the door's transcript watcher (hubd/doors/broker/proof.py), once it serves
        self.proofs: object | None = None
        self.seats = BrokerSeats(self.principal, self.namespace)  # handles it may speak for

    def handle_of(self, endpoint: int) -> str | None:
        binding = self.bindings.get(endpoint)
        return binding[0] if binding else None

    def via_of(self, endpoint: int) -> str | None:
        binding = self.bindings.get(endpoint)
        return binding[1] if binding else None

    def bind(self, endpoint: int, handle: str, via: str | None) -> None:
        binding = self.bindings.get(endpoint)
        if binding is not None and binding[0] == handle:
            binding[1] = via if via != handle else None  # still its listener, if it was
            return
        self.unbind(endpoint)
        self.bindings[endpoint] = [handle, via if via != handle else None]
        self.connected[handle] = self.connected.get(handle, 0) + 1

    def unbind(self, endpoint: int) -> None:
        binding = self.bindings.pop(endpoint, None)
        if binding is None:
            return
        handle = binding[0]
        left = self.connected.get(handle, 0) - 1
        if left > 0:
            self.connected[handle] = left
        else:
            self.connected.pop(handle, None)
        if self.listeners.get(handle) == endpoint:
            del self.listeners[handle]
            self.batcher.forget(handle)

    def rename(self, old: str, new: str) -> None:
        for binding in self.bindings.values():
            if binding[0] == old:
                binding[0] = new
            if binding[1] == old:
                binding[1] = new
        for table in (self.connected, self.listeners, self.natives):
            if old in table:
                table[new] = table.pop(old)
        self.batcher.forget(old)


def live_of(router: Router) -> BrokerLive:
    return router.live_of(BrokerLive)


def seat_refusal(router: Router, live: BrokerLive, handle_: str) -> str | None:
    """Why the broker may not speak for this handle's seat (hubd/state/broker_seats.py)."""
    return live.seats.refusal(router.hub.identity.table, handle_)


def speaks_for(router: Router, live: BrokerLive, handle_: str) -> None:
    """Refuse (`forbidden`, before anything is journaled) a handle whose seat
    <namespace>/<handle> the broker may not speak for."""
    refusal = seat_refusal(router, live, handle_)
    if refusal is not None:
        raise Refusal(wire.FORBIDDEN, refusal)


# -- the messages a broker endpoint gets (its door writes each as one line)

def answer_message(request_id: int, result: dict) -> Message:
    return Message({"v": wire.PROTOCOL_VERSION, "id": request_id, "ok": True, "result": result})


def error_message(request_id: int | None, code: str, text: str, **extra) -> Message:
    error = {"code": code, "message": text, **extra}
    return Message({"v": wire.PROTOCOL_VERSION, "id": request_id, "ok": False, "error": error})


def event_message(event: str, payload) -> Message:
    return Message({"v": wire.PROTOCOL_VERSION, "type": "event", "event": event,
                    "payload": payload})


# -- commands

class _Deferred:
    """A verb that answers later (wait)."""


DEFERRED = _Deferred()


def handle(router: Router, endpoint: int, request: wire.Request, native=None) -> None:
    """One request line from a broker endpoint. Its answer is a message to the
    endpoint; if the events cannot be committed the answer is broker_down."""
    live = live_of(router)
    metrics = router.metrics
    metrics.broker_requests[request.type] = metrics.broker_requests.get(request.type, 0) + 1
    verb = VERBS[request.type]
    live.request_id = request.id
    router.acting = live.principal  # the events it journals record the broker's principal
    try:
        result = verb(router, live, endpoint, request.fields, native)
    except Refusal as refusal:
        metrics.broker_errors[refusal.code] = metrics.broker_errors.get(refusal.code, 0) + 1
        router.send(endpoint, error_message(request.id, refusal.code, refusal.message,
                                            **refusal.extra), ANSWER)
        return
    except REFUSALS as refused:
        text = router.refuse_command(refused)  # what it did so far is dropped
        code = wire.BAD_REQUEST if isinstance(refused, UnstorableEvent) else wire.BROKER_DOWN
        metrics.broker_errors[code] = metrics.broker_errors.get(code, 0) + 1
        router.send(endpoint, error_message(request.id, code, text), ANSWER)
        return
    finally:
        router.acting = None
    if result is DEFERRED:
        return
    router.send(endpoint, answer_message(request.id, result), ANSWER)
    if router.has_events():
        request_id = request.id
        router.send_on_failure(endpoint, ANSWER, lambda: error_message(
            request_id, wire.BROKER_DOWN, "The hub could not journal this request; nothing was "
                                          "changed. Retry later."))


def endpoint_closed(router: Router, endpoint: int) -> None:
    live = live_of(router)
    handle_ = live.handle_of(endpoint)
    live.unbind(endpoint)
    for thread_id, waiters in list(live.waiters.items()):
        kept = [w for w in waiters if w.endpoint != endpoint]
        for waiter in waiters:
            if waiter.endpoint == endpoint:
                router.cancel_timer(waiter.timer)
        if kept:
            live.waiters[thread_id] = kept
        else:
            del live.waiters[thread_id]
    if handle_ is not None and handle_ not in live.connected:
        native = live.natives.pop(handle_, None)
        if native is not None:
            native.close()


def tick(router: Router) -> None:
    """Once a second: notification batches whose window has ended."""
    live = live_of(router)
    for handle_, batch in live.batcher.due(router.now):
        endpoint = live.listeners.get(handle_)
        if endpoint is not None:
            router.send(endpoint, event_message("notification", batch), NOTIFICATION)


# -- journaling and what follows from each event

def _journal(router: Router, live: BrokerLive, decision: rules.Decision) -> dict:
    for kind, payload, route in decision.events:
        router.event(kind, payload, route)
        if kind == bs.MESSAGE:
            _after_message(router, live, payload["id"], route["states"])
        elif kind == bs.SESSION and payload.get("renamedFrom"):
            live.rename(payload["renamedFrom"], payload["handle"])
    return decision.result


def _push(router: Router, live: BrokerLive, handle_: str, message: bs.Message,
          encoded: list) -> None:
    endpoint = live.listeners.get(handle_)
    native = live.natives.get(handle_)
    if endpoint is None and native is None:
        return
    if not encoded:
        encoded.append(event_message("push", views.push_payload(message)))
    if endpoint is not None:
        router.send(endpoint, encoded[0], PUSH)
        router.metrics.broker_pushes += 1
        _expect_proof(router, handle_, message.id)
    if native is not None:
        push = encoded[0]
        router.after_release(lambda: native.deliver(push))


def _expect_proof(router: Router, handle_: str, message_id: int) -> None:
    """Once the push is out, watch the session's transcript for its tag."""
    session = bs.of(router.state).session_of(handle_)
    proofs = live_of(router).proofs
    if session is None or not session.transcript_path or proofs is None:
        return
    path = session.transcript_path
    router.after_release(lambda: proofs.expect(handle_, message_id, path))


def proven(router: Router, proven: dict) -> None:
    """Tags found in transcripts: those deliveries are delivered (if they still
    are the handle's and not further along)."""
    live = live_of(router)
    state = bs.of(router.state)
    router.acting = live.principal  # journaled as if the adapter had sent `delivered`
    try:
        for handle_, ids in proven.items():
            table = state.deliveries.get(handle_, {})
            ids = [i for i in ids if i in table]
            if ids:
                _journal(router, live, rules.decide_advance(state, handle_, ids, "delivered"))
    finally:
        router.acting = None


def _notify(router: Router, live: BrokerLive, handle_: str, item: dict) -> None:
    endpoint = live.listeners.get(handle_)
    if endpoint is None:
        return  # nobody to tell: the facts are in inbox, thread and collect
    batch = live.batcher.add(handle_, item, router.now)
    if batch is not None:
        router.send(endpoint, event_message("notification", batch), NOTIFICATION)


def _after_message(router: Router, live: BrokerLive, message_id: int, states: dict) -> None:
    state = bs.of(router.state)
    message = state.messages[message_id]
    encoded: list = []
    for recipient in message.to:
        if recipient not in state.peers:
            _to_hub(router, live, message, recipient)
            continue
        if states.get(recipient) == "sent":
            _push(router, live, recipient, message, encoded)
        elif recipient not in live.listeners:
            _notify(router, live, message.sender, views.notification(
                "peer_offline", handle=recipient, threadId=message.thread_id,
                messageId=message.id))
        elif message.mode == "silent" and message.reply_to is not None:
            _notify(router, live, recipient, views.notification(
                "reply_arrived", threadId=message.thread_id, messageId=message.id,
                fromHandle=message.sender))
    waiters = live.waiters.get(message.thread_id)
    if waiters:
        _check_waiters(router, live, message.thread_id, waiters)


def _mark_sent(router: Router, live: BrokerLive, handle_: str, ids: list[int],
               target: str) -> list[bs.Message]:
    """Journal that these deliveries left (pushed, fetched or hooked), and tell
    the senders whose messages had been queued."""
    state = bs.of(router.state)
    table = state.deliveries[handle_]
    was_queued = [i for i in ids if table[i] == "queued"]
    router.event(bs.DELIVERIES, {"handle": handle_, "ids": ids, "state": target})
    messages = [state.messages[i] for i in ids]
    for message_id in was_queued:
        message = state.messages[message_id]
        _notify(router, live, message.sender, views.notification(
            "queued_delivered", handle=handle_, threadId=message.thread_id,
            messageId=message_id))
    return messages


# -- waits

def _check_waiters(router: Router, live: BrokerLive, thread_id: int, waiters: list) -> None:
    kept = []
    for waiter in waiters:
        met, matrix = views.wait_condition(bs.of(router.state), thread_id, waiter.until)
        if met:
            router.cancel_timer(waiter.timer)
            router.send(waiter.endpoint, answer_message(waiter.request_id, {
                "threadId": thread_id, "conditionMet": True, "timedOut": False,
                "matrix": matrix}), ANSWER)
        else:
            kept.append(waiter)
    if kept:
        live.waiters[thread_id] = kept
    else:
        live.waiters.pop(thread_id, None)


def wait_expired(router: Router, command: WaitExpired) -> None:
    waiter = command.waiter
    live = live_of(router)
    waiters = live.waiters.get(waiter.thread_id, [])
    if waiter not in waiters:
        return  # answered already
    waiters.remove(waiter)
    if not waiters:
        live.waiters.pop(waiter.thread_id, None)
    met, matrix = views.wait_condition(bs.of(router.state), waiter.thread_id, waiter.until)
    router.send(waiter.endpoint, answer_message(waiter.request_id, {
        "threadId": waiter.thread_id, "conditionMet": met, "timedOut": True,
        "matrix": matrix}), ANSWER)


# -- the hub side

def hub_target_check(router: Router):
    def check(target: str) -> str | None:
        remote = parse_remote(target)
        if remote is None:
            return None  # a seat on this hub: delivered, mailboxed or dead-lettered as a chat
        if isinstance(remote, RemoteTargetError):
            return remote.text
        remote_hubs = router.installed.remote_hubs
        if remote_hubs is None or not remote_hubs.knows(remote.hub):
            return f"Hub '{remote.hub}' is not a configured message peer of this hub."
        refused = remote_hubs.refusal(router, remote.hub)
        if refused is not None:  # the forward backlog is full: nothing is journaled
            raise Refusal(wire.RATE_LIMITED, refused)
        return None
    return check


def hub_text(message: bs.Message, namespace: str) -> str:
    """What a hub seat sees: the push text with a footer saying how to answer
    over the hub."""
    lines = views.push_text(message).split("\n")
    lines[-1] = (f"(reply: a chat to {namespace}/{message.sender} starting \"m{message.id}: \" "
                 f"or \"m{message.id} agree: \" (or disagree, info), or with reply_to "
                 f"\"m{message.id}\")")
    return "\n".join(lines)


def _to_hub(router: Router, live: BrokerLive, message: bs.Message, target: str) -> None:
    """A broker message for a hub seat: an ordinary chat from <ns>/<sender>."""
    state = bs.of(router.state)
    if message.sender not in state.peers:
        return  # a hub seat's reply is not relayed to other hub seats (docs/broker.md)
    from hubd.handlers.chat import route_chat

    seat = f"{live.namespace}/{message.sender}"
    frame = {"type": "chat", "target": target, "payload": hub_text(message, live.namespace),
             "metadata": {"broker": {"messageId": message.id, "threadId": message.thread_id,
                                     "seq": message.seq, "verdict": message.verdict}}}
    remote = parse_remote(target)
    if remote is None:
        route_chat(router, frame, seat)
    else:
        # the backlog was checked when the message was decided (hub_target_check)
        router.installed.remote_hubs.forward_from(router, seat, frame, remote, False)


def broker_seat(router: Router, item: str) -> str | None:
    """The handle a hub target item names, when it is <ns>/<handle> of a peer
    the broker may speak for (a seat a principal holds is that principal's)."""
    live = live_of(router)
    head, sep, rest = item.partition("/")
    if sep and head == live.namespace and rest in bs.of(router.state).peers \
            and seat_refusal(router, live, rest) is None:
        return rest
    return None


@dataclass
class HubChatPlan:
    """What a hub chat to local/<handle> seats will do to the broker, decided
    before the chat is journaled (the seats it reaches are its recipients)."""

    seats: list
    decide: list  # callables, each making one decision on the state as it is then

    def journal(self, router: Router) -> None:
        live = live_of(router)
        for make in self.decide:
            _journal(router, live, make())


def plan_hub_chat(router: Router, frame: dict, sender: str, target) -> HubChatPlan | None:
    """A chat from the hub side to local/<handle>: a reply when it names a message
    of a thread the handle takes part in, else a new thread in the handle's inbox.
    A handle that refuses it (its inbox is full) is not reached."""
    handles = [h for item, glob in zip(target.items, target.globs)
               if not glob and (h := broker_seat(router, item)) is not None]
    if not handles:
        return None
    live = live_of(router)
    state = bs.of(router.state)
    payload = frame.get("payload")
    body = payload if isinstance(payload, str) and payload.strip() else wire_text(payload)
    reply = rules.parse_hub_reply(frame, body)
    if reply is not None and reply.message_id in state.messages:
        fields = {"messageId": reply.message_id, "body": reply.body}
        if reply.verdict:
            fields["verdict"] = reply.verdict

        def make_reply() -> rules.Decision:
            return rules.decide_reply(bs.of(router.state), sender, None, fields, router.now,
                                      live.listeners, live.limits, from_hub=True)
        try:
            reached = set(make_reply().events[0][1]["to"])
        except Refusal as refusal:
            log.info("hub reply to a broker thread refused", sender=sender, code=refusal.code,
                     reason=refusal.message)
            reached = set()
        seats = [f"{live.namespace}/{h}" for h in handles if h in reached]
        if seats:
            return HubChatPlan(seats, [make_reply])
    seats, decide = [], []
    for handle_ in handles:
        def make_chat(handle_=handle_) -> rules.Decision:
            return rules.decide_hub_chat(bs.of(router.state), sender, handle_, body, router.now,
                                         live.listeners, live.limits)
        try:
            make_chat()
        except Refusal as refusal:
            log.info("hub chat to a broker handle refused", handle=handle_, sender=sender,
                     code=refusal.code, reason=refusal.message)
            continue
        seats.append(f"{live.namespace}/{handle_}")
        decide.append(make_chat)
    return HubChatPlan(seats, decide) if seats else None


def wire_text(value) -> str:
    from hubd.wire import codec

    return codec.encode(value).decode()


# -- the verbs

def _bound(router: Router, live: BrokerLive, endpoint: int) -> str:
    handle_ = live.handle_of(endpoint)
    if handle_ is None:
        raise Refusal(wire.BAD_REQUEST, "This connection has no handle yet: register or "
                                        "session first.")
    speaks_for(router, live, handle_)  # the principal's seats may have changed since
    return handle_


def _known(router: Router, live: BrokerLive, handle_: str) -> str:
    if handle_ not in bs.of(router.state).peers:
        raise Refusal(wire.UNKNOWN_HANDLE, f"No handle '{handle_}' on this broker.")
    speaks_for(router, live, handle_)
    return handle_


def _thread(state: bs.BrokerState, thread_id: int) -> bs.Thread:
    thread = state.threads.get(thread_id)
    if thread is None:
        raise Refusal(wire.UNKNOWN_THREAD, f"No thread {thread_id}.")
    return thread


def v_auth(router, live, endpoint, f, native):
    raise Refusal(wire.BAD_REQUEST, "This connection is authenticated already.")


def v_register(router, live, endpoint, f, native):
    state = bs.of(router.state)
    decision = rules.decide_register(state, f, router.now)
    speaks_for(router, live, decision.result["handle"])
    result = _journal(router, live, decision)
    via = rules.resolve_via(state, f.get("ancestors") or ())
    live.bind(endpoint, result["handle"], via)
    return dict(result, via=live.via_of(endpoint))


def v_session(router, live, endpoint, f, native):
    state = bs.of(router.state)
    decision = rules.decide_session(state, f, router.now)
    handle_ = decision.result["handle"]
    speaks_for(router, live, handle_)  # a title's slug may rename the handle
    previous = decision.events[0][1].get("renamedFrom")
    if f.get("listen") and previous not in live.listeners and handle_ not in live.listeners \
            and len(live.listeners) >= MAX_LISTENERS:
        raise Refusal(wire.BAD_REQUEST, f"The broker serves at most {MAX_LISTENERS} listening "
                                        "connections.")
    _journal(router, live, decision)
    live.bind(endpoint, handle_, None)
    if native is not None:
        _set_native(live, handle_, native)
    if f.get("listen"):
        live.listeners[handle_] = endpoint
        pending = rules.pending_pushes(state, handle_, bs.UNREAD_CAP)
        if pending:
            for message in _mark_sent(router, live, handle_, pending, "sent"):
                router.send(endpoint, event_message("push", views.push_payload(message)), PUSH)
                router.metrics.broker_pushes += 1
                _expect_proof(router, handle_, message.id)
    return decision.result


def _set_native(live: BrokerLive, handle_: str, native) -> None:
    old = live.natives.get(handle_)
    if old is not None and old is not native:
        old.close()
    live.natives[handle_] = native


def v_delivered(router, live, endpoint, f, native):
    handle_ = _bound(router, live, endpoint)
    _journal(router, live, rules.decide_advance(bs.of(router.state), handle_, f["ids"],
                                                "delivered"))
    return {"delivered": list(dict.fromkeys(f["ids"]))}


def v_ack(router, live, endpoint, f, native):
    handle_ = _bound(router, live, endpoint)
    _journal(router, live, rules.decide_advance(bs.of(router.state), handle_, f["ids"],
                                                "acknowledged"))
    return {"acknowledged": list(dict.fromkeys(f["ids"]))}


def v_send(router, live, endpoint, f, native):
    handle_ = _bound(router, live, endpoint)
    return _journal(router, live, rules.decide_send(
        bs.of(router.state), handle_, live.via_of(endpoint), f, router.now, live.listeners,
        live.namespace, hub_target_check(router), live.limits))


def v_reply(router, live, endpoint, f, native):
    handle_ = _bound(router, live, endpoint)
    return _journal(router, live, rules.decide_reply(
        bs.of(router.state), handle_, live.via_of(endpoint), f, router.now, live.listeners,
        live.limits))


def v_read(router, live, endpoint, f, native):
    state = bs.of(router.state)
    _journal(router, live, rules.decide_read(state, live.handle_of(endpoint), f["ids"]))
    return {"messages": [views.message_view(state.messages[i], True)
                         for i in dict.fromkeys(f["ids"])]}


def v_inbox(router, live, endpoint, f, native):
    return views.inbox_view(bs.of(router.state), _bound(router, live, endpoint), f["unreadOnly"])


def v_thread(router, live, endpoint, f, native):
    state = bs.of(router.state)
    thread = _thread(state, f["threadId"])
    message_id = f.get("messageId")
    if message_id is not None and message_id not in thread.messages:
        raise Refusal(wire.BAD_REQUEST, f"Message m{message_id} is not in thread {thread.id}.")
    return views.thread_view(state, thread.id, f["sinceSeq"], f["full"], message_id)


def v_collect(router, live, endpoint, f, native):
    state = bs.of(router.state)
    return views.collect_view(state, _thread(state, f["threadId"]).id)


def v_wait(router, live, endpoint, f, native):
    state = bs.of(router.state)
    thread = _thread(state, f["threadId"])
    timeout_ms = f.get("timeoutMs", bs.WAIT_DEFAULT_MS)
    met, matrix = views.wait_condition(state, thread.id, f["until"])
    if met or timeout_ms == 0:
        return {"threadId": thread.id, "conditionMet": met, "timedOut": not met,
                "matrix": matrix}
    waiter = Waiter(endpoint, live.request_id, thread.id, f["until"])
    live.waiters.setdefault(thread.id, []).append(waiter)
    waiter.timer = router.at(router.now + timeout_ms / 1000, WaitExpired(waiter))
    return DEFERRED


def v_groups(router, live, endpoint, f, native):
    return _journal(router, live, rules.decide_groups(bs.of(router.state), f))


def v_status(router, live, endpoint, f, native):
    return views.status_view(bs.of(router.state), router.now, live.connected, live.listeners)


def v_prune(router, live, endpoint, f, native):
    return _journal(router, live, rules.decide_prune(bs.of(router.state), live.connected))


def v_hook(router, live, endpoint, f, native):
    state = bs.of(router.state)
    handle_ = f.get("handle")
    if handle_ is None and f.get("sessionHint"):
        for session in state.sessions.values():
            if session.cli_session_id == f["sessionHint"]:
                handle_ = session.handle
    if handle_ is None:
        handle_ = live.handle_of(endpoint)
    if handle_ is None:
        raise Refusal(wire.UNKNOWN_HANDLE, "hook: no handle, session hint or bound handle.")
    _known(router, live, handle_)
    ids = rules.pending_pushes(state, handle_, HOOK_MESSAGES, states=("queued", "sent"))
    messages = _mark_sent(router, live, handle_, ids, "delivered") if ids else []
    texts = [views.push_text(m) for m in messages]
    return {"handle": handle_, "event": f["event"], "count": len(messages),
            "messages": [views.message_view(m, True) for m in messages],
            "text": "\n\n".join(texts)}


def v_native_register(router, live, endpoint, f, native):
    _known(router, live, f["handle"])
    _set_native(live, f["handle"], native)
    return {}


def v_fetch_push(router, live, endpoint, f, native):
    state = bs.of(router.state)
    handle_ = _known(router, live, f["handle"])
    ids = rules.pending_pushes(state, handle_, f["limit"])
    messages = _mark_sent(router, live, handle_, ids, "sent") if ids else []
    return {"messages": [views.message_view(m, True) for m in messages],
            "texts": [views.push_text(m) for m in messages]}


VERBS = {"auth": v_auth, "register": v_register, "session": v_session,
         "delivered": v_delivered, "send": v_send, "reply": v_reply, "ack": v_ack,
         "read": v_read, "inbox": v_inbox, "thread": v_thread, "collect": v_collect,
         "wait": v_wait, "groups": v_groups, "status": v_status, "prune": v_prune,
         "hook": v_hook, "native-register": v_native_register, "fetch-push": v_fetch_push}
assert set(VERBS) == set(wire.VERBS)

"""What follows from each broker event, inside the same Router command:
pushes to listening connections and native sockets, notifications (batched),
waits met, the transcript watcher told what to look for, and a message for
a hub seat routed as a chat. Everything here is output through the Router's
API, released after the commit.
"""

from __future__ import annotations

from hubd.actors.router import Router
from hubd.core.message import Message
from hubd.state import broker as bs
from hubd.state import broker_rules as rules
from hubd.state import broker_views as views

from .. import routing
from .live import (ANSWER, DOOR, NOTIFICATION, PROOF, PUSH, BrokerLive, WaitExpired,
                   answer_message, event_message, listener, live_of)


def journal(router: Router, live: BrokerLive, decision: rules.Decision) -> dict:
    for kind, payload, route in decision.events:
        router.event(kind, payload, route)
        if kind == bs.MESSAGE:
            after_message(router, live, payload["id"], route["states"])
        elif kind == bs.SESSION and payload.get("renamedFrom"):
            router.presence.rename(DOOR, payload["renamedFrom"], payload["handle"])
            live.batcher.forget(payload["renamedFrom"])
    return decision.result


def push(router: Router, live: BrokerLive, handle: str, message: bs.Message,
         encoded: list) -> None:
    endpoint = listener(router, handle)
    native = router.presence.push_only_endpoint(DOOR, handle)
    if endpoint is None and native is None:
        return
    if not encoded:
        encoded.append(event_message("push", views.push_payload(message)))
    if endpoint is not None:
        router.send(endpoint, encoded[0], PUSH)
        router.metrics.broker_pushes += 1
        expect_proof(router, handle, message.id)
    if native is not None:
        router.send(native, encoded[0], PUSH)


def expect_proof(router: Router, handle: str, message_id: int) -> None:
    """Once the push is out, the door watches the session's transcript for its tag."""
    session = bs.of(router.state).session_of(handle)
    proofs = live_of(router).proofs
    if session is None or not session.transcript_path or proofs is None:
        return
    router.send(proofs, Message({"type": PROOF, "handle": handle, "messageId": message_id,
                                 "path": session.transcript_path}), PROOF)


def proven(router: Router, handle: str, ids: list[int]) -> None:
    """Tags found in a transcript: those deliveries are delivered (if they still
    are the handle's and not further along)."""
    live = live_of(router)
    state = bs.of(router.state)
    router.acting = live.principal  # journaled as if the adapter had sent `delivered`
    try:
        table = state.deliveries.get(handle, {})
        ids = [i for i in ids if i in table]
        if ids:
            journal(router, live, rules.decide_advance(state, handle, ids, "delivered"))
    finally:
        router.acting = None


def notify(router: Router, live: BrokerLive, handle: str, item: dict) -> None:
    endpoint = listener(router, handle)
    if endpoint is None:
        return  # nobody to tell: the facts are in inbox, thread and collect
    batch = live.batcher.add(handle, item, router.now)
    if batch is not None:
        router.send(endpoint, event_message("notification", batch), NOTIFICATION)


def tick(router: Router) -> None:
    """Once a second: notification batches whose window has ended."""
    live = live_of(router)
    for handle, batch in live.batcher.due(router.now):
        endpoint = listener(router, handle)
        if endpoint is not None:
            router.send(endpoint, event_message("notification", batch), NOTIFICATION)


def after_message(router: Router, live: BrokerLive, message_id: int, states: dict) -> None:
    state = bs.of(router.state)
    message = state.messages[message_id]
    encoded: list = []
    for recipient in message.to:
        if recipient not in state.peers:
            to_hub(router, live, message, recipient)
            continue
        if states.get(recipient) == "sent":
            push(router, live, recipient, message, encoded)
        elif listener(router, recipient) is None:
            notify(router, live, message.sender, views.notification(
                "peer_offline", handle=recipient, threadId=message.thread_id,
                messageId=message.id))
        elif message.mode == "silent" and message.reply_to is not None:
            notify(router, live, recipient, views.notification(
                "reply_arrived", threadId=message.thread_id, messageId=message.id,
                fromHandle=message.sender))
    waiters = live.waiters.get(message.thread_id)
    if waiters:
        check_waiters(router, live, message.thread_id, waiters)


def mark_sent(router: Router, live: BrokerLive, handle: str, ids: list[int],
              target: str) -> list[bs.Message]:
    """Journal that these deliveries left (pushed, fetched or hooked), and tell
    the senders whose messages had been queued."""
    state = bs.of(router.state)
    table = state.deliveries[handle]
    was_queued = [i for i in ids if table[i] == "queued"]
    router.event(bs.DELIVERIES, {"handle": handle, "ids": ids, "state": target})
    messages = [state.messages[i] for i in ids]
    for message_id in was_queued:
        message = state.messages[message_id]
        notify(router, live, message.sender, views.notification(
            "queued_delivered", handle=handle, threadId=message.thread_id,
            messageId=message_id))
    return messages


# -- waits

def check_waiters(router: Router, live: BrokerLive, thread_id: int, waiters: list) -> None:
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


# -- a message for a hub seat

def hub_text(message: bs.Message, namespace: str) -> str:
    """What a hub seat sees: the push text with a footer saying how to answer
    over the hub."""
    lines = views.push_text(message).split("\n")
    lines[-1] = (f"(reply: a chat to {namespace}/{message.sender} starting \"m{message.id}: \" "
                 f"or \"m{message.id} agree: \" (or disagree, info), or with reply_to "
                 f"\"m{message.id}\")")
    return "\n".join(lines)


def to_hub(router: Router, live: BrokerLive, message: bs.Message, target: str) -> None:
    """A broker message for a hub seat: an ordinary chat from <ns>/<sender>,
    wherever the target lives (its backlog to a peer hub was checked when
    the message was decided: hub_side.hub_target_check)."""
    state = bs.of(router.state)
    if message.sender not in state.peers:
        return  # a hub seat's reply is not relayed to other hub seats (docs/broker.md)
    seat = f"{live.namespace}/{message.sender}"
    frame = {"type": "chat", "target": target, "payload": hub_text(message, live.namespace),
             "metadata": {"broker": {"messageId": message.id, "threadId": message.thread_id,
                                     "seq": message.seq, "verdict": message.verdict}}}
    routing.send_chat(router, frame, seat)

"""What the shared verbs mean on the broker door.

The door (hubd/doors/broker/) turns each request line into a command of the
shared vocabulary on the Router's inbox: register and session are Register,
send and reply are Send, fetch-push is Take, delivered and ack are Ack, the
others Requests (`broker.inbox`, `broker.wait`, ...). Each carries the line's
verb, id and fields (and the endpoint of a native socket the door connected
for it). Here every one goes to its verb (verbs.py); its answer is a message
to the asking connection, released after the commit (a send answered ok is
durable), or broker_down if the commit fails. The connection's commands come
in line order on the one inbox, so their answers leave in that order.

The transcript watcher (hubd/doors/broker/proof.py) is an endpoint of its
own door, `broker-proofs`: the Router tells it what to watch for, and a tag
it finds comes back as an Ack (that delivery is delivered).
"""

from __future__ import annotations

from hubd.actors.router import Router
from hubd.core.refusals import REFUSALS
from hubd.core.plugin import Dialect
from hubd.state.broker_rules import Refusal
from hubd.state.events import UnstorableEvent
from hubd.state.presence import Session
from hubd.wire import broker as wire

from .live import ANSWER, DOOR, answer_message, error_message, live_of
from .outputs import proven
from .verbs import DEFERRED, VERBS


def handle(router: Router, session: Session, command) -> None:
    """One request line from a broker connection. Its answer is a message to
    the connection; if the events cannot be committed the answer is broker_down."""
    fields = command.fields
    name, request_id, native = fields["verb"], fields["id"], fields.get("native")
    endpoint = session.endpoint
    live = live_of(router)
    metrics = router.metrics
    metrics.broker_requests[name] = metrics.broker_requests.get(name, 0) + 1
    live.request_id = request_id
    router.acting = live.principal  # the events it journals record the broker's principal
    try:
        result = VERBS[name](router, live, session, fields["request"], native)
    except Refusal as refusal:
        metrics.broker_errors[refusal.code] = metrics.broker_errors.get(refusal.code, 0) + 1
        router.send(endpoint, error_message(request_id, refusal.code, refusal.message,
                                            **refusal.extra), ANSWER)
        result = None
    except REFUSALS as refused:
        text = router.refuse_command(refused)  # what it did so far is dropped
        code = wire.BAD_REQUEST if isinstance(refused, UnstorableEvent) else wire.BROKER_DOWN
        metrics.broker_errors[code] = metrics.broker_errors.get(code, 0) + 1
        router.send(endpoint, error_message(request_id, code, text), ANSWER)
        result = None
    finally:
        router.acting = None
    if native is not None and native not in router.presence.push_only.values():
        router.close(native, 1000, "not taken")  # the request did not take the socket
    if result is None or result is DEFERRED:  # refused (answered above), or a wait
        return
    router.send(endpoint, answer_message(request_id, result), ANSWER)
    if router.has_events():
        router.send_on_failure(endpoint, ANSWER, lambda: error_message(
            request_id, wire.BROKER_DOWN, "The hub could not journal this request; nothing was "
                                          "changed. Retry later."))


def closed(router: Router, session: Session) -> None:
    """A connection went away: what it served, listened for and waited on."""
    live = live_of(router)
    endpoint, handle = session.endpoint, session.serves
    if session.listening:
        live.batcher.forget(handle)
    for thread_id, waiters in list(live.waiters.items()):
        kept = [w for w in waiters if w.endpoint != endpoint]
        for waiter in waiters:
            if waiter.endpoint == endpoint:
                router.cancel_timer(waiter.timer)
        if kept:
            live.waiters[thread_id] = kept
        else:
            del live.waiters[thread_id]
    if handle is not None and not router.presence.serving(DOOR, handle):
        native = router.presence.set_push_only(DOOR, handle, None)
        if native is not None:
            router.close(native, 1000, "its handle has no connection left")


# -- the transcript watcher's endpoint

def proofs_opened(router: Router, session: Session, command) -> None:
    live_of(router).proofs = session.endpoint


def proofs_found(router: Router, session: Session, command) -> None:
    proven(router, command.identity, command.ids)


# a broker line that is not a shared verb (inbox, thread, wait, ...)
_OWN_VERBS = {f"broker.{name}": handle for name in VERBS if name not in wire.SHARED_VERBS}
DIALECTS = {DOOR: Dialect(closed=closed, register=handle, send=handle, take=handle, ack=handle,
                          requests=_OWN_VERBS),
            wire.PROOFS_DOOR: Dialect(opened=proofs_opened, ack=proofs_found)}

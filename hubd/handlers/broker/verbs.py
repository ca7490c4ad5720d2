"""The local broker's verbs (seed 004), each decided inside the Router.

A verb reads the broker's projection, decides with the pure rules
(hubd/state/broker_rules.py), journals the decision (outputs.journal: its
events and what follows from them) and returns its result, which the dialect
(dialect.py) answers to the asking connection after the commit. A verb
refuses with broker_rules.Refusal before anything is journaled. `native` is
the endpoint of a CLI's native socket the door connected for this request
(session with `native`, native-register), else None.
"""

from __future__ import annotations

from hubd.actors.router import Router
from hubd.state import broker as bs
from hubd.state import broker_rules as rules
from hubd.state import broker_views as views
from hubd.state.broker_rules import Refusal
from hubd.state.presence import Session
from hubd.wire import broker as wire

from .hub_side import hub_target_check
from .live import (DOOR, HOOK_MESSAGES, MAX_LISTENERS, PUSH, BrokerLive, Waiter, WaitExpired,
                   event_message, listening, speaks_for)
from .outputs import expect_proof, journal, mark_sent


class _Deferred:
    """A verb that answers later (wait)."""


DEFERRED = _Deferred()


def _bound(router: Router, live: BrokerLive, session: Session) -> str:
    handle = session.serves
    if handle is None:
        raise Refusal(wire.BAD_REQUEST, "This connection has no handle yet: register or "
                                        "session first.")
    speaks_for(router, live, handle)  # the principal's seats may have changed since
    return handle


def _known(router: Router, live: BrokerLive, handle: str) -> str:
    if handle not in bs.of(router.state).peers:
        raise Refusal(wire.UNKNOWN_HANDLE, f"No handle '{handle}' on this broker.")
    speaks_for(router, live, handle)
    return handle


def _thread(state: bs.BrokerState, thread_id: int) -> bs.Thread:
    thread = state.threads.get(thread_id)
    if thread is None:
        raise Refusal(wire.UNKNOWN_THREAD, f"No thread {thread_id}.")
    return thread


def _connected(router: Router):
    return router.presence.identities_served(DOOR)


def v_auth(router, live, session, f, native):
    raise Refusal(wire.BAD_REQUEST, "This connection is authenticated already.")


def v_register(router, live, session, f, native):
    state = bs.of(router.state)
    decision = rules.decide_register(state, f, router.now)
    speaks_for(router, live, decision.result["handle"])
    result = journal(router, live, decision)
    via = rules.resolve_via(state, f.get("ancestors") or ())
    _serve(router, live, session, result["handle"], via)
    return dict(result, via=session.via)


def v_session(router, live, session, f, native):
    state = bs.of(router.state)
    decision = rules.decide_session(state, f, router.now)
    handle = decision.result["handle"]
    speaks_for(router, live, handle)  # a title's slug may rename the handle
    previous = decision.events[0][1].get("renamedFrom")
    listeners = listening(router)
    if f.get("listen") and previous not in listeners and handle not in listeners \
            and len(listeners) >= MAX_LISTENERS:
        raise Refusal(wire.BAD_REQUEST, f"The broker serves at most {MAX_LISTENERS} listening "
                                        "connections.")
    journal(router, live, decision)
    _serve(router, live, session, handle, None)
    if native is not None:
        set_native(router, handle, native)
    if f.get("listen"):
        router.presence.listen(session)
        pending = rules.pending_pushes(state, handle, bs.UNREAD_CAP)
        if pending:
            for message in mark_sent(router, live, handle, pending, "sent"):
                router.send(session.endpoint, event_message("push",
                                                            views.push_payload(message)), PUSH)
                router.metrics.broker_pushes += 1
                expect_proof(router, handle, message.id)
    return decision.result


def _serve(router: Router, live: BrokerLive, session: Session, handle: str,
           via: str | None) -> None:
    """The connection serves `handle` from now on (acting through `via`); a
    handle it listened for before loses its pending notification batch."""
    old = session.serves
    if old is not None and old != handle and \
            router.presence.listener(DOOR, old) == session.endpoint:
        live.batcher.forget(old)
    router.presence.serve(session, handle, via)


def set_native(router: Router, handle: str, endpoint: int) -> None:
    """The handle's pushes go to this CLI's native socket too (the one it had
    before is closed)."""
    replaced = router.presence.set_push_only(DOOR, handle, endpoint)
    if replaced is not None:
        router.close(replaced, 1000, "replaced by a newer native socket")


def v_delivered(router, live, session, f, native):
    handle = _bound(router, live, session)
    journal(router, live, rules.decide_advance(bs.of(router.state), handle, f["ids"],
                                               "delivered"))
    return {"delivered": list(dict.fromkeys(f["ids"]))}


def v_ack(router, live, session, f, native):
    handle = _bound(router, live, session)
    journal(router, live, rules.decide_advance(bs.of(router.state), handle, f["ids"],
                                               "acknowledged"))
    return {"acknowledged": list(dict.fromkeys(f["ids"]))}


def v_send(router, live, session, f, native):
    handle = _bound(router, live, session)
    return journal(router, live, rules.decide_send(
        bs.of(router.state), handle, session.via, f, router.now, listening(router),
        live.namespace, hub_target_check(router, handle), live.limits))


def v_reply(router, live, session, f, native):
    handle = _bound(router, live, session)
    return journal(router, live, rules.decide_reply(
        bs.of(router.state), handle, session.via, f, router.now, listening(router),
        live.limits))


def v_read(router, live, session, f, native):
    state = bs.of(router.state)
    journal(router, live, rules.decide_read(state, session.serves, f["ids"]))
    return {"messages": [views.message_view(state.messages[i], True)
                         for i in dict.fromkeys(f["ids"])]}


def v_inbox(router, live, session, f, native):
    return views.inbox_view(bs.of(router.state), _bound(router, live, session), f["unreadOnly"])


def v_thread(router, live, session, f, native):
    state = bs.of(router.state)
    thread = _thread(state, f["threadId"])
    message_id = f.get("messageId")
    if message_id is not None and message_id not in thread.messages:
        raise Refusal(wire.BAD_REQUEST, f"Message m{message_id} is not in thread {thread.id}.")
    return views.thread_view(state, thread.id, f["sinceSeq"], f["full"], message_id)


def v_collect(router, live, session, f, native):
    state = bs.of(router.state)
    return views.collect_view(state, _thread(state, f["threadId"]).id)


def v_wait(router, live, session, f, native):
    state = bs.of(router.state)
    thread = _thread(state, f["threadId"])
    timeout_ms = f.get("timeoutMs", bs.WAIT_DEFAULT_MS)
    met, matrix = views.wait_condition(state, thread.id, f["until"])
    if met or timeout_ms == 0:
        return {"threadId": thread.id, "conditionMet": met, "timedOut": not met,
                "matrix": matrix}
    waiter = Waiter(session.endpoint, live.request_id, thread.id, f["until"])
    live.waiters.setdefault(thread.id, []).append(waiter)
    waiter.timer = router.at(router.now + timeout_ms / 1000, WaitExpired(waiter))
    return DEFERRED


def v_groups(router, live, session, f, native):
    return journal(router, live, rules.decide_groups(bs.of(router.state), f))


def v_status(router, live, session, f, native):
    return views.status_view(bs.of(router.state), router.now, _connected(router),
                             listening(router))


def v_prune(router, live, session, f, native):
    return journal(router, live, rules.decide_prune(bs.of(router.state), _connected(router)))


def v_hook(router, live, session, f, native):
    state = bs.of(router.state)
    handle = f.get("handle")
    if handle is None and f.get("sessionHint"):
        for cli_session in state.sessions.values():
            if cli_session.cli_session_id == f["sessionHint"]:
                handle = cli_session.handle
    if handle is None:
        handle = session.serves
    if handle is None:
        raise Refusal(wire.UNKNOWN_HANDLE, "hook: no handle, session hint or bound handle.")
    _known(router, live, handle)
    ids = rules.pending_pushes(state, handle, HOOK_MESSAGES, states=("queued", "sent"))
    messages = mark_sent(router, live, handle, ids, "delivered") if ids else []
    texts = [views.push_text(m) for m in messages]
    return {"handle": handle, "event": f["event"], "count": len(messages),
            "messages": [views.message_view(m, True) for m in messages],
            "text": "\n\n".join(texts)}


def v_native_register(router, live, session, f, native):
    _known(router, live, f["handle"])
    set_native(router, f["handle"], native)
    return {}


def v_fetch_push(router, live, session, f, native):
    state = bs.of(router.state)
    handle = _known(router, live, f["handle"])
    ids = rules.pending_pushes(state, handle, f["limit"])
    messages = mark_sent(router, live, handle, ids, "sent") if ids else []
    return {"messages": [views.message_view(m, True) for m in messages],
            "texts": [views.push_text(m) for m in messages]}


VERBS = {"auth": v_auth, "register": v_register, "session": v_session,
         "delivered": v_delivered, "send": v_send, "reply": v_reply, "ack": v_ack,
         "read": v_read, "inbox": v_inbox, "thread": v_thread, "collect": v_collect,
         "wait": v_wait, "groups": v_groups, "status": v_status, "prune": v_prune,
         "hook": v_hook, "native-register": v_native_register, "fetch-push": v_fetch_push}
assert set(VERBS) == set(wire.VERBS)

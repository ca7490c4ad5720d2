"""Event-log pull, serving side: `multihub_log_request` -> `multihub_log_snapshot`.

Served only to a peer that holds a grant in the serving policy and presents its
pinned client certificate on this connection, and then only the events of the
namespaces its grant names: every other event is a `withheld` placeholder at
its seq (federation/logscope.py), so the log stays contiguous. Anyone else gets the same empty
shape as "no new events" (with `log_end_seq: null`, exactly as the reference
hub answers, so a follower cannot tell a refusal from a quiet log by content
alone beyond that documented field).

The journal is read on the reader threads; events are copied into the reply as
the JSON text they are stored as (orjson fragments), never re-encoded, so what a
peer fingerprints is byte-for-byte what this hub journaled. Beside them goes
the rows' hash chain and the signed checkpoints in the page's range
(federation/log_chain.py), which the follower checks.
"""

from __future__ import annotations

import asyncio
import sqlite3

import orjson
import structlog

from federation import logscope
from federation.handlers.receiver import authorise_peer, peer_alive
from federation.log_chain import served_chain
from hubd.actors.router import Router
from hubd.journal.store import PULL_CURSOR_META
from hubd.core.plugin import Verbs
from hubd.core.message import Message
from hubd.state.presence import Session
from hubd.wire.envelope import strict_int

log = structlog.get_logger("hubd.federation.logpull")

# this module's verbs (its plugin installs them)
verbs = Verbs()

MAX_EVENTS = 2000  # per snapshot; a follower pages by asking again from next_cursor
MAX_BYTES = 4 * 1024 * 1024
CHAIN_BYTES = 200  # an event's entry in the page's chain field, at most
NOTE_STEP = 500  # a peer's pull cursor is noted again once it moved this far (_note_pull)
# pulls read at once, for all peers: a follower asks for one page at a time, so
# more is a peer pipelining requests; the rest get "nothing now" and ask again
IN_FLIGHT = 8


def _policy_of(router: Router):
    return router.hub.federation.serving_policy


def _decoded(payload):
    try:
        return orjson.loads(payload)
    except orjson.JSONDecodeError:
        return None


def _snapshot(router: Router, target: str, events: list, next_cursor: int,
              log_end_seq, served: frozenset | None = None,
              page_chain: dict | None = None) -> Message:
    fields = {}
    if served is not None:
        # the namespaces this peer's grant shows; others' events are withheld
        fields["served_namespaces"] = sorted(served)
    if page_chain is not None:
        # the rows' hash chain and signed checkpoints (federation/log_chain.py)
        fields["chain"] = page_chain
    frame = router.frame("multihub_log_snapshot", target, "Multi-hub log snapshot",
                         events=events, next_cursor=next_cursor, log_end_seq=log_end_seq,
                         **fields)
    # the events are orjson fragments (their stored text): encoded now, once
    return Message(frame, orjson.dumps(frame))


async def _note_pull(hub, peer: str, after: int) -> None:
    """Where this peer asks from, in the journal's meta (not an event): `hubd
    journal compact` keeps what a follower still re-reads (docs/journal.md,
    "Compaction"). Written when it goes back, or forward by NOTE_STEP: each
    write is a commit (an fsync) on the writer's thread, and a value behind
    the truth only keeps more rows."""
    noted = hub.federation.pulls_noted
    last = noted.get(peer)
    store = hub.writer.store
    if store is None or (last is not None and last <= after < last + NOTE_STEP):
        return
    noted[peer] = after
    try:
        await hub.writer.call(store.set_meta, f"{PULL_CURSOR_META}{peer}", str(after))
    except sqlite3.Error as exc:
        noted.pop(peer, None)
        log.warning("could not note a peer's log-pull cursor", peer=peer, error=repr(exc))


@verbs.handles("multihub_log_request", peers=True)
def log_request(router: Router, session: Session, frame: dict, size: int) -> None:
    target = session.peer_hub or session.name or "all"
    sender = frame.get("sender")
    after = strict_int(frame.get("after_seq"))
    limit = frame.get("limit")
    decision = authorise_peer(router, session, sender, None)
    if decision is None or not decision.allowed:
        log.info("log pull refused", sender=sender,
                 reason=decision.detail if decision else "no serving policy")
        cursor = after if after is not None and after >= 0 else 0
        router.send(session.endpoint, _snapshot(router, target, [], cursor, None))
        return
    peer_alive(router, session)
    granted = _policy_of(router).granted_namespaces(sender, session.peer_cert, router.now)
    if after is None or after < 0 or (limit is not None and (strict_int(limit) is None
                                                             or limit <= 0)):
        router.send(session.endpoint, _snapshot(router, target, [], 0, None))
        return
    count = min(limit or MAX_EVENTS, MAX_EVENTS)
    endpoint, hub = session.endpoint, router.hub
    serving = hub.federation.log_pulls
    if len(serving) >= IN_FLIGHT:
        log.warning("log pull answered 'nothing now': too many being read", peer=target,
                    in_flight=len(serving))
        router.send(endpoint, _snapshot(router, target, [], after, None))
        return

    async def serve() -> None:
        rows, prev, signed = await hub.read_journal("chain_page", after, count)
        end = await hub.read_journal("max_seq")
        events, shown, used, cursor = [], [], 0, after
        for seq, ts, kind, payload, *_ in rows:
            used += len(payload) + 64 + CHAIN_BYTES
            if events and used > MAX_BYTES:
                break
            withheld = logscope.withheld_reason(kind, _decoded(payload), granted)
            if withheld is None:
                events.append({"seq": seq, "ts": ts, "kind": kind,
                               "payload": orjson.Fragment(payload)})
            else:
                events.append(logscope.placeholder(seq, ts, withheld))
            shown.append(withheld is None)
            cursor = seq
        page_chain = None
        if prev is not None:
            page_chain = served_chain(prev, rows[:len(events)], shown,
                                      [cp for cp in signed if cp.seq <= cursor])
        hub.endpoints.deliver(endpoint, _snapshot(router, target, events, cursor, end,
                                                  granted, page_chain))
        await _note_pull(hub, sender, after)

    ticket = object()  # the pull's place in `serving` (the bound) until its task starts
    serving.add(ticket)

    def start() -> None:
        serving.discard(ticket)
        task = asyncio.get_running_loop().create_task(serve(), name=f"log-pull-{target}")
        serving.add(task)
        task.add_done_callback(serving.discard)
        hub.track(task)

    # Started once this command is released, so the page goes out after every
    # answer the link's earlier frames got (they wait for the writer's commit;
    # the page does not), as the mailbox and inbox pages do.
    router.after_release(start)

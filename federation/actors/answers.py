"""Where a peer's answers go: the PeerLink's correlation table, kept by the
link and consulted only in its reader task.

A request waits on a future it handed the link (federation/actors/link.py
`Ask`): matched by the id the answer echoes (a forward_id or request_id), or
in order when the answer echoes none (log snapshots; the reference hub's
claim results). A waiter leaves the table however its future ends (answered,
failed when the link went down, or cancelled by an asker that gave up), so
the table holds only live waiters; a waiter that gave up is skipped, never
handed an answer meant for the next one. Forward results nobody waits for
(the outbox's forwards) go to the link's subscribers.
"""

from __future__ import annotations

import asyncio
from collections import deque
from functools import partial
from typing import Callable

import structlog

log = structlog.get_logger("hubd.federation.link")


class Answers:
    def __init__(self, peer: str, on_result: Callable[[str, dict], None],
                 on_rejected: Callable[[str, str], None]):
        self.peer = peer
        self.on_result, self.on_rejected = on_result, on_rejected
        self._by_key: dict[str, asyncio.Future] = {}  # answers that echo an id
        self._in_order: dict[str, deque] = {}  # reply type -> waiters, for answers without one
        # reply type -> keyed waiters that also take an answer echoing no id
        self._keyed_in_order: dict[str, deque] = {}

    def __len__(self) -> int:
        return len(self._by_key) + sum(len(w) for w in self._in_order.values())

    def expect(self, reply: asyncio.Future, key: str | None, reply_type: str | None) -> None:
        """`reply` waits for the answer echoing `key`, or with no key the
        next answer of `reply_type`. With both, an answer of that type that
        echoes no id at all (the reference hub's multihub_claim_result) is
        matched in order among such waiters."""
        if key is None:
            self._in_order.setdefault(reply_type, deque()).append(reply)
        else:
            self._by_key[key] = reply
            if reply_type is not None:
                self._keyed_in_order.setdefault(reply_type, deque()).append(reply)
        reply.add_done_callback(partial(self._forget, key, reply_type))

    def _forget(self, key: str | None, reply_type: str | None, reply: asyncio.Future) -> None:
        if key is not None and self._by_key.get(key) is reply:
            del self._by_key[key]
        table = self._in_order if key is None else self._keyed_in_order
        waiting = table.get(reply_type)
        if waiting and reply in waiting:
            waiting.remove(reply)

    def route(self, frame: dict) -> None:
        kind = frame.get("type")
        if kind == "multihub_message_result_batch":
            results = frame.get("results")
            if isinstance(results, list):
                for result in results:
                    if isinstance(result, dict):
                        self.on_result(self.peer, result)
        elif kind == "multihub_message_result":
            waiter = self._by_key.get(frame.get("forward_id"))
            if waiter is None:
                self.on_result(self.peer, frame)
            else:
                _answer(waiter, frame)
        elif kind in ("multihub_log_snapshot", "multihub_claim_result"):
            rid = frame.get("request_id")
            if isinstance(rid, str):
                # only the request it names (never another keyed one: a late
                # answer to a request that gave up must not answer the next)
                waiter = self._by_key.get(rid)
            else:
                waiter = _first_live(self._keyed_in_order.get(kind))
            if waiter is None:
                waiter = _first_live(self._in_order.get(kind))
            if waiter is not None:
                _answer(waiter, frame)
        elif kind == "error":
            text = str(frame.get("payload", ""))
            if "'multihub_message_forward'" in text:
                # A hub older than wire v5 does not know the verb at all.
                self.on_rejected(self.peer, text)
            else:
                log.warning("peer sent an error", peer=self.peer, error=text)

    def fail_all(self, error: Exception) -> None:
        """The link went down: every waiting request hears it."""
        waiters = list(self._by_key.values())
        for waiting in self._in_order.values():
            waiters.extend(waiting)
        for waiter in waiters:
            if not waiter.done():
                waiter.set_exception(error)


def _first_live(waiting: deque | None) -> asyncio.Future | None:
    while waiting:
        waiter = waiting[0]
        if not waiter.done():
            return waiter
        waiting.popleft()  # gave up; its done callback may not have run yet
    return None


def _answer(waiter: asyncio.Future, frame: dict) -> None:
    if not waiter.done():
        waiter.set_result(frame)

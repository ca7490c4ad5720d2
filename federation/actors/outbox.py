"""ForwardOutbox: one actor per peer hub, sending the forwards journaled for it until each settles.

Its one inbox is a Mailbox that never blocks whoever posts to it (its
messages: federation/actors/outbox_messages.py):
- rows, from the Router once a chat and its outbox row are committed;
- the link's events (up, down, an answer, a pre-v5 peer refusing the verb),
  a sign of life from the peer outside this link, a roster (who) request,
  and the ticks of its own timer.
What it learns goes back to the Router as messages (`report`): settlements,
"still pending" notices, the peer's retry schedule to journal, roster
answers. It reads no one's state and no one reads its own but /health and
/metrics (figures only): what it knows of its link (up, batching, since when,
the last error) is what the link's events said; it only posts frames on the
link's inbox (`send`, refused at once when the link is down or full) and
pokes it (`wake`).

Memory is bounded whatever the backlog. The journal is the durable outbox;
the actor holds at most RESIDENT forwards (body, attempts, timers). Past
that it keeps only a cursor, the highest seq it holds: every unsettled row
at or below it is held, and the rows above it are read back from the
journal, oldest first, as room frees up (`load`: the Router's index names
the unsettled seqs, the journal reader gives their bodies), the way Matrix's
federation sender catches a destination up from its durable watermark. A
row the mailbox had no room for is left to that catch-up too.

Retries: a forward that timed out or was refused for a transient reason waits
1, 2, 4 ... 300 s (jittered) before its next attempt. A link that went down
and came back drains everything at once: the backoff clock is for a peer that
answers "not now", not for a peer that was away. The attempt counter of a
forward resets only after its link has been up for a while, so a flapping link
cannot turn into a tight retry loop. A sign of life from the peer sends the
forwards that got no answer again at once, but not those the peer refused for
now (hubd/state/forward_table.py: WAITING vs HELD).

The peer's retry schedule (its attempt count and next due time, and whether
it refused or did not answer) is journaled whenever its count or kind
changes, and cleared when the peer accepts again. When the outbox starts it
reads it with its first load: if that retry is not due yet, the backlog it
reads from the journal waits for it (in HELD or WAITING, with the journaled
count), and this hub's first link-up does not release it, since it was this
hub that was away, not the peer (docs/federation.md, "Retries across a restart").
"""

from __future__ import annotations

import asyncio
import heapq
import secrets
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Callable

import structlog

from federation.actors.outbox_messages import (TICK, Answer, LinkDown, LinkUp, Load, PeerAlive,
                                               Rejected, Resync, RetrySchedule, Roster,
                                               RosterAnswer, Settled, StillPending, Tick)
from federation.clock import SYSTEM, PeerRetry, next_retry, restored_wait, retry_to_journal
from federation.delivery_forward_rules import relay_sessions
from federation.state import PendingForward
from hubd.state import forward_table as dl
from hubd.state.forward_table import ACCEPTED, DUPLICATE, forward_step
from hubd.timing import Timing

log = structlog.get_logger("hubd.federation.outbox")

WINDOW = 1024  # forwards in flight
BATCH = 256  # forwards per frame, to a peer that takes batches
RESIDENT = 4096  # forwards held in memory; the rest wait in the journal
REFILL = 1024  # read the journal again once this much room is free
EVENTS = 4 * WINDOW  # mailbox events (answers) held before new answers are dropped
ROSTERS = 32  # roster requests waiting for this peer's answer



class Mailbox:
    """The actor's inbox, bounded, never blocking a poster (the Router, the link).

    Rows past `max_rows` are not kept: only the lowest seq dropped, and the
    actor reads them from the journal. Answers past `max_events` are dropped
    and counted: their forwards time out and go again, and the peer answers
    `duplicate`. A tick or a sign of life already waiting is not queued again
    (the Router reports one per forward it gets from the peer); link
    transitions and resyncs are always kept (a few per reconnect); roster
    requests past the bound are refused."""

    def __init__(self, max_rows: int, max_events: int):
        self.max_rows, self.max_events = max_rows, max_events
        self.rows: list[PendingForward] = []
        self.rows_dropped_from: int | None = None
        self.events: deque = deque()
        self.dropped = {"row": 0, "answer": 0, "roster": 0}
        self._waiting_once: set = set()  # the coalesced kinds queued since the last take
        self._ready = asyncio.Event()

    def post_rows(self, items: list[PendingForward]) -> None:
        room = 0 if self.rows_dropped_from is not None else self.max_rows - len(self.rows)
        if len(items) > room:
            self.dropped["row"] += len(items) - room
            if self.rows_dropped_from is None:
                self.rows_dropped_from = items[room].seq
            items = items[:room]
        self.rows.extend(items)
        self._ready.set()

    def post(self, event) -> bool:
        """False if the event was dropped at the bound (answers, roster requests)."""
        kind = type(event)
        if kind is Tick or kind is PeerAlive:
            if kind in self._waiting_once:
                return True
            self._waiting_once.add(kind)
        elif kind in (Answer, Roster) and len(self.events) >= self.max_events:
            self.dropped["answer" if kind is Answer else "roster"] += 1
            return False
        self.events.append(event)
        self._ready.set()
        return True

    async def wait(self) -> None:
        await self._ready.wait()

    def take(self) -> tuple[list, int | None, deque]:
        rows, dropped_from, events = self.rows, self.rows_dropped_from, self.events
        self.rows, self.rows_dropped_from, self.events = [], None, deque()
        self._waiting_once.clear()
        self._ready.clear()
        return rows, dropped_from, events


@dataclass(slots=True)
class Attempt:
    item: PendingForward
    attempts: int = 0
    sent_at: float | None = None  # monotonic time of the attempt in flight
    state: str = dl.QUEUED  # hubd.state.forward_table's states

    def step(self, event: str) -> str:
        self.state = forward_step(self.state, event)
        return self.state


@dataclass(slots=True)
class WaitingRoster:
    reply_to: int
    name: str
    due: float


class ForwardOutbox:
    def __init__(self, origin_hub: str, peer: str, link, subscribe: Callable[..., None],
                 metrics, report: Callable[[list], None], load: Load, *, timing: Timing,
                 clock=SYSTEM):
        self.origin = origin_hub
        self.peer = peer
        self.metrics = metrics
        self.report = report
        self.load = load
        self.clock = clock
        self.timing = timing
        self.mailbox = Mailbox(RESIDENT, EVENTS)
        self.items: OrderedDict[str, Attempt] = OrderedDict()  # held forwards, oldest first
        self.ready: deque = deque()  # forward_ids to send now
        self.delayed: list = []  # heap of (due, forward_id)
        self.in_flight: dict[str, Attempt] = {}
        self.first_answer: deque = deque()  # (due, forward_id), in due order
        self.rosters: dict[str, WaitingRoster] = {}  # by the request's forward_id
        self._roster_frames: deque = deque()  # roster requests not sent yet
        self.cursor = 0  # every unsettled row with seq <= cursor is in self.items
        self.caught_up = False  # and every one above it is in the mailbox
        self.last_success: float | None = None
        # the link as its events told it
        self._up = False
        self._batching = False
        self._up_since: float | None = None
        self._link_error: dict | None = None
        self._journal_short = False  # the last load met an uncommitted row: wait a tick
        self.retry: PeerRetry | None = None  # the peer's retry schedule as journaled
        self._restored = False  # the first load read the journaled schedule
        self._restored_until: float | None = None  # the backlog read before this waits
        self._restored_step = dl.RESTORED_REFUSED
        self._been_up = False  # a link-up after this is the peer coming back
        self._reports: list = []
        post = self.mailbox.post
        self.link = link  # written to (send) and woken; its state comes in its events
        # the link calls these in its own task, as it goes up or down: what it
        # says of itself then travels in the event
        subscribe(on_up=lambda peer: post(LinkUp(link.batching, link.up_since)),
                  on_down=lambda peer, cause: post(LinkDown(cause, link.last_error)),
                  on_result=self._answer_arrived,
                  on_rejected=lambda peer, text: post(Rejected(text)))

    def _answer_arrived(self, peer: str, frame: dict) -> None:
        if not self.mailbox.post(Answer(frame)) and self.mailbox.dropped["answer"] % 1000 == 1:
            log.warning("forward outbox mailbox full; an answer was dropped (its forward "
                        "goes again after the answer timeout; logged once per 1,000)",
                        peer=peer, dropped=self.mailbox.dropped["answer"])

    # -- the actor

    async def run(self) -> None:
        ticker = asyncio.ensure_future(self._tick())
        try:
            await self._refill()
            while True:
                self._flush_reports()
                self._send_ready()
                self._flush_reports()
                await self.mailbox.wait()
                self._take()
                if not self.caught_up and not self._journal_short and \
                        len(self.items) <= RESIDENT - REFILL:
                    await self._refill()
        except BaseException:
            self._fail_rosters("this hub's forward outbox for the peer stopped")
            self._flush_reports()
            raise
        finally:
            ticker.cancel()

    async def _tick(self) -> None:
        while True:
            await self.clock.sleep(self.timing.forward_tick)
            self.mailbox.post(TICK)

    def _flush_reports(self) -> None:
        if self._reports:
            reports, self._reports = self._reports, []
            self.report(reports)

    def _take(self) -> None:
        rows, dropped_from, events = self.mailbox.take()
        for event in events:
            kind = type(event)
            if kind is Answer:
                self._on_answer(event.frame)
            elif kind is Tick:
                self._sweep()
            elif kind is LinkUp:
                self._up, self._batching, self._up_since = True, event.batching, event.since
                if self._been_up:  # the peer was away: what waited goes now
                    self._release_delayed(dl.LINK_UP)
                self._been_up = True
            elif kind is LinkDown:
                self._up, self._up_since, self._link_error = False, None, event.error
                self._link_down(event.cause)
            elif kind is PeerAlive:
                self._peer_alive()
            elif kind is Roster:
                self._ask_roster(event)
            elif kind is Rejected:
                self._peer_rejected(event.text)
            elif kind is Resync:
                self.caught_up, self.cursor = False, 0
            else:
                raise TypeError(f"forward outbox got an unknown event {event!r}")
        for item in rows:
            self._row(item)
        if dropped_from is not None:
            self.caught_up = False  # rows from dropped_from on are read from the journal

    # -- rows in

    def _row(self, item: PendingForward) -> None:
        if not self.caught_up or item.seq <= self.cursor:
            return  # the journal has it, and a load reads it (or it is held already)
        if len(self.items) >= RESIDENT:
            self.caught_up = False
            return
        self.cursor = item.seq
        self._hold(item)
        if item.receipt_requested:
            self.first_answer.append((self.clock.monotonic() + self.timing.forward_first_answer,
                                      item.forward_id))

    def _hold(self, item: PendingForward) -> None:
        self.items[item.forward_id] = Attempt(item)
        self.ready.append(item.forward_id)

    def _hold_restored(self, item: PendingForward) -> None:
        """A row of the backlog a restarted hub read while the peer's
        journaled retry is not due: it waits for it, as the schedule says."""
        attempt = self.items[item.forward_id] = Attempt(item, attempts=self.retry.attempts)
        attempt.step(self._restored_step)
        heapq.heappush(self.delayed, (self._restored_until, item.forward_id))

    async def _refill(self) -> None:
        rows, complete, retry = await self.load(self.peer, self.cursor,
                                                RESIDENT - len(self.items))
        if not self._restored:
            self._restore(retry)
        restoring = self._restored_until is not None and \
            self.clock.monotonic() < self._restored_until
        for item in rows:
            if item.forward_id not in self.items:
                if restoring:
                    self._hold_restored(item)
                else:
                    self._hold(item)
            self.cursor = max(self.cursor, item.seq)
        self.caught_up = complete
        # stopped short of RESIDENT by a row not committed yet: try again next tick
        self._journal_short = not complete and len(self.items) < RESIDENT

    def _restore(self, retry: PeerRetry | None) -> None:
        """At start: the peer's journaled retry schedule. If its next retry is
        not due yet, the backlog read from the journal waits for it (a "not
        now" in HELD, no answer in WAITING, so a sign of life sends the
        latter), and its attempt count goes on from the journaled one."""
        self._restored = True
        self.retry = retry
        wait = restored_wait(retry, self.clock.wall())
        if wait > 0:
            self._restored_until = self.clock.monotonic() + wait
            self._restored_step = dl.RESTORED_REFUSED if retry.refused else \
                dl.RESTORED_NO_ANSWER
            log.info("restored the peer's retry schedule: its backlog waits for the retry due",
                     peer=self.peer, attempts=retry.attempts, seconds=round(wait, 3),
                     refused=retry.refused)

    # -- link events

    def _release_delayed(self, event: str) -> None:
        """Step every backing-off forward with `event`; those the table sends
        back to QUEUED go out now, the rest stay in the heap with their due time."""
        keep = []
        for due, forward_id in self.delayed:
            attempt = self.items.get(forward_id)
            if attempt is None or attempt.state not in dl.BACKING_OFF:
                continue  # a stale entry: settled, or queued again since
            if attempt.step(event) == dl.QUEUED:
                self.ready.append(forward_id)
            else:
                keep.append((due, forward_id))
        heapq.heapify(keep)
        self.delayed = keep

    def _peer_alive(self) -> None:
        """The peer showed life (its inbound link, a forward, a log pull):
        retries waiting out a backoff because no answer came go now, if the
        link is up (else LinkUp sends them when it is). Retries the peer
        itself asked to wait keep their backoff (the table keeps them HELD)."""
        self.link.wake()
        if self._up and self.delayed:
            self._release_delayed(dl.PEER_ALIVE)

    def _link_down(self, cause: str) -> None:
        # In-flight forwards go back to the front: the peer may or may not have
        # them; a resend is answered `duplicate` if it did.
        returning = list(self.in_flight)
        self.in_flight.clear()
        for forward_id in reversed(returning):
            attempt = self.items.get(forward_id)
            if attempt is not None:
                attempt.step(dl.LINK_DOWN)
                attempt.sent_at = None
                self.ready.appendleft(forward_id)
        for attempt in self.items.values():
            self._still_pending(attempt.item, f"link to {self.peer} is down ({cause})")
        self._fail_rosters(f"the link to {self.peer} went down ({cause})")

    def _on_answer(self, frame: dict) -> None:
        forward_id = frame.get("forward_id")
        roster = self.rosters.pop(forward_id, None)
        if roster is not None:
            self._answer_roster(roster, frame)
            return
        attempt = self.in_flight.pop(forward_id, None)
        if attempt is None:
            return  # an answer to a forward already settled or re-sent
        disposition = frame.get("disposition")
        reason = str(frame.get("reason_code") or "")
        detail = str(frame.get("detail") or "")[:512]
        result = frame.get("result") if isinstance(frame.get("result"), dict) else {}
        started = attempt.sent_at
        event = dl.answer_event(disposition, reason)
        state = attempt.step(event)
        if state in (ACCEPTED, DUPLICATE):
            self.last_success = self.clock.wall()
            if self.retry is not None:
                self.retry = None  # the peer answers again: nothing to hold back after a restart
                self._reports.append(RetrySchedule(self.peer, None))
            if started is not None:
                self.metrics.forward_latency(self.peer, self.clock.monotonic() - started)
            self._finish(attempt, "", detail, result)
        elif state == dl.HELD:
            self.metrics.forward_outcome(self.peer, "retried")
            self._retry_later(attempt, f"{self.peer} refused for now: {reason} {detail}".strip())
        elif event == dl.ANSWER_REFUSED:
            self._finish(attempt, reason or "refused", detail, result)
        else:
            self._finish(attempt, "peer_invalid_answer",
                         f"{self.peer} answered disposition {disposition!r}", {})

    def _peer_rejected(self, text: str) -> None:
        """A peer older than wire v5: every forward to it is refused, no retries."""
        log.error("peer does not speak wire v5 forwarding; refusing its forwards", peer=self.peer,
                  answer=text)
        for attempt in list(self.items.values()):
            attempt.step(dl.PEER_REJECTED)
            self._finish(attempt, "peer_rejected", text[:512], {})

    # -- roster requests (who_request naming this peer)

    def _ask_roster(self, ask: Roster) -> None:
        if not self._up:
            self._roster_error(ask.reply_to, ask.name, f"the link to {self.peer} is down")
            return
        if len(self.rosters) >= ROSTERS:
            self.mailbox.dropped["roster"] += 1
            self._roster_error(ask.reply_to, ask.name,
                               f"{ROSTERS} roster requests to {self.peer} are already waiting")
            return
        forward_id = secrets.token_hex(16)
        due = self.clock.monotonic() + self.timing.roster_timeout
        self.rosters[forward_id] = WaitingRoster(ask.reply_to, ask.name, due)
        # sent with the forwards (below), so a hung link holds it like them
        self._roster_frames.append({
            "sender": self.origin, "target": "System", "type": "multihub_message_forward",
            "payload": "", "forward_id": forward_id, "kind": "who", "sender_seat": ask.name})

    def _answer_roster(self, roster: WaitingRoster, frame: dict) -> None:
        if frame.get("disposition") != ACCEPTED:
            self._roster_error(roster.reply_to, roster.name, (
                f"refused the roster request: {frame.get('reason_code')} "
                f"{frame.get('detail', '')}").strip())
            return
        result = frame.get("result") if isinstance(frame.get("result"), dict) else {}
        seats = sorted(f"{s}@{self.peer}" for s in result.get("online_agents", [])
                       if isinstance(s, str))
        self._reports.append(RosterAnswer(roster.reply_to, roster.name, "who_snapshot",
                                          "Who snapshot", {"remote_hub": self.peer,
                                                           "online_agents": seats,
                                                           "connected_clients": len(seats),
                                                           "delivery_sessions": relay_sessions(
                                                               result, self.peer)}))

    def _roster_error(self, reply_to: int, name: str, why: str) -> None:
        self._reports.append(RosterAnswer(reply_to, name, "error",
                                          f"Hub '{self.peer}' did not answer the roster "
                                          f"request: {why}", {}))

    def _fail_rosters(self, why: str) -> None:
        waiting, self.rosters = self.rosters, {}
        self._roster_frames.clear()
        for roster in waiting.values():
            self._roster_error(roster.reply_to, roster.name, why)

    # -- internals

    def _still_pending(self, item: PendingForward, why: str) -> None:
        if item.receipt_requested:
            self._reports.append(StillPending(item, why))

    def _finish(self, attempt: Attempt, reason: str, detail: str, result: dict) -> None:
        """Settle a forward that reached one of the table's settled states."""
        item = attempt.item
        state = attempt.state
        assert state in dl.SETTLED, state
        self.items.pop(item.forward_id, None)
        self.in_flight.pop(item.forward_id, None)
        self.metrics.forward_outcome(self.peer, state)
        self._reports.append(Settled(item, state, reason, detail, result))

    def _retry_later(self, attempt: Attempt, why: str) -> None:
        attempt.sent_at = None
        now = self.clock.monotonic()
        up_for = now - self._up_since if self._up_since is not None else None
        due, attempt.attempts = next_retry(attempt.attempts, now, up_for, self.clock.jitter(),
                                           self.timing)
        heapq.heappush(self.delayed, (due, attempt.item.forward_id))
        changed = retry_to_journal(self.retry, attempt.attempts, self.clock.wall() + due - now,
                                   refused=attempt.state == dl.HELD)
        if changed is not None:
            self.retry = changed
            self._reports.append(RetrySchedule(self.peer, changed))
        self._still_pending(attempt.item, why)

    def _send_ready(self) -> None:
        """Post to the link while it is up as far as its events said (a link
        that went down since, or whose inbox is full, refuses the post: the
        forwards go back to the front; a LinkDown follows, or the next event
        tries again)."""
        link = self.link
        while self._roster_frames and self._up:
            if not link.send(self._roster_frames[0]):
                break  # down: LinkDown answers the waiting requests; busy: sent later
            self._roster_frames.popleft()
        while self.ready and len(self.in_flight) < WINDOW and self._up:
            batch = []
            limit = BATCH if self._batching else 1
            now = self.clock.monotonic()
            while self.ready and len(batch) < limit and len(self.in_flight) < WINDOW:
                forward_id = self.ready.popleft()
                attempt = self.items.get(forward_id)
                if attempt is None or attempt.state != dl.QUEUED:
                    continue  # a stale entry: settled, or queued again since
                attempt.step(dl.SEND)
                attempt.sent_at = now
                self.in_flight[forward_id] = attempt
                batch.append(attempt)
            if not batch:
                break
            if len(batch) == 1:
                frame = batch[0].item.frame(self.origin)
            else:
                frame = {"sender": self.origin, "target": "System",
                         "type": "multihub_message_forward_batch", "payload": "",
                         "forwards": [a.item.entry() for a in batch]}
            if not link.send(frame):
                for attempt in reversed(batch):
                    self.in_flight.pop(attempt.item.forward_id, None)
                    attempt.step(dl.SEND_FAILED)
                    attempt.sent_at = None
                    self.ready.appendleft(attempt.item.forward_id)
                break

    def _sweep(self) -> None:
        """Every timing.forward_tick: answers that never came, due retries,
        expired rows, senders owed a "pending", roster requests past their time."""
        answer_timeout = self.timing.forward_answer
        now_mono = self.clock.monotonic()
        now = self.clock.wall()
        self._journal_short = False
        for forward_id, attempt in list(self.in_flight.items()):
            if now_mono - attempt.sent_at > answer_timeout:
                del self.in_flight[forward_id]
                attempt.step(dl.ANSWER_TIMEOUT)
                self.metrics.forward_outcome(self.peer, "timeout")
                self._retry_later(attempt,
                                  f"{self.peer} did not answer within {answer_timeout:g}s")
        while self.delayed and self.delayed[0][0] <= now_mono:
            _, forward_id = heapq.heappop(self.delayed)
            attempt = self.items.get(forward_id)
            if attempt is not None and attempt.state in dl.BACKING_OFF:
                attempt.step(dl.RETRY_DUE)
                self.ready.append(forward_id)
        for attempt in list(self.items.values()):
            if attempt.item.expires_at > now:
                break  # rows are in creation order, and so in expiry order
            attempt.step(dl.TTL)
            self._finish(attempt, "forward_expired",
                         f"not accepted by {self.peer} within its TTL", {})
        while self.first_answer and self.first_answer[0][0] <= now_mono:
            _, forward_id = self.first_answer.popleft()
            attempt = self.items.get(forward_id)
            if attempt is not None:
                error = self._link_error
                why = "no answer yet" if self._up else (
                    f"link to {self.peer} is down ({error['cause']})"
                    if error else f"link to {self.peer} is down")
                self._still_pending(attempt.item, why)
        late = [fid for fid, roster in self.rosters.items() if roster.due <= now_mono]
        for forward_id in late:
            roster = self.rosters.pop(forward_id)
            self._roster_error(roster.reply_to, roster.name,
                               f"no answer within {self.timing.roster_timeout:g}s")

    # -- figures

    def held(self) -> tuple[int, float]:
        """(forwards held in memory, the oldest one's age in seconds)."""
        first = next(iter(self.items.values()), None)
        oldest = self.clock.wall() - first.item.created if first is not None else 0.0
        return len(self.items), max(oldest, 0.0)

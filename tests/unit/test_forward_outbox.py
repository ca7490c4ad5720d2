"""The ForwardOutbox on its own: an in-memory link to the peer, a manual clock,
no sockets and no sleeping. Its settlements and pending notices are what it
hands back; the peer's answers are frames the test sends."""

import asyncio

import pytest
from prometheus_client import CollectorRegistry

import federation.actors.outbox as outbox_module
from federation.clock import ManualClock, PeerRetry, settle
from federation.metrics import ForwardMetrics
from federation.actors.outbox import ForwardOutbox
from federation.actors.outbox_messages import (Backlog, PeerAlive, RetrySchedule, Settled,
                                               StillPending)
from federation.state import PendingForward
from hubd.state import forward_table as dl
from hubd.timing import Timing
from tests.support.memlink import DROP, HANG, MemoryLink


TIMING = Timing()  # the production profile
ANSWER_TIMEOUT = TIMING.forward_answer

def forward(n: int, clock: ManualClock, ttl: float = 3600.0,
            receipt: bool = True) -> PendingForward:
    return PendingForward(
        forward_id=f"f{n:031d}", peer="west", seq=n + 1, created=clock.wall(),
        expires_at=clock.wall() + ttl, sender="PROJ/alice", sender_seat="PROJ/alice",
        target_seat="PROJ/bob", body={"payload": f"chat {n}", "origin_msg_id": n,
                                      "origin_timestamp": clock.wall()},
        receipt_requested=receipt, client_msg_id=None, msg_id=n, target="PROJ/bob@west")


def answer(forward_id: str, disposition: str = "accepted", reason: str = "") -> dict:
    return {"type": "multihub_message_result", "forward_id": forward_id,
            "disposition": disposition, "reason_code": reason, "detail": "",
            "result": {"delivered": True, "recipients": ["PROJ/bob"]}}


class Harness:
    """The outbox with what it talks to: the in-memory link, the Router's side
    (reports recorded, rows settled out of the index), and the journal (the
    unsettled rows, by seq; `uncommitted` ones are in the index, not yet on
    disk: a load stops before them, and they are posted once committed)."""

    def __init__(self, batching: bool = False):
        self.clock = ManualClock()
        self.settled = []  # (forward_id, state, reason)
        self.notices = []  # (forward_id, why)
        self.rosters = []  # RosterAnswer
        self.journal: dict[int, PendingForward] = {}
        self.uncommitted: set[int] = set()
        self.loads = []  # (after_seq, limit) of every load the outbox made
        self.retry = None  # the peer's journaled retry schedule (federation/clock.py PeerRetry)
        self.retries = []  # every schedule the outbox reported, in order
        self.link = MemoryLink("west", "east", self.clock, batching=batching)
        self.outbox = ForwardOutbox(
            "east", "west", self.link, self._attach, ForwardMetrics(CollectorRegistry(), None),
            self._report, self._load, timing=TIMING, clock=self.clock)
        self.task = None

    def _attach(self, **events):
        self.link.far.subscribe(**events)

    def _report(self, reports):
        for report in reports:
            if isinstance(report, Settled):
                self.settled.append((report.item.forward_id, report.state, report.reason))
                self.journal.pop(report.item.seq, None)
            elif isinstance(report, StillPending):
                self.notices.append((report.item.forward_id, report.why))
            elif isinstance(report, RetrySchedule):
                self.retries.append(report.retry)
                self.retry = report.retry  # journaled, as the Router does
            else:
                self.rosters.append(report)

    async def _load(self, peer, after_seq, limit):
        self.loads.append((after_seq, limit))
        seqs = sorted(seq for seq in self.journal if seq > after_seq)[:limit]
        rows = []
        for seq in seqs:
            if seq in self.uncommitted:
                break
            rows.append(self.journal[seq])
        return Backlog(rows, len(seqs) < limit, self.retry)

    async def start(self):
        self.task = asyncio.ensure_future(self.outbox.run())
        await settle()

    async def stop(self):
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)

    def submit(self, *items):
        """As the Router does: the rows are in the journal, then posted."""
        for item in items:
            self.journal[item.seq] = item
        self.outbox.mailbox.post_rows(list(items))

    async def answer(self, frame: dict):
        self.link.far.answer(frame)
        await settle()

    async def connect(self):
        self.link.far.connect()
        await settle()

    async def cut(self):
        self.link.far.cut()
        await settle()

    def sent_ids(self) -> list[str]:
        ids = []
        for frame in self.link.far.take():
            if frame["type"] == "multihub_message_forward_batch":
                ids += [entry["forward_id"] for entry in frame["forwards"]]
            else:
                ids.append(frame["forward_id"])
        return ids

    def state_of(self, item) -> str:
        return self.outbox.items[item.forward_id].state


def run(scenario):
    async def main():
        h = Harness(**getattr(scenario, "options", {}))
        if hasattr(scenario, "before_start"):
            scenario.before_start(h)
        await h.start()
        try:
            await scenario(h)
        finally:
            await h.stop()
    asyncio.run(main())


def test_rows_wait_for_the_link_then_leave_in_one_batch_and_settle():
    async def scenario(h):
        items = [forward(n, h.clock) for n in range(3)]
        h.submit(*items)
        await settle()
        assert h.link.far.received == [] and h.state_of(items[0]) == dl.QUEUED
        await h.connect()
        await settle()
        [frame] = h.link.far.received
        assert frame["type"] == "multihub_message_forward_batch"
        assert h.sent_ids() == [i.forward_id for i in items]
        assert h.state_of(items[0]) == dl.IN_FLIGHT
        await h.answer({"type": "multihub_message_result_batch",
                           "results": [answer(i.forward_id) for i in items]})
        assert [s[1] for s in h.settled] == ["accepted"] * 3
        assert len(h.outbox.items) == 0
    scenario.options = {"batching": True}
    run(scenario)


def test_a_transient_refusal_is_retried_on_the_schedule_of_the_clock():
    async def scenario(h):
        item = forward(1, h.clock)
        await h.connect()
        h.submit(item)
        await settle()
        assert h.sent_ids() == [item.forward_id]
        await h.answer(answer(item.forward_id, "refused", "quota_exceeded"))
        assert h.state_of(item) == dl.HELD and h.notices
        await h.clock.advance(0.6)  # first retry is due after 1 s (jitter 0.5)
        assert h.sent_ids() == []
        await h.clock.advance(0.6)
        assert h.sent_ids() == [item.forward_id]
        await h.answer(answer(item.forward_id, "refused", "quota_exceeded"))
        await h.clock.advance(1.6)  # the second waits 2 s (due at +2.0, seen by the
        assert h.sent_ids() == []   # sweep, which runs every 0.5 s)
        await h.clock.advance(0.8)
        assert h.sent_ids() == [item.forward_id]
        await h.answer(answer(item.forward_id))
        assert h.settled == [(item.forward_id, "accepted", "")]
    run(scenario)


def test_a_final_refusal_settles_refused_and_an_unknown_answer_is_refused_too():
    async def scenario(h):
        first, second = forward(1, h.clock), forward(2, h.clock)
        await h.connect()
        h.submit(first, second)
        await settle()
        h.sent_ids()
        await h.answer(answer(first.forward_id, "refused", "namespace_not_granted"))
        await h.answer(answer(second.forward_id, "perhaps"))
        assert h.settled == [(first.forward_id, "refused", "namespace_not_granted"),
                             (second.forward_id, "refused", "peer_invalid_answer")]
    run(scenario)


def test_an_answer_that_never_comes_times_out_and_is_resent():
    async def scenario(h):
        item = forward(1, h.clock)
        await h.connect()
        h.link.far.mode = DROP
        h.submit(item)
        await settle()
        await h.clock.advance(ANSWER_TIMEOUT - 0.5)
        assert h.state_of(item) == dl.IN_FLIGHT
        await h.clock.advance(1.0)
        assert h.state_of(item) == dl.WAITING
        assert any("did not answer" in why for _, why in h.notices)
        h.link.far.mode = "deliver"
        await h.clock.advance(1.5)
        assert h.sent_ids() == [item.forward_id]
    run(scenario)


def test_a_sign_of_life_resends_what_got_no_answer_and_keeps_a_not_now_waiting():
    async def scenario(h):
        unanswered, not_now = forward(1, h.clock), forward(2, h.clock)
        await h.connect()
        h.link.far.mode = DROP
        h.submit(unanswered)
        await settle()
        await h.clock.advance(ANSWER_TIMEOUT + 0.5)
        assert h.state_of(unanswered) == dl.WAITING  # its retry is due a second later
        h.link.far.mode = "deliver"
        h.submit(not_now)
        await settle()
        assert h.sent_ids() == [not_now.forward_id]
        await h.answer(answer(not_now.forward_id, "refused", "quota_exceeded"))
        assert h.state_of(not_now) == dl.HELD
        h.outbox.mailbox.post(PeerAlive())
        await settle()  # e.g. the peer's own link to this hub came up
        await settle()
        assert h.sent_ids() == [unanswered.forward_id]
        assert h.state_of(unanswered) == dl.IN_FLIGHT
        assert h.state_of(not_now) == dl.HELD  # the peer asked to wait: it still waits
        await h.answer(answer(unanswered.forward_id))
        await h.clock.advance(1.5)  # not_now's own backoff (1 s, jitter 0.5) runs out
        assert h.sent_ids() == [not_now.forward_id]
        await h.answer(answer(not_now.forward_id))
        assert h.settled == [(unanswered.forward_id, "accepted", ""),
                             (not_now.forward_id, "accepted", "")]
    run(scenario)


def test_a_cut_returns_forwards_in_flight_to_the_front_and_a_return_drains_at_once():
    async def scenario(h):
        items = [forward(n, h.clock) for n in range(3)]
        await h.connect()
        h.submit(*items)
        await settle()
        assert len(h.sent_ids()) == 3
        await h.cut()
        assert all(h.state_of(i) == dl.QUEUED for i in items)
        assert len(h.notices) == 3  # each sender is told its forward waits
        await h.connect()  # no time passes: everything goes out now, in order
        await settle()
        assert h.sent_ids() == [i.forward_id for i in items]
        for i in items:
            await h.answer(answer(i.forward_id, "duplicate"))
        assert [s[1] for s in h.settled] == ["duplicate"] * 3
    run(scenario)


def test_a_hung_send_holds_nothing_else_up_and_is_requeued_by_the_cut():
    async def scenario(h):
        item = forward(1, h.clock)
        await h.connect()
        h.link.far.mode = HANG
        h.submit(item)
        await settle()
        assert h.state_of(item) == dl.IN_FLIGHT and h.link.far.received == []
        await h.cut()
        await settle()
        assert h.state_of(item) == dl.QUEUED
        h.link.far.mode = "deliver"
        await h.connect()
        await settle()
        assert h.sent_ids() == [item.forward_id]
    run(scenario)


def test_rows_past_their_ttl_expire_whatever_their_state():
    async def scenario(h):
        waiting, queued = forward(1, h.clock, ttl=5), forward(2, h.clock, ttl=5)
        await h.connect()
        h.submit(waiting)
        await settle()
        h.sent_ids()
        await h.answer(answer(waiting.forward_id, "refused", "chat_refused"))
        await h.cut()
        h.submit(queued)
        await h.clock.advance(5.5)
        assert sorted(h.settled) == sorted([(waiting.forward_id, "expired", "forward_expired"),
                                            (queued.forward_id, "expired", "forward_expired")])
    run(scenario)


def test_in_flight_is_bounded_by_the_window(monkeypatch):
    monkeypatch.setattr(outbox_module, "WINDOW", 2)

    async def scenario(h):
        items = [forward(n, h.clock) for n in range(5)]
        await h.connect()
        h.submit(*items)
        await settle()
        assert h.sent_ids() == [i.forward_id for i in items[:2]]
        await h.answer(answer(items[0].forward_id))
        await settle()
        assert h.sent_ids() == [items[2].forward_id]
        assert len(h.outbox.in_flight) == 2
    run(scenario)


def test_a_peer_older_than_wire_v5_refuses_every_forward_without_retries():
    async def scenario(h):
        items = [forward(n, h.clock) for n in range(2)]
        h.submit(*items)
        await h.connect()
        await settle()
        await h.answer({"type": "error",
                           "payload": "Unknown message type 'multihub_message_forward'."})
        assert [s[1:] for s in h.settled] == [("refused", "peer_rejected")] * 2
    run(scenario)


@pytest.mark.parametrize("disposition", ["accepted", "duplicate"])
def test_a_late_answer_after_settling_changes_nothing(disposition):
    async def scenario(h):
        item = forward(1, h.clock)
        await h.connect()
        h.submit(item)
        await settle()
        await h.answer(answer(item.forward_id, disposition))
        await h.answer(answer(item.forward_id, disposition))
        assert len(h.settled) == 1
    run(scenario)


def small_outbox(monkeypatch, resident=4, refill=2, window=2, events=None):
    monkeypatch.setattr(outbox_module, "RESIDENT", resident)
    monkeypatch.setattr(outbox_module, "REFILL", refill)
    monkeypatch.setattr(outbox_module, "WINDOW", window)
    if events is not None:
        monkeypatch.setattr(outbox_module, "EVENTS", events)


def test_a_backlog_past_what_it_holds_waits_in_the_journal_and_goes_once_in_order(monkeypatch):
    small_outbox(monkeypatch)

    async def scenario(h):
        items = [forward(n, h.clock, receipt=False) for n in range(10)]
        for item in items:  # one Router round each, the link down
            h.submit(item)
            await settle()
            assert len(h.outbox.items) <= 4
        assert [a.item.seq for a in h.outbox.items.values()] == [1, 2, 3, 4]
        assert h.outbox.cursor == 4 and not h.outbox.caught_up
        await h.connect()
        sent = []
        while len(h.settled) < 10:
            ids = h.sent_ids()
            assert ids, "nothing in flight and not all settled"
            sent += ids
            for forward_id in ids:
                await h.answer(answer(forward_id))
                assert len(h.outbox.items) <= 4
        assert sent == [i.forward_id for i in items]  # each once, oldest first
        assert [s[0] for s in h.settled] == sent
        assert h.outbox.caught_up and not h.outbox.items
        # every load asked for no more than there was room for
        assert all(limit <= 4 for _, limit in h.loads)
    run(scenario)


def test_rows_the_mailbox_has_no_room_for_are_read_back_from_the_journal(monkeypatch):
    small_outbox(monkeypatch)

    async def scenario(h):
        items = [forward(n, h.clock, receipt=False) for n in range(6)]
        h.submit(*items)  # one post before the outbox takes anything: 2 over the bound
        assert h.outbox.mailbox.dropped["row"] == 2
        await settle()
        assert [a.item.seq for a in h.outbox.items.values()] == [1, 2, 3, 4]
        await h.connect()
        for _ in range(3):
            for forward_id in h.sent_ids():
                await h.answer(answer(forward_id))
        assert [s[0] for s in h.settled] == [i.forward_id for i in items]
    run(scenario)


def test_a_load_stops_before_an_uncommitted_row_which_comes_by_the_mailbox(monkeypatch):
    small_outbox(monkeypatch, resident=8, refill=4, window=4)

    async def scenario(h):
        first, second, third = (forward(n, h.clock, receipt=False) for n in range(3))
        h.outbox.mailbox.post(outbox_module.Resync())  # read the journal from the start
        h.journal.update({first.seq: first, second.seq: second, third.seq: third})
        h.uncommitted.add(third.seq)
        await settle()
        assert list(h.outbox.items) == [first.forward_id, second.forward_id]
        assert h.outbox.caught_up  # the index had no more: the third is on its way
        h.uncommitted.clear()
        h.outbox.mailbox.post_rows([third])  # committed, then posted by the Router
        await h.connect()
        assert h.sent_ids() == [first.forward_id, second.forward_id, third.forward_id]
    run(scenario)


def test_answers_past_the_mailbox_bound_are_dropped_counted_and_the_forward_goes_again(
        monkeypatch):
    small_outbox(monkeypatch, resident=8, refill=4, window=8, events=2)

    async def scenario(h):
        items = [forward(n, h.clock, receipt=False) for n in range(3)]
        await h.connect()
        h.submit(*items)
        await settle()
        assert h.sent_ids() == [i.forward_id for i in items]
        for item in items:  # three answers before the outbox takes any
            h.link.far.answer(answer(item.forward_id))
        assert h.outbox.mailbox.dropped["answer"] == 1
        await settle()
        assert [s[0] for s in h.settled] == [i.forward_id for i in items[:2]]
        await h.clock.advance(ANSWER_TIMEOUT + 1)
        await h.clock.advance(1.5)  # the retry after the timeout (1 s, jitter 0.5)
        assert h.sent_ids() == [items[2].forward_id]
        await h.answer(answer(items[2].forward_id, "duplicate"))
        assert h.settled[-1] == (items[2].forward_id, "duplicate", "")
    run(scenario)


def test_roster_requests_are_answered_refused_at_the_bound_and_timed_out(monkeypatch):
    monkeypatch.setattr(outbox_module, "ROSTERS", 1)
    Roster, RosterAnswer = outbox_module.Roster, outbox_module.RosterAnswer

    async def scenario(h):
        h.outbox.mailbox.post(Roster(7, "PROJ/alice"))
        await settle()
        assert h.rosters[-1].type == "error" and "link to west is down" in h.rosters[-1].text
        await h.connect()
        h.outbox.mailbox.post(Roster(7, "PROJ/alice"))
        h.outbox.mailbox.post(Roster(8, "PROJ/amy"))
        await settle()
        [asked] = h.link.far.take()
        assert asked["kind"] == "who" and asked["sender_seat"] == "PROJ/alice"
        busy = h.rosters[-1]
        assert (busy.reply_to, busy.type) == (8, "error") and "already waiting" in busy.text
        await h.answer({"type": "multihub_message_result", "forward_id": asked["forward_id"],
                        "disposition": "accepted",
                        "result": {"online_agents": ["PROJ/bob", 3], "delivery_sessions": {
                            "PROJ/bob": {"incarnation": "e" * 64,
                                         "capabilities": {"next_turn": "native"}}}}})
        assert h.rosters[-1] == RosterAnswer(7, "PROJ/alice", "who_snapshot", "Who snapshot", {
            "remote_hub": "west", "online_agents": ["PROJ/bob@west"], "connected_clients": 1,
            "delivery_sessions": {"PROJ/bob@west": {
                "incarnation": "e" * 64, "capabilities": {"next_turn": "native"},
                "hub_id": "west"}}})
        h.outbox.mailbox.post(Roster(9, "PROJ/ann"))
        await settle()
        # the seed's bound on a peer's answer is ten seconds (d590ccf gave up at 5)
        answered = len(h.rosters)
        await h.clock.advance(9.4)
        assert len(h.rosters) == answered
        await h.clock.advance(1.2)  # past 10 s, within the outbox's 0.5 s sweep
        late = h.rosters[-1]
        assert late.reply_to == 9 and "no answer within 10s" in late.text
        assert h.outbox.mailbox.dropped["roster"] == 1
    run(scenario)


def test_an_outbox_that_dies_answers_its_waiting_requests_and_fails_loudly():
    async def main():
        h = Harness()
        await h.start()
        await h.connect()
        h.outbox.mailbox.post(outbox_module.Roster(7, "PROJ/alice"))
        await settle()
        assert h.link.far.take()  # the request is out, waiting for its answer
        h.outbox.mailbox.events.append("not an event")  # a defect in whoever posted it
        h.outbox.mailbox.post(outbox_module.TICK)
        await settle()
        assert h.task.done()
        with pytest.raises(TypeError, match="unknown event"):
            h.task.result()
        [failed] = h.rosters
        assert failed.reply_to == 7 and failed.type == "error" and "stopped" in failed.text
    asyncio.run(main())


def test_the_roster_timeout_is_the_seeds_ten_seconds_unless_a_flag_shortens_it():
    from hubd.cli import build_parser, config_from_args
    parser = build_parser()
    for argv, seconds in (([], 10.0), (["--roster-timeout", "0.5"], 0.5)):
        assert config_from_args(parser.parse_args(argv), parser).timing.roster_timeout == \
            seconds
    with pytest.raises(SystemExit):
        config_from_args(parser.parse_args(["--roster-timeout", "0"]), parser)


# -- the peer's retry schedule, journaled and restored (docs/federation.md,
# "Retries across a restart")


def test_a_refusing_peers_schedule_is_reported_once_per_level_and_cleared_by_an_answer():
    async def scenario(h):
        first, second = forward(1, h.clock), forward(2, h.clock)
        await h.connect()
        h.submit(first, second)
        await settle()
        h.sent_ids()
        await h.answer(answer(first.forward_id, "refused", "quota_exceeded"))
        await h.answer(answer(second.forward_id, "refused", "quota_exceeded"))
        # both wait 1 s at attempt 1: one schedule, not one per forward
        assert h.retries == [PeerRetry(1, h.clock.wall() + 1.0, True)]
        await h.clock.advance(1.1)
        assert sorted(h.sent_ids()) == sorted([first.forward_id, second.forward_id])
        await h.answer(answer(first.forward_id, "refused", "quota_exceeded"))
        assert [(r.attempts, r.refused) for r in h.retries] == [(1, True), (2, True)]
        await h.answer(answer(second.forward_id))  # the peer takes one: nothing to hold back
        assert h.retries[-1] is None and len(h.retries) == 3
    run(scenario)


def test_no_answer_is_journaled_as_such():
    async def scenario(h):
        item = forward(1, h.clock)
        await h.connect()
        h.link.far.mode = DROP
        h.submit(item)
        await settle()
        await h.clock.advance(ANSWER_TIMEOUT + 0.5)
        [retry] = h.retries
        assert retry.attempts == 1 and retry.refused is False
    run(scenario)


def restarted(retry_in: float, attempts: int = 4, refused: bool = True):
    """The scenario's harness starts as a restarted hub: its journal holds a
    backlog and the peer's retry schedule, due `retry_in` seconds from now."""
    def options(h):
        h.retry = PeerRetry(attempts, h.clock.wall() + retry_in, refused)
        h.backlog = [forward(n, h.clock) for n in range(3)]
        for item in h.backlog:
            h.journal[item.seq] = item
    return options


def test_after_a_restart_a_refusing_peers_backlog_waits_for_the_journaled_retry():
    async def scenario(h):
        await h.connect()  # this hub's first link-up since the restart
        assert h.sent_ids() == []
        assert all(h.state_of(i) == dl.HELD for i in h.backlog)
        h.outbox.mailbox.post(PeerAlive())  # a "not now" is not cut short by a sign of life
        await h.clock.advance(29.0)
        assert h.sent_ids() == []
        await h.clock.advance(1.5)  # the journaled retry is due
        assert h.sent_ids() == [i.forward_id for i in h.backlog]
        await h.answer(answer(h.backlog[0].forward_id, "refused", "quota_exceeded"))
        # the attempt count goes on from the journaled one, not from the start
        assert h.retries[-1].attempts == 5
    scenario.before_start = restarted(30.0)
    run(scenario)


def test_a_restored_wait_for_an_answer_yields_to_a_sign_of_life():
    async def scenario(h):
        await h.connect()
        assert h.sent_ids() == [] and h.state_of(h.backlog[0]) == dl.WAITING
        h.outbox.mailbox.post(PeerAlive())
        await settle()
        assert h.sent_ids() == [i.forward_id for i in h.backlog]
    scenario.before_start = restarted(30.0, refused=False)
    run(scenario)


def test_a_peer_that_comes_back_after_a_restart_gets_the_restored_backlog_at_once():
    async def scenario(h):
        await h.connect()
        assert h.sent_ids() == []
        await h.cut()  # the peer goes away and returns: it was away, not refusing
        await h.connect()
        assert h.sent_ids() == [i.forward_id for i in h.backlog]
    scenario.before_start = restarted(30.0)
    run(scenario)


def test_a_journaled_retry_already_due_holds_nothing_back_and_new_chats_are_not_held():
    async def scenario(h):
        fresh = forward(10, h.clock)
        h.submit(fresh)
        await h.connect()
        assert h.sent_ids() == [i.forward_id for i in h.backlog] + [fresh.forward_id]
    scenario.before_start = restarted(-5.0)
    run(scenario)

"""The ForwardOutbox on its own: an in-memory link to the peer, a manual clock,
no sockets and no sleeping. Its settlements and pending notices are what it
hands back; the peer's answers are frames the test sends."""

import asyncio

import pytest
from prometheus_client import CollectorRegistry

import federation.outbox as outbox_module
from federation.clock import ManualClock, settle
from federation.metrics import ForwardMetrics
from federation.outbox import ANSWER_TIMEOUT, ForwardOutbox
from federation.state import PendingForward
from hubd.state import delivery as dl
from tests.support.memlink import DROP, HANG, MemoryLink


def forward(n: int, clock: ManualClock, ttl: float = 3600.0) -> PendingForward:
    return PendingForward(
        forward_id=f"f{n:031d}", peer="west", seq=n, created=clock.wall(),
        expires_at=clock.wall() + ttl, sender="PROJ/alice", sender_seat="PROJ/alice",
        target_seat="PROJ/bob", body={"payload": f"chat {n}", "origin_msg_id": n,
                                      "origin_timestamp": clock.wall()},
        receipt_requested=True, client_msg_id=None, msg_id=n, target="PROJ/bob@west")


def answer(forward_id: str, disposition: str = "accepted", reason: str = "") -> dict:
    return {"type": "multihub_message_result", "forward_id": forward_id,
            "disposition": disposition, "reason_code": reason, "detail": "",
            "result": {"delivered": True, "recipients": ["PROJ/bob"]}}


class Harness:
    def __init__(self, batching: bool = False):
        self.clock = ManualClock()
        self.settled = []  # (forward_id, state, reason)
        self.notices = []  # (forward_id, why)
        self.link = MemoryLink("west", "east", self.clock, batching=batching)
        self.outbox = ForwardOutbox(
            "east", {"west": self.link}, ForwardMetrics(CollectorRegistry(), None),
            settle=lambda item, state, reason, detail, result:
                self.settled.append((item.forward_id, state, reason)),
            pending_notice=lambda item, why: self.notices.append((item.forward_id, why)),
            clock=self.clock)
        self.link.on_up = self.outbox.link_up
        self.link.on_down = self.outbox.link_down
        self.link.on_result = self.outbox.on_result
        self.link.on_rejected = self.outbox.peer_rejected
        self.tasks = []

    async def start(self):
        self.tasks = [asyncio.ensure_future(self.outbox.run_peer("west")),
                      asyncio.ensure_future(self.outbox.sweep())]
        await settle()

    async def stop(self):
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

    def submit(self, *items):
        for item in items:
            self.outbox.submit(item)

    def sent_ids(self) -> list[str]:
        ids = []
        for frame in self.link.far.take():
            if frame["type"] == "multihub_message_forward_batch":
                ids += [entry["forward_id"] for entry in frame["forwards"]]
            else:
                ids.append(frame["forward_id"])
        return ids

    def state_of(self, item) -> str:
        return self.outbox.queues["west"].items[item.forward_id].state


def run(scenario):
    async def main():
        h = Harness(**getattr(scenario, "options", {}))
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
        h.link.far.connect()
        await settle()
        [frame] = h.link.far.received
        assert frame["type"] == "multihub_message_forward_batch"
        assert h.sent_ids() == [i.forward_id for i in items]
        assert h.state_of(items[0]) == dl.IN_FLIGHT
        h.link.far.answer({"type": "multihub_message_result_batch",
                           "results": [answer(i.forward_id) for i in items]})
        assert [s[1] for s in h.settled] == ["accepted"] * 3
        assert h.outbox.backlog("west")[0] == 0
    scenario.options = {"batching": True}
    run(scenario)


def test_a_transient_refusal_is_retried_on_the_schedule_of_the_clock():
    async def scenario(h):
        item = forward(1, h.clock)
        h.link.far.connect()
        h.submit(item)
        await settle()
        assert h.sent_ids() == [item.forward_id]
        h.link.far.answer(answer(item.forward_id, "refused", "quota_exceeded"))
        assert h.state_of(item) == dl.HELD and h.notices
        await h.clock.advance(0.6)  # first retry is due after 1 s (jitter 0.5)
        assert h.sent_ids() == []
        await h.clock.advance(0.6)
        assert h.sent_ids() == [item.forward_id]
        h.link.far.answer(answer(item.forward_id, "refused", "quota_exceeded"))
        await h.clock.advance(1.6)  # the second waits 2 s (due at +2.0, seen by the
        assert h.sent_ids() == []   # sweep, which runs every 0.5 s)
        await h.clock.advance(0.8)
        assert h.sent_ids() == [item.forward_id]
        h.link.far.answer(answer(item.forward_id))
        assert h.settled == [(item.forward_id, "accepted", "")]
    run(scenario)


def test_a_final_refusal_settles_refused_and_an_unknown_answer_is_refused_too():
    async def scenario(h):
        first, second = forward(1, h.clock), forward(2, h.clock)
        h.link.far.connect()
        h.submit(first, second)
        await settle()
        h.sent_ids()
        h.link.far.answer(answer(first.forward_id, "refused", "namespace_not_granted"))
        h.link.far.answer(answer(second.forward_id, "perhaps"))
        assert h.settled == [(first.forward_id, "refused", "namespace_not_granted"),
                             (second.forward_id, "refused", "peer_invalid_answer")]
    run(scenario)


def test_an_answer_that_never_comes_times_out_and_is_resent():
    async def scenario(h):
        item = forward(1, h.clock)
        h.link.far.connect()
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
        h.link.far.connect()
        h.link.far.mode = DROP
        h.submit(unanswered)
        await settle()
        await h.clock.advance(ANSWER_TIMEOUT + 0.5)
        assert h.state_of(unanswered) == dl.WAITING  # its retry is due a second later
        h.link.far.mode = "deliver"
        h.submit(not_now)
        await settle()
        assert h.sent_ids() == [not_now.forward_id]
        h.link.far.answer(answer(not_now.forward_id, "refused", "quota_exceeded"))
        assert h.state_of(not_now) == dl.HELD
        h.outbox.peer_alive("west")  # e.g. the peer's own link to this hub came up
        await settle()
        assert h.sent_ids() == [unanswered.forward_id]
        assert h.state_of(unanswered) == dl.IN_FLIGHT
        assert h.state_of(not_now) == dl.HELD  # the peer asked to wait: it still waits
        h.link.far.answer(answer(unanswered.forward_id))
        await h.clock.advance(1.5)  # not_now's own backoff (1 s, jitter 0.5) runs out
        assert h.sent_ids() == [not_now.forward_id]
        h.link.far.answer(answer(not_now.forward_id))
        assert h.settled == [(unanswered.forward_id, "accepted", ""),
                             (not_now.forward_id, "accepted", "")]
    run(scenario)


def test_a_cut_returns_forwards_in_flight_to_the_front_and_a_return_drains_at_once():
    async def scenario(h):
        items = [forward(n, h.clock) for n in range(3)]
        h.link.far.connect()
        h.submit(*items)
        await settle()
        assert len(h.sent_ids()) == 3
        h.link.far.cut()
        assert all(h.state_of(i) == dl.QUEUED for i in items)
        assert len(h.notices) == 3  # each sender is told its forward waits
        h.link.far.connect()  # no time passes: everything goes out now, in order
        await settle()
        assert h.sent_ids() == [i.forward_id for i in items]
        for i in items:
            h.link.far.answer(answer(i.forward_id, "duplicate"))
        assert [s[1] for s in h.settled] == ["duplicate"] * 3
    run(scenario)


def test_a_hung_send_holds_nothing_else_up_and_is_requeued_by_the_cut():
    async def scenario(h):
        item = forward(1, h.clock)
        h.link.far.connect()
        h.link.far.mode = HANG
        h.submit(item)
        await settle()
        assert h.state_of(item) == dl.IN_FLIGHT and h.link.far.received == []
        h.link.far.cut()
        await settle()
        assert h.state_of(item) == dl.QUEUED
        h.link.far.mode = "deliver"
        h.link.far.connect()
        await settle()
        assert h.sent_ids() == [item.forward_id]
    run(scenario)


def test_rows_past_their_ttl_expire_whatever_their_state():
    async def scenario(h):
        waiting, queued = forward(1, h.clock, ttl=5), forward(2, h.clock, ttl=5)
        h.link.far.connect()
        h.submit(waiting)
        await settle()
        h.sent_ids()
        h.link.far.answer(answer(waiting.forward_id, "refused", "chat_refused"))
        h.link.far.cut()
        h.submit(queued)
        await h.clock.advance(5.5)
        assert sorted(h.settled) == sorted([(waiting.forward_id, "expired", "forward_expired"),
                                            (queued.forward_id, "expired", "forward_expired")])
    run(scenario)


def test_in_flight_is_bounded_by_the_window(monkeypatch):
    monkeypatch.setattr(outbox_module, "WINDOW", 2)

    async def scenario(h):
        items = [forward(n, h.clock) for n in range(5)]
        h.link.far.connect()
        h.submit(*items)
        await settle()
        assert h.sent_ids() == [i.forward_id for i in items[:2]]
        h.link.far.answer(answer(items[0].forward_id))
        await settle()
        assert h.sent_ids() == [items[2].forward_id]
        assert len(h.outbox.queues["west"].in_flight) == 2
    run(scenario)


def test_a_peer_older_than_wire_v5_refuses_every_forward_without_retries():
    async def scenario(h):
        items = [forward(n, h.clock) for n in range(2)]
        h.submit(*items)
        h.link.far.connect()
        await settle()
        h.link.far.answer({"type": "error",
                           "payload": "Unknown message type 'multihub_message_forward'."})
        assert [s[1:] for s in h.settled] == [("refused", "peer_rejected")] * 2
    run(scenario)


@pytest.mark.parametrize("disposition", ["accepted", "duplicate"])
def test_a_late_answer_after_settling_changes_nothing(disposition):
    async def scenario(h):
        item = forward(1, h.clock)
        h.link.far.connect()
        h.submit(item)
        await settle()
        h.link.far.answer(answer(item.forward_id, disposition))
        h.link.far.answer(answer(item.forward_id, disposition))
        assert len(h.settled) == 1
    run(scenario)

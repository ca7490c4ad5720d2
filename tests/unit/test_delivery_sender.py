"""The DeliverySender actor on its own: the real PeerLink over an in-memory
pair, a manual clock, no sockets and no sleeping. What it tells the Router is
its DeliveryAnswered messages."""

import asyncio

import pytest

from federation.actors.delivery_sender import DeliveryAsk, DeliverySender
from federation.clock import ManualClock, settle
from federation.delivery_forward_rules import PEER_REJECTED, PEER_UNREACHABLE
from hubd.timing import Timing
from tests.support.memlink import DROP, MemoryLink

ANSWER_TIMEOUT = Timing().forward_answer  # production's: the seed's ten seconds


def delivery(n: int, kind: str = "delivery_request") -> DeliveryAsk:
    forward_id = f"f{n:031d}"
    frame = {"sender": "east", "target": "west", "type": "multihub_message_forward",
             "payload": "", "forward_id": forward_id, "kind": kind,
             "sender_seat": "PROJ/alice", "target_seat": "PROJ/bob",
             "body": {"request_id": f"r{n}"}}
    return DeliveryAsk(forward_id, kind, frame, 7, "PROJ/alice", f"r{n}", None)


def result(forward_id: str) -> dict:
    return {"type": "multihub_message_result", "forward_id": forward_id,
            "disposition": "accepted", "result": {"status": {"stage": "queued"}}}


class Harness:
    def __init__(self, **link_options):
        self.clock = ManualClock()
        self.told = []
        self.link = MemoryLink("west", "east", self.clock, **link_options)
        self.sender = DeliverySender("west", self.link, self.link.far.subscribe, self.told.append,
                                     timeout=ANSWER_TIMEOUT, clock=self.clock)
        self.task = asyncio.ensure_future(self.sender.run())

    async def __aenter__(self):
        self.link.far.connect()
        await settle()
        return self

    async def __aexit__(self, *exc):
        if not self.task.done():
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)

    def refusals(self):
        return [(t.ask.request_id, t.code) for t in self.told if t.answer is None]


def run(scenario):
    asyncio.run(scenario())


def test_an_ask_goes_over_the_link_and_its_answer_comes_back_as_a_message():
    async def scenario():
        async with Harness() as h:
            ask = delivery(1)
            assert h.sender.submit(ask)
            await settle()
            [sent] = h.link.far.take("multihub_message_forward")
            assert sent == ask.frame
            h.link.far.answer(result(ask.forward_id))
            await settle()
            [answered] = h.told
            assert answered.ask == ask and answered.peer == "west"
            assert answered.answer["result"]["status"]["stage"] == "queued"
            assert h.sender.held() == 0 and len(h.link.answers) == 0
    run(scenario)


def test_a_link_that_is_down_is_refused_at_once_and_nothing_is_sent():
    async def scenario():
        async with Harness() as h:
            h.link.far.cut()
            await settle()
            h.sender.submit(delivery(1))
            await settle()
            assert h.refusals() == [("r1", PEER_UNREACHABLE)]
            assert "the link to hub 'west' is down" in h.told[0].text
            assert h.link.far.take() == []
    run(scenario)


@pytest.mark.parametrize("options", [{"protocol_version": 4},
                                     {"protocol_version": 7, "features": ["forward_batch"]}],
                         ids=["not-hubd-below-v5", "hubd-without-the-feature"])
def test_a_peer_that_does_not_serve_intents_is_refused_by_what_its_welcome_said(options):
    async def scenario():
        async with Harness(**options) as h:
            h.sender.submit(delivery(1))
            await settle()
            assert h.refusals() == [("r1", PEER_REJECTED)]
            assert h.link.far.take() == []
    run(scenario)


def test_no_answer_within_the_bound_of_the_clock_is_unreachable_and_a_late_one_changes_nothing():
    async def scenario():
        async with Harness() as h:
            h.link.far.mode = DROP
            ask = delivery(1)
            h.sender.submit(ask)
            await settle()
            await h.clock.advance(ANSWER_TIMEOUT - 0.5)
            assert h.told == []
            await h.clock.advance(1.0)  # past the bound, within the sender's 0.5 s sweep
            assert h.refusals() == [("r1", PEER_UNREACHABLE)]
            assert "did not answer" in h.told[0].text and "10s" in h.told[0].text
            assert len(h.link.answers) == 0  # its waiter left the link's table
            h.link.far.answer(result(ask.forward_id))
            await settle()
            assert len(h.told) == 1
    run(scenario)


def test_a_link_that_drops_while_an_ask_waits_answers_it_at_once():
    async def scenario():
        async with Harness() as h:
            h.sender.submit(delivery(1))
            await settle()
            h.link.far.cut()
            await settle()
            assert h.refusals() == [("r1", PEER_UNREACHABLE)]
            assert "did not answer: link went down" in h.told[0].text
    run(scenario)


def test_asks_in_flight_start_no_task_of_their_own():
    async def scenario():
        async with Harness() as h:
            h.link.far.mode = DROP
            await settle()
            before = len(asyncio.all_tasks())
            for n in range(50):
                assert h.sender.submit(delivery(n))
            await settle()
            assert h.sender.held() == 50 and len(h.link.far.dropped) == 50
            assert len(asyncio.all_tasks()) == before
    run(scenario)


def test_the_sender_refuses_past_its_bound():
    async def scenario():
        clock = ManualClock()
        link = MemoryLink("west", "east", clock)
        sender = DeliverySender("west", link, link.far.subscribe, lambda answered: None,
                                timeout=ANSWER_TIMEOUT, clock=clock, bound=2)
        assert sender.submit(delivery(1)) and sender.submit(delivery(2))
        assert not sender.submit(delivery(3))
    run(scenario)


def test_a_sender_that_dies_answers_what_it_held_and_fails_loudly():
    async def scenario():
        async with Harness() as h:
            h.link.far.mode = DROP
            for n in range(2):
                h.sender.submit(delivery(n))
            await settle()
            h.sender._post("not an event")  # a defect in whoever posted it
            await settle()
            assert h.task.done()
            with pytest.raises(TypeError, match="unknown event"):
                h.task.result()
            assert sorted(h.refusals()) == [("r0", PEER_UNREACHABLE), ("r1", PEER_UNREACHABLE)]
            assert all("unknown" in t.text and "internal error" in t.text for t in h.told)
            assert len(h.link.answers) == 0
    run(scenario)

"""The WatchFollower actor on its own: an in-memory link to the watched peer, a
manual clock, no sockets and no sleeping. What it tells is its messages."""

import asyncio

from federation.clock import ManualClock, settle
from federation.actors.watch import Equivocated, Observed, SetQuarantine, WatchFollower
from hubd.timing import Timing
from tests.support.memlink import DROP, MemoryLink

LOG = [
    {"seq": 1, "ts": 1.0, "kind": "chat", "payload": {"text": "hi"}},
    {"seq": 2, "ts": 2.0, "kind": "claim", "payload": {
        "task_id": "t", "owner": "PROJ/nina", "epoch": 1, "lease_expires_at": 2e9}},
]


def page(request: dict, log=LOG) -> dict:
    after = request["after_seq"]
    events = [e for e in log if e["seq"] > after]
    return {"type": "multihub_log_snapshot", "events": events,
            "next_cursor": events[-1]["seq"] if events else after,
            "log_end_seq": log[-1]["seq"]}


class Harness:
    def __init__(self, interval=5.0):
        self.clock = ManualClock()
        self.told = []
        self.follower = WatchFollower("north", None, Timing(watch_interval=interval),
                                      self.told.append, "east",
                                      clock=self.clock)
        self.link = MemoryLink("north", "east", self.clock, on_up=self.follower.link_up)
        self.follower.link = self.link
        self.task = None

    async def start(self):
        self.task = asyncio.ensure_future(self.follower.run())
        await settle()

    async def stop(self):
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)

    async def serve(self, log=LOG):
        """Answer every pull waiting on the far end."""
        for request in self.link.far.take("multihub_log_request"):
            self.link.far.answer(page(request, log))
        await settle()


def test_a_link_coming_up_wakes_the_follower_at_once():
    async def scenario():
        h = Harness(interval=60.0)
        await h.start()
        # the first poll finds the link down: a failure, the last observation stands
        [first] = h.told
        assert isinstance(first, Observed) and first.asserting is None
        assert not first.refreshed_ok and first.status.polls == 1
        h.link.far.connect()  # no time passes: the wake is what polls now
        await settle()
        await h.serve()
        assert isinstance(h.told[-1], Observed)
        assert h.told[-1].asserting == {"PROJ": {"north"}} and h.told[-1].refreshed_ok
        assert h.told[-1].status.cursor == 2 and h.told[-1].status.lag == 0
        assert h.clock.monotonic() == 1000.0
        await h.stop()
    asyncio.run(scenario())


def test_it_polls_every_interval_of_its_clock_re_reading_an_overlap():
    async def scenario():
        h = Harness(interval=5.0)
        h.link.far.connect()
        await h.start()
        await h.serve()
        assert len(h.told) == 1
        await h.clock.advance(4.9)
        assert h.link.far.received == []
        await h.clock.advance(0.2)
        [again] = h.link.far.take("multihub_log_request")
        assert again["after_seq"] == 0  # cursor 2, minus the overlap re-read
        h.link.far.answer(page(again))
        await settle()
        assert len(h.told) == 2 and h.told[-1].status.polls == 2
        await h.stop()
    asyncio.run(scenario())


def test_a_pull_that_is_never_answered_fails_at_the_clocks_timeout():
    async def scenario():
        h = Harness(interval=60.0)
        h.link.far.connect()
        h.link.far.mode = DROP
        await h.start()
        assert h.told == []
        await h.clock.advance(10.1)
        [failed] = h.told
        assert failed.asserting is None and "10s" in failed.status.last_error
        await h.stop()
    asyncio.run(scenario())


def test_a_rewritten_history_quarantines_the_peer_and_it_is_not_polled_again():
    async def scenario():
        h = Harness(interval=5.0)
        h.link.far.connect()
        await h.start()
        await h.serve()
        await h.clock.advance(5.1)
        rewritten = [LOG[0], dict(LOG[1], ts=2.5)]
        await h.serve(rewritten)
        assert isinstance(h.told[-1], Equivocated) and h.told[-1].error.seq == 2
        assert h.told[-1].status.quarantined
        count = len(h.told)
        await h.clock.advance(60)
        assert h.link.far.received == [] and len(h.told) == count
        # the Router lifts the quarantine (restored from the journal): polling resumes
        h.follower.post(SetQuarantine(False))
        await settle()
        assert h.link.far.take("multihub_log_request")
        await h.stop()
    asyncio.run(scenario())

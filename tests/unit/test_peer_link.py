"""The PeerLink actor on its own: the real link over an in-memory pair
(tests/support/memlink.py) on a manual clock, no sockets and no sleeping.
What it owns is its inbox, its writer loop, its watchdog and the answers it
correlates; what it tells is its subscribers' events and its asks' futures."""

import asyncio

import pytest

from federation.actors.link import Ask
from federation.actors.link_socket import (BUSY, CLOSED, SILENT, STALLED, TIMEOUT,
                                           LinkError)
from federation.clock import ManualClock, settle
from hubd.timing import Timing
from tests.support.memlink import HANG, MemoryLink

TIMING = Timing()  # production's, which MemoryLink's links run with


def run(scenario):
    asyncio.run(scenario())


async def connected(clock, **options):
    events = []
    link = MemoryLink("west", "east", clock,
                      on_up=lambda peer: events.append("up"),
                      on_down=lambda peer, cause: events.append(("down", cause)), **options)
    link.far.connect()
    await settle()
    assert link.up and events == ["up"]
    return link, events


def ask(link, n: int, reply_type: str = "multihub_log_snapshot", key=None) -> asyncio.Future:
    reply = asyncio.get_running_loop().create_future()
    link.post(Ask({"type": "multihub_log_request", "n": n}, key, reply_type, reply))
    return reply


async def keep_talking(link, clock, seconds: float) -> None:
    """The peer keeps sending (so it is not silent) while time passes."""
    for _ in range(int(seconds / TIMING.link_ping)):
        link.far.send({"type": "presence", "sender": "System"})
        await clock.advance(TIMING.link_ping)


def test_the_link_registers_under_its_hub_id_and_reads_the_welcome():
    async def scenario():
        clock = ManualClock()
        link, _ = await connected(clock, batching=True)
        assert link.far.registered["sender"] == "east"
        assert link.far.registered["type"] == "heartbeat"
        assert link.batching and link.features == frozenset({"forward_batch"})
        assert link.far.received == []  # the registration is not a request
    run(scenario)


def test_a_write_that_does_not_complete_cuts_the_link_and_fails_what_waited():
    """A peer that keeps talking but stopped reading: the write in progress
    has not completed within the stall deadline, so the link is cut (not
    left to hold every request behind it) and redialled."""
    async def scenario():
        clock = ManualClock()
        link, events = await connected(clock)
        link.far.mode = HANG
        assert link.send({"type": "multihub_message_forward", "forward_id": "f1"})
        waiting = ask(link, 1)
        await settle()
        assert not waiting.done() and link.health()["inbox"] == 1  # behind the stuck write
        await keep_talking(link, clock, TIMING.link_write_stall - 1.0)
        assert link.up and not waiting.done()
        await keep_talking(link, clock, 1.5)
        assert events == ["up", ("down", STALLED)]
        assert link.stall_closes == 1 and link.last_error["cause"] == STALLED
        assert isinstance(waiting.exception(), LinkError)
        assert waiting.exception().cause == CLOSED  # heard at once, not at a timeout
        link.far.mode = "deliver"
        await clock.advance(1.0)  # the reconnect backoff, on the clock
        assert link.up and link.connects == 2 and events[-1] == "up"
        assert link.send({"type": "multihub_message_forward", "forward_id": "f2"})
        await settle()
        assert [f["forward_id"] for f in link.far.take()] == ["f2"]
    run(scenario)


def test_a_silent_peer_is_closed_for_silence_on_the_clock():
    async def scenario():
        clock = ManualClock()
        link, events = await connected(clock)
        link.far.silent = True  # answers no ping
        await clock.advance(TIMING.link_silence - 0.1)
        assert link.up
        await clock.advance(1.0)
        assert events[:2] == ["up", ("down", SILENT)] and link.silence_closes == 1
        assert "pings unanswered" in link.last_error["detail"]
    run(scenario)


def test_the_inbox_is_bounded_and_a_post_past_it_is_refused_at_once():
    async def scenario():
        clock = ManualClock()
        link, _ = await connected(clock, inbox=3)
        for n in range(3):
            assert link.send({"type": "multihub_message_forward", "forward_id": f"f{n}"})
        assert not link.send({"type": "multihub_message_forward", "forward_id": "f3"})
        refused = ask(link, 4)
        assert isinstance(refused.exception(), LinkError) and refused.exception().cause == BUSY
        assert link.health()["refused_busy"] == 2
        await settle()  # the writer drains the inbox, in order
        assert [f["forward_id"] for f in link.far.take()] == ["f0", "f1", "f2"]
        assert link.send({"type": "multihub_message_forward", "forward_id": "f4"})
    run(scenario)


def test_a_post_to_a_link_that_is_down_is_refused_at_once():
    async def scenario():
        clock = ManualClock()
        link = MemoryLink("west", "east", clock)
        await settle()
        assert not link.up and not link.send({"type": "multihub_message_forward"})
        refused = ask(link, 1)
        assert refused.exception().cause == CLOSED
        with pytest.raises(LinkError, match="closed"):
            await link.request({"type": "multihub_log_request"}, 1.0,
                               reply_type="multihub_log_snapshot")
    run(scenario)


def test_answers_in_order_meet_the_asks_in_the_order_written_skipping_one_that_gave_up():
    async def scenario():
        clock = ManualClock()
        link, _ = await connected(clock)
        first, second, third = ask(link, 1), ask(link, 2), ask(link, 3)
        await settle()
        assert [f["n"] for f in link.far.take()] == [1, 2, 3]
        first.cancel()  # its asker gave up
        link.far.send({"type": "multihub_log_snapshot", "events": [], "answer": "a"})
        link.far.send({"type": "multihub_log_snapshot", "events": [], "answer": "b"})
        await settle()
        assert second.result()["answer"] == "a" and third.result()["answer"] == "b"
        assert len(link.answers) == 0  # nothing left waiting in the table
    run(scenario)


def test_an_answer_of_any_other_type_meets_the_first_ask_waiting_for_that_type():
    """Cross-hub attachment reads wait in order for attachment_peer_result;
    an answer nobody waits for is dropped."""
    async def scenario():
        clock = ManualClock()
        link, _ = await connected(clock)
        snapshot = ask(link, 1)
        read = ask(link, 2, "attachment_peer_result")
        await settle()
        link.far.send({"type": "attachment_peer_result", "ok": True, "n": 2})
        link.far.send({"type": "attachment_peer_result", "ok": False})  # nobody waits
        await settle()
        assert read.result()["n"] == 2 and not snapshot.done()
    run(scenario)


def test_an_ask_whose_asker_gave_up_while_it_waited_is_never_written():
    async def scenario():
        clock = ManualClock()
        link, _ = await connected(clock)
        gone, kept = ask(link, 1), ask(link, 2)
        gone.cancel()
        await settle()
        assert [f["n"] for f in link.far.take()] == [2] and not kept.done()
    run(scenario)


def test_an_answer_that_names_a_request_goes_to_that_request_only():
    async def scenario():
        clock = ManualClock()
        link, _ = await connected(clock)
        late = ask(link, 1, "multihub_claim_result", key="r-1")
        current = ask(link, 2, "multihub_claim_result", key="r-2")
        await settle()
        late.cancel()
        link.far.send({"type": "multihub_claim_result", "request_id": "r-1", "granted": True})
        await settle()
        assert not current.done()  # the late answer was r-1's
        link.far.send({"type": "multihub_claim_result", "request_id": "r-2", "granted": False})
        await settle()
        assert current.result()["granted"] is False
    run(scenario)


def test_a_request_times_out_on_the_clock_and_leaves_the_table():
    async def scenario():
        clock = ManualClock()
        link, _ = await connected(clock)
        asking = asyncio.ensure_future(link.request(
            {"type": "multihub_log_request"}, 10.0, reply_type="multihub_log_snapshot"))
        await clock.advance(9.5)
        assert not asking.done()
        await clock.advance(1.0)
        with pytest.raises(LinkError) as failed:
            await asking
        assert failed.value.cause == TIMEOUT and len(link.answers) == 0
    run(scenario)


def test_a_peer_that_never_welcomes_is_given_up_at_the_connect_timeout_of_the_clock():
    async def scenario():
        clock = ManualClock()
        link = MemoryLink("west", "east", clock)
        link.far.welcomes = False
        link.far.connect()
        await settle()
        assert not link.up and link.far.registered is not None
        await clock.advance(TIMING.link_connect + 0.1)
        assert link.last_error["cause"] == TIMEOUT and not link.up
    run(scenario)


def test_a_writer_that_fails_in_a_way_nobody_expected_fails_the_link_loudly():
    """A defect under the writer (not a connection that ended) ends the link's
    task with the exception, so a hub stops instead of keeping a link that can
    no longer write; whatever waited hears that the link went down."""
    async def scenario():
        clock = ManualClock()
        link, events = await connected(clock)
        link.far.defect = RuntimeError("a bug below the link")
        waiting = ask(link, 1)
        await settle()
        assert link.far.task.done()
        with pytest.raises(RuntimeError, match="a bug below the link"):
            link.far.task.result()
        assert waiting.exception().cause == CLOSED and events[-1][0] == "down"
    run(scenario)

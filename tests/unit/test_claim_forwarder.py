"""The ClaimForwarder actor on its own: an in-memory link, a manual clock, no
sockets and no sleeping. Its verdicts are the messages it hands back."""

import asyncio

import pytest

from federation.actors.claim_forwarder import (LEASE_ENDED, LEASE_HELD, ClaimForwarder,
                                               ClaimForwarderFull, ForwardClaim)
from federation.clock import ManualClock, settle
from hubd.timing import Timing
from tests.support.memlink import DROP, HANG, MemoryLink

LEASE = {"task_id": "t-1", "owner": "PROJ/amy", "epoch": 4, "version": 0,
         "lease_expires_at": 2e9, "status": "claimed", "paths": ["src"]}


def request(n: int, verb: str = "claim", owner: str = "east") -> ForwardClaim:
    rid = f"r-{n}"
    frame = {"type": "multihub_claim_request", "request_id": rid, "namespace": "PROJ",
             "claimant": "PROJ/amy", "task_id": "t-1", "claim": {"type": verb}}
    return ForwardClaim(rid, owner, verb, "PROJ", "t-1", "PROJ/amy", frame, reply_to=("conn", n))


def result(frame: dict, granted=True, **extra) -> dict:
    return {"type": "multihub_claim_result", "request_id": frame["request_id"],
            "granted": granted, "task_id": "t-1", "namespace": "PROJ", "owner_hub_id": "east",
            "detail": "ok" if granted else "no", **extra}


class Harness:
    def __init__(self, **options):
        self.clock = ManualClock()
        self.link = MemoryLink("east", "west", self.clock)
        self.verdicts = []
        options.setdefault("timeout", Timing().claim_answer)
        self.forwarder = ClaimForwarder({"east": self.link}, self.verdicts.append,
                                        clock=self.clock, **options)
        self.task = None

    async def __aenter__(self):
        self.link.far.connect()
        self.task = asyncio.ensure_future(self.forwarder.run())
        await settle()
        return self

    async def __aexit__(self, *exc):
        if not self.task.done():
            self.task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await self.task


def run(coro):
    asyncio.run(coro)


def test_a_grant_comes_back_as_a_verdict_with_the_owners_lease():
    async def scenario():
        async with Harness() as h:
            h.forwarder.submit(request(1))
            await settle()
            [sent] = h.link.far.take("multihub_claim_request")
            h.link.far.answer(result(sent, grant={"type": "claim_granted", **LEASE},
                                     lease={**LEASE, "claimed_at": 1.0}))
            await settle()
            [verdict] = h.verdicts
            assert verdict.ok and verdict.type == "claim_granted"
            assert verdict.lease_effect == LEASE_HELD and verdict.lease["claimed_at"] == 1.0
            assert verdict.fields["epoch"] == 4 and "type" not in verdict.fields
            assert verdict.fields["owner_hub_id"] == "east"
            assert h.forwarder.health()["in_flight"] == 0
    run(scenario())


@pytest.mark.parametrize("verb,granted_type,effect", [
    ("release", "release_granted", LEASE_ENDED), ("task_update", "task_updated", LEASE_HELD),
    ("checkpoint", "checkpoint_saved", LEASE_HELD), ("handoff", "handoff_granted", LEASE_HELD),
    ("wait_request", "wait_granted", None)])
def test_every_claim_family_verb_is_forwarded(verb, granted_type, effect):
    async def scenario():
        async with Harness() as h:
            h.forwarder.submit(request(1, verb))
            await settle()
            [sent] = h.link.far.take()
            assert sent["claim"]["type"] == verb
            lease = None if verb in ("release", "wait_request") else LEASE
            h.link.far.answer(result(sent, lease=lease))
            await settle()
            [verdict] = h.verdicts
            assert (verdict.ok, verdict.type, verdict.lease_effect) == (True, granted_type, effect)
    run(scenario())


def test_a_refusal_keeps_the_owners_words_and_task_updates_refuse_as_errors():
    async def scenario():
        async with Harness() as h:
            h.forwarder.submit(request(1, "task_update"))
            await settle()
            [sent] = h.link.far.take()
            h.link.far.answer(result(sent, granted=False, detail="Task 't-1' not found."))
            await settle()
            [verdict] = h.verdicts
            assert (verdict.ok, verdict.type, verdict.text) == (False, "error",
                                                                "Task 't-1' not found.")
            assert verdict.lease_effect is None
    run(scenario())


@pytest.mark.parametrize("grant,code", [
    ({"reason_code": "SCOPE_CONFLICT", "conflict_task_id": "t-0", "holder": "PROJ/bob"},
     "SCOPE_CONFLICT"),
    ({"reason_code": "LEASE_LIVE", "conflict_task_id": "t-1", "holder": "PROJ/bob"},
     "LEASE_LIVE"),
    (None, "CLAIM_DENIED"),  # the reference hub: the text only
    ({"reason_code": "scope conflict!"}, "CLAIM_DENIED"),
    ({"reason_code": ["LEASE_LIVE"]}, "CLAIM_DENIED"),
    ({"reason_code": "X" * 65}, "CLAIM_DENIED")])
def test_a_refused_claim_carries_the_owners_stable_code_or_the_generic_one(grant, code):
    async def scenario():
        async with Harness() as h:
            h.forwarder.submit(request(1))
            await settle()
            [sent] = h.link.far.take()
            h.link.far.answer(result(sent, granted=False, grant=grant,
                                     detail="Task 't-1' is already claimed by PROJ/bob."))
            await settle()
            [verdict] = h.verdicts
            assert (verdict.type, verdict.text) == (
                "claim_denied", "Task 't-1' is already claimed by PROJ/bob.")
            assert verdict.fields["reason_code"] == code
            assert verdict.fields["owner_hub_id"] == "east"
            if code != "CLAIM_DENIED":
                assert verdict.fields == {"task_id": "t-1", "namespace": "PROJ",
                                          "owner_hub_id": "east", **grant}
    run(scenario())


def claim_on(n: int, task: str) -> ForwardClaim:
    c = request(n)
    frame = {**c.request, "task_id": task}
    return ForwardClaim(c.request_id, c.owner, c.verb, c.namespace, task, c.claimant, frame,
                        c.reply_to)


def test_an_owner_that_echoes_no_request_id_is_answered_in_order():
    """The reference hub's multihub_claim_result carries no request_id: its
    answers, one socket served in order, go to the requests in order."""
    async def scenario():
        async with Harness() as h:
            for n, task in ((1, "t-a"), (2, "t-b")):
                h.forwarder.submit(claim_on(n, task))
            await settle()
            sent = h.link.far.take()
            assert [f["task_id"] for f in sent] == ["t-a", "t-b"]
            for frame in sent:
                answer = {k: v for k, v in result(frame, granted=False).items()
                          if k != "request_id"}
                h.link.far.answer({**answer, "task_id": frame["task_id"],
                                   "detail": f"no for {frame['task_id']}"})
            await settle()
            assert [(v.claim.task_id, v.text, v.fields["reason_code"]) for v in h.verdicts] == \
                [("t-a", "no for t-a", "CLAIM_DENIED"), ("t-b", "no for t-b", "CLAIM_DENIED")]
    run(scenario())


def test_an_answer_in_order_about_another_task_is_not_this_requests():
    async def scenario():
        async with Harness() as h:
            h.forwarder.submit(claim_on(1, "t-a"))
            await settle()
            [sent] = h.link.far.take()
            answer = {k: v for k, v in result(sent).items() if k != "request_id"}
            h.link.far.answer({**answer, "task_id": "t-other"})
            await settle()
            [verdict] = h.verdicts
            assert not verdict.ok and verdict.fields["forward_error"] == "invalid_answer"
    run(scenario())


def test_a_late_answer_naming_a_request_that_gave_up_answers_no_other():
    async def scenario():
        async with Harness(timeout=10.0) as h:
            h.forwarder.submit(claim_on(1, "t-a"))
            await settle()
            [late] = h.link.far.take()
            await h.clock.advance(10.1)
            [gave_up] = h.verdicts
            assert gave_up.fields["forward_error"] == "timeout"
            h.forwarder.submit(claim_on(2, "t-a"))
            await settle()
            [current] = h.link.far.take()
            h.link.far.answer(result(late, task_id="t-a",
                                     grant={"type": "claim_granted", **LEASE}))
            await settle()
            assert len(h.verdicts) == 1  # the late grant was r-1's, not r-2's
            h.link.far.answer(result(current, granted=False, task_id="t-a", detail="no"))
            await settle()
            assert [(v.claim.request_id, v.ok, v.text) for v in h.verdicts[1:]] == \
                [("r-2", False, "no")]
    run(scenario())


def test_an_owner_that_never_answers_is_refused_at_the_timeout_of_the_clock():
    async def scenario():
        async with Harness(timeout=10.0) as h:
            h.link.far.mode = DROP  # the request vanishes on the way
            h.forwarder.submit(request(1))
            await settle()
            await h.clock.advance(9.9)
            assert h.verdicts == []
            await h.clock.advance(0.2)
            [verdict] = h.verdicts
            assert not verdict.ok and verdict.fields["forward_error"] == "timeout"
            assert "did not answer" in verdict.text
    run(scenario())


def test_a_hung_send_and_a_cut_link_are_refused_not_lost():
    async def scenario():
        async with Harness() as h:
            h.link.far.mode = HANG
            h.forwarder.submit(request(1))
            await settle()
            assert h.verdicts == [] and h.forwarder.health()["in_flight"] == 1
            h.link.far.cut()
            await settle()
            [verdict] = h.verdicts
            assert not verdict.ok and verdict.fields["forward_error"] == "closed"
            # while the link is down, a claim is refused at once
            h.forwarder.submit(request(2))
            await settle()
            assert h.verdicts[1].fields["forward_error"] == "closed"
    run(scenario())


def test_an_answer_that_is_not_one_is_refused_as_invalid():
    async def scenario():
        async with Harness() as h:
            h.forwarder.submit(request(1))
            await settle()
            [sent] = h.link.far.take()
            h.link.far.answer({"type": "multihub_claim_result", "request_id": sent["request_id"],
                               "granted": "yes"})
            await settle()
            assert h.verdicts[0].fields["forward_error"] == "invalid_answer"
    run(scenario())


def test_in_flight_and_inbox_are_bounded_and_a_full_inbox_is_refused_visibly():
    async def scenario():
        async with Harness(in_flight=2, inbox=3) as h:
            h.link.far.mode = DROP
            for n in range(2):
                h.forwarder.submit(request(n))
            await settle()
            assert len(h.link.far.dropped) == 2  # two in flight
            for n in range(2, 5):
                h.forwarder.submit(request(n))  # waiting in the inbox
            await settle()
            assert len(h.link.far.dropped) == 2 and h.forwarder.health()["queued"] == 3
            with pytest.raises(ClaimForwarderFull):
                h.forwarder.submit(request(5))
            assert h.forwarder.health()["refused_full"] == 1
            # as the first two time out, the next two go out
            await h.clock.advance(10.5)
            assert len(h.verdicts) == 2 and len(h.link.far.dropped) == 4
    run(scenario())


def test_an_actor_that_dies_answers_its_pending_requests_and_fails_loudly():
    async def scenario():
        delivered = []

        def deliver(verdict):
            if verdict.claim.request_id == "r-0":
                raise RuntimeError("the Router side broke")
            delivered.append(verdict)

        clock = ManualClock()
        link = MemoryLink("east", "west", clock)
        link.far.connect()
        forwarder = ClaimForwarder({"east": link}, deliver, timeout=Timing().claim_answer,
                                   clock=clock)
        task = asyncio.ensure_future(forwarder.run())
        for n in range(3):
            forwarder.submit(request(n))
        await settle()
        for sent in link.far.take()[:1]:
            link.far.answer(result(sent))
        await settle()
        with pytest.raises(ExceptionGroup) as failed:
            await task
        assert failed.group_contains(RuntimeError, match="the Router side broke")
        # r-1 and r-2 were in flight: their claimants hear that the outcome is unknown
        assert sorted(v.claim.request_id for v in delivered) == ["r-1", "r-2"]
        assert all(not v.ok and v.fields["forward_error"] == "forwarder_stopped"
                   and "unknown" in v.text for v in delivered)
    run(scenario())

"""Dead-link decisions (federation/liveness.py) and the outbox's wake-up on a
sign of life, without IO (an in-memory link stand-in)."""

import asyncio

from federation import liveness
from federation.outbox import ANSWER_TIMEOUT, ForwardOutbox
from federation.state import PendingForward


def test_silence_past_the_deadline_is_dead():
    assert not liveness.is_dead(now=10.0, last_heard=10.0)
    assert not liveness.is_dead(now=10.0 + liveness.SILENCE_DEADLINE, last_heard=10.0)
    assert liveness.is_dead(now=10.01 + liveness.SILENCE_DEADLINE, last_heard=10.0)
    assert liveness.silent_for(5.0, 7.0) == 0.0  # a clock read before the last message


def test_deadline_leaves_room_for_several_pings():
    assert liveness.SILENCE_DEADLINE >= 3 * liveness.PING_INTERVAL


def test_backoff_doubles_to_its_cap_and_resets_after_a_stable_link():
    backoff, seen = liveness.BACKOFF_START, []
    for _ in range(6):
        backoff = liveness.next_backoff(backoff, up_for=None)
        seen.append(backoff)
    assert seen == sorted(seen) and seen[-1] == liveness.BACKOFF_MAX
    assert liveness.next_backoff(liveness.BACKOFF_MAX, up_for=1.0) == liveness.BACKOFF_MAX
    assert liveness.next_backoff(liveness.BACKOFF_MAX,
                                 up_for=liveness.STABLE_AFTER + 1) == liveness.BACKOFF_START


def test_jitter_stays_within_half_and_full_backoff():
    assert liveness.jittered(0.5, 0.0) == 0.25
    assert 0.25 <= liveness.jittered(0.5, 0.999) < 0.5


def test_redial_during_a_cut_is_frequent_enough_to_cross_a_heal_within_about_a_second():
    # the longest gap between two SYNs while the peer is unreachable
    assert liveness.DIAL_TIMEOUT + liveness.BACKOFF_MAX <= 1.5


def test_stalled_needs_pending_work_an_up_link_and_no_progress():
    after = liveness.STALLED_AFTER
    assert not liveness.stall(0, True, 100.0, None, 100.0 + after + 1).stalled  # nothing pending
    assert not liveness.stall(5, False, None, None, 1000.0).stalled  # link down: not "stalled"
    assert not liveness.stall(5, True, 100.0, None, 100.0 + after - 1).stalled  # just came up
    late = liveness.stall(5, True, 100.0, None, 100.0 + after + 1)
    assert late.stalled and late.since == 100.0
    progressing = liveness.stall(5, True, 100.0, 500.0, 500.0 + after - 1)
    assert not progressing.stalled
    stuck = liveness.stall(5, True, 100.0, 500.0, 500.0 + after + 1)
    assert stuck.stalled and stuck.since == 500.0


class StubLink:
    """Stands in for a PeerLink: up or not, records what is sent."""

    def __init__(self, up=True):
        self.up = up
        self.up_since = 0.0
        self.batching = False
        self.sent = []

    async def send(self, frame):
        self.sent.append(frame)
        return True


class Figures:
    def forward_outcome(self, peer, outcome):
        pass

    def forward_latency(self, peer, seconds):
        pass


def pending(forward_id):
    return PendingForward(forward_id=forward_id, peer="west", seq=1, created=0.0,
                          expires_at=1e12, sender="PROJ/alice", sender_seat="PROJ/alice",
                          target_seat="PROJ/bob", body={"payload": "hi"},
                          receipt_requested=False, client_msg_id=None, msg_id=1,
                          target="PROJ/bob@west")


async def test_sign_of_life_releases_unanswered_retries_not_the_peers_not_now():
    link = StubLink()
    outbox = ForwardOutbox("east", {"west": link}, Figures(), settle=lambda *a: None,
                           pending_notice=lambda *a: None)
    sender = asyncio.get_running_loop().create_task(outbox.run_peer("west"))
    try:
        outbox.submit(pending("unanswered"))
        outbox.submit(pending("not-now"))
        await asyncio.sleep(0)
        assert [f["forward_id"] for f in link.sent] == ["unanswered", "not-now"]
        outbox.on_result("west", {"forward_id": "not-now", "disposition": "refused",
                                  "reason_code": "quota_exceeded"})
        queue = outbox.queues["west"]
        # no answer for the other one: timed out as the sweep does it
        outbox.time_out_unanswered("west", queue.in_flight["unanswered"].sent_at +
                                   ANSWER_TIMEOUT + 1)
        assert sorted(fid for _, fid in queue.delayed) == ["not-now", "unanswered"]
        link.up = False
        outbox.peer_alive("west")  # the link is down: link_up() will release them
        assert len(queue.delayed) == 2
        link.up = True
        outbox.peer_alive("west")
        assert [fid for _, fid in queue.delayed] == ["not-now"]  # the peer said wait
        await asyncio.sleep(0)
        assert [f["forward_id"] for f in link.sent] == ["unanswered", "not-now", "unanswered"]
        outbox.link_up("west")  # a link coming back sends everything
        assert not queue.delayed
        await asyncio.sleep(0)
        assert link.sent[-1]["forward_id"] == "not-now"
    finally:
        sender.cancel()

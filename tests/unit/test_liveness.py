"""Dead-link decisions (federation/liveness.py), without IO. The outbox's
answer to a sign of life is tested with the outbox (test_forward_outbox.py)."""

from federation import liveness
from hubd.timing import Timing

T = Timing()  # the production profile


def test_silence_past_the_deadline_is_dead():
    assert not liveness.is_dead(now=10.0, last_heard=10.0, timing=T)
    assert not liveness.is_dead(now=10.0 + T.link_silence, last_heard=10.0, timing=T)
    assert liveness.is_dead(now=10.01 + T.link_silence, last_heard=10.0, timing=T)
    assert liveness.silent_for(5.0, 7.0) == 0.0  # a clock read before the last message


def test_deadline_leaves_room_for_several_pings():
    assert T.link_silence >= 3 * T.link_ping


def test_backoff_doubles_to_its_cap_and_resets_after_a_stable_link():
    backoff, seen = T.link_backoff_first, []
    for _ in range(6):
        backoff = liveness.next_backoff(backoff, up_for=None, timing=T)
        seen.append(backoff)
    assert seen == sorted(seen) and seen[-1] == T.link_backoff_max
    assert liveness.next_backoff(T.link_backoff_max, up_for=1.0,
                                 timing=T) == T.link_backoff_max
    assert liveness.next_backoff(T.link_backoff_max, up_for=T.link_stable_after + 1,
                                 timing=T) == T.link_backoff_first


def test_jitter_stays_within_half_and_full_backoff():
    assert liveness.jittered(0.5, 0.0) == 0.25
    assert 0.25 <= liveness.jittered(0.5, 0.999) < 0.5


def test_redial_during_a_cut_is_frequent_enough_to_cross_a_heal_within_about_a_second():
    # the longest gap between two SYNs while the peer is unreachable
    assert T.link_dial + T.link_backoff_max <= 1.5


def test_stalled_needs_pending_work_an_up_link_and_no_progress():
    after = T.stalled_after
    # nothing pending
    assert not liveness.stall(0, True, 100.0, None, 100.0 + after + 1, after).stalled
    # link down: not "stalled"
    assert not liveness.stall(5, False, None, None, 1000.0, after).stalled
    # just came up
    assert not liveness.stall(5, True, 100.0, None, 100.0 + after - 1, after).stalled
    late = liveness.stall(5, True, 100.0, None, 100.0 + after + 1, after)
    assert late.stalled and late.since == 100.0
    progressing = liveness.stall(5, True, 100.0, 500.0, 500.0 + after - 1, after)
    assert not progressing.stalled
    stuck = liveness.stall(5, True, 100.0, 500.0, 500.0 + after + 1, after)
    assert stuck.stalled and stuck.since == 500.0

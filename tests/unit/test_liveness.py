"""Dead-link decisions (federation/liveness.py), without IO. The outbox's
answer to a sign of life is tested with the outbox (test_forward_outbox.py)."""

from federation import liveness


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

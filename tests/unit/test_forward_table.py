"""A forward's state table (hubd/state/forward_table.py) and the retry
schedule as a pure function of its inputs."""

import pytest

from federation.clock import next_retry, retry_delay
from hubd.state import forward_table as dl
from hubd.timing import Timing


def test_every_forward_path_through_the_table():
    # the common life: queued, sent, accepted
    assert dl.forward_step(dl.QUEUED, dl.SEND) == dl.IN_FLIGHT
    assert dl.forward_step(dl.IN_FLIGHT, dl.ANSWER_ACCEPTED) == dl.ACCEPTED
    # a link that drops returns the forward to the queue; a "not now" waits
    assert dl.forward_step(dl.IN_FLIGHT, dl.LINK_DOWN) == dl.QUEUED
    assert dl.forward_step(dl.IN_FLIGHT, dl.ANSWER_TRANSIENT) == dl.HELD
    assert dl.forward_step(dl.IN_FLIGHT, dl.ANSWER_TIMEOUT) == dl.WAITING
    for state in (dl.WAITING, dl.HELD):
        assert dl.forward_step(state, dl.LINK_UP) == dl.QUEUED
        assert dl.forward_step(state, dl.RETRY_DUE) == dl.QUEUED
    # a sign of life resends what got no answer, not what the peer refused for now
    assert dl.forward_step(dl.WAITING, dl.PEER_ALIVE) == dl.QUEUED
    assert dl.forward_step(dl.HELD, dl.PEER_ALIVE) == dl.HELD
    for state in (dl.QUEUED, dl.IN_FLIGHT, dl.WAITING, dl.HELD):
        assert dl.forward_step(state, dl.TTL) == dl.EXPIRED
        assert dl.forward_step(state, dl.PEER_REJECTED) == dl.REFUSED
    # every target of the table is a state, and settled states go nowhere
    states = {dl.QUEUED, dl.IN_FLIGHT, dl.WAITING, dl.HELD} | dl.SETTLED
    assert set(dl.FORWARD_TRANSITIONS.values()) <= states
    assert not [key for key in dl.FORWARD_TRANSITIONS if key[0] in dl.SETTLED]


@pytest.mark.parametrize("state,event", [
    (dl.ACCEPTED, dl.ANSWER_ACCEPTED),  # a late duplicate answer after settling
    (dl.QUEUED, dl.ANSWER_ACCEPTED),  # an answer to a forward never sent
    (dl.WAITING, dl.SEND),  # sending a forward in its back-off
    (dl.HELD, dl.SEND),
    (dl.QUEUED, dl.PEER_ALIVE),  # only a backing-off forward is released by a sign of life
    (dl.EXPIRED, dl.TTL),
])
def test_a_move_the_table_lacks_is_an_error(state, event):
    with pytest.raises(dl.InvalidTransition, match=state):
        dl.forward_step(state, event)


def test_answers_map_to_events():
    assert dl.answer_event("accepted", "") == dl.ANSWER_ACCEPTED
    assert dl.answer_event("duplicate", "") == dl.ANSWER_DUPLICATE
    assert dl.answer_event("refused", "quota_exceeded") == dl.ANSWER_TRANSIENT
    assert dl.answer_event("refused", "namespace_not_granted") == dl.ANSWER_REFUSED
    assert dl.answer_event("maybe", "") == dl.ANSWER_INVALID
    assert dl.answer_event(None, "") == dl.ANSWER_INVALID


def test_retry_schedule():
    T = Timing()  # the production profile
    RETRY_MAX = T.forward_retry_max
    assert [retry_delay(n, 0.5, T) for n in range(10)] == \
        [1, 2, 4, 8, 16, 32, 64, 128, 256, RETRY_MAX]
    assert retry_delay(0, 0.0, T) == 0.75
    assert retry_delay(3, 0.999, T) == pytest.approx(8 * 1.2495)
    with pytest.raises(ValueError):
        retry_delay(0, 1.0, T)
    # the due time moves with the injected clock, not with the machine's
    assert next_retry(0, 500.0, None, 0.5, T) == (501.0, 1)
    assert next_retry(2, 10.0, 5.0, 0.5, T) == (14.0, 3)
    # a flapping link keeps its count; a steady one that says "not now" starts over
    assert next_retry(9, 0.0, 5.0, 0.5, T) == (RETRY_MAX, 10)
    assert next_retry(8, 0.0, 31.0, 0.5, T) == (1.0, 1)
    assert next_retry(5, 0.0, 31.0, 0.5, T) == (32.0, 6)

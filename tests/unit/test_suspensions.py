"""Whose changes the Router refuses after a failed command made it rebuild
its state (hubd/state/suspensions.py): pure, so time is given."""

import pytest

from hubd.state import suspensions as sus
from hubd.state.suspensions import Suspensions, suspension_seconds


def test_the_first_rebuild_is_forgiven_then_twenty_times_its_cost_doubling():
    assert suspension_seconds(1, 30.0) == 0.0
    assert suspension_seconds(2, 0.5) == pytest.approx(10.0)
    assert suspension_seconds(3, 0.5) == pytest.approx(20.0)
    assert suspension_seconds(4, 0.5) == pytest.approx(40.0)
    assert suspension_seconds(9, 30.0) == sus.MAX_SECONDS


def test_a_principal_is_refused_until_its_suspension_ends_and_others_never():
    table = Suspensions()
    assert table.suspend("mallory", 100.0, 0.5) == 0.0
    assert table.refused_until("mallory", 100.0) is None  # forgiven
    assert table.suspend("mallory", 101.0, 0.5) == pytest.approx(10.0)
    assert table.refused_until("mallory", 105.0) == pytest.approx(111.0)
    assert table.refused_until("alice", 105.0) is None
    assert table.refused_until(None, 105.0) is None  # the hub's own work
    assert table.live(105.0) == 1
    assert table.refused_until("mallory", 111.0) is None
    assert table.live(111.0) == 0
    # a repeat while remembered doubles
    assert table.suspend("mallory", 112.0, 0.5) == pytest.approx(20.0)


def test_an_offence_long_after_the_last_suspension_ended_counts_as_a_first():
    table = Suspensions()
    table.suspend(None, 0.0, 1.0)
    table.suspend(None, 1.0, 1.0)  # suspended until 21
    assert table.suspend(None, 21.0 + sus.FORGET_SECONDS + 1, 1.0) == 0.0


def test_the_table_is_bounded_dropping_ended_suspensions_first(monkeypatch):
    monkeypatch.setattr(sus, "MAX_KEYS", 3)
    table = Suspensions()
    for key in ("a", "b"):
        table.suspend(key, 0.0, 1.0)
        table.suspend(key, 0.0, 1.0)  # live until 20
    table.suspend("c", 0.0, 1.0)  # forgiven: ended at once
    table.suspend("d", 1.0, 1.0)
    assert set(table.entries) == {"a", "b", "d"} and table.evicted_live == 0
    table.suspend("d", 1.0, 1.0)
    table.suspend("e", 2.0, 1.0)
    # every other suspension is live: the least recent goes, and it is counted
    assert set(table.entries) == {"b", "d", "e"} and table.evicted_live == 1

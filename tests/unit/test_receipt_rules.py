"""The receipt decisions (hubd/state/receipt_rules.py), without IO."""

from hubd.state import receipt_rules as rules

POLICY = rules.LivenessPolicy(True, reaction_window=90.0, waiter_window=20.0)


def test_a_fresh_reaction_is_live_and_a_keepalive_only_seat_goes_stale():
    assert rules.liveness(100.0, None, 150.0, POLICY) == rules.Liveness(True, False, 50.0)
    stale = rules.liveness(100.0, None, 191.0, POLICY)
    assert stale.proven_live is False and stale.has_live_waiter is False
    assert stale.last_reaction_age == 91.0


def test_a_fresh_waiter_vouches_for_its_seat_and_a_silent_one_does_not():
    vouched = rules.liveness(0.0, 95.0, 100.0, POLICY)
    assert vouched.proven_live and vouched.has_live_waiter
    silent = rules.liveness(0.0, 79.0, 100.0, POLICY)
    assert not silent.proven_live and not silent.has_live_waiter
    # a seat connected only through its waiter has no reaction age
    assert rules.liveness(None, 99.0, 100.0, POLICY) == rules.Liveness(True, True, None)


def test_the_gate_switched_off_treats_every_match_as_live():
    off = rules.LivenessPolicy(False, 90.0, 20.0)
    assert rules.liveness(0.0, None, 10_000.0, off).proven_live is True


def test_partition_sorts_live_from_stale():
    assert rules.partition(["p/c", "p/a", "p/b"], lambda n: n != "p/b") == (
        ["p/a", "p/c"], ["p/b"])


class Seat:
    def __init__(self, last_reaction=None, last_heard=None):
        self.last_reaction, self.last_heard = last_reaction, last_heard


def test_only_stale_is_the_seeds_dead_letter():
    by_name = {"p/stale": Seat(0.0), "p/live": Seat(95.0), "p/vouched": Seat(0.0),
               "p/vouched-rx": Seat(last_heard=99.0)}
    connected = by_name.__contains__
    assert rules.only_stale(["p/stale"], by_name, 100.0, POLICY, connected) is True
    # one live match, a waiter that vouches, a seat served outside presence
    assert rules.only_stale(["p/stale", "p/live"], by_name, 100.0, POLICY, connected) is False
    assert rules.only_stale(["p/vouched"], by_name, 100.0, POLICY, connected) is False
    assert rules.only_stale(["p/stale", "b/box"], by_name, 100.0, POLICY, connected) is False
    # no match is the other dead letter, not this one; tracking off: nothing is stale
    assert rules.only_stale([], by_name, 100.0, POLICY, connected) is False
    off = rules.LivenessPolicy(False, 90.0, 20.0)
    assert rules.only_stale(["p/stale"], by_name, 100.0, off, connected) is False
    assert rules.seat_liveness(by_name, "p/vouched", 100.0, POLICY).has_live_waiter is True
    for name in ("p/stale", "p/live", "p/vouched", "p/absent"):
        for now in (0.0, 99.0, 100.0, 185.0, 190.0, 200.0):
            assert rules.proven_live(by_name, name, now, POLICY) == \
                rules.seat_liveness(by_name, name, now, POLICY).proven_live, (name, now)


def test_immediate_verdicts():
    verdict = rules.immediate_verdict
    assert verdict(["p/b"], [], ["p/b"]) == rules.DELIVERED
    assert verdict(["p/b", "p/c"], ["p/b"], ["p/c"]) == rules.DELIVERED
    assert verdict([], [], []) == rules.NO_ONLINE_RECIPIENT
    assert verdict(["p/b", "p/c"], ["p/b", "p/c"], []) == rules.NO_LIVE_RECIPIENT
    # a live match whose write did not complete: never positive
    assert verdict(["p/b"], [], []) == rules.TRANSPORT_UNAVAILABLE
    assert verdict(["p/b", "p/c"], ["p/b"], []) == rules.TRANSPORT_UNAVAILABLE
    assert rules.NEGATIVE == {rules.NO_ONLINE_RECIPIENT, rules.NO_LIVE_RECIPIENT,
                              rules.TRANSPORT_UNAVAILABLE}


def test_evictions_make_room_for_exactly_one_more():
    assert rules.evictions(0, 4) == 0
    assert rules.evictions(3, 4) == 0
    assert rules.evictions(4, 4) == 1
    assert rules.evictions(6, 4) == 3  # a window shrunk by a restart with a smaller limit


def test_owned_work_lists_live_claims_and_unfinished_suggested_tasks():
    work = rules.owned_work(
        {"p/c": {"t-2", "t-1", "gone"}, "p/x": {"gone"}},
        lambda t: t != "gone",
        [{"task_id": "b-2", "suggested_owner": "p/d", "status": "open"},
         {"task_id": "b-1", "suggested_owner": "p/d", "status": "in_progress"},
         {"task_id": "b-3", "suggested_owner": "p/e", "status": "done"},
         {"task_id": "b-4", "suggested_owner": "", "status": "open"}],
        ("done", "cancelled"))
    assert work == {"p/c": (("t-1", "t-2"), ()), "p/d": ((), ("b-1", "b-2"))}


def test_dark_seat_alerts_once_per_episode_after_the_persistence():
    work = {"p/c": (("t-1",), ())}
    waiter = {"p/c": False}
    episodes, alerts = rules.dark_seat_round({}, work, waiter.get, 100.0, 30.0)
    assert alerts == [] and episodes == {"p/c": (100.0, False)}
    episodes, alerts = rules.dark_seat_round(episodes, work, waiter.get, 129.0, 30.0)
    assert alerts == []
    episodes, alerts = rules.dark_seat_round(episodes, work, waiter.get, 130.5, 30.0)
    assert [(a.identity, a.claims, m) for a, m in alerts] == [("p/c", ("t-1",), 30.5)]
    episodes, alerts = rules.dark_seat_round(episodes, work, waiter.get, 200.0, 30.0)
    assert alerts == []  # one alert per continuous episode
    # re-arming clears the episode, so a later regression alerts again
    waiter["p/c"] = True
    episodes, alerts = rules.dark_seat_round(episodes, work, waiter.get, 201.0, 30.0)
    assert episodes == {} and alerts == []
    waiter["p/c"] = False
    episodes, _ = rules.dark_seat_round(episodes, work, waiter.get, 300.0, 30.0)
    episodes, alerts = rules.dark_seat_round(episodes, work, waiter.get, 330.0, 30.0)
    assert [a.identity for a, _ in alerts] == ["p/c"]
    # ending the work ends the episode too
    episodes, alerts = rules.dark_seat_round(episodes, {}, waiter.get, 331.0, 30.0)
    assert episodes == {} and alerts == []

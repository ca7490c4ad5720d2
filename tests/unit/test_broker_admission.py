"""hubd/doors/broker/admission.py: the broker socket's two connection bounds
and the rate-limited refusal log."""

from hubd.doors.broker import admission
from hubd.doors.broker.admission import Admission, RefusalLog


def test_waiting_connections_never_take_an_authenticated_place():
    a = Admission(authenticated=2, unauthenticated=3)
    for conn in range(100):  # a flood that never authenticates
        a.arrive(conn)
    assert a.counts() == {"authenticated": 0, "unauthenticated": 3}
    assert a.arrive("client") == (None, 97)  # the oldest waiting one makes room
    assert a.authenticate("client") is None
    assert a.counts() == {"authenticated": 1, "unauthenticated": 2}


def test_a_newcomer_displaces_the_connection_that_waited_longest():
    a = Admission(authenticated=5, unauthenticated=2)
    assert a.arrive("a") == (None, None)
    assert a.arrive("b") == (None, None)
    assert a.arrive("c") == (None, "a")
    assert a.authenticate("b") is None  # b leaves the waiting queue
    assert a.arrive("d") == (None, None)
    assert a.arrive("e") == (None, "c")
    assert list(a.waiting) == ["d", "e"]


def test_the_authenticated_bound_refuses_newcomers_and_late_auths():
    a = Admission(authenticated=2, unauthenticated=4)
    a.arrive("late")
    for conn in ("x", "y"):
        a.arrive(conn)
        assert a.authenticate(conn) is None
    assert a.arrive("z") == (admission.AUTHENTICATED_FULL, None)
    assert a.counts() == {"authenticated": 2, "unauthenticated": 1}  # z holds nothing
    assert a.authenticate("late") == admission.AUTHENTICATED_FULL
    assert a.counts() == {"authenticated": 2, "unauthenticated": 0}
    a.leave("x")
    assert a.arrive("again") == (None, None) and a.authenticate("again") is None


def test_leaving_frees_either_kind_of_place_once():
    a = Admission(authenticated=1, unauthenticated=1)
    a.arrive("w")
    a.leave("w")
    a.leave("w")
    a.arrive("v")
    assert a.authenticate("v") is None
    a.leave("v")
    assert a.counts() == {"authenticated": 0, "unauthenticated": 0}


def test_every_reason_has_its_sentence():
    assert set(admission.SENTENCES) == set(admission.REASONS)


def test_refusal_log_says_one_line_per_reason_per_period_with_the_count():
    log = RefusalLog(every=10)
    assert log.refused("r", 0.0) == 1
    assert [log.refused("r", t) for t in (1.0, 2.0, 9.9)] == [None, None, None]
    assert log.refused("other", 5.0) == 1  # each reason on its own clock
    assert log.refused("r", 10.5) == 4  # the three held back, and this one
    assert log.refused("r", 11.0) is None


def test_a_flooding_process_displaces_its_own_connections_first():
    a = Admission(authenticated=8, unauthenticated=4)
    a.arrive("honest-1", process=10)
    for n in range(100):  # another process opens connections as fast as it can
        assert a.arrive(f"flood-{n}", process=66)[1] in (None, f"flood-{n - 3}")
    assert "honest-1" in a.waiting  # never displaced while the flooder holds more
    assert a.arrive("honest-2", process=11) == (None, "flood-97")
    assert a.authenticate("honest-1") is None and a.authenticate("honest-2") is None
    assert a.counts() == {"authenticated": 2, "unauthenticated": 2}


def test_among_equal_holders_the_longest_waiting_connection_goes():
    a = Admission(authenticated=8, unauthenticated=2)
    a.arrive("p1", process=1)
    a.arrive("p2", process=2)
    assert a.arrive("p3", process=3) == (None, "p1")
    assert list(a.waiting) == ["p2", "p3"]

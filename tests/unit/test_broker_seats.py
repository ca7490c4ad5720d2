"""hubd/state/broker_seats.py: which handles the broker may speak for. A seat a
principal of the hub's table holds is spoken for only as that principal."""

from hubd.state.broker_seats import BrokerSeats, broker_principal, seat_refusal
from hubd.state.principals import build_table, make_principal, seat_holders, token_digest


def table(*principals, shared: str | None = None):
    made = [make_principal(name, seats) for name, seats in principals]
    tokens = [(p.name, token_digest(f"t-{p.name}"), "default") for p in made]
    return build_table(made, tokens, shared)


def test_on_a_hub_without_principals_every_handle_of_the_namespace_is_the_brokers():
    for t in (table(), table(shared="s3cret")):
        assert seat_refusal(t, "broker", "local", "alice") is None
        assert broker_principal(t, "broker", "local").seats == ("local/*",)


def test_a_seat_another_principal_holds_is_refused_and_the_rest_stay_open():
    t = table(("lalice", ["local/alice"]), ("ops", ["OPS/*"]))
    refusal = seat_refusal(t, "broker", "local", "alice")
    assert refusal == ("Seat 'local/alice' is held by principal 'lalice': only its token "
                       "speaks for it, and the broker speaks as 'broker'.")
    assert seat_refusal(t, "broker", "local", "bob") is None
    assert seat_refusal(t, "broker", "local", "alice-rx") is not None  # its wake sidecar too


def test_prefix_and_every_seat_patterns_hold_seats_too():
    assert seat_refusal(table(("team", ["local/*"])), "broker", "local", "bob") is not None
    assert seat_refusal(table(("root", ["*"])), "broker", "local", "bob") is not None
    # a principal of another namespace holds nothing of the broker's
    assert seat_refusal(table(("team", ["localx/*"])), "broker", "local", "bob") is None


def test_the_brokers_own_principal_in_the_table_decides_with_its_seats():
    t = table(("cli-bus", ["local/*"]), ("lalice", ["local/alice"]))
    # it holds local/alice too (the operator gave both): it may speak for it
    assert seat_refusal(t, "cli-bus", "local", "alice") is None
    narrow = table(("cli-bus", ["local/renn"]), ("lalice", ["local/alice"]))
    assert seat_refusal(narrow, "cli-bus", "local", "renn") is None
    assert seat_refusal(narrow, "cli-bus", "local", "bob") == (
        "Principal 'cli-bus' may not speak for 'local/bob' (its seats: local/renn).")
    assert seat_refusal(narrow, "cli-bus", "local", "alice") == (
        "Principal 'cli-bus' may not speak for 'local/alice' (its seats: local/renn).")


def test_seat_holders_lists_the_tables_principals_only():
    t = table(("a", ["local/*"]), ("b", ["local/bob"]), ("c", ["OPS/*"]), shared="s3cret")
    assert seat_holders(t, "local/bob") == ("a", "b")
    assert seat_holders(t, "local/zed") == ("a",)
    assert seat_holders(t, "elsewhere/x") == ()


def test_answers_are_remembered_per_table_and_a_new_table_starts_over():
    seats = BrokerSeats("broker", "local")
    before = table(("ops", ["OPS/*"]))
    assert seats.refusal(before, "alice") is None
    after = table(("ops", ["OPS/*"]), ("lalice", ["local/alice"]))
    assert "lalice" in seats.refusal(after, "alice")
    assert seats.refusal(before, "alice") is None

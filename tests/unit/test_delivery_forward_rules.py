"""The pure decisions of forwarded delivery intents (federation/delivery_forward_rules.py)."""

from __future__ import annotations

import pytest

from federation import delivery_forward_rules as df
from hubd.state import delivery_rules as rules

KEY = "a" * 64


def status(**changes) -> dict:
    base = {"operation_key": KEY, "request_id": "r1", "task_id": "t1",
            "selected_mode": "next_turn", "quality": "native", "stage": "queued",
            "cancel_requested": False, "receiver_reachable": True, "active_session": True,
            "boundary_delivered": False, "explicitly_acknowledged": False,
            "task_completed": False, "latest_event_seq": 2}
    base.update(changes)
    return base


def result(fid="f1", disposition="accepted", code="", detail="", res=None) -> dict:
    return {"type": "multihub_message_result", "forward_id": fid, "disposition": disposition,
            "reason_code": code, "detail": detail,
            "result": {"status": status()} if res is None else res}


@pytest.mark.parametrize("version,features,serves", [
    (2, frozenset({"forward_batch", "delivery_forward"}), True),  # hubd: the feature counts
    (7, frozenset({"forward_batch"}), False),  # a hubd without it, whatever it says
    (7, frozenset(), False),
    (None, None, False),
    (4, None, False),  # not hubd: the seed's v5
    (5, None, True),
    (7, None, True),
])
def test_who_serves_forwarded_intents(version, features, serves):
    assert df.peer_serves_delivery(version, features) is serves


@pytest.mark.parametrize("raw,expected", [
    ("PROJ/bob@west", ("PROJ/bob", "west")),
    ("PROJ/*@west", df.INVALID_TARGET),
    ("PROJ/a@west,PROJ/b@west", df.INVALID_TARGET),
    ("PROJ/bob@-bad", df.INVALID_TARGET),
    ("all@west", df.INVALID_TARGET),
    (17, df.INVALID_TARGET),
])
def test_read_target(raw, expected):
    got = df.read_target(raw)
    if isinstance(expected, tuple):
        assert got == expected
    else:
        assert isinstance(got, rules.Refusal) and got.reason_code == expected


def test_read_status_keeps_only_the_facts():
    got = df.read_status({"status": status(extra="dropped", body="secret")}, None, "r1")
    assert got == status()


@pytest.mark.parametrize("res,expected_key,rid,words", [
    (None, None, None, "no delivery status"),
    ({"status": "queued"}, None, None, "no delivery status"),
    ({"status": status(latest_event_seq=True)}, None, None, "latest_event_seq"),
    ({"status": status(cancel_requested="no")}, None, None, "cancel_requested"),
    ({"status": {k: v for k, v in status().items() if k != "stage"}}, None, None, "stage"),
    ({"status": status(operation_key="A" * 64)}, None, None, "64 lower-case hex"),
    ({"status": status(operation_key="a" * 63)}, None, None, "64 lower-case hex"),
    ({"status": status(stage="delivered")}, None, None, "stage is unknown"),
    ({"status": status()}, "b" * 64, None, "another operation"),
    ({"status": status()}, None, "r2", "another request"),
])
def test_read_status_refuses_what_is_malformed(res, expected_key, rid, words):
    got = df.read_status(res, expected_key, rid)
    assert isinstance(got, str) and words in got


def test_route_problem():
    routes = df.DeliveryRoutes()
    mine = df.Route("west", "PROJ/alice", "r1")
    routes.add(KEY, mine)
    assert df.route_problem(routes, {}, KEY, mine) is None  # a retry of the same request
    assert df.route_problem(routes, {}, "c" * 64, df.Route("north", "PROJ/x", "r9")) is None
    for other in (df.Route("north", "PROJ/alice", "r1"), df.Route("west", "PROJ/carol", "r1"),
                  df.Route("west", "PROJ/alice", "r2")):
        assert "already routed" in df.route_problem(routes, {}, KEY, other)
    assert "local operation" in df.route_problem(routes, {"c" * 64: object()}, "c" * 64, mine)


def test_read_answer():
    ok = df.read_answer(result(), "f1", None, "r1")
    assert ok.status == status() and ok.code == ""
    assert df.read_answer(result(disposition="duplicate"), "f1", None, "r1").status == status()
    refused = df.read_answer(result(disposition="refused", code="stale_incarnation",
                                    detail="recipient session changed"), "f1", None, "r1")
    assert (refused.status, refused.code, refused.text) == \
        (None, "stale_incarnation", "recipient session changed")
    for bad in (result(fid="f2"), {**result(), "type": "error"}, "text",
                result(disposition="maybe"), result(disposition="refused", code="Not A Code"),
                result(disposition="refused", code=""), result(res={"status": status(stage=1)})):
        assert df.read_answer(bad, "f1", None, "r1").code == df.PEER_INVALID_ANSWER, bad
    long = df.read_answer(result(disposition="refused", code="x_y", detail="é" * 600),
                          "f1", None, None)
    assert len(long.text.encode()) <= df.MAX_DETAIL_BYTES


def test_routes_are_bounded_oldest_first(monkeypatch):
    monkeypatch.setattr(df, "MAX_ROUTES", 3)
    routes = df.DeliveryRoutes()
    for i in range(5):
        routes.add(f"{i:064x}", df.Route("west", "PROJ/alice", f"r{i}"))
    assert list(routes.by_key) == [f"{i:064x}" for i in (2, 3, 4)]
    assert set(routes.by_request) == {("PROJ/alice", f"r{i}") for i in (2, 3, 4)}
    assert routes.evicted == 2


def test_relay_sessions_names_seats_on_the_peer_and_drops_the_malformed():
    got = df.relay_sessions({"delivery_sessions": {
        "PROJ/bob": {"incarnation": KEY, "capabilities": {"next_turn": "native"}},
        "PROJ/bad": {"incarnation": "short", "capabilities": {}},
        "PROJ/odd": {"incarnation": KEY, "capabilities": {"telepathy": "native"}},
        "PROJ/x@elsewhere": {"incarnation": KEY, "capabilities": {}},
    }}, "west")
    assert got == {"PROJ/bob@west": {"incarnation": KEY, "capabilities": {"next_turn": "native"},
                                     "hub_id": "west"}}
    assert df.relay_sessions({}, "west") == {} and \
        df.relay_sessions({"delivery_sessions": []}, "west") == {}

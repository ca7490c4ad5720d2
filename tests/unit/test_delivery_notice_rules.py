"""federation/delivery_notice_rules.py: which notifications go back to an
origin, what an origin takes from a push, what a recipient hub settles."""

from __future__ import annotations

from federation import delivery_notice_rules as nr
from federation.delivery_forward_rules import DeliveryRoutes, Route

KEY = "a" * 64


def notice(**over) -> dict:
    note = {"audience": "PROJ/alice@east", "cancel_requested": False, "event_seq": 4,
            "notification_id": f"delivery:{KEY}:2", "operation_key": KEY,
            "protocol_version": 3, "request_id": "r1", "sender": "SynapseHub",
            "source": "recipient", "stage": "boundary_delivered", "target": "PROJ/bob",
            "target_incarnation": "b" * 64, "task_id": "t1", "type": "delivery_status"}
    note.update(over)
    return note


def routes(peer="west", sender="PROJ/alice", rid="r1") -> DeliveryRoutes:
    table = DeliveryRoutes()
    table.add(KEY, Route(peer, sender, rid))
    return table


def test_relay_only_to_an_origin_that_takes_notices():
    assert nr.relay_to("PROJ/alice@east", "east", False, {"east"}) == "east"
    assert nr.relay_to("PROJ/alice@east", "east", False, set(), {"east"}) == "east"
    assert nr.relay_to("PROJ/alice@east", "east", False, set(), set()) is None
    assert nr.relay_to("PROJ/alice", "west", False, {"west"}) is None  # a local requester
    assert nr.relay_to("PROJ/alice@east", "north", False, {"north"}) is None  # not its origin


def test_an_origin_that_took_notices_at_admission_takes_them_with_no_link_up():
    assert nr.relay_to("PROJ/alice@east", "east", True) == "east"
    assert nr.relay_to("PROJ/alice@east", "east", True, set(), set()) == "east"
    # the requester is still the one that decides where it goes
    assert nr.relay_to("PROJ/alice", "east", True) is None
    assert nr.relay_to("PROJ/alice@north", "east", True) is None


def test_a_routed_notice_becomes_the_local_seats_notification():
    seat, frame = nr.read_notice(notice(), "west", "east", routes())
    assert seat == "PROJ/alice"
    assert (frame["audience"], frame["target"], frame["remote_hub"], frame["type"],
            frame["stage"]) == ("PROJ/alice", "PROJ/bob@west", "west", "delivery_status",
                                "boundary_delivered")
    assert "unknown" not in frame  # only the whitelisted facts


def test_a_notice_that_names_no_route_of_the_peer_is_not_taken():
    assert isinstance(nr.read_notice(notice(), "north", "east", routes()), str)  # other peer
    assert isinstance(nr.read_notice(notice(), "west", "east", routes(sender="PROJ/carol")),
                      str)  # other seat
    assert isinstance(nr.read_notice(notice(), "west", "east", routes(rid="r9")), str)
    assert isinstance(nr.read_notice(notice(audience="PROJ/alice@north"), "west", "east",
                                     routes()), str)
    assert isinstance(nr.read_notice(notice(operation_key="c" * 64), "west", "east",
                                     routes()), str)


def test_malformed_notices_are_refused():
    for bad in (notice(stage="exploded"), notice(source="mallory"), notice(event_seq=True),
                notice(cancel_requested="no"), notice(notification_id="x" * 500),
                {k: v for k, v in notice().items() if k != "task_id"}, "text", None):
        assert isinstance(nr.read_notice(bad, "west", "east", routes()), str), bad


def test_acks_settle_only_the_peers_own_requesters():
    acks = nr.read_acks([{"audience": "PROJ/alice@east", "notification_id": "n1"},
                         {"audience": "PROJ/alice@east", "notification_id": "n2"},
                         {"audience": "PROJ/bob@north", "notification_id": "n3"},
                         {"audience": "PROJ/bob", "notification_id": "n4"}], "east")
    assert acks == {"PROJ/alice@east": ["n1", "n2"]}
    assert nr.read_acks("nope", "east") is None
    assert nr.read_acks([{"audience": 1, "notification_id": "n"}], "east") is None
    assert nr.read_acks([{}] * (nr.MAX_PER_FRAME + 1), "east") is None


def test_pending_for_a_peer_and_chunks():
    outbox = {"PROJ/alice@east": {"n1": {"id": 1}, "n2": {"id": 2}},
              "PROJ/bob": {"n3": {"id": 3}}, "PROJ/carol@north": {"n4": {"id": 4}}}
    assert nr.pending_for_peer(outbox, "east") == [{"id": 1}, {"id": 2}]
    assert [len(c) for c in nr.chunks(list(range(600)))] == [256, 256, 88]


def test_received_ids_are_bounded():
    state = nr.NoticeState()
    for i in range(nr.MAX_RECEIVED + 5):
        state.remember(f"n{i}")
    assert len(state.received) == nr.MAX_RECEIVED and state.evicted == 5
    assert "n0" not in state.received and f"n{nr.MAX_RECEIVED + 4}" in state.received

"""hubd/state/presence.py: one presence for every door. Seats (the hub
wire's names) and the identities a door serves itself (a broker handle: its
connections, its listener, a push-only socket), and agents heard without a
connection (REDSYN), each by door."""

from hubd.state import presence as pr


def test_a_door_serves_an_identity_with_a_listener_and_a_push_only_endpoint():
    p = pr.Presence()
    a = p.open(1, "broker", "local", None, door="broker", broadcast=False)
    b = p.open(2, "broker", "local", None, door="broker", broadcast=False)
    assert p.endpoints == ()  # a dialect's endpoints get no broadcasts
    p.serve(a, "alice", via="bob")
    p.serve(b, "alice")
    p.listen(a)
    assert p.serving("broker", "alice") == [1, 2] and p.listener("broker", "alice") == 1
    assert "alice" in p.identities_served("broker") and "alice" not in p.identities_served("x")
    assert list(p.identities_listening("broker")) == ["alice"] and a.via == "bob"
    assert p.set_push_only("broker", "alice", 9) is None
    assert p.set_push_only("broker", "alice", 10) == 9  # the one it replaces
    p.listen(b)  # another connection listens now
    assert p.listener("broker", "alice") == 2 and not a.listening
    closed = p.close(2)
    assert closed.serves == "alice" and closed.listening  # what it served, as it went
    assert p.listener("broker", "alice") is None and p.serving("broker", "alice") == [1]


def test_a_renamed_identity_keeps_its_endpoints():
    p = pr.Presence()
    a = p.open(1, "broker", "local", None, door="broker", broadcast=False)
    c = p.open(2, "broker", "local", None, door="broker", broadcast=False)
    p.serve(a, "old")
    p.listen(a)
    p.serve(c, "other", via="old")
    p.set_push_only("broker", "old", 7)
    p.rename("broker", "old", "new")
    assert a.serves == "new" and p.listener("broker", "new") == 1 and c.via == "new"
    assert p.push_only_endpoint("broker", "new") == 7 and p.serving("broker", "old") == []
    p.serve(a, "elsewhere")  # serving another identity drops the listener
    assert p.listener("broker", "new") is None and not a.listening


def test_seats_and_served_identities_do_not_mix():
    p = pr.Presence()
    seat = p.open(1, "p", "127.0.0.1", None)
    handle = p.open(2, "broker", "local", None, door="broker", broadcast=False)
    p.bind(seat, "p/alice", (), 0.0)
    p.serve(handle, "p/alice")
    assert p.online() == ["p/alice"] and p.endpoints == (1,)
    assert p.session_of("p/alice") is seat and p.serving("broker", "p/alice") == [2]


def test_agents_heard_without_a_connection_are_bounded(monkeypatch):
    monkeypatch.setattr(pr, "MAX_HEARD", 3)
    p = pr.Presence()
    for i in range(5):
        p.hear("redsyn", f"a/b/c/{i}", "node", float(i))
    p.hear("redsyn", "a/b/c/2", "other", 9.0)  # heard again: the latest
    assert p.last_heard("redsyn", "a/b/c/0") is None
    assert p.last_heard("redsyn", "a/b/c/2") == (9.0, "other")
    assert len(p.heard) == 3

"""The durable inbox query's pure decisions (hubd/state/inbox.py): the query
check and the page's bounds. The wire behaviour against both hubs is
tests/interop/test_inbox_interop.py."""

from hubd.state import inbox as ib

ME = "PROJ/me"


def query(**fields):
    q = {"version": 1, "identity": ME, "hub_id": "", "since_seq": 0, "limit": 10}
    q.update(fields)
    return ib.read_query(q, ME, "hub-a", 100)


def chat(seq, target=ME, sender="PROJ/other", **extra):
    return (seq, "chat", {"type": "chat", "sender": sender, "target": target,
                          "payload": f"m{seq}", **extra})


def size_of(message):
    return 100


def test_read_query():
    assert query() == ib.Query(ME, 0, 10)
    assert query(hub_id="hub-a", since_seq=100) == ib.Query(ME, 100, 10)
    assert ib.read_query({"version": 1, "identity": ME, "hub_id": "", "since_seq": 0,
                          "limit": 1}, ME + "-rx", "hub-a", 0) == ib.Query(ME, 0, 1)
    for bad in (dict(version=True), dict(version="1"), dict(limit=0), dict(limit=101),
                dict(limit=True), dict(since_seq=-1), dict(since_seq=2**63),
                dict(since_seq=5), dict(identity=""), dict(identity=3), dict(hub_id=None)):
        assert query(**bad) == ib.Refused(ib.INVALID, ME), bad
    assert ib.read_query("all", ME, "hub-a", 0) == ib.Refused(ib.INVALID, ME)
    assert query(identity="PROJ/you") == ib.Refused(ib.NOT_OWNED, "PROJ/you")
    # a seat may not read its sidecar's inbox (only the other way round)
    assert query(identity=ME + "-rx") == ib.Refused(ib.NOT_OWNED, ME + "-rx")
    assert query(hub_id="hub-b", since_seq=3) == ib.Refused(ib.OTHER_HUB, ME, 3)
    assert query(hub_id="hub-a", since_seq=101) == ib.Refused(ib.PAST_JOURNAL, ME, 101)


def test_what_an_inbox_holds():
    assert ib.addressed({"sender": "a", "target": ME}, ME, ())
    assert ib.addressed({"sender": "a", "target": f"x,{ME}"}, ME, ())
    assert ib.addressed({"sender": "a", "target": "PROJ/*"}, ME, ())
    assert ib.addressed({"sender": "a", "target": "PROJ"}, ME, ())
    assert ib.addressed({"sender": "a", "target": "all"}, ME, ())
    assert ib.addressed({"sender": "a", "target": "reviewer"}, ME, ("reviewer",))
    assert not ib.addressed({"sender": "a", "target": "reviewer"}, ME, ())
    assert not ib.addressed({"sender": ME, "target": ME}, ME, ())  # its own
    assert not ib.addressed({"sender": "a", "target": ME, "channel": "dev"}, ME, ())
    assert not ib.addressed({"sender": "a", "target": "PROJ/you"}, ME, ())
    assert not ib.addressed({"sender": "a", "target": "OTHER/*"}, ME, ())


def test_the_cursor_passes_what_was_looked_at_and_stops_at_the_limit():
    q = ib.Query(ME, 0, 2)
    rows = [chat(1), chat(2, target="PROJ/you"), (3, "claim_granted", None), chat(4),
            chat(5), chat(6)]
    page = ib.page(rows, q, (), size_of)
    assert [m["seq"] for m in page.messages] == [1, 4]
    assert (page.cursor, page.has_more) == (4, True)
    rest = ib.page(rows[4:], ib.Query(ME, 4, 2), (), size_of)
    assert ([m["seq"] for m in rest.messages], rest.cursor, rest.has_more) == ([5, 6], 6, False)
    # the end of the journal: the cursor moves past trailing foreign rows
    tail = ib.page([chat(7, target="PROJ/you"), (8, "lease_expired", None)],
                   ib.Query(ME, 6, 2), (), size_of)
    assert (tail.messages, tail.cursor, tail.has_more) == ([], 8, False)
    # an undecodable chat row is looked at, not returned
    broken = ib.page([(9, "chat", None), chat(10)], ib.Query(ME, 8, 5), (), size_of)
    assert ([m["seq"] for m in broken.messages], broken.cursor) == ([10], 10)


def test_scan_bounds_say_has_more_even_with_no_messages():
    foreign = [chat(seq, target="PROJ/you") for seq in range(1, ib.SCAN_CHAT_ROWS + 5)]
    page = ib.page(foreign, ib.Query(ME, 0, 10), (), size_of)
    assert (page.messages, page.cursor, page.has_more) == ([], ib.SCAN_CHAT_ROWS, True)
    other = [(seq, "agent_seen", None) for seq in range(1, ib.SCAN_ROWS + 2)]
    page = ib.page(other, ib.Query(ME, 0, 10), (), size_of)
    assert (page.messages, page.cursor, page.has_more) == ([], ib.SCAN_ROWS, True)


def test_the_byte_budget():
    big = ib.PAGE_BYTES // 3 + 1
    sizes = {1: big, 2: big, 3: big}
    page = ib.page([chat(1), chat(2), chat(3)], ib.Query(ME, 0, 10), (),
                   lambda m: sizes[m["seq"]])
    # the third would overflow: the page ends before it, and the next begins there
    assert ([m["seq"] for m in page.messages], page.cursor, page.has_more) == ([1, 2], 2, True)
    alone = ib.page([chat(4)], ib.Query(ME, 3, 10), (), lambda m: ib.PAGE_BYTES + 1)
    assert (alone.error, alone.messages, alone.cursor) == (ib.TOO_BIG, [], 3)

"""The pure parts of failures that explain themselves and of the status
page: /health's judgement and its reasons (hubd/health.py,
federation/health_problems.py), the rate-limited log line (hubd/logs.py),
who is online door by door (Presence.online_by_door), the page's rendering
(escaping, bounds) and which requests for `/` get it."""

from __future__ import annotations

from multidict import CIMultiDict

from federation.health_problems import federation_problems
from federation.pins import describe_certificate
from hubd.doors.status_page import HEADERS, render, wants_page
from hubd.health import journal_problems, judge
from hubd.logs import MAX_LINES, WINDOW_SECONDS, LimitedLog
from hubd.state.presence import Presence


def test_a_hub_without_reasons_is_ok_and_one_with_any_is_degraded_listing_all():
    assert judge({"journal_corrupt_rows": 0}, (journal_problems,)) == {
        "journal_corrupt_rows": 0, "status": "ok", "reasons": []}
    document = {"journal_corrupt_rows": 2, "journal_unknown_events": 1,
                "journal_unknown_kinds": ["x_new"],
                "message_forward": {"west": {"link": "down", "pending": 3, "last_error": {
                    "cause": "pin_mismatch", "detail": "west presented sha256:ab"}}}}
    judged = judge(document, (journal_problems, federation_problems))
    assert judged["status"] == "degraded"
    assert judged["reasons"] == [
        "journal: 2 undecodable row(s) quarantined; mutations are refused until the journal is "
        "recovered",
        "journal: 1 event(s) of kinds this hubd does not know (x_new); mutations are refused: "
        "run the hubd that wrote them",
        "message peer west: link down (pin_mismatch: west presented sha256:ab); 3 forward(s) "
        "pending"]


def test_federation_reasons_each_name_the_peer_or_namespace():
    document = {
        "message_forward": {"a": {"link": "up", "stalled": True, "stalled_since": 12.5},
                            "b": {"link": "up", "stalled": False}},
        "multihub": {"partitioned": ["PROJ"], "quarantined": ["north"],
                     "claim_routes": {"east": {"link": "down", "last_error": None},
                                      "west": {"link": "up"}},
                     "watches": {"north": {"link": "down", "link_error": {
                         "cause": "tls", "detail": "handshake failed"}}}}}
    assert federation_problems(document) == [
        "message peer a: forwards stalled (the link is up, nothing settles) since 12.5",
        "namespace PROJ: partitioned (two hubs claim to own it); claims in it are refused until "
        "it heals",
        "peer north: quarantined for equivocation; its log is not followed until an operator "
        "recovers it (hubd multihub recover)",
        "claim route east: link down",
        "watch of north: link down (tls: handshake failed)"]
    assert federation_problems({}) == []


def test_a_presented_certificate_is_described_by_its_pins():
    assert describe_certificate(None) == "no certificate"
    assert describe_certificate(b"not a certificate") == "an unparseable certificate"


class Recorder:
    def __init__(self):
        self.lines = []

    def info(self, event, **fields):
        self.lines.append((event, fields))


def test_a_limited_log_writes_its_lines_per_window_then_reports_what_it_held():
    now = [100.0]
    logger = Recorder()
    line = LimitedLog(logger, "info", clock=lambda: now[0])
    for i in range(MAX_LINES + 5):
        line("auth denied", peer="1.2.3.4", seat=None, n=i)
    assert len(logger.lines) == MAX_LINES
    assert logger.lines[0] == ("auth denied", {"peer": "1.2.3.4", "n": 0})  # None fields left out
    now[0] += WINDOW_SECONDS
    line("auth denied", n=99)
    assert logger.lines[-1] == ("auth denied", {"n": 99, "suppressed": 5})


def test_who_is_online_is_listed_per_door_bounded_with_the_count():
    presence = Presence()
    for i in range(5):
        session = presence.open(i, "p", "10.0.0.1", None)
        presence.bind(session, f"PROJ/s{i}", (), now=1.0)
    presence.open(10, "p", "10.0.0.2", None)  # opened, not registered: not listed
    handle = presence.open(11, "broker", "local", None, door="broker", broadcast=False)
    presence.serve(handle, "bertha")
    peer = presence.open(12, "p", "10.0.0.3", b"cert")
    presence.mark_peer(peer, "west")
    for i in range(4):
        presence.hear("redsyn", f"a/b/c/agent{i}", "a/b/c:box", now=float(i))
    online = presence.online_by_door(limit=3)
    assert list(online) == ["broker", "hub", "peer-hubs", "redsyn"]
    assert online["hub"]["count"] == 5
    assert [e["name"] for e in online["hub"]["listed"]] == ["PROJ/s0", "PROJ/s1", "PROJ/s2"]
    assert online["broker"] == {"count": 1, "listed": [{"name": "bertha", "listening": False}]}
    assert online["peer-hubs"]["listed"] == [{"name": "west", "peer_host": "10.0.0.3"}]
    # the latest heard are listed (by name), the rest counted
    assert online["redsyn"]["count"] == 4
    assert [e["name"] for e in online["redsyn"]["listed"]] == [
        "a/b/c/agent1", "a/b/c/agent2", "a/b/c/agent3"]


def test_the_page_escapes_every_value_and_says_how_many_are_not_listed():
    evil = '<script>alert("x")</script>'
    view = {"hub_id": evil, "status": "degraded", "reasons": [evil], "generated_at": 1000.0,
            "online": {"hub": {"count": 250, "listed": [
                {"name": evil, "peer_host": "127.0.0.1", "since": 990.0}]}},
            "claims": {"count": 1, "listed": [{"task_id": evil, "owner": "PROJ/a",
                                               "paths": [evil], "lease_expires_at": 1060.0,
                                               "holder_online": True, "status": "claimed"}]},
            "board": {"count": 0, "listed": []},
            "message_forward": {"west": {"link": "down", "pending": 2, "last_error": {
                "cause": "tls", "detail": evil, "at": 995.0}}},
            "multihub": {"partitioned": ["PROJ"], "namespace_owners": {"PROJ": "east"},
                         "quarantined": []}}
    page = render(view)
    assert "<script" not in page and "&lt;script&gt;" in page
    assert "and 249 more" in page
    assert "connected 10 s ago from 127.0.0.1" in page and "in 60 s" in page
    assert "Partitioned: PROJ" in page and "never" in page
    assert '<meta http-equiv="refresh" content="5">' in page
    assert "default-src 'none'" in HEADERS["Content-Security-Policy"]


def test_only_a_browser_asking_for_html_without_an_upgrade_gets_the_page():
    def headers(**pairs):
        return CIMultiDict({k.replace("_", "-"): v for k, v in pairs.items()})
    browser = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"
    assert wants_page(headers(Accept=browser))
    assert not wants_page(headers(Accept=browser, Upgrade="websocket"))
    assert not wants_page(headers())
    assert not wants_page(headers(Accept="*/*"))
    assert not wants_page(headers(Accept="application/json"))

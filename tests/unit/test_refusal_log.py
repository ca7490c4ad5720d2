"""The HTTP listener's refusal log: its line budget and how it reads what
aiohttp reports (hubd/http/refusals.py)."""

from aiohttp.http_exceptions import BadHttpMessage, BadHttpMethod, LineTooLong

from hubd.http.refusals import (CLIENT_GONE, HANDLER_FAILED, MALFORMED, ServerLog,
                                kind_of)
from hubd.logs import LineBudget
from hubd.metrics import HubMetrics


def test_the_budget_writes_its_lines_per_window_and_counts_the_rest():
    budget = LineBudget(lines=3, window=10.0)
    assert [budget.take(0.0) for _ in range(5)] == [(True, 0)] * 3 + [(False, 0)] * 2
    assert budget.take(9.9) == (False, 0)
    # a new window: the first line written reports what was held back
    assert budget.take(10.0) == (True, 3)
    assert budget.take(10.1) == (True, 0)


def test_what_aiohttp_reports_is_sorted_by_kind():
    assert kind_of(BadHttpMethod("G@T")) == MALFORMED
    assert kind_of(LineTooLong(b"x", 8190)) == MALFORMED
    assert kind_of(BadHttpMessage("bad")) == MALFORMED
    assert kind_of(ConnectionResetError("Connection lost")) == CLIENT_GONE
    assert kind_of(KeyError("x")) == HANDLER_FAILED


def test_the_server_log_counts_every_refusal_even_those_it_does_not_write():
    metrics = HubMetrics()
    now = [0.0]
    server_log = ServerLog(metrics, lambda: now[0])
    for _ in range(25):
        server_log.exception("Error handling request from %s", "127.0.0.1",
                             exc_info=BadHttpMethod("G@T"))
    server_log.debug("Error handling request from %s", "127.0.0.1",
                     exc_info=ConnectionResetError("gone"))
    server_log.debug("Ignored premature client disconnection")  # no exception: not counted
    assert metrics.http_refused == {MALFORMED: 25, CLIENT_GONE: 1}
    assert server_log.budget.take(0.0) == (False, 0)

"""A short seeded hostile-input run against the REDSYN and broker doors of a
real hub process, interleaved with valid round trips (issue 30, "Done when";
the 60 s runs are tests/bench/hostile_doors.py): no 5xx but a documented 503,
no broker `internal`, every request answered, no traceback or handler
failure in the hub's log, and every valid round trip completes."""

from __future__ import annotations

from tests.support.hostile_doors import run

SEED = 30
SECONDS = 8.0


async def test_a_seeded_hostile_run_breaks_no_rule_of_either_door(tmp_path):
    summary = await run(SEED, SECONDS, tmp_path)
    report = "\n".join(summary.lines())
    assert summary.findings() == [], report
    # it was a run: hostile input of every kind on both doors, and round trips
    assert sum(summary.redsyn_hostile.values()) >= 200, report
    for status in (400, 401, 403, 404):
        assert summary.redsyn_hostile[status] > 0, report
    assert summary.raw_http["400"] > 0 and summary.raw_http["cut short"] > 0, report
    assert sum(summary.broker_hostile.values()) >= 100, report
    assert summary.broker_hostile["bad_request"] > 0 and summary.broker_hostile["ok"] > 0, report
    assert summary.redsyn_trips["completed"] >= 3 and summary.broker_trips["completed"] >= 3, \
        report
    assert summary.broker_one_shots["completed"] >= 3, report

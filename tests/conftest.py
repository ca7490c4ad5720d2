"""Shared test setup: tests import their helpers as tests.support.*.

`pytest --reverse-order` runs every module's tests, and the modules, in
reverse order: no test may depend on another having run first.

On CI (see tests/support/prereq.py) a skipped test is a failed test: the
environment must provide everything, so any skip, however it was raised, is
reported as a failure there."""

import sys
from pathlib import Path

import pytest

REPO = str(Path(__file__).resolve().parents[1])
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from tests.support.prereq import strict  # noqa: E402


def pytest_addoption(parser):
    parser.addoption(
        "--reverse-order", action="store_true",
        help="run the tests of every module in reverse order (and the modules too): "
             "a test that passes only after another one ran first fails")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--reverse-order"):
        items.reverse()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.skipped and strict() and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"skipped on CI, where nothing may skip: {reason}"

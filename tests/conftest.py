"""Shared test setup: tests import their helpers as tests.support.*.

`pytest --reverse-order` runs every module's tests, and the modules, in
reverse order: no test may depend on another having run first.

On CI (see tests/support/prereq.py) a skipped test is a failed test: the
environment must provide everything, so any skip, however it was raised, is
reported as a failure there."""

import compileall
import sys
from pathlib import Path

import pytest

REPO = str(Path(__file__).resolve().parents[1])
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from tests.support.prereq import strict  # noqa: E402
from tests.support import ref_forks  # noqa: E402


def pytest_configure(config):
    """Compile hubd, federation and the tests' helpers to bytecode once, before
    the workers start. The suite starts hundreds of hub processes and operator
    commands from this checkout; with PYTHONDONTWRITEBYTECODE set (as on this
    project's machines) or a fresh clone, each of them compiled ~200 modules
    from source again (~0.7 s of CPU per start, about a third of it), where an
    installed hubd reads the bytecode pip wrote. compileall writes regardless
    of that variable and skips what is already current."""
    ref_forks.hubs_too = True
    if hasattr(config, "workerinput"):  # an xdist worker: the controller did it
        return
    for package in ("hubd", "federation", "tests/support"):
        if not compileall.compile_dir(str(Path(REPO) / package), quiet=1):
            raise pytest.UsageError(f"{package} does not compile")


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


@pytest.fixture(scope="session", autouse=True)
def _reference_zygotes():
    """Stop the reference programs' zygotes (tests/support/ref_forks.py) at the
    session's end, so their programs' CPU is counted before pytest reports."""
    yield
    ref_forks.stop_zygotes()

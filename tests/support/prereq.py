"""One home for "this test needs something the machine may not have".

Every test that depends on the environment (root, network namespaces,
nftables, a tmpfs mount, openssl, promtool, docker-compose, the reference
venv, a Python package, a free well-known port) asks here instead of calling
pytest.skip itself. On a developer's machine a missing prerequisite skips,
saying why; on CI (``CI=true``, or ``HUBD_REQUIRE_PREREQS=1`` anywhere) it
fails the test, because a CI run that skips is a run that did not test.
tests/conftest.py backs this up: on CI any skip that does not come through
here is turned into a failure as well.
"""

from __future__ import annotations

import importlib
import os
import shutil

import pytest


def strict() -> bool:
    """Is a missing prerequisite a failure here (CI) rather than a skip?"""
    return os.environ.get("CI", "").lower() == "true" or \
        os.environ.get("HUBD_REQUIRE_PREREQS") == "1"


def missing(why: str) -> None:
    """Skip (or, on CI, fail) the running test because `why` is not available."""
    if strict():
        pytest.fail(f"prerequisite missing on CI (it must not skip): {why}", pytrace=False)
    pytest.skip(why)


def need(ok: bool, why: str) -> None:
    if not ok:
        missing(why)


def need_root(what: str) -> None:
    need(os.geteuid() == 0, f"needs root to {what}")


def need_tool(name: str, package: str | None = None) -> str:
    """The path of a program on PATH, e.g. need_tool("promtool", "prometheus")."""
    path = shutil.which(name)
    if path is None:
        missing(f"`{name}` is not installed (Debian package {package or name}; "
                ".ci/run installs it)")
    return path


def need_module(name: str, extra: str = "test"):
    """Import a Python package the [test] extra provides."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        missing(f"Python package {name!r} is not installed (pip install -e '.[{extra}]'): {exc}")

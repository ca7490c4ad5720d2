"""The one switch: on CI a missing prerequisite, or any other skip, fails."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.support.procs import REPO

SAMPLE = '''
import pytest
from tests.support.prereq import need_tool

def test_needs_a_tool_that_is_not_there():
    need_tool("no-such-tool-hubd-test", "nothing")

def test_skips_on_its_own():
    pytest.skip("a bare skip, not routed through prereq")

def test_passes():
    pass
'''


def run_sample(tmp_path, ci: str | None):
    (tmp_path / "test_sample.py").write_text(SAMPLE)
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "HUBD_REQUIRE_PREREQS")}
    if ci is not None:
        env["CI"] = ci
    env["PYTHONPATH"] = str(REPO)
    # only tests.conftest (-p), the plugin under test: the installed plugins'
    # imports (hypothesis, aiohttp, asyncio, xdist) were 3 of its 3.5 CPU-s
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "tests.conftest", "-p",
         "no:cacheprovider", str(tmp_path / "test_sample.py")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def test_off_ci_a_missing_prerequisite_skips_saying_why(tmp_path):
    result = run_sample(tmp_path, None)
    assert "1 passed, 2 skipped" in result.stdout, result.stdout
    assert "no-such-tool-hubd-test" in result.stdout  # -rs shows the reason


def test_on_ci_every_skip_fails(tmp_path):
    result = run_sample(tmp_path, "true")
    assert result.returncode == 1
    assert "2 failed, 1 passed" in result.stdout, result.stdout
    assert "prerequisite missing on CI" in result.stdout
    assert "skipped on CI, where nothing may skip: Skipped: a bare skip" in result.stdout

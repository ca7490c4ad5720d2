"""The README's two opening commands, as written: each makes or reuses a venv
of its own and installs nothing outside it (a Debian or Ubuntu Python
refuses a system-wide pip install, PEP 668, and may have no pip), .ci/run
runs the second exactly as the README writes it, and the first, run twice in
a copy of the checkout, installs hubd and serves a hub both times, the
second reusing the venv the first made (pip takes its wheels from a folder
the test fills first)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tomllib

from tests.support import readme
from tests.support.prereq import missing
from tests.support.procs import REPO
from tests.support.sites import one_machine
from tests.support.sitecmd import driver, env
from tests.support.waiting import wait_for


def test_each_command_parses_and_makes_its_own_venv():
    lines = readme.first_block()
    assert len(lines) == 2, lines
    for number, line in enumerate(lines, 1):
        printed = subprocess.run([str(REPO / ".ci" / "readme-command"), str(number)],
                                 capture_output=True, text=True, timeout=30)
        assert printed.returncode == 0 and printed.stdout == line + "\n", printed
        assert subprocess.run(["bash", "-n", "-c", line], timeout=30).returncode == 0, line
        steps = [shlex.split(step) for step in line.split("&&")]
        assert steps[0] == ["python3", "-m", "venv", ".venv"], line
        # every later program is the venv's own: nothing is installed elsewhere
        assert all(step[0].startswith(".venv/bin/") for step in steps[1:]), line
        assert steps[1][:3] == [".venv/bin/pip", "install", "-e"], line
    assert lines[1].endswith(".venv/bin/pytest"), "the second command runs the suite"


def test_ci_runs_the_readmes_test_command_and_no_install_of_its_own():
    code = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()
            if line.strip() and not line.strip().startswith("#")]
    assert "test_command=$(.ci/readme-command 2)" in code
    assert 'bash -euo pipefail -c "$test_command"' in code
    for line in code:
        assert "pip install" not in line and "-m venv .venv" not in line, line
        assert not line.split()[0].endswith("pytest"), line


def test_the_first_command_serves_a_hub_twice_reusing_its_venv(tmp_path):
    """As written, in a copy of the checkout, on a machine where 8876 is free."""
    if shutil.which("git") is None or shutil.which("python3") is None:
        missing("git and python3 are needed to copy the checkout and run the README")
    checkout = tmp_path / "checkout"
    files = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others",
                            "--exclude-standard"], capture_output=True, check=True).stdout
    for name in filter(None, files.decode().split("\0")):
        if (REPO / name).is_file():
            (checkout / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, checkout / name)
    [first, _] = readme.first_block()
    # never run a README line that would install outside its own venv
    assert first.startswith("python3 -m venv .venv && .venv/bin/pip install "), first
    # pip's wheels from a folder made here first (a network namespace has no
    # network): the command's install reuses them, as it may reuse pip's cache
    wheels = tmp_path / "wheels"
    needed = tomllib.loads((REPO / "pyproject.toml").read_text())
    got = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "-d", str(wheels),
                          *needed["build-system"]["requires"], *needed["project"]["dependencies"]],
                         capture_output=True, text=True, timeout=600)
    if got.returncode != 0:
        missing(f"pip cannot download hubd's dependencies here: {got.stderr[-500:]}")
    # the command's own environment: not this test run's venv or imports
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    clean.update(PIP_NO_INDEX="1", PIP_FIND_LINKS=str(wheels))
    with one_machine([8876]) as machine:
        for run in (1, 2):
            log = tmp_path / f"run-{run}.log"
            with open(log, "w") as out:
                proc = machine.popen(["bash", "-c", first], cwd=checkout, env=clean, stdout=out,
                                     stderr=subprocess.STDOUT)

            def health():
                assert proc.poll() is None, log.read_text()[-3000:]
                got = machine.run(driver("get", "--url", "http://127.0.0.1:8876/health"),
                                  env=env(), timeout=10)
                return json.loads(got.stdout) if got.returncode == 0 else None

            answer = wait_for(health, 600, f"run {run}: the README's hub on 8876", interval=1)
            assert answer["status"] == "ok", answer
            machine.stop(proc)
            if run == 1:  # the second run must find and reuse this venv
                marker = checkout / ".venv" / "made-by-the-first-run"
                marker.write_text("")
        assert marker.exists()
    assert (checkout / "hubd.db").exists()
    assert "Successfully installed" in (tmp_path / "run-1.log").read_text()
    assert "Traceback" not in (tmp_path / "run-2.log").read_text()

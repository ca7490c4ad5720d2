"""HUBD_FAULT (hubd/faults.py): off unless set, strict about what it says."""

from __future__ import annotations

import subprocess
import sys

import pytest

from hubd import faults
from hubd.state.events import Event
from tests.support.procs import free_port


def test_off_by_default(monkeypatch):
    monkeypatch.delenv("HUBD_FAULT", raising=False)
    assert faults.from_env() is None
    monkeypatch.setenv("HUBD_FAULT", "")
    assert faults.from_env() is None


def test_parses_stage_selector_and_count():
    fault = faults.parse("kill-after-commit:chat+forwarded:3")
    assert (fault.stage, fault.kind, fault.route_key, fault.nth) == ("after", "chat", "forwarded", 3)
    fault = faults.parse("kill-before-commit:forward_settled")
    assert (fault.stage, fault.kind, fault.route_key, fault.nth) == (
        "before", "forward_settled", None, 1)


@pytest.mark.parametrize("spec", ["kill:chat", "kill-after-commit", "kill-after-commit:",
                                  "kill-after-commit:chat:0", "kill-after-commit:chat:x",
                                  "kill-after-commit:chat:1:2", "crash-after-commit:chat"])
def test_refuses_what_it_does_not_know(spec):
    with pytest.raises(faults.FaultSpecError, match="HUBD_FAULT"):
        faults.parse(spec)


def test_selector_matches_kind_and_route_key():
    fault = faults.parse("kill-after-commit:chat+forwarded")
    forwarded = Event(1, 0.0, "chat", {}, {"forwarded": {"forward_id": "f"}})
    local = Event(2, 0.0, "chat", {}, {"online": []})
    bare = Event(3, 0.0, "chat", {}, None)
    other = Event(4, 0.0, "forward_settled", {}, {"forwarded": {}})
    assert fault.matches(forwarded)
    assert not any(fault.matches(e) for e in (local, bare, other))
    # a stage or a commit without a match does not count towards n
    fault = faults.parse("kill-after-commit:chat+forwarded:2")
    fault.reached("before", [forwarded])
    fault.reached("after", [local, bare])
    assert fault.seen == 0


def test_a_hub_with_a_malformed_fault_does_not_start(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "hubd", "--port", str(free_port()), "--db", str(tmp_path / "h.db")],
        env={"HUBD_FAULT": "kill-sometime", "PATH": "/usr/bin:/bin"}, capture_output=True,
        text=True, timeout=60)
    assert result.returncode != 0
    assert "FaultSpecError" in result.stderr and "kill-sometime" in result.stderr

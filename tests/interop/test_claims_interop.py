"""Interop: the reference client's claim, board and capability commands against a hub.

Every test runs against the reference hub and against hubd (fixture ``hub``);
passing against the reference validates the test, passing against hubd proves
the real CLI works unchanged. The reference package runs only as separate
programs from its own virtual environment (tests/support/refclient.py).

Facts: docs/reference-observed.md ("ro §N").
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.support.refclient import RefClient

pytestmark = pytest.mark.interop


def ok(res):
    assert res.returncode == 0, str(res)
    return res.stdout


def active_claims(ref: RefClient) -> dict[str, str]:
    """`synapse state` lines by task id (ro §2.3)."""
    out = ok(ref.run("state", "--name", "iop/reader"))
    count = int(re.search(r"Active claims \((\d+)\):", out).group(1))
    lines = {m.group(1): m.group(0) for m in re.finditer(r"^  (\S+) \[\w+\] .*$", out, re.M)}
    assert len(lines) == count, out
    return lines


def test_lock_holds_the_lease_while_its_command_runs(hub, ref):
    """`synapse lock`: claim, drop the socket, run the child, reconnect under the same
    name and release with the epoch and a keyed digest-checked verdict (ro §2.1)."""
    inner = [ref.synapse, "state", "--uri", hub.url, "--name", "iop/inner"]
    res = ref.run("lock", "--name", "iop/locker", "--paths", "src/a.py", "--paths", "lib/",
                  "t-lock", "--", *inner)
    out = ok(res)
    assert re.search(r"^  t-lock \[claimed\] owner=iop/locker paths=src/a.py, lib ", out, re.M), out
    assert active_claims(ref) == {}
    # the child's exit code is lock's, and the lease is released either way
    res = ref.run("lock", "--name", "iop/locker", "--paths", "x", "t-exit", "--", "sh", "-c",
                  "exit 7")
    assert res.returncode == 7, str(res)
    assert active_claims(ref) == {}


def test_lock_is_refused_while_another_agent_holds_the_scope(hub, ref):
    holder = ref.agent("iop/holder")
    since = holder.mark()
    holder.send("claim", payload="h-1", task_id="h-1", paths=["src"], note="holding")
    granted = holder.wait_frame(type="claim_granted", task_id="h-1", since=since)
    assert granted["owner"] == "iop/holder" and isinstance(granted["epoch"], int)
    res = ref.run("lock", "--name", "iop/locker", "--wait-timeout", "0", "--paths", "src/a.py",
                  "t-2", "--", "true")
    assert res.returncode == 1, str(res)
    assert ("Could not acquire lock 't-2': Task 't-2' file scope conflicts with 'h-1' held by "
            "iop/holder.") in res.output, str(res)
    res = ref.run("lock", "--name", "iop/locker", "--wait-timeout", "0", "--paths", "docs",
                  "h-1", "--", "true")
    assert res.returncode == 1 and "is already claimed by iop/holder" in res.output, str(res)
    assert "h-1" in active_claims(ref)
    since = holder.mark()
    holder.send("release", payload="h-1", task_id="h-1", epoch=granted["epoch"])
    holder.wait_frame(type="release_granted", task_id="h-1", since=since)
    ok(ref.run("lock", "--name", "iop/locker", "--wait-timeout", "0", "--paths", "src/a.py",
               "t-2", "--", "true"))


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    path = tmp_path / "repo"
    (path / "src").mkdir(parents=True)
    (path / "src" / "mod.py").write_text("x = 1\n")
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.invalid",
           "PATH": "/usr/bin:/bin"}
    for argv in (["git", "init", "-q", "-b", "main", "."], ["git", "add", "."],
                 ["git", "commit", "-q", "-m", "init"]):
        subprocess.run(argv, cwd=path, env=env, check=True, capture_output=True)
    return path


def test_git_claim_state_and_release_with_evidence(hub, ref, repo):
    """git-claim sends path_identity and checks the exact echo; release probes
    release_confirmation first, then checks the request digest (ro §2.2, §2.5)."""
    out = ok(ref.run("git-claim", "--name", "iop/gitter", "--paths", "src/mod.py",
                     "--paths", "newdir", "T-git", cwd=repo))
    assert "claimed 'T-git' on branch main" in out, out
    line = active_claims(ref)["T-git"]
    assert "owner=iop/gitter paths=src/mod.py, newdir" in line and "git=main->main" in line, line
    # the same file, claimed by another identity: refused (same display path)
    res = ref.run("git-claim", "--name", "iop/other", "--paths", "src", "T-git2", cwd=repo)
    assert res.returncode == 1, str(res)
    assert ("claim denied for 'T-git2': Task 'T-git2' file scope conflicts with 'T-git' held "
            "by iop/gitter.") in res.output, str(res)
    res = ref.run("release", "--name", "iop/other", "T-git")
    assert res.returncode == 1, str(res)
    assert "release refused for 'T-git': Task 'T-git' is owned by iop/gitter, not iop/other." in (
        res.output), str(res)
    res = ref.run("release", "--name", "iop/gitter", "--evidence", "pytest: ok",
                  "--changed-file", "src/mod.py", "--freshness-seconds", "5", "--receipt-json",
                  "T-git")
    receipt = json.loads(ok(res))
    assert receipt["released"] is True and receipt["task_id"] == "T-git"
    assert receipt["owner"] == "iop/gitter" and receipt["evidence"] == ["pytest: ok"]
    assert receipt["changed_files"] == ["src/mod.py"] and receipt["freshness_seconds"] == 5.0
    assert active_claims(ref) == {}
    board = ok(ref.run("board", "--name", "iop/reader"))
    assert ("iop/gitter [assessment] T-git: release receipt: evidence=pytest: ok; "
            "changed_files=src/mod.py; freshness_seconds=5.0;") in board, board


def test_task_declare_update_progress_and_board(hub, ref):
    def task(sub: str, *args: str):
        return ref.run("task", sub, "--uri", hub.url, *args, uri=False)

    assert ok(task("declare", "--name", "iop/planner", "--title", "Build",
                      "--project", "iop", "--idem-key", "td-1", "B-1")).strip() == (
        "declared B-1 — Build (deps: none)")
    # a keyed retry is answered again (the original verdict)
    assert ok(task("declare", "--name", "iop/planner", "--title", "Build",
                      "--project", "iop", "--idem-key", "td-1", "B-1")).strip() == (
        "declared B-1 — Build (deps: none)")
    ok(task("declare", "--name", "iop/planner", "--title", "Docs",
               "--depends-on", "B-1", "B-2"))
    assert ok(task("update", "--name", "iop/worker", "--status", "done",
                      "--expected-version", "1", "B-1")).strip() == "updated B-1 -> status=done"
    assert ok(task("progress", "--name", "iop/worker", "--kind", "blocked", "B-2",
                      "waiting on review")).strip() == "posted blocked on B-2: waiting on review"
    res = task("declare", "--name", "iop/planner", "--title", "X", "--project",
                  "other", "B-1")
    assert res.returncode == 1 and res.stdout.strip() == (
        "Task 'B-1' project conflict: already scoped to 'iop', cannot re-scope to 'other'."), str(res)
    res = task("update", "--name", "iop/worker", "--status", "done",
                  "--expected-version", "9", "B-1")
    assert res.returncode == 1 and res.stdout.strip() == (
        "Task 'B-1' version conflict: expected v9, board has v2."), str(res)
    res = task("update", "--name", "iop/worker", "--status", "nonsense", "B-1")
    assert res.returncode == 1 and "Unknown ledger status 'nonsense'." in res.stdout, str(res)
    board = ok(ref.run("board", "--name", "iop/reader"))
    assert board.splitlines() == [
        "Tasks (2):",
        "  [done] B-1 — Build",
        "  [open] B-2 — Docs  (deps: B-1)",
        "Ready: B-2",
        "Recent progress:",
        "  iop/worker [blocked] B-2: waiting on review",
    ], board


def test_manifest_lists_a_persistent_capability_card(hub, ref, tmp_path):
    """`synapse wait --capability-card` registers its seat's card from the -rx
    sidecar (persist); the card outlives the sidecar's connection (ro §2.8)."""
    card = tmp_path / "card.json"
    card.write_text(json.dumps({"description": "docs writer", "skills": ["markdown"],
                                "task_classes": ["docs"], "model": "m-x", "dispatchable": True}))
    res = ref.run("wait", "--name", "iop/x-rx", "--for", "iop/x", "--timeout", "2",
                  "--capability-card", str(card))
    assert res.returncode == 2, str(res)  # nothing arrived before the timeout
    out = ok(ref.run("manifest", "--name", "iop/reader"))
    assert out.splitlines() == ["Agents (1):",
                                "  iop/x [docs] model=m-x verify=missing_signature: docs writer"], out

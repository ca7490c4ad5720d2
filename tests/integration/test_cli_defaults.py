"""`hubd` with no options: one hub on 127.0.0.1:8876, journal ./hubd.db, a stable
hub id kept in the journal; operator subcommands answer --help."""

import json
import os
import shutil
import signal
import stat
import subprocess
import sys

import pytest

from tests.support.prereq import missing
from tests.support.sites import one_machine
from tests.support.procs import REPO


HEALTH = """
import json, sys, time, urllib.request
deadline = time.monotonic() + 20
while True:
    try:
        urllib.request.urlopen("http://127.0.0.1:8876/readyz", timeout=1).read()
        print(urllib.request.urlopen("http://127.0.0.1:8876/health", timeout=1).read().decode())
        break
    except OSError:
        if time.monotonic() > deadline:
            sys.exit("hubd did not come up on 8876")
        time.sleep(0.1)
"""


def test_hubd_with_no_options(tmp_path):
    """In a network namespace of its own when it can (so 8876 is free whatever
    else runs on this machine), else on this host's loopback if 8876 is free."""
    with one_machine([8876]) as machine:
        run_twice(tmp_path, machine.popen,
                  lambda: machine.run([sys.executable, "-c", HEALTH], timeout=60))


def run_twice(tmp_path, popen, fetch_health):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    ids = []
    for _ in range(2):
        proc = popen([sys.executable, "-m", "hubd"], cwd=tmp_path, env=env,
                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            answer = fetch_health()
            assert answer.returncode == 0, answer.stderr
            health = json.loads(answer.stdout)
            assert health["status"] == "ok" and health["protocol_version"] >= 2
            ids.append(health["hub_id"])
            # the broker's socket, named after the journal (as the README says)
            assert stat.S_ISSOCK((tmp_path / "hubd.db-bus.sock").stat().st_mode)
        finally:
            os.kill(proc.pid, signal.SIGTERM)
            _, err = proc.communicate(timeout=15)
        assert proc.returncode == 0, err
        assert (tmp_path / "hubd.db").exists()
        assert (tmp_path / "hubd.db-bus.token").exists()
    assert ids[0] == ids[1] and ids[0].startswith("hubd-")  # generated once, then kept
    readme = (REPO / "README.md").read_text()
    assert "`./hubd.db`" in readme and "`./hubd.db-bus.sock`" in readme \
        and "`./hubd.db-bus.token`" in readme
    # what it leaves in the folder it ran in (the README's first command runs
    # it in the checkout) is git-ignored there: journal, broker socket, token
    left = sorted(path.name for path in tmp_path.iterdir()) + ["hubd.db-bus.sock"]
    assert {"hubd.db", "hubd.db-bus.token"} <= set(left), left
    assert not_git_ignored(left) == []


def not_git_ignored(names: list[str]) -> list[str]:
    """Those of `names` that the checkout's .gitignore does not ignore at its root."""
    if shutil.which("git") is None:
        missing("git is not installed")
    answer = subprocess.run(["git", "-C", str(REPO), "check-ignore", "--no-index", "--stdin"],
                            input="\n".join(names) + "\n", capture_output=True, text=True)
    assert answer.returncode in (0, 1), answer.stderr  # 1: none of them ignored
    ignored = set(answer.stdout.split())
    return [name for name in names if name not in ignored]


@pytest.mark.parametrize("argv", [["--help"], ["certs", "--help"], ["multihub", "--help"]])
def test_commands_answer_help(argv):
    out = subprocess.run([sys.executable, "-m", "hubd", *argv], capture_output=True, text=True,
                         cwd=REPO, timeout=30)
    assert out.returncode == 0 and "usage" in out.stdout.lower()


def test_operator_commands_find_the_journal_with_db_and_the_hubs_default(tmp_path):
    """principal, redsyn and multihub spell the journal's path --db, and
    without it use ./hubd.db, as the hub does: what one writes the next reads."""
    def hubd(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "hubd", *argv], cwd=tmp_path, timeout=60,
                              capture_output=True, text=True, env={**os.environ,
                                                                   "PYTHONPATH": str(REPO)})

    assert hubd("principal", "add", "alice", "--seat", "PROJ/alice").returncode == 0
    assert (tmp_path / "hubd.db").exists()
    assert hubd("redsyn", "login", "--person", "acme/dev/joel", "--name", "laptop").returncode == 0
    listed = json.loads(hubd("principal", "list", "--json").stdout)
    assert "alice" in json.dumps(listed)
    assert hubd("redsyn", "logout", "--person", "acme/dev/joel", "--name", "laptop").returncode == 0
    assert hubd("multihub", "status", "--json").returncode == 0
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(("-wal", "-shm"))) \
        == ["hubd.db"]
    for command in (["principal", "add"], ["redsyn", "login"], ["multihub", "status"],
                    ["multihub", "recover"]):
        said = " ".join(hubd(*command, "--help").stdout.split())
        assert "--db DB" in said and "(default ./hubd.db)" in said, (command, said)

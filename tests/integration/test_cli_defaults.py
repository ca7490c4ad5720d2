"""`hubd` with no options: one hub on 127.0.0.1:8876, journal ./hubd.db, a stable
hub id kept in the journal; operator subcommands answer --help."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from tests.support.prereq import missing
from tests.support.procs import REPO


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _health(timeout=20.0):
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen("http://127.0.0.1:8876/readyz", timeout=1):
                pass
            with urllib.request.urlopen("http://127.0.0.1:8876/health", timeout=1) as r:
                return json.loads(r.read())
        except OSError:
            assert time.monotonic() < deadline, "hubd did not come up on 8876"
            time.sleep(0.1)


def test_hubd_with_no_options(tmp_path):
    if not _port_free(8876):
        missing("port 8876 is taken on this machine")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    ids = []
    for _ in range(2):
        proc = subprocess.Popen([sys.executable, "-m", "hubd"], cwd=tmp_path, env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            health = _health()
            assert health["status"] == "ok" and health["protocol_version"] >= 2
            ids.append(health["hub_id"])
        finally:
            os.kill(proc.pid, signal.SIGTERM)
            _, err = proc.communicate(timeout=15)
        assert proc.returncode == 0, err
        assert (tmp_path / "hubd.db").exists()
    assert ids[0] == ids[1] and ids[0].startswith("hubd-")  # generated once, then kept


@pytest.mark.parametrize("argv", [["--help"], ["certs", "--help"], ["multihub", "--help"]])
def test_commands_answer_help(argv):
    out = subprocess.run([sys.executable, "-m", "hubd", *argv], capture_output=True, text=True,
                         cwd=REPO, timeout=30)
    assert out.returncode == 0 and "usage" in out.stdout.lower()

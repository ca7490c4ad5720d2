"""The hub command keeps Python's cyclic garbage collector off while it
imports and builds the hub (a tenth of a start, issue 29), and turns it back
on (with what the imports made frozen) before the journal is read: a hub
that serves collects garbage."""

import subprocess
import sys

# Runs hubd/__main__.py itself (`python -m hubd`), reporting once the hub is
# ready whether the collector is on and whether the imports' objects were frozen.
STARTED = """
import gc, os, runpy, sys
import hubd.server as server
start = server.HubServer.start
async def started(self):
    await start(self)
    print(gc.isenabled(), gc.get_freeze_count() > 0, flush=True)
    os._exit(0)
server.HubServer.start = started
sys.argv = ["hubd", "--port", "0", "--db", sys.argv[1]]
runpy.run_module("hubd", run_name="__main__", alter_sys=True)
"""


def test_a_hub_started_by_its_command_collects_garbage_once_built(tmp_path):
    out = subprocess.run([sys.executable, "-c", STARTED, str(tmp_path / "hubd.db")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["True", "True"], out.stdout + out.stderr[-3000:]


def test_an_operator_command_collects_garbage(tmp_path):
    code = ("import gc, sys\n"
            "from hubd.cli import main\n"
            "sys.argv = ['hubd', 'journal', 'verify', '--db', sys.argv[1]]\n"
            "gc.disable()\n"
            "main()\n"
            "print(gc.isenabled())\n")
    db = tmp_path / "hubd.db"
    from hubd.journal.store import JournalStore
    JournalStore(db).close()
    out = subprocess.run([sys.executable, "-c", code, str(db)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and out.stdout.splitlines()[-1] == "True", \
        out.stdout + out.stderr[-3000:]

"""`hubd journal compact` (issue 29 item 3) on a real hub's journal: it drops
only rows the newest snapshot makes unnecessary, as far as the operator's
retention says, never a row the mailbox still reads back, anchors the chain
at a signed checkpoint (verify holds after), refuses while the hub runs, and
a hub restarted on the compacted journal has the state it had before."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import subprocess
import sys

from hubd.composition import build_hub
from hubd.journal.restore import policy_for, project
from hubd.journal.store import JournalReader
from hubd.state.frozen import canonical
from hubd.timing import Timing
from tests.integration.test_journal_verify import verify
from tests.support import inproc
from tests.support.procs import REPO, hubd_process
from tests.support.waiting import wait_for
from tests.support.wsprobe import WsProbe

EVERY = 10  # --checkpoint-every
SNAPSHOT_EVERY = 40


def compact(db, *args):
    done = subprocess.run([sys.executable, "-m", "hubd", "journal", "compact", "--db", str(db),
                           *args], capture_output=True, text=True, timeout=120, cwd=REPO)
    return done.returncode, done.stdout + done.stderr


async def history(url):
    """Chats to everyone, and one early directed chat to p/bob, who is away:
    the mailbox keeps its seq until bob reads it."""
    alice = await WsProbe.open(url)
    await alice.register("p/alice")
    await alice.recv_type("presence_update", agent="p/alice", timeout=10)
    for i in range(12):
        await alice.chat("p/alice", "all", f"before {i}")
    await alice.chat("p/alice", "p/bob", "for bob, when he is back")
    for i in range(50):
        await alice.chat("p/alice", "all", f"after {i}")
    await alice.recv(lambda f: f.get("payload") == "after 49", timeout=10)
    await alice.close()


def state_of(tmp_path, db):
    """The projection a hub of the default flags starts from (its snapshot
    plus the rows after it), in canonical form."""
    hub = build_hub(inproc.test_config(tmp_path / "inproc", db=db))
    reader = JournalReader(db)
    try:
        return canonical(project(reader, hub.fresh_state,
                                 policy_for(db, "test-hub", hub.fresh_state)).state)
    finally:
        reader.close()


def hub_with_a_snapshot(tmp_path):
    """A running hub on tmp_path/hubd.db with the history written and a snapshot
    taken (checkpoints every EVERY events, a snapshot every SNAPSHOT_EVERY)."""
    timing = Timing(snapshot_check=0.1, snapshot_interval=0.1)
    hub = hubd_process(tmp_path, "--checkpoint-every", str(EVERY), "--snapshot-every",
                       str(SNAPSHOT_EVERY), timing=timing).start()
    try:
        asyncio.run(history(hub.url))
        wait_for(lambda: "snapshot written" in hub.log(), what="a snapshot")
    except BaseException:
        hub.stop()
        raise
    return hub


def seqs(db):
    conn = sqlite3.connect(db)
    try:
        return [row[0] for row in conn.execute("SELECT seq FROM events ORDER BY seq")]
    finally:
        conn.close()


def test_compact_keeps_what_is_needed_and_a_restart_has_the_same_state(tmp_path):
    db = tmp_path / "hubd.db"
    hub = hub_with_a_snapshot(tmp_path)
    try:
        code, out = compact(db, "--keep-after-seq", "1000")
        assert code == 2 and "stop the hub first" in out, out  # never under a running hub
    finally:
        hub.stop()
    before = state_of(tmp_path, db)
    conn = sqlite3.connect(db)
    (bobs,) = conn.execute("SELECT seq FROM events WHERE payload LIKE '%for bob%'").fetchone()
    conn.close()
    last = seqs(db)[-1]

    code, out = compact(db, "--keep-after-seq", "1000", "--json")
    assert code == 0, out
    done = json.loads(out)
    # the retention allows all, the snapshot all before it; the mailbox holds bob's chat
    assert done["requested"] == 1000 and done["limits"]["mailbox"] == bobs - 1
    assert done["limits"]["snapshot"] == done["snapshot_seq"] - 1 >= bobs
    assert done["cut"] == (bobs - 1) // EVERY * EVERY and done["cut"] > 0  # a checkpoint's seq
    assert seqs(db) == list(range(done["cut"] + 1, last + 1))
    assert done["dropped"] == done["cut"]

    code, out = verify(db, "--json")
    assert code == 0, out
    report = json.loads(out)
    assert report["chain"]["anchor_seq"] == done["cut"] and report["chain"]["first_bad_seq"] is None
    assert state_of(tmp_path, db) == before

    code, out = compact(db, "--keep-after-seq", "1000")  # nothing more may go
    assert code == 0 and "nothing dropped" in out, out

    hub = hubd_process(tmp_path, "--checkpoint-every", str(EVERY)).start()
    try:
        assert "journal replayed" in hub.log()

        async def bob_reads():
            bob = await WsProbe.open(hub.url)
            await bob.register("p/bob")
            await bob.send_json({"sender": "p/bob", "type": "heartbeat", "mailbox": True})
            frame = await bob.recv(lambda f: "for bob, when he is back" in json.dumps(f),
                                   timeout=10)
            await bob.close()
            return frame
        assert asyncio.run(bob_reads())
    finally:
        hub.stop()


def test_a_compaction_the_retention_does_not_allow_drops_nothing(tmp_path):
    db = tmp_path / "hubd.db"
    hub_with_a_snapshot(tmp_path).stop()
    all_rows = seqs(db)
    code, out = compact(db, "--keep-days", "1")  # every row is younger than a day
    assert code == 0 and "nothing dropped" in out, out
    code, out = compact(db, "--keep-after-seq", str(EVERY - 1))  # below the first checkpoint
    assert code == 0 and "nothing dropped" in out, out
    assert seqs(db) == all_rows

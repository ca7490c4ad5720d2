"""`hubd journal verify` (issue 29 item 3, the snapshot half): one replay of a
real journal file checks every row and every snapshot beside it; each fault
is named (where, what) and the exit code says whether there is one. Run as
the operator runs it: `python -m hubd journal verify`, a real process."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys

from hubd.composition import build_hub
from hubd.journal import snapshots
from hubd.journal.restore import policy_for, take
from hubd.state.frozen import freeze, thaw
from tests.integration.test_handler_failure import write_history
from tests.support import inproc
from tests.support.procs import REPO

ROWS = 300


def verify(db, *args: str) -> tuple[int, str]:
    done = subprocess.run([sys.executable, "-m", "hubd", "journal", "verify", "--db", str(db),
                           *args], capture_output=True, text=True, cwd=REPO, timeout=120)
    return done.returncode, done.stdout + done.stderr


def journal_with_snapshots(tmp_path, *seqs: int):
    """A journal of ROWS chats and a snapshot at each of `seqs`, as a hub of
    the default flags (the ones verify judges by) writes them."""
    db = tmp_path / "hubd.db"
    write_history(db, ROWS)
    hub = build_hub(inproc.test_config(tmp_path, db=db))
    policy = policy_for(db, "test-hub", hub.fresh_state)
    for seq in seqs:
        take(db, hub.fresh_state, policy, len(seqs), upto=seq)
    return db, hub, snapshots.listed(policy.directory)


def test_a_sound_journal_and_its_snapshots_verify(tmp_path):
    db, _, files = journal_with_snapshots(tmp_path, 100, 250)
    code, out = verify(db, "--json")
    assert code == 0, out
    report = json.loads(out)
    assert report["ok"] and report["rows"] == ROWS and report["problems"] == []
    assert [(s["seq"], s["status"]) for s in report["snapshots"]] == [(100, "ok"), (250, "ok")]
    code, out = verify(db)
    assert code == 0 and out.strip().endswith("ok"), out


def test_a_damaged_snapshot_is_named(tmp_path):
    db, _, files = journal_with_snapshots(tmp_path, 100, 250)
    data = bytearray(files[0].path.read_bytes())
    data[-100] ^= 1
    files[0].path.write_bytes(bytes(data))
    code, out = verify(db)
    assert code == 1, out
    assert f"FAULT snapshot {files[0].path.name}: checksum mismatch" in out
    assert f"snapshot {files[1].path.name}" in out and "1 fault(s)" in out


def test_a_snapshot_whose_state_is_not_the_journals_is_found(tmp_path):
    """Whole and signed off by its checksum, but its state is not the
    replay's: verify compares, a hub would not notice."""
    db, hub, files = journal_with_snapshots(tmp_path, 200)
    header, body = snapshots.decode(files[0].path.read_bytes())
    state, notes = thaw(body, hub.fresh_state().appliers)
    state.chat.history.pop()  # a chat lost
    files[0].path.write_bytes(snapshots.encode(header, freeze(state, notes)))
    code, out = verify(db, "--json")
    assert code == 1, out
    report = json.loads(out)
    assert report["problems"] == [{"where": f"snapshot {files[0].path.name}",
                                   "what": "its state differs from the replay of the journal "
                                           "at its seq"}]


def test_a_snapshot_of_another_hubd_is_stale_not_a_fault(tmp_path):
    db, _, files = journal_with_snapshots(tmp_path, 150)
    header, body = snapshots.decode(files[0].path.read_bytes())
    header.update(hubd="0.0.1", fingerprint="0" * 64)
    files[0].path.write_bytes(snapshots.encode(header, body))
    code, out = verify(db, "--json")
    assert code == 0, out
    assert json.loads(out)["snapshots"][0]["status"] == "stale"


def test_an_undecodable_row_and_a_snapshot_of_another_journal_are_named(tmp_path):
    db, _, files = journal_with_snapshots(tmp_path, 120)
    conn = sqlite3.connect(db)
    conn.execute("UPDATE events SET payload = '{not json' WHERE seq = 17")
    conn.execute("UPDATE events SET payload = replace(payload, 'old chat', 'new chat') "
                 "WHERE seq = 120")
    conn.commit()
    conn.close()
    code, out = verify(db)
    assert code == 1, out
    assert "FAULT row 17: undecodable chat row" in out
    assert (f"FAULT snapshot {files[0].path.name}: the journal's row at its seq is not the one "
            "it was taken at") in out

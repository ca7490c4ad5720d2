"""The journal's files, on real hubd processes and real SQLite files: made
owner-only (they hold message bodies, token digests and webhook secrets) and
refused when others can read them (issue 30.7); a journal a newer hubd wrote
refused, events of kinds this hubd does not know reported, and a journal
that cannot be opened explained (issue 22.7)."""

from __future__ import annotations

import asyncio
import ctypes
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

from hubd.journal.store import JournalStore
from hubd.state import events as ev
from hubd.state.events import Event
from tests.support.procs import free_port, hubd_process
from tests.support.wsprobe import joined

NOBODY = 65534
PR_CAPBSET_DROP, CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH = 24, 1, 2  # linux/prctl.h, capability.h


def start_refused(db, **run) -> str:
    """Start hubd on `db`; it must refuse with exit code 2 and one line saying
    why: that line."""
    out = subprocess.run([sys.executable, "-m", "hubd", "--host", "127.0.0.1",
                          "--port", str(free_port()), "--db", str(db)],
                         capture_output=True, text=True, timeout=60, **run)
    assert out.returncode == 2, (out.returncode, out.stderr[-3000:])
    said = [line for line in out.stderr.splitlines() if "refusing to start" in line]
    assert len(said) == 1, out.stderr[-3000:]
    assert "Traceback" not in out.stderr and "unable to open database file" not in out.stderr
    return said[0]


def mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def journal_with(db: Path, *events: Event) -> None:
    store = JournalStore(db)
    try:
        store.set_meta("hub_id", "test-hub")
        store.append([event.row() for event in events])
    finally:
        store.close()


def chat(seq: int, text: str) -> Event:
    frame = {"type": "chat", "sender": "PROJ/bob", "target": "all", "payload": text,
             "timestamp": 1.0e9 + seq, "hub_id": "test-hub", "msg_id": seq, "seq": seq}
    return Event(seq, 1.0e9 + seq, ev.CHAT, frame, {"recipients": []})


# -- owner-only (30.7)

def test_the_hub_and_the_principal_command_make_the_journal_owner_only(tmp_path):
    hub = hubd_process(tmp_path / "hub")
    db = Path(hub.argv[hub.argv.index("--db") + 1])
    hub.start()
    try:
        async def one_chat():
            bob = await joined(hub.url, "PROJ/bob")
            await bob.chat("PROJ/bob", "all", "a body others must not read")
            await bob.recv_type("chat")
            await bob.close()
        asyncio.run(one_chat())
        for path in (db, Path(f"{db}-wal"), Path(f"{db}-shm")):
            assert mode(path) == 0o600, (path, oct(mode(path)))
    finally:
        hub.stop()
    # the CLI makes a new journal owner-only too, whatever the umask says
    made = tmp_path / "cli" / "hubd.db"
    made.parent.mkdir()
    out = subprocess.run([sys.executable, "-m", "hubd", "principal", "add", "alice",
                          "--seat", "PROJ/alice", "--db", str(made)],
                         capture_output=True, text=True, timeout=60, umask=0)
    assert out.returncode == 0, out.stderr
    assert mode(made) == 0o600


def test_a_journal_others_can_read_is_refused_with_the_fix(tmp_path):
    hub = hubd_process(tmp_path)
    db = Path(hub.argv[hub.argv.index("--db") + 1])
    hub.start()
    hub.kill()  # a crash leaves the -wal and -shm beside the journal
    wal = Path(f"{db}-wal")
    assert wal.exists()
    os.chmod(db, 0o644)
    os.chmod(wal, 0o640)
    said = start_refused(db)
    assert "accessible by other users" in said
    assert f"run: chmod 600 {db} {wal}" in said, said
    os.chmod(db, 0o600)
    os.chmod(wal, 0o600)
    hub.start()  # the one-line fix is all it takes
    hub.stop()


# -- what a journal says about itself (22.7)

# Opens a journal as a hub's writer does and says whether the schema library
# (sqlite-utils) was loaded to do it.
OPEN_JOURNAL = ("import sys; from hubd.journal.store import JournalStore; "
                "JournalStore(sys.argv[1]).close(); print('sqlite_utils' in sys.modules)")


def schema_library_loaded(db: Path) -> bool:
    out = subprocess.run([sys.executable, "-c", OPEN_JOURNAL, str(db)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-3000:]
    # the last line: an upgrade logs what it did before it (the hash chain's)
    return out.stdout.strip().splitlines()[-1] == "True"


def schema_of(db: Path) -> list:
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT type, name, sql FROM sqlite_master ORDER BY name").fetchall() \
            + conn.execute("SELECT key, value FROM meta ORDER BY key").fetchall()


def test_a_journal_in_this_hubds_schema_is_opened_without_the_schema_library(tmp_path):
    """Every start but a journal's first finds nothing to create: sqlite-utils
    (a tenth of a second or more of a start to import and load its plugins)
    makes a new journal and upgrades an old one, and is not loaded otherwise."""
    db = tmp_path / "hubd.db"
    assert schema_library_loaded(db)  # a new journal
    made = schema_of(db)
    assert not schema_library_loaded(db)
    assert schema_of(db) == made
    # a journal from before principals (its events table has no principal
    # column) is still upgraded, by sqlite-utils
    old = tmp_path / "old.db"
    with sqlite3.connect(old) as conn:
        conn.execute("CREATE TABLE events (seq INTEGER PRIMARY KEY, ts FLOAT NOT NULL, "
                     "kind TEXT NOT NULL, payload TEXT NOT NULL, route TEXT)")
        conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT)")
        conn.execute("INSERT INTO meta VALUES ('schema_version', '1')")
    os.chmod(old, 0o600)
    assert schema_library_loaded(old)
    with sqlite3.connect(old) as conn:
        assert "principal" in {row[1] for row in conn.execute("PRAGMA table_info(events)")}
    assert not schema_library_loaded(old)


def test_a_journal_from_a_newer_hubd_is_refused_naming_both_versions(tmp_path):
    db = tmp_path / "hubd.db"
    journal_with(db, chat(1, "hello"))
    conn = sqlite3.connect(db)
    with conn:
        conn.execute("UPDATE meta SET value = '3' WHERE key = 'schema_version'")
    conn.close()
    said = start_refused(db)
    assert "newer hubd" in said and "journal schema 3" in said and "reads schema 2" in said
    # the principal command refuses it alike, and changes nothing
    out = subprocess.run([sys.executable, "-m", "hubd", "principal", "list", "--db", str(db)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "journal schema 3" in out.stderr, out.stderr


def test_events_of_kinds_this_hubd_does_not_know_are_reported_not_skipped(tmp_path):
    db = tmp_path / "hubd.db"
    journal_with(db, chat(1, "before"),
                 Event(2, 1.0e9 + 2, "lease_from_the_future", {"task_id": "t-1"}),
                 Event(3, 1.0e9 + 3, "lease_from_the_future", {"task_id": "t-2"}),
                 chat(4, "after"))
    hub = hubd_process(tmp_path, db=db).start()
    try:
        health = hub.get_json("/health")
        assert health["status"] == "degraded"
        assert health["journal_unknown_events"] == 2
        assert health["journal_unknown_kinds"] == ["lease_from_the_future"]
        assert health["journal_corrupt_rows"] == 0
        assert health["reasons"] == [
            "journal: 2 event(s) of kinds this hubd does not know (lease_from_the_future); "
            "mutations are refused: run the hubd that wrote them"]
        said = [line for line in hub.log().splitlines() if "does not know" in line]
        assert len(said) == 1 and "lease_from_the_future" in said[0] and "first_seq=2" in said[0]

        async def reads_yes_writes_no():
            bob = await joined(hub.url, "PROJ/bob")
            await bob.send_json({"sender": "PROJ/bob", "type": "history_request",
                                 "target": "System"})
            history = (await bob.recv_type("history_snapshot"))["history"]
            assert [m["payload"] for m in history] == ["before", "after"]
            await bob.chat("PROJ/bob", "all", "new")
            refused = await bob.recv_type("error")
            assert "does not know" in refused["payload"], refused
            await bob.close()
        asyncio.run(reads_yes_writes_no())
    finally:
        hub.stop()


def test_a_journal_that_cannot_be_opened_is_explained(tmp_path):
    said = start_refused(tmp_path / "no-such-folder" / "hubd.db")
    assert f"its folder {tmp_path / 'no-such-folder'} does not exist" in said
    assert "mkdir -p" in said
    (tmp_path / "a-folder").mkdir()
    said = start_refused(tmp_path / "a-folder")
    assert "is a directory, not a file" in said and "a-folder/hubd.db" in said


def _without_dac_override() -> None:
    """In the child before exec: drop the capabilities that let root read and
    write any file (from the bounding set, so the exec'd hub has neither)."""
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    for capability in (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH):
        if prctl(PR_CAPBSET_DROP, capability, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def test_a_journal_hubd_may_not_read_and_write_is_explained(tmp_path):
    """File permissions bind root only without CAP_DAC_OVERRIDE: as root the
    hub runs without it, on files another user owns; as anyone else the
    files are simply made unreadable."""
    folder = tmp_path / "journals"
    folder.mkdir()
    db = folder / "hubd.db"
    journal_with(db, chat(1, "hello"))
    if os.geteuid() == 0:
        run = {"preexec_fn": _without_dac_override}
        os.chown(db, NOBODY, NOBODY)  # 0600: nobody's alone
    else:
        run = {}
        os.chmod(db, 0)
    said = start_refused(db, **run)
    assert f"no permission to read and write it as uid {os.geteuid()}" in said, said
    # nor may it make a journal where it cannot write
    if os.geteuid() == 0:
        os.chown(folder, NOBODY, NOBODY)
    else:
        os.chmod(folder, 0o555)
    said = start_refused(folder / "new.db", **run)
    assert "may not create files in" in said, said
    os.chmod(folder, 0o755)

"""The journal backup and restore of docs/operations.md, against a real hub:
an online backup (compose/bin/hubd-journal-backup, SQLite's backup API) taken
while chats are being committed is consistent, and a hub started on the
restored copy comes up with the same hub id at the backup's sequence."""

from __future__ import annotations

import asyncio
import json
import shutil
import sqlite3
import subprocess
import sys

from tests.support.compose import COMPOSE_DIR
from tests.support.procs import hubd_process
from tests.support.wsprobe import WsProbe

BACKUP = COMPOSE_DIR / "bin" / "hubd-journal-backup"


def journal_rows(path, up_to=None):
    db = sqlite3.connect(path)
    try:
        return db.execute("SELECT seq, ts, kind, payload, route FROM events WHERE seq <= ? "
                          "ORDER BY seq", (up_to if up_to is not None else 1 << 62,)).fetchall()
    finally:
        db.close()


def test_online_backup_while_chats_commit_then_restore(tmp_path):
    hub = hubd_process(tmp_path / "live", hub_id="site", db=tmp_path / "live" / "hubd.db")
    hub.start()
    live_db = tmp_path / "live" / "hubd.db"
    backup = tmp_path / "backups" / "hubd-backup.db"
    backup.parent.mkdir()
    try:
        async def traffic_with_backup_in_the_middle():
            alice = await WsProbe.open(hub.url)
            await alice.recv_type("welcome")
            await alice.register("PROJ/alice")
            backup_done = asyncio.Event()
            sent_after = 0

            async def flow():
                # chats keep committing before, during and after the backup
                nonlocal sent_after
                i = 0
                while sent_after < 100:
                    await alice.chat("PROJ/alice", "PROJ/bob", f"chat {i}", client_msg_id=f"c{i}")
                    i += 1
                    if backup_done.is_set():
                        sent_after += 1
                    await asyncio.sleep(0.002)
                await alice.send_json({"sender": "PROJ/alice", "type": "who_request",
                                       "target": "System"})
                await alice.recv_type("who_snapshot")  # every chat above is committed

            flowing = asyncio.create_task(flow())
            while (await asyncio.to_thread(hub.get_json, "/health"))["journal_seq"] < 150:
                await asyncio.sleep(0.05)
            before = (await asyncio.to_thread(hub.get_json, "/health"))["journal_seq"]
            done = await asyncio.to_thread(
                subprocess.run, [sys.executable, str(BACKUP), str(live_db), str(backup)],
                capture_output=True, text=True, timeout=60)
            backup_done.set()
            await flowing
            await alice.close()
            return before, done

        before, done = asyncio.run(traffic_with_backup_in_the_middle())
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        final_seq = hub.get_json("/health")["journal_seq"]
        assert report["hub_id"] == "site"
        # the copy was taken mid-stream: after the chats committed before it
        # started, before those that committed after it
        assert before <= report["last_seq"] < final_seq, (before, report, final_seq)
        # and it is consistent: exactly the live journal's first last_seq events
        copied = journal_rows(backup)
        assert copied == journal_rows(live_db, report["last_seq"])
        assert [row[0] for row in copied] == list(range(1, report["last_seq"] + 1))
    finally:
        hub.stop()

    # a second backup to the same name is refused (never overwrites)
    again = subprocess.run([sys.executable, str(BACKUP), str(tmp_path / "live" / "hubd.db"),
                            str(backup)], capture_output=True, text=True)
    assert again.returncode != 0 and "exists" in again.stderr

    # the copy holds what the journal holds: owner-only like it
    assert backup.stat().st_mode & 0o777 == 0o600
    # restore: the copy becomes the journal (no -wal/-shm beside it), the hub starts on it
    restored = tmp_path / "restored"
    restored.mkdir()
    shutil.copy(backup, restored / "hubd.db")  # as cp does, with the copy's mode
    assert not (restored / "hubd.db-wal").exists()
    hub2 = hubd_process(restored, hub_id="site", db=restored / "hubd.db")
    hub2.start()
    try:
        health = hub2.get_json("/health")
        assert health["status"] == "ok" and health["hub_id"] == "site"
        assert health["journal_seq"] == report["last_seq"]
        assert health["journal_corrupt_rows"] == 0
    finally:
        hub2.stop()

"""The journal backup and restore of docs/operations.md, against a real hub:
an online backup (compose/bin/hubd-journal-backup, SQLite's backup API) taken
while chats are being committed is consistent, and a hub started on the
restored copy comes up with the same hub id at the backup's sequence."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys

from tests.support.compose import COMPOSE_DIR
from tests.support.procs import hubd_process
from tests.support.wsprobe import WsProbe

BACKUP = COMPOSE_DIR / "bin" / "hubd-journal-backup"


def test_online_backup_while_chats_commit_then_restore(tmp_path):
    hub = hubd_process(tmp_path / "live", hub_id="site", db=tmp_path / "live" / "hubd.db")
    hub.start()
    backup = tmp_path / "backups" / "hubd-backup.db"
    backup.parent.mkdir()
    try:
        async def traffic_with_backup_in_the_middle():
            alice = await WsProbe.open(hub.url)
            await alice.recv_type("welcome")
            await alice.register("PROJ/alice")
            result = None
            for i in range(300):
                await alice.chat("PROJ/alice", "PROJ/bob", f"chat {i}", client_msg_id=f"c{i}")
                if i == 150:
                    result = asyncio.create_task(asyncio.to_thread(
                        subprocess.run, [sys.executable, str(BACKUP), str(hub.argv[hub.argv.index(
                            "--db") + 1]), str(backup)], capture_output=True, text=True,
                        timeout=60))
            done = await result
            await alice.close()
            return done

        done = asyncio.run(traffic_with_backup_in_the_middle())
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        assert report["hub_id"] == "site" and report["last_seq"] > 0
        live_seq = hub.get_json("/health")["journal_seq"]
        assert live_seq >= report["last_seq"]
    finally:
        hub.stop()

    # a second backup to the same name is refused (never overwrites)
    again = subprocess.run([sys.executable, str(BACKUP), str(tmp_path / "live" / "hubd.db"),
                            str(backup)], capture_output=True, text=True)
    assert again.returncode != 0 and "exists" in again.stderr

    # restore: the copy becomes the journal (no -wal/-shm beside it), the hub starts on it
    restored = tmp_path / "restored"
    restored.mkdir()
    shutil.copyfile(backup, restored / "hubd.db")
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

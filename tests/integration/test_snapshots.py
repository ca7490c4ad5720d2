"""Snapshots on real hub processes and real SQLite files (docs/journal.md,
"Snapshots"): a hub takes them in a worker process as its journal grows,
keeps the newest few, and a restart starts from the newest one it may use
and replays only the rows after it, to the same state a replay from the
start gives; a snapshot cut short by a crash, damaged, or written by
another hubd is passed over with a log line, for the one before it."""

from __future__ import annotations

import asyncio
import re
import shutil
import sqlite3
import time
from pathlib import Path

import pytest

from hubd.journal import snapshots
from hubd.timing import Timing
from tests.support.procs import HubProcess, hubd_process
from tests.support.wsprobe import joined

EVERY = ("--snapshot-every", "10")
# the snapshotter looks every 50 ms, and may start a worker as soon as the last ended
FAST = Timing(snapshot_check=0.05, snapshot_interval=0.01)
NEVER = ("--snapshot-every", "0")


def snapshot_files(db: Path) -> list[snapshots.SnapshotFile]:
    return snapshots.listed(snapshots.snapshot_dir(db))


async def chat(url: str, first: int, count: int) -> None:
    """p/a sends `count` directed chats to p/b (every third asking a
    receipt), each read by p/b: all of them are committed."""
    a = await joined(url, "p/a", mailbox=True)
    b = await joined(url, "p/b", mailbox=True)
    try:
        for i in range(first, first + count):
            await a.chat("p/a", "p/b", f"m{i}", client_msg_id=f"c{i}",
                         receipt_requested=i % 3 == 0)
            await b.recv_type("chat", payload=f"m{i}", timeout=10)
    finally:
        await a.close()
        await b.close()


async def observe(url: str) -> dict:
    """What a client sees of the hub's projection: the history and the state
    snapshot (without the observer's own presence and the clock)."""
    probe = await joined(url, "q/observer")
    try:
        await probe.send_json({"sender": "q/observer", "type": "history_request",
                               "target": "System"})
        history = (await probe.recv_type("history_snapshot"))["history"]
        await probe.send_json({"sender": "q/observer", "type": "state_request",
                               "target": "System"})
        state = (await probe.recv_type("state_snapshot"))["snapshot"]
    finally:
        await probe.close()
    state.pop("generated_at")
    state["agents"] = [a for a in state["agents"] if a["agent"] != "q/observer"]
    return {"history": history, "state": state}


def health(hub: HubProcess) -> dict:
    found = hub.get_json("/health")
    found.pop("uptime_seconds")
    return found


def started_from(hub: HubProcess) -> tuple[int, int]:
    """(the snapshot's seq, events replayed after it) the hub's log names."""
    found = re.search(r"journal replayed .*?applied=(\d+) .*?from_snapshot=(\d+)", hub.log())
    assert found, hub.log()[-2000:]
    return int(found.group(2)), int(found.group(1))


def wait_for(predicate, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def written(hub: HubProcess) -> float:
    return hub.metric('hubd_snapshots_total{outcome="written"}')


def journal_with_snapshots(folder: Path, rounds: int, *args: str) -> Path:
    """A journal of `rounds` rounds of 10 chats, its hub writing a snapshot
    of each round (of more than --snapshot-every events) before the next one
    starts; its db path."""
    hub = hubd_process(folder, *EVERY, *args, timing=FAST).start()
    try:
        for round_ in range(rounds):
            asyncio.run(chat(hub.url, 10 * round_, 10))
            seq = hub.get_json("/health")["journal_seq"]
            wait_for(lambda: written(hub) == round_ + 1, f"snapshot {round_ + 1}")
            assert snapshot_files(hub_db(folder))[0].seq >= seq
        assert "snapshot not written" not in hub.log()
    finally:
        assert hub.stop() == 0
    return hub_db(folder)


def last_seq(db: Path) -> int:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return conn.execute("SELECT MAX(seq) FROM events").fetchone()[0]
    finally:
        conn.close()


def hub_db(folder: Path) -> Path:
    return folder / "hubd.db"


def restarted(folder: Path, db: Path, *args: str, env: dict | None = None) -> HubProcess:
    return hubd_process(folder, *NEVER, *args, db=db, env=env).start()


def restart_sees_every_chat(tmp_path: Path, db: Path, snapshot: int, chats: int,
                            *logged: str) -> None:
    """A restart starts from the snapshot at seq `snapshot` (and the rows
    after it), its log says each of `logged`, it holds the `chats` chats, and
    it sees and says what a hub on a copy of the journal without its
    snapshots does."""
    tail = last_seq(db) - snapshot
    hub = restarted(db.parent, db)
    try:
        assert started_from(hub) == (snapshot, tail)
        for line in logged:
            assert line in hub.log()
        seen = asyncio.run(observe(hub.url))
        assert [c["payload"] for c in seen["history"]] == [f"m{i}" for i in range(chats)]
        said = health(hub)
        assert said["status"] == "ok"
    finally:
        assert hub.stop() == 0
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(db, bare / "hubd.db")
    hub = restarted(bare, bare / "hubd.db")
    try:
        assert started_from(hub) == (0, last_seq(db))
        assert asyncio.run(observe(hub.url)) == seen
        assert health(hub) == said
    finally:
        hub.stop()


def test_a_restart_starts_from_the_newest_snapshot_with_the_state_of_a_full_replay(tmp_path):
    db = journal_with_snapshots(tmp_path / "a", 4, "--snapshot-keep", "2")
    assert len(snapshot_files(db)) == 2  # the newest two of four
    newest = snapshot_files(db)[0].seq
    hub = restarted(tmp_path / "a", db)
    try:
        assert started_from(hub) == (newest, last_seq(db) - newest)
        asyncio.run(chat(hub.url, 40, 5))  # a longer tail after the newest snapshot
    finally:
        assert hub.stop() == 0
    restart_sees_every_chat(tmp_path, db, newest, 45)


def test_sigkill_during_a_snapshot_write_leaves_the_previous_snapshot_usable(tmp_path):
    db = journal_with_snapshots(tmp_path / "a", 2)
    hub = restarted(tmp_path / "a", db)  # 20 more chats, no snapshot of them
    try:
        asyncio.run(chat(hub.url, 20, 20))
    finally:
        assert hub.stop() == 0
    before = snapshot_files(db)[0]
    before_bytes = before.path.read_bytes()
    # due at once: its worker SIGKILLs the hub and itself halfway through the write
    hub = hubd_process(tmp_path / "a", *EVERY, db=db, timing=FAST,
                       env={"HUBD_SNAPSHOT_FAULT": "kill-midway"}).start()
    hub.proc.wait(timeout=60)
    assert hub.proc.returncode == -9, hub.log()[-2000:]
    assert "fault injected: killing the hub mid-snapshot" in hub.log()
    directory = snapshots.snapshot_dir(db)
    leftovers = [p for p in directory.iterdir() if p.name.startswith(snapshots.TEMP_PREFIX)]
    assert len(leftovers) == 1 and 0 < leftovers[0].stat().st_size
    assert snapshot_files(db)[0] == before and before.path.read_bytes() == before_bytes

    restart_sees_every_chat(tmp_path, db, before.seq, 40)
    assert not leftovers[0].exists()  # the dead writer's file was cleared at start


def damage(file: snapshots.SnapshotFile) -> str:
    data = bytearray(file.path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    file.path.write_bytes(bytes(data))
    return "checksum mismatch"


def from_another_version(file: snapshots.SnapshotFile) -> str:
    header, body = snapshots.decode(file.path.read_bytes())
    header.update(hubd="0.0.1", fingerprint="0" * 64)
    file.path.write_bytes(snapshots.encode(header, body))
    return "written by another hubd version or configuration"


@pytest.mark.parametrize("spoil", [damage, from_another_version])
def test_a_snapshot_that_cannot_be_used_is_skipped_for_the_one_before(tmp_path, spoil):
    db = journal_with_snapshots(tmp_path / "a", 2)
    newest, previous = snapshot_files(db)[:2]
    reason = spoil(newest)
    restart_sees_every_chat(tmp_path, db, previous.seq, 20, "snapshot skipped", reason,
                            f"seq={newest.seq}")

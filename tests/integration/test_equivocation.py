"""Equivocation with real hub processes over mTLS: east watches west's event
log; west's journal is changed under an identity east already accepted.

- test_rewritten_served_event_quarantines_the_peer: a real tamper (west
  stopped, `UPDATE events SET payload=...` on an already-served row, west
  started again) must be caught by east's next poll: one digest-only
  `multihub_equivocation` row, the prior observed view kept (a claim west
  journals after the tamper, in the same batch, must not show west asserting
  PROJ), west no longer polled (quarantined in /health), still quarantined
  after a restart, and lifted only by `hubd multihub recover` (refused for an
  unknown peer), after which east polls west again from zero.
- test_journal_restored_from_older_backup_quarantines_the_peer: the case
  docs/operations.md promises ("Peers that watch it detect that as
  equivocation and quarantine it") -- west restored from a backup and writing
  new events under sequence numbers east has already seen.
- test_journaled_quarantine_survives_restart_and_recovery_repolls_from_zero:
  what works today, from a quarantine row written (hub stopped) in the exact
  shape the watcher would journal: not polled across a restart, recovery
  refused for an unknown peer, accepted for west, then polled from zero.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import sqlite3
import subprocess
import sys
import time

import pytest

from federation.journal_access import append_operator_row
from federation.log_model import Equivocation
from federation.quarantine import MULTIHUB_EQUIVOCATION, equivocation_payload
from hubd.journal import chain
from hubd.timing import Timing
from tests.support.federation import make_pki, site_flags, write_serving_policy
from tests.support.procs import REPO, free_port, hubd_process
from tests.support.wsprobe import WsProbe
from tests.support.waiting import wait_for


MARKER = "TAMPERED-5d1e0c-rewritten-history"
# east polls west this often (production: every 30 s; the flag's floor is 1 s)
WATCH_INTERVAL = 0.2


def journal(hub_dir):
    """Every row of a hub's journal, read-only: [(seq, ts, kind, payload text)]."""
    db = sqlite3.connect(f"file:{hub_dir / 'hubd.db'}?mode=ro", uri=True)
    try:
        return db.execute("SELECT seq, ts, kind, payload FROM events ORDER BY seq").fetchall()
    finally:
        db.close()


def rows(hub_dir, kind):
    return [json.loads(p) for (_s, _t, k, p) in journal(hub_dir) if k == kind]


def max_seq(hub_dir):
    rows_ = journal(hub_dir)
    return rows_[-1][0] if rows_ else 0


async def agent(url, name):
    probe = await WsProbe.open(url)
    await probe.register(name)
    await probe.recv_type("presence_update", agent=name, timeout=10)
    return probe


async def claim(probe, name, task_id, paths, ttl=120):
    await probe.send_json({"sender": name, "target": "System", "type": "claim",
                           "payload": task_id, "task_id": task_id, "worktree": "/repo",
                           "paths": paths, "ttl_seconds": ttl})
    return await probe.recv(lambda f: f.get("type") in ("claim_granted", "claim_denied")
                            and f.get("task_id") == task_id
                            and (f.get("type") == "claim_denied" or f.get("owner") == name),
                            timeout=15)


def recover(hub_dir, peer):
    return subprocess.run(
        [sys.executable, "-m", "hubd", "multihub", "recover", "--db",
         str(hub_dir / "hubd.db"), "--peer-id", peer, "--operator", "incident-commander",
         "--reason", "west's checkpoint verified out of band", "--new-log-generation",
         "west-generation-2", "--json"],
        capture_output=True, text=True, timeout=60, cwd=REPO)


@contextlib.contextmanager
def east_watching_west(tmp_path, flags: tuple[str, ...] = ()):
    """make(hub) for east (watching west every WATCH_INTERVAL) and west (no
    owner map: it grants PROJ claims itself, so a live one is an assertion),
    each over mTLS with `flags` too; every hub made is stopped at the end."""
    pki = make_pki(tmp_path / "pki", ["east", "west"])
    ports = {hub: free_port() for hub in ("east", "west")}
    url = {hub: f"wss://127.0.0.1:{port}/" for hub, port in ports.items()}
    procs = {}

    def make(hub, port=None):
        """`port`: another than the one east watches (west, out of east's sight)."""
        grants = {"west": ["PROJ"]} if hub == "east" else {"east": ["PROJ"]}
        policy = write_serving_policy(tmp_path / f"{hub}-policy", pki, grants)
        site = site_flags(pki, hub, policy)
        extra = list(flags)
        if hub == "east":
            extra += ["--namespace-owner", "PROJ=east", "--multihub-watch",
                      f"west={url['west']}", "--multihub-watch-pin",
                      f"west={pki.server_pin('west')}"]
        proc = hubd_process(tmp_path / hub, *site.serve, *site.connect, *extra, hub_id=hub,
                            port=port or ports[hub], scheme="wss",
                            timing=Timing(watch_interval=WATCH_INTERVAL))
        procs[hub] = proc
        return proc

    try:
        yield make, url
    finally:
        for proc in procs.values():
            proc.stop()


@pytest.fixture
def pair(tmp_path):
    with east_watching_west(tmp_path) as made:
        yield made


def watch(east):
    return east.get_json("/health")["multihub"]["watches"]["west"]


def caught_up(east, west_dir):
    """East's cursor on west equals west's last seq (west idle)."""
    target = max_seq(west_dir)
    status = watch(east)
    return status["cursor"] == target and status["last_success"] is not None and target > 0


async def west_history(url):
    """A little of everything east folds or skips: chats, a claim and its release."""
    wendy = await agent(url, "PROJ/wendy")
    for i in range(3):
        await wendy.chat("PROJ/wendy", "PROJ/wendy", f"status report {i}: all green")
    granted = await claim(wendy, "PROJ/wendy", "w-1", ["src"])
    assert granted["type"] == "claim_granted"
    await wendy.send_json({"sender": "PROJ/wendy", "type": "release", "task_id": "w-1",
                           "epoch": granted["epoch"]})
    await wendy.recv_type("release_granted", timeout=10)
    await wendy.close()


def tamper(west_dir, seq):
    """Rewrite one row's payload in place (the hub is stopped), and its hash
    chain from there on, as a new generation of the history would be (a row
    changed under its link is refused for good: test_chain_federation.py)."""
    db = sqlite3.connect(west_dir / "hubd.db")
    try:
        (payload,) = db.execute("SELECT payload FROM events WHERE seq = ?", (seq,)).fetchone()
        value = json.loads(payload)
        value["payload"] = MARKER
        with db:
            changed = db.execute("UPDATE events SET payload = ? WHERE seq = ?",
                                 (json.dumps(value), seq)).rowcount
            assert changed == 1
            relink(db)
    finally:
        db.close()


def relink(db):
    linked, _ = chain.chained(chain.GENESIS, db.execute(
        "SELECT seq, ts, kind, payload, route, principal FROM events ORDER BY seq").fetchall())
    db.executemany("UPDATE events SET chain = ? WHERE seq = ?",
                   [(row[6], row[0]) for row in linked])


async def rogue_claim(url, task_id):
    wendy = await agent(url, "PROJ/wendy")
    granted = await claim(wendy, "PROJ/wendy", task_id, ["docs"])
    await wendy.close()
    assert granted["type"] == "claim_granted"  # west has no owner map: a local grant
    return granted


def assert_quarantined_and_unchanged(east, east_dir, cursor_before, partitions_before=()):
    """`partitions_before`: the partition rows east had journaled when it
    caught up (a poll that lands while west_history's claim is live sees a
    contest and journals one, healed by the release; nothing after may)."""
    status = watch(east)
    assert status["quarantined"] is True
    assert status["cursor"] == cursor_before  # the refused batch published nothing
    health = east.get_json("/health")["multihub"]
    assert health["quarantined"] == ["west"]
    assert health["partitioned"] == []  # west's post-tamper claim was never folded
    assert rows(east_dir, "multihub_partition") == list(partitions_before)
    polls = status["polls"]
    time.sleep(3 * WATCH_INTERVAL)  # three polls, were east still polling west
    assert watch(east)["polls"] == polls, "east kept polling a quarantined peer"


def test_rewritten_served_event_quarantines_the_peer(tmp_path, pair):
    make, url = pair
    east_dir, west_dir = tmp_path / "east", tmp_path / "west"
    west = make("west").start()
    east = make("east").start()
    asyncio.run(west_history(url["west"]))
    wait_for(lambda: caught_up(east, west_dir), what="east caught up with west")
    cursor = watch(east)["cursor"]
    assert east.get_json("/health")["multihub"]["partitioned"] == []
    partitions = rows(east_dir, "multihub_partition")

    # west's operator rewrites a chat east has already accepted
    west.stop()
    chats = [seq for seq, _ts, kind, _p in journal(west_dir) if kind == "chat"]
    served = max(s for s in chats if s <= cursor)
    tamper(west_dir, served)
    west.start()
    # ... and west grants a PROJ claim: it lands in the batch after the tamper
    asyncio.run(rogue_claim(url["west"], "w-2"))

    found = wait_for(lambda: rows(east_dir, MULTIHUB_EQUIVOCATION), timeout=10,
                     what="east journaled multihub_equivocation")
    assert len(found) == 1
    row = found[0]
    assert row["peer_id"] == "west" and row["seq"] == served
    assert row["observer_id"] == "east" and row["status"] == "quarantined"
    assert row["accepted_fingerprint"] != row["conflicting_fingerprint"]
    assert_quarantined_and_unchanged(east, east_dir, cursor, partitions)
    assert len(rows(east_dir, MULTIHUB_EQUIVOCATION)) == 1
    # digests only: the rewritten content never reaches east's journal
    assert not any(MARKER in payload for *_x, payload in journal(east_dir))

    # a restart does not lift it
    east.stop()
    east.start()
    assert watch(east)["quarantined"] is True
    assert_quarantined_and_unchanged(east, east_dir, 0, partitions)
    east.stop()

    refused = recover(east_dir, "south")
    assert refused.returncode == 2 and "not quarantined" in refused.stderr
    accepted = recover(east_dir, "west")
    assert accepted.returncode == 0, accepted.stderr
    assert json.loads(accepted.stdout)["payload"]["new_log_generation"] == "west-generation-2"
    assert not any(MARKER in payload for *_x, payload in journal(east_dir))

    east.start()
    # polled again from zero: west's whole (new-generation) log, and with it
    # the live PROJ claim west granted -- now a contest east journals
    wait_for(lambda: caught_up(east, west_dir), what="east re-read west from zero")
    assert watch(east)["quarantined"] is False
    partition = wait_for(lambda: rows(east_dir, "multihub_partition"), timeout=10,
                         what="the re-read shows west asserting PROJ")
    assert partition[0]["contesting_hubs"] == ["west"]
    assert len(rows(east_dir, MULTIHUB_EQUIVOCATION)) == 1


def test_journal_restored_from_older_backup_quarantines_the_peer(tmp_path, pair):
    make, url = pair
    east_dir, west_dir = tmp_path / "east", tmp_path / "west"
    west = make("west").start()
    east = make("east").start()

    async def chats(prefix, n):
        wendy = await agent(url["west"], "PROJ/wendy")
        for i in range(n):
            await wendy.chat("PROJ/wendy", "PROJ/wendy", f"{prefix} {i}")
        for i in range(n):  # journaled and routed back: nothing left in flight
            await wendy.recv(lambda f: f.get("type") == "chat"
                             and f.get("payload") == f"{prefix} {i}", timeout=10)
        await wendy.close()

    asyncio.run(chats("before the backup", 3))
    wait_for(lambda: caught_up(east, west_dir), what="east caught up with west")
    backup = tmp_path / "west-backup.db"
    src, dst = sqlite3.connect(west_dir / "hubd.db"), sqlite3.connect(backup)
    src.backup(dst)
    src.close()
    dst.close()
    asyncio.run(chats("after the backup", 10))
    wait_for(lambda: caught_up(east, west_dir), what="east caught up with west")
    cursor = watch(east)["cursor"]

    west.stop()
    for suffix in ("", "-wal", "-shm"):
        (west_dir / f"hubd.db{suffix}").unlink(missing_ok=True)
    shutil.copyfile(backup, west_dir / "hubd.db")
    (west_dir / "hubd.db").chmod(0o600)  # a restored journal is owner-only, as hubd made it
    west.start()
    # new history under sequence numbers east already accepted, and past them
    asyncio.run(chats("a different history", 15))
    assert max_seq(west_dir) > cursor
    found = wait_for(lambda: rows(east_dir, MULTIHUB_EQUIVOCATION), timeout=10,
                     what="east journaled multihub_equivocation")
    assert len(found) == 1 and found[0]["peer_id"] == "west"
    assert_quarantined_and_unchanged(east, east_dir, cursor)


def test_journaled_quarantine_survives_restart_and_recovery_repolls_from_zero(tmp_path, pair):
    make, url = pair
    east_dir, west_dir = tmp_path / "east", tmp_path / "west"
    make("west").start()
    east = make("east").start()
    asyncio.run(west_history(url["west"]))
    wait_for(lambda: caught_up(east, west_dir), what="east caught up with west")
    partitions = rows(east_dir, "multihub_partition")
    east.stop()
    # the row the watcher journals on equivocation, written while east is stopped
    error = Equivocation("west", 2, "a" * 64, "b" * 64)
    append_operator_row(east_dir / "hubd.db", MULTIHUB_EQUIVOCATION,
                        lambda _rows: equivocation_payload(error, "east", time.time()),
                        reads=(MULTIHUB_EQUIVOCATION,))
    # west grants a PROJ claim east would see as a contest -- if it polled west
    asyncio.run(rogue_claim(url["west"], "w-2"))

    east.start()
    status = watch(east)
    assert status["quarantined"] is True and status["polls"] == 0
    assert_quarantined_and_unchanged(east, east_dir, 0, partitions)
    assert watch(east)["polls"] == 0
    # a second restart: still quarantined
    east.stop()
    east.start()
    assert_quarantined_and_unchanged(east, east_dir, 0, partitions)

    running = recover(east_dir, "west")
    assert running.returncode == 2 and "stop the hub first" in running.stderr
    east.stop()
    refused = recover(east_dir, "south")
    assert refused.returncode == 2 and "not quarantined" in refused.stderr
    accepted = recover(east_dir, "west")
    assert accepted.returncode == 0, accepted.stderr
    again = recover(east_dir, "west")
    assert again.returncode == 2 and "already recovered" in again.stderr

    east.start()
    wait_for(lambda: caught_up(east, west_dir), what="east polled west from zero")
    assert watch(east)["quarantined"] is False
    assert east.get_json("/health")["multihub"]["quarantined"] == []
    partition = wait_for(lambda: rows(east_dir, "multihub_partition"), timeout=10,
                         what="west's live PROJ claim seen after recovery")
    assert partition[0]["contesting_hubs"] == ["west"]

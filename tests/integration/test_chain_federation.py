"""A peer's hash chain and signed checkpoints, checked by a follower (issue 29
item 2), with real hub processes over mTLS: east watches west's event log.

- a row of west's changed on disk under its link is refused at east's first
  pull of it (never published), loudly: a log line, the quarantine metric,
  a journaled quarantine naming the seq; `hubd journal verify` on west's
  journal names the same seq;
- west restored from a backup signs a second, different head for a seq it
  had signed before: east keeps both signed checkpoints in its journal as
  the proof, and `hubd multihub status` (and --json) shows them; anyone can
  check the two signatures with west's key.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import sqlite3
import subprocess
import sys

import pytest

from federation.quarantine import MULTIHUB_EQUIVOCATION
from hubd.journal import chain_checkpoints
from tests.integration.test_equivocation import (agent, caught_up, east_watching_west, journal,
                                                 max_seq, rows, watch)
from tests.integration.test_journal_chain import change_payload
from tests.integration.test_journal_verify import verify
from tests.support.procs import REPO, free_port
from tests.support.waiting import wait_for

EVERY = 4  # west's --checkpoint-every


@pytest.fixture
def pair(tmp_path):
    with east_watching_west(tmp_path, ("--checkpoint-every", str(EVERY))) as made:
        yield made


async def chats(url, prefix, n):
    wendy = await agent(url, "PROJ/wendy")
    for i in range(n):
        await wendy.chat("PROJ/wendy", "PROJ/wendy", f"{prefix} {i}")
    for i in range(n):  # journaled and routed back: nothing left in flight
        await wendy.recv(lambda f: f.get("type") == "chat" and f.get("payload") == f"{prefix} {i}",
                         timeout=10)
    await wendy.close()


def status(east_dir, *args):
    return subprocess.run([sys.executable, "-m", "hubd", "multihub", "status", "--journal",
                           str(east_dir / "hubd.db"), *args],
                          capture_output=True, text=True, timeout=60, cwd=REPO)


def test_a_row_changed_under_its_link_is_refused_by_the_follower(tmp_path, pair):
    make, url = pair
    east_dir, west_dir = tmp_path / "east", tmp_path / "west"
    west = make("west").start()
    asyncio.run(chats(url["west"], "status report", 6))
    west.stop()
    seq = [s for s, _t, kind, _p in journal(west_dir) if kind == "chat"][2]
    change_payload(west_dir / "hubd.db", seq)
    code, out = verify(west_dir / "hubd.db", "--json")
    assert code == 1 and json.loads(out)["chain"]["first_bad_seq"] == seq, out

    west.start()
    east = make("east").start()
    found = wait_for(lambda: rows(east_dir, MULTIHUB_EQUIVOCATION), timeout=20,
                     what="east journaled the quarantine")
    assert len(found) == 1
    row = found[0]
    assert (row["peer_id"], row["seq"], row["reason"]) == ("west", seq, "chain_broken")
    assert "proof" not in row  # a broken link proves nothing signed; it is refused
    status_now = watch(east)
    assert status_now["quarantined"] is True
    assert status_now["cursor"] == 0  # the page was refused whole: nothing published
    assert east.get_json("/health")["multihub"]["quarantined"] == ["west"]
    assert east.metric('hubd_watch_quarantines_total{peer="west",reason="chain_broken"}') == 1
    assert "peer equivocated; quarantined" in east.log() and "hash chain broken" in east.log()


def test_two_signed_heads_for_one_seq_are_kept_as_proof(tmp_path, pair):
    make, url = pair
    east_dir, west_dir = tmp_path / "east", tmp_path / "west"
    west = make("west").start()
    asyncio.run(chats(url["west"], "before the backup", 1))
    west.stop()
    backup = tmp_path / "west-backup.db"
    src, dst = sqlite3.connect(west_dir / "hubd.db"), sqlite3.connect(backup)
    src.backup(dst)
    src.close()
    dst.close()
    west.start()
    east = make("east").start()
    asyncio.run(chats(url["west"], "after the backup", 2 * EVERY))
    wait_for(lambda: caught_up(east, west_dir), what="east caught up with west")
    signed = chain_checkpoints.between(sqlite3.connect(west_dir / "hubd.db"), 0, 1 << 40)
    assert len(signed) >= 2
    cursor = watch(east)["cursor"]

    west.stop()  # restored from the backup, with its key: it signs a new history
    for suffix in ("", "-wal", "-shm"):
        (west_dir / f"hubd.db{suffix}").unlink(missing_ok=True)
    shutil.copyfile(backup, west_dir / "hubd.db")
    (west_dir / "hubd.db").chmod(0o600)
    # the new history written out of east's sight, then served whole: east's
    # first pull of it holds west's new signed heads (polled while half-written,
    # it could meet a changed event before any new checkpoint: conflicting_offer)
    scribe = make("west", port=free_port()).start()
    asyncio.run(chats(scribe.url, "a different history", 2 * EVERY))
    scribe.stop()
    make("west").start()
    assert max_seq(west_dir) >= cursor

    found = wait_for(lambda: rows(east_dir, MULTIHUB_EQUIVOCATION), timeout=20,
                     what="east journaled the equivocation")
    assert len(found) == 1 and found[0]["reason"] == "checkpoint_equivocation"
    first, second = (chain_checkpoints.from_json(value) for value in found[0]["proof"])
    # both hold for west's key, for one seq, with two heads: they cannot both be true
    assert first.hub_id == second.hub_id == "west" and first.seq == second.seq
    assert first.key == second.key and first.head != second.head
    assert chain_checkpoints.conflict(first, second)
    assert watch(east)["quarantined"] is True and watch(east)["cursor"] == cursor

    east.stop()  # the proof is in east's journal: status reads it there
    shown = status(east_dir, "--json")
    assert shown.returncode == 0, shown.stderr
    quarantined = json.loads(shown.stdout)["quarantined"]["west"]
    assert quarantined["reason"] == "checkpoint_equivocation"
    assert quarantined["proof"] == found[0]["proof"]
    text = status(east_dir)
    assert text.returncode == 0, text.stderr
    assert f"west: signed two heads at seq {first.seq}" in text.stdout
    assert f"proof: hub west seq {first.seq} head {first.head}" in text.stdout
    assert f"proof: hub west seq {second.seq} head {second.head}" in text.stdout

"""`hubd multihub observe|status|recover` on real journals: two live hubs as in
the seed's walkthrough, a reference-schema journal, and the recovery ceremony
(refused while the hub runs, refused for unknown or recovered peers)."""

from __future__ import annotations

import hashlib
import json
import re
import sqlite3

import pytest

from federation.log_model import event_fingerprint
from hubd.cli import main as hubd_main
from hubd.journal.store import JournalReader, JournalStore
from hubd.state.events import Event
from tests.integration.test_claims import claim, joined, send, settled
from tests.support.inproc import running_hub

A, B = "a" * 64, "b" * 64


def run(capsys, *argv):
    capsys.readouterr()  # drop what a hub running in this test logged
    code = hubd_main(["multihub", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def replay(path):
    reader = JournalReader(path)
    try:
        return list(reader.replay())
    finally:
        reader.close()


def file_state(path):
    return {p.name: p.read_bytes() for p in path.parent.iterdir()
            if p.name.startswith(path.name) and not p.name.endswith("-shm")}


async def test_observe_two_live_hubs(tmp_path, capsys):
    """The seed's walkthrough: declare a task on each hub, claim on east, and
    read each hub's journal from the other side while both run."""
    (tmp_path / "east").mkdir()
    (tmp_path / "west").mkdir()
    async with running_hub(tmp_path / "east", hub_id="east") as east, \
            running_hub(tmp_path / "west", hub_id="west") as west:
        alice = await joined(east.url, "PROJ/alice")
        await send(alice, "PROJ/alice", "ledger_task", task_id="build", title="Build the wheel")
        await alice.recv_type("ledger_task_posted")
        assert (await claim(alice, "PROJ/alice", "build", paths=["src/"]))["type"] == (
            "claim_granted")
        bob = await joined(west.url, "PROJ/bob")
        await send(bob, "PROJ/bob", "ledger_task", task_id="docs", title="Write the docs")
        await bob.recv_type("ledger_task_posted")
        await settled(east)
        await settled(west)
        west_db, east_db = west.config.db, east.config.db

        code, out, _ = run(capsys, "observe", "--peer-db", str(west_db), "--peer-id", "west")
        assert code == 0
        lines = out.splitlines()
        assert lines[0] == "observing peer 'west' — 1 tasks, 0 progress notes, 0 observed claims"
        assert lines[1] == ("board (verified causal heads; display LWW among unresolved heads "
                            "— non-authoritative):")
        assert re.fullmatch(r"  \[open\] docs — Write the docs \[display source west#\d+ @ \S+\]",
                            lines[2]), lines[2]
        assert len(lines) == 3

        before = file_state(east_db)
        code, out, _ = run(capsys, "observe", "--peer-db", str(east_db), "--peer-id", "east")
        assert code == 0
        lines = out.splitlines()
        assert lines[0] == "observing peer 'east' — 1 tasks, 0 progress notes, 1 observed claims"
        assert lines[-2:] == ["observed claims (advisory — not granted):",
                              "  build -> PROJ/alice @ east"]
        assert file_state(east_db) == before  # read-only: the peer's files are untouched

        code, out, _ = run(capsys, "observe", "--peer-db", str(east_db), "--peer-id", "east",
                           "--json")
        view = json.loads(out)
        assert view["peer_id"] == "east" and view["journal_schema"] == "hubd"
        prov = view["board_provenance"]["build"]
        row = [e for e in replay(east_db) if e.kind == "ledger_task"][0]
        assert prov["event_fingerprint"] == event_fingerprint("east", row.seq, row.ts,
                                                              row.kind, row.payload)
        assert view["observed_claims"]["build"]["claim"]["owner"] == "PROJ/alice"
        assert view["board_policy"]["authoritative"] is False

        # the journal is in use: recovery refuses and says to stop the hub
        code, _, err = run(capsys, "recover", "--db", str(east_db), "--peer-id", "west",
                           "--operator", "ic", "--reason", "r", "--new-log-generation", "g2")
        assert code == 2 and "stop the hub first" in err


def seed_journal(path, rows):
    store = JournalStore(path)
    try:
        start = store.max_seq()
        store.append([Event(start + i + 1, 10.0 + i, kind, payload).row()
                      for i, (kind, payload) in enumerate(rows)])
    finally:
        store.close()


def test_recover_and_status(tmp_path, capsys):
    db = tmp_path / "hub.db"
    seed_journal(db, [
        ("chat", {"sender": "a", "target": "b", "type": "chat", "payload": "hi"}),
        ("multihub_equivocation", {"peer_id": "west", "observer_id": "east", "seq": 3,
                                   "accepted_fingerprint": A, "conflicting_fingerprint": B,
                                   "detected_at": 11.0, "status": "quarantined"}),
        ("multihub_partition", {"namespace": "PROJ", "local_hub_id": "east",
                                "owner_hub_id": "east", "contesting_hubs": ["north"],
                                "outcome": "partitioned", "transition": "entered"}),
    ])
    code, out, _ = run(capsys, "status", "--db", str(db))
    assert code == 0
    assert "  PROJ: contested by north" in out
    assert "  west: equivocated at seq 3" in out

    code, _, err = run(capsys, "recover", "--db", str(db), "--peer-id", "north",
                       "--operator", "ic", "--reason", "r", "--new-log-generation", "g2")
    assert code == 2 and "'north' is not quarantined" in err

    code, out, _ = run(capsys, "recover", "--db", str(db), "--peer-id", "west",
                       "--operator", "incident-commander", "--reason", "checkpoint verified",
                       "--new-log-generation", "west-generation-2", "--json")
    assert code == 0
    result = json.loads(out)
    assert result["seq"] == 4 and result["kind"] == "multihub_equivocation_recovery"
    events = replay(db)
    assert [e.seq for e in events] == [1, 2, 3, 4]
    payload = events[-1].payload
    assert {k: payload[k] for k in ("peer_id", "operator", "new_log_generation")} == {
        "peer_id": "west", "operator": "incident-commander",
        "new_log_generation": "west-generation-2"}
    assert payload["reason_sha256"] == hashlib.sha256(b"checkpoint verified").hexdigest()
    assert isinstance(payload["recovered_at"], float)
    assert events[-1].ts == payload["recovered_at"]

    code, _, err = run(capsys, "recover", "--db", str(db), "--peer-id", "west",
                       "--operator", "ic", "--reason", "r", "--new-log-generation", "g3")
    assert code == 2 and "already recovered" in err
    code, out, _ = run(capsys, "status", "--db", str(db), "--json")
    status = json.loads(out)
    assert status["quarantined"] == {} and status["partitioned"] == {"PROJ": ["north"]}

    code, _, err = run(capsys, "recover", "--db", str(tmp_path / "none.db"), "--peer-id",
                       "west", "--operator", "ic", "--reason", "r", "--new-log-generation", "g")
    assert code == 2 and "journal not found" in err
    assert not (tmp_path / "none.db").exists()


async def test_a_recovered_journal_still_starts(tmp_path, capsys):
    db = tmp_path / "hub.db"
    async with running_hub(tmp_path, hub_id="east") as east:
        alice = await joined(east.url, "PROJ/alice")
        assert (await claim(alice, "PROJ/alice", "t"))["type"] == "claim_granted"
        await settled(east)
    seed_journal(db, [("multihub_equivocation", {"peer_id": "west", "seq": 1,
                                                  "accepted_fingerprint": A,
                                                  "conflicting_fingerprint": B})])
    code, _, _ = run(capsys, "recover", "--db", str(db), "--peer-id", "west", "--operator",
                     "ic", "--reason", "r", "--new-log-generation", "g2")
    assert code == 0
    async with running_hub(tmp_path, hub_id="east") as east:
        bob = await joined(east.url, "PROJ/bob")
        denied = await claim(bob, "PROJ/bob", "t")  # the lease survived the restart
        assert denied["type"] == "claim_denied"


def reference_journal(path, rows):
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE events(seq INTEGER PRIMARY KEY AUTOINCREMENT, ts REAL NOT NULL, "
                 "kind TEXT NOT NULL, payload TEXT NOT NULL, mac TEXT)")
    for seq, ts, kind, payload in rows:
        conn.execute("INSERT INTO events (seq, ts, kind, payload, mac) VALUES (?,?,?,?,?)",
                     (seq, ts, kind, json.dumps(payload, sort_keys=True), "m"))
    conn.commit()
    conn.close()


def test_observe_a_reference_journal(tmp_path, capsys):
    db = tmp_path / "west.db"
    docs = {"task_id": "docs", "title": "Write the docs", "description": "", "depends_on": [],
            "status": "open", "suggested_owner": "", "project": "", "version": 1,
            "created_by": "p/alice", "created_at": 1796015532.39, "updated_at": 1796015532.39}
    reference_journal(db, [
        (1, 1796015532.39, "ledger_task", docs),
        (2, 1796015533.0, "claim", {"task_id": "build", "owner": "PROJ/alice", "epoch": 1,
                                    "lease_expires_at": 4e9}),
        (3, 1796015534.0, "release", {"task_id": "build"}),
        (4, 1796015535.0, "ledger_progress", {"task_id": "docs", "author": "p/alice",
                                              "kind": "note", "text": "halfway",
                                              "posted_at": 1796015535.0}),
    ])
    code, out, _ = run(capsys, "observe", "--peer-db", str(db))  # peer id: the file name
    assert code == 0
    assert out.splitlines() == [
        "observing peer 'west' — 1 tasks, 1 progress notes, 0 observed claims",
        "board (verified causal heads; display LWW among unresolved heads — non-authoritative):",
        "  [open] docs — Write the docs [display source west#1 @ 1.79602e+09]"]
    code, out, _ = run(capsys, "observe", "--peer-db", str(db), "--json")
    view = json.loads(out)
    # the value the reference's own `multihub observe --json` prints for this event
    assert view["board_provenance"]["docs"]["event_fingerprint"] == (
        "b3d074b3cff8fe06866780443be0cf2656a105474e8f0215ceafc6f1346a54f2")
    assert view["journal_schema"] == "reference"
    code, _, err = run(capsys, "recover", "--db", str(db), "--peer-id", "x",
                       "--operator", "o", "--reason", "r", "--new-log-generation", "g")
    assert code == 2 and "reference hub journal" in err


@pytest.mark.parametrize("content", [b"not a database at all" * 100, b""])
def test_observe_refuses_non_journals(tmp_path, capsys, content):
    path = tmp_path / "x.db"
    path.write_bytes(content)
    code, _, err = run(capsys, "observe", "--peer-db", str(path))
    assert code == 2 and "hubd multihub observe:" in err


def test_observe_refuses_a_log_with_a_hole(tmp_path, capsys):
    db = tmp_path / "p.db"
    reference_journal(db, [(1, 1.0, "chat", {}), (3, 3.0, "chat", {})])
    code, _, err = run(capsys, "observe", "--peer-db", str(db))
    assert code == 2 and "expected seq 2, got 3" in err


def test_follow_an_unreachable_peer_fails_clearly(capsys):
    code, _, err = run(capsys, "follow", "--peer-uri", "ws://127.0.0.1:1/", "--timeout", "2")
    assert code == 2 and "could not follow peer hub" in err and "127.0.0.1:1" in err

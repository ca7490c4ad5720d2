"""The journal's hash chain and signed checkpoints (issue 29 item 2), on real
hub processes and real SQLite files: a hub links every row it writes and
signs its head; `hubd journal verify` names the first row changed after it
was written, and a history rewritten whole (every link recomputed) by the
checkpoints it no longer matches; a journal from before the chain is linked
in place at start, once, with a log line."""

from __future__ import annotations

import asyncio
import json
import sqlite3

from hubd.journal import chain
from tests.integration.test_journal_verify import verify
from tests.support.procs import hubd_process
from tests.support.wsprobe import WsProbe

CHATS = 25
EVERY = 10  # --checkpoint-every


async def chats(url: str, count: int, text: str = "chat") -> None:
    probe = await WsProbe.open(url)
    await probe.register("p/alice")
    await probe.recv_type("presence_update", agent="p/alice", timeout=10)
    for i in range(count):
        await probe.chat("p/alice", "all", f"{text} {i}")
    await probe.close()


def written_by_a_hub(tmp_path):
    hub = hubd_process(tmp_path, "--checkpoint-every", str(EVERY)).start()
    try:
        asyncio.run(chats(hub.url, CHATS))
    finally:
        hub.stop()
    return tmp_path / "hubd.db"


def rows(db):
    conn = sqlite3.connect(db)
    try:
        return conn.execute("SELECT seq, ts, kind, payload, route, principal, chain FROM events "
                            "ORDER BY seq").fetchall()
    finally:
        conn.close()


def change_payload(db, seq):
    conn = sqlite3.connect(db)
    with conn:
        (payload,) = conn.execute("SELECT payload FROM events WHERE seq = ?", (seq,)).fetchone()
        value = json.loads(payload)
        value["payload"] = "not what was said"
        conn.execute("UPDATE events SET payload = ? WHERE seq = ?", (json.dumps(value), seq))
    conn.close()


def test_a_hub_links_every_row_and_signs_its_head(tmp_path):
    db = written_by_a_hub(tmp_path)
    stored = rows(db)
    assert len(stored) >= CHATS
    prev = chain.GENESIS
    for row in stored:  # every link is the one its content and the row before make
        prev = chain.row_link(prev, row)
        assert bytes(row[6]) == prev
    code, out = verify(db, "--json")
    assert code == 0, out
    report = json.loads(out)
    assert report["chain"]["head"] == prev.hex() and report["chain"]["first_bad_seq"] is None
    # one at the start's head, then at least one per EVERY events
    assert report["chain"]["checkpoints"] >= len(stored) // EVERY
    assert (tmp_path / "hubd.db.chain-key").stat().st_mode & 0o777 == 0o600


def test_verify_names_the_first_changed_row(tmp_path):
    db = written_by_a_hub(tmp_path)
    seqs = [row[0] for row in rows(db) if row[2] == "chat"]
    first, later = seqs[5], seqs[12]
    change_payload(db, later)
    change_payload(db, first)
    code, out = verify(db, "--json")
    assert code == 1, out
    report = json.loads(out)
    assert report["chain"]["first_bad_seq"] == first
    where = [p["where"] for p in report["problems"]]
    assert where[:2] == [f"row {first}", f"row {later}"], report["problems"]
    code, out = verify(db)
    assert code == 1 and f"FAULT row {first}: its hash-chain link does not hold" in out, out
    assert f"first bad seq {first}" in out


def test_a_history_rewritten_whole_is_caught_by_its_signed_checkpoints(tmp_path):
    """Whoever changes a row and recomputes every link after it leaves a
    chain that holds, but not the heads the hub signed."""
    db = written_by_a_hub(tmp_path)
    seq = [row[0] for row in rows(db) if row[2] == "chat"][3]
    change_payload(db, seq)
    conn = sqlite3.connect(db)
    with conn:
        linked, _ = chain.chained(chain.GENESIS, [row[:6] for row in rows(db)])
        conn.executemany("UPDATE events SET chain = ? WHERE seq = ?",
                         [(row[6], row[0]) for row in linked])
    conn.close()
    code, out = verify(db, "--json")
    assert code == 1, out
    report = json.loads(out)
    assert report["chain"]["first_bad_seq"] is None  # the links hold ...
    signed = [p for p in report["problems"] if p["where"].startswith("checkpoint ")]
    assert signed and all("rewritten after it was signed" in p["what"] for p in signed)
    # ... every checkpoint at or after the changed row names another head
    assert min(int(p["where"].split()[1]) for p in signed) >= seq


def test_a_journal_from_before_the_chain_is_linked_in_place_once(tmp_path):
    db = written_by_a_hub(tmp_path)
    before = rows(db)
    conn = sqlite3.connect(db)  # the journal as a hubd of schema 1 left it
    with conn:
        conn.execute("ALTER TABLE events DROP COLUMN chain")
        conn.execute("DROP TABLE checkpoints")
        conn.execute("DELETE FROM meta WHERE key = 'chain_key'")
        conn.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")
    conn.close()
    code, out = verify(db)  # read-only: it says what a start will do
    assert code == 1 and "FAULT journal: no hash chain" in out, out
    hub = hubd_process(tmp_path, "--checkpoint-every", str(EVERY)).start()
    try:
        assert "journal upgraded in place: hash chain computed over its existing rows" in hub.log()
        asyncio.run(chats(hub.url, 3, "after the upgrade"))
    finally:
        hub.stop()
    after = rows(db)
    assert [row[6] for row in after[:len(before)]] == [row[6] for row in before]
    code, out = verify(db, "--json")
    assert code == 0, out
    assert json.loads(out)["chain"]["rows"] == len(after)
    hub = hubd_process(tmp_path).start()  # linked once: not again
    try:
        assert "journal upgraded in place" not in hub.log()
    finally:
        hub.stop()

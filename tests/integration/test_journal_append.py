"""JournalStore.append on a real SQLite file: every row of a commit is there
after it returns, in one statement or (past ROWS_PER_STATEMENT) in one
transaction of several, and a commit that fails leaves none of its rows."""

import sqlite3

import pytest

from hubd.journal import store as journal
from hubd.journal.store import JournalReader, JournalStore


def rows(first: int, n: int) -> list[tuple]:
    return [(seq, 1000.0 + seq, "chat", f'{{"n":{seq}}}', None, None if seq % 2 else "p")
            for seq in range(first, first + n)]


@pytest.mark.parametrize("n", [1, 7, journal.ROWS_PER_STATEMENT, journal.ROWS_PER_STATEMENT * 2 + 3])
def test_every_row_of_a_commit_is_read_back_by_another_connection(tmp_path, n):
    store = JournalStore(tmp_path / "j.db")
    store.append(rows(1, n))
    store.append(rows(n + 1, 2))
    reader = JournalReader(tmp_path / "j.db")
    try:
        got = [(e.seq, e.ts, e.kind, e.payload) for e in reader.replay()]
        principals = [p for (p,) in reader.conn.execute("SELECT principal FROM events ORDER BY seq")]
    finally:
        reader.close()
        store.close()
    assert got == [(s, 1000.0 + s, "chat", {"n": s}) for s in range(1, n + 3)]
    assert principals == [None if s % 2 else "p" for s in range(1, n + 3)]


@pytest.mark.parametrize("n", [5, journal.ROWS_PER_STATEMENT + 5])
def test_a_commit_that_fails_leaves_none_of_its_rows(tmp_path, n):
    store = JournalStore(tmp_path / "j.db")
    store.append(rows(1, 3))
    clash = rows(4, n)
    clash[-1] = (2, *clash[-1][1:])  # its last row reuses seq 2: the whole commit is refused
    with pytest.raises(sqlite3.IntegrityError):
        store.append(clash)
    assert not store.conn.in_transaction
    store.append(rows(4, 1))  # the connection is usable afterwards
    assert [r[0] for r in store.conn.execute("SELECT seq FROM events ORDER BY seq")] == [1, 2, 3, 4]
    store.close()

"""Property: the projection loaded from the newest snapshot plus the journal's
tail equals the replay from the journal's start and the Router's live state,
for random frame sequences from several sockets with snapshots taken at
random points (and restarts, which start from the newest snapshot). Real
hub, real sockets, real SQLite files; the snapshots are written by the code
the snapshot worker runs (hubd/journal/restore.py take), here in a thread."""

import asyncio
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from hubd.journal import snapshots
from hubd.journal.restore import take
from hubd.state.frozen import canonical
from tests.integration import test_projection_property as base

actions = st.one_of(base.actions, base.actions, st.tuples(st.just("snapshot"), st.integers(1, 3)))


async def take_snapshot(server, sockets, step) -> None:
    await base.settle(server, sockets)
    hub = server.hub
    taken = await asyncio.to_thread(take, hub.config.db, hub.fresh_state, hub.snapshot_policy,
                                    step[1])
    kept = snapshots.listed(hub.snapshot_policy.directory)
    assert len(kept) <= step[1]
    # one at the journal's last seq (none of an empty journal)
    assert taken.seq == hub.writer.committed_seq
    assert [f.seq for f in kept[:1]] == ([taken.seq] if taken.seq else [])


async def check(server) -> None:
    hub = server.hub
    live = hub.router.state
    from_start = await hub.load_state(use_snapshots=False)
    assert hub.projected.from_snapshot == 0
    loaded = await hub.load_state()
    newest = snapshots.listed(hub.snapshot_policy.directory)
    # the newest snapshot was used, not passed over
    assert hub.projected.from_snapshot == (newest[0].seq if newest else 0)
    assert hub.projected.skipped == []
    event("loaded from a snapshot" if hub.projected.from_snapshot else "loaded from the start")
    assert loaded == from_start == live
    assert canonical(loaded) == canonical(from_start)
    assert hub.ready


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(actions, min_size=12, max_size=60))
def test_snapshot_plus_tail_equals_replay_from_the_start(steps):
    # two seats online from the start, so most snapshots hold something
    steps = [("connect", 0, True, 0), ("connect", 1, False, 0)] + steps
    with tempfile.TemporaryDirectory() as folder:
        asyncio.run(base.scenario(Path(folder), steps, {"snapshot": take_snapshot}, check))


async def test_every_plugin_projection_survives_a_snapshot(tmp_path):
    """hubd 66f4a31's journal (REDSYN boxes, broker threads, receipts, chats):
    a snapshot at every seq, each loaded with the tail after it, is the state
    replayed from the start."""
    import os
    import sqlite3

    from hubd.composition import build_hub
    from tests.support.inproc import test_config

    data = Path(__file__).parent / "data" / "journal_66f4a31"
    db = tmp_path / "hub.db"
    os.close(os.open(db, os.O_CREAT | os.O_WRONLY, 0o600))
    connection = sqlite3.connect(db)
    connection.executescript((data / "journal.sql").read_text())
    last = connection.execute("SELECT MAX(seq) FROM events").fetchone()[0]
    connection.close()
    hub = build_hub(test_config(tmp_path, db=db))
    await hub.open()
    try:
        from_start = await hub.load_state(use_snapshots=False)
        assert from_start.extensions["broker"].threads and from_start.extensions["redsyn"].messages
        for seq in range(1, last + 1):
            taken = await asyncio.to_thread(take, db, hub.fresh_state, hub.snapshot_policy, 1,
                                            upto=seq)
            assert taken.seq == seq
            loaded = await hub.load_state()
            assert hub.projected.from_snapshot == seq and hub.projected.applied == last - seq
            assert loaded == from_start
            assert canonical(loaded) == canonical(from_start)
    finally:
        await hub.shutdown()


async def test_a_snapshot_that_cannot_be_used_is_replaced_by_the_next_one(tmp_path):
    """A damaged snapshot of the journal's last row does not stop the next
    take from writing a good one of that row; with a good one, a take has
    nothing to write."""
    from hubd.composition import build_hub
    from tests.integration.test_handler_failure import write_history
    from tests.support import inproc

    db = tmp_path / "hub.db"
    write_history(db, 300)
    hub = build_hub(inproc.test_config(tmp_path, db=db))
    await hub.open()
    try:
        first = await asyncio.to_thread(take, db, hub.fresh_state, hub.snapshot_policy, 2)
        assert first.seq == 300 and first.path is not None
        first.path.write_bytes(first.path.read_bytes()[:-1])  # cut short
        await hub.load_state()
        assert hub.projected.from_snapshot == 0 and hub.projected.skipped[0][0] == 300
        again = await asyncio.to_thread(take, db, hub.fresh_state, hub.snapshot_policy, 2)
        assert again.path == first.path and again.applied == 300
        await hub.load_state()
        assert hub.projected.from_snapshot == 300 and hub.projected.skipped == []
        current = await asyncio.to_thread(take, db, hub.fresh_state, hub.snapshot_policy, 2)
        assert current.path is None and current.seq == 300 and current.from_snapshot == 300
    finally:
        await hub.shutdown()

"""Faults: a handler that raises, and a journal that cannot be written."""

import asyncio
import errno
import subprocess

import pytest

from hubd.state import events as ev
from tests.support.inproc import running_hub
from tests.support.prereq import missing, need_root
from tests.support.wsprobe import joined


async def test_unexpected_handler_exception_closes_only_that_connection(tmp_path, monkeypatch):
    def explode(router, session, frame, size):
        # a half-done mutation: one event applied, then a bug
        router.event(ev.MAILBOX_WATERMARK, {"identity": session.name, "seq": 0})
        raise RuntimeError("bug in a handler")

    async with running_hub(tmp_path, allow_crashes=True) as server:
        # a verb of this test's own, beside the installed ones
        monkeypatch.setitem(server.hub.router.handlers, "test_explode", explode)
        bystander = await joined(server.url, "p/bystander")
        victim = await joined(server.url, "p/victim")
        await victim.chat("p/victim", "all", "before")
        await bystander.recv_type("chat", payload="before")
        seq_before = server.hub.router.state.last_seq
        await victim.send_json({"sender": "p/victim", "type": "test_explode"})
        assert (await victim.wait_closed()).code == 1011
        await bystander.recv_type("presence_update", agent="p/victim", event="left")
        # no partial state: the dropped event left no trace, and the next event
        # takes the seq it would have used
        await bystander.chat("p/bystander", "all", "after")
        after = await bystander.recv_type("chat", payload="after")
        assert after["seq"] == seq_before + 1
        assert await server.hub.load_state() == server.hub.router.state
        assert server.hub.metrics.handler_crashes == 1
        await bystander.close()


def _mount_tmpfs(path, size="4m"):
    need_root("mount a size-limited tmpfs")
    path.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                            capture_output=True, text=True)
    if result.returncode != 0:
        missing(f"cannot mount tmpfs: {result.stderr.strip()}")


def _fill(path):
    """Write until the filesystem is full; return the filler's path."""
    filler = path / "filler"
    # unbuffered: a buffered file keeps what the full disk refused and raises
    # ENOSPC again when the with-block closes it
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 65536)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    return filler


async def notified(probe, name: str) -> None:
    """After `probe` read a receipt: the hub has journaled its receipt_notified
    too (the write that delivered the receipt makes the Router journal it, a
    round later, before it handles this round trip)."""
    await probe.send_json({"sender": name, "type": "who_request"})
    await probe.recv_type("who_snapshot")


async def test_journal_write_failure_refuses_mutations_and_keeps_reads(tmp_path):
    mnt = tmp_path / "small"
    _mount_tmpfs(mnt)
    try:
        async with running_hub(mnt) as server:
            alice = await joined(server.url, "p/alice")
            bob = await joined(server.url, "p/bob")
            await alice.chat("p/alice", "p/bob", "fits", client_msg_id="a1", receipt_requested=True)
            assert (await alice.recv_type("delivery_receipt"))["delivered"] is True
            await notified(alice, "p/alice")
            committed = server.hub.router.state.last_seq
            filler = _fill(mnt)

            # a big chat needs new WAL pages: the commit fails with SQLITE_FULL
            await alice.chat("p/alice", "p/bob", "x" * 200_000, client_msg_id="a2",
                             receipt_requested=True)
            err = await alice.recv_type("error")
            assert "not journalled" in err["payload"] and err["client_msg_id"] == "a2"
            assert alice.seen("delivery_receipt")[1:] == []
            # while refusing: reads are served, mutations get a private error
            await alice.send_json({"sender": "p/alice", "type": "who_request"})
            assert (await alice.recv_type("who_snapshot"))["online_agents"] == ["p/alice", "p/bob"]
            # nothing half-applied
            assert server.hub.router.state.last_seq == committed
            assert await server.hub.load_state() == server.hub.router.state
            await alice.chat("p/alice", "p/bob", "small", client_msg_id="a3")
            refused = await alice.recv_type("error", timeout=5)
            assert "cannot write its journal" in refused["payload"]
            assert server.hub.metrics.journal_failures >= 1

            # storage recovers: the same client_msg_id goes through once
            filler.unlink()
            deadline = asyncio.get_running_loop().time() + 10
            while True:
                await alice.chat("p/alice", "p/bob", "small", client_msg_id="a3",
                                 receipt_requested=True)
                frame = await alice.recv(lambda f: f.get("type") in ("delivery_receipt", "error"))
                if frame["type"] == "delivery_receipt":
                    break
                assert asyncio.get_running_loop().time() < deadline, frame
                await asyncio.sleep(0.1)
            assert frame["delivered"] is True
            got = await bob.recv_type("chat", payload="small")
            assert got["client_msg_id"] == "a3"
            assert [f["payload"] for f in bob.seen("chat")] == ["fits", "small"]
            await notified(alice, "p/alice")
            assert await server.hub.load_state() == server.hub.router.state
            await alice.close()
            await bob.close()
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


async def test_a_journal_that_is_not_hubds_is_refused_with_a_reason(tmp_path):
    import sqlite3

    from hubd.server import HubServer, StartupError
    from tests.support.inproc import test_config

    db = sqlite3.connect(tmp_path / "hub.db")
    db.execute("CREATE TABLE events (seq INTEGER PRIMARY KEY, ts REAL, kind TEXT, payload TEXT, "
               "mac TEXT)")
    db.commit()
    db.close()
    (tmp_path / "hub.db").chmod(0o600)  # owner-only, as hubd makes them
    with pytest.raises(StartupError, match="did not write"):
        await HubServer(test_config(tmp_path)).start()
    (tmp_path / "other.db").write_bytes(b"this is not sqlite at all" * 100)
    (tmp_path / "other.db").chmod(0o600)
    with pytest.raises(StartupError, match="not a database"):
        await HubServer(test_config(tmp_path, db=tmp_path / "other.db")).start()

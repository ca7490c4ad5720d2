"""The shared blackboard and capability cards over real sockets, a real
journal, and (for the rollback sentences) a really full disk."""

import asyncio
import subprocess

from hubd.timing import Timing
from tests.integration.test_claims import frame, journal, joined, same_as_replay, send, settled
from tests.integration.test_faults import _fill, _mount_tmpfs
from tests.support.inproc import running_hub


async def board(probe, name):
    await send(probe, name, "board_request", payload="board")
    return (await probe.recv_type("board_snapshot"))["board"]


async def test_tasks_compare_and_set_scope_and_progress(tmp_path):
    async with running_hub(tmp_path) as server:
        alice = await joined(server.url, "p/alice")
        bob = await joined(server.url, "p/bob")
        await send(alice, "p/alice", "ledger_task", task_id="B-1", title="Build parser",
                   description="desc", project="p", suggested_owner="p/bob", idem_key="d1")
        posted = await bob.recv_type("ledger_task_posted")
        task = posted["task"]
        assert posted["payload"] == "Task 'B-1' declared by p/alice."
        assert (task["version"], task["status"], task["project"], task["created_by"]) == (
            1, "open", "p", "p/alice")
        await send(alice, "p/alice", "ledger_task", task_id="B-2", title="Docs",
                   depends_on=["B-1"], expected_version=0)
        await alice.recv_type("ledger_task_posted", payload="Task 'B-2' declared by p/alice.")

        refusals = [
            ({"task_id": "B-1", "title": "x", "project": "other"},
             "Task 'B-1' project conflict: already scoped to 'p', cannot re-scope to 'other'."),
            ({"task_id": "B-1", "title": "x", "expected_version": 5},
             "Task 'B-1' version conflict: expected v5, board has v1."),
            ({"task_id": "B-3", "title": "x", "expected_version": True},
             "Malformed frame: 'expected_version' must be an integer."),
            ({"task_id": "B-1", "title": "x", "depends_on": ["B-2"]},
             "Task 'B-1' dependencies would form a cycle."),
            ({"task_id": "B-3"}, "Task title is required."),
            ({"task_id": "B-3", "title": "x", "causal_parent": "east:3:abc"},
             "Malformed frame: causal_parent must be an object"),
            ({"task_id": "B-3", "title": "x",
              "causal_parent": {"hub_id": "e", "seq": 0, "event_fingerprint": "a" * 64}},
             "Malformed frame: causal parent seq must be an integer from 1 through 2^63-1"),
        ]
        for fields, text in refusals:
            await send(alice, "p/alice", "ledger_task", **fields)
            assert (await alice.recv_type("error"))["payload"] == text
        for fields, text in (
                ({"task_id": "B-1", "status": "bogus"}, "Unknown ledger status 'bogus'."),
                ({"task_id": "B-9", "status": "done"}, "Task 'B-9' is not on the board."),
                ({"task_id": "B-1", "status": "done", "expected_version": 7},
                 "Task 'B-1' version conflict: expected v7, board has v1.")):
            await send(bob, "p/bob", "ledger_task_update", **fields)
            assert (await bob.recv_type("error"))["payload"] == text

        parent = {"hub_id": "west", "seq": 5, "event_fingerprint": "b" * 64}
        await send(bob, "p/bob", "ledger_task_update", task_id="B-1", status="done",
                   expected_version=1, causal_parent=parent)
        updated = await alice.recv_type("ledger_task_updated")
        assert updated["payload"] == "Task 'B-1' plan updated."
        assert updated["task"]["status"] == "done" and updated["task"]["version"] == 2
        assert "causal_parent" not in updated["task"] and "_causal_parent" not in updated["task"]
        await settled(server)
        rows = [p for _, _, p in journal(server, "ledger_task") if p["task_id"] == "B-1"]
        assert rows[-1]["_causal_parent"] == parent and rows[-1]["version"] == 2

        await send(bob, "p/bob", "ledger_progress", task_id="B-2", kind="blocked",
                   payload="waiting on review")
        note = (await alice.recv_type("ledger_progress_posted"))["note"]
        assert (note["author"], note["kind"], note["text"]) == ("p/bob", "blocked",
                                                                "waiting on review")
        await send(bob, "p/bob", "ledger_progress", task_id="B-2", kind="weird", payload="x")
        assert (await bob.recv_type("error"))["payload"] == "Unknown progress kind 'weird'."

        snapshot = await board(bob, "p/bob")
        assert [t["task_id"] for t in snapshot["tasks"]] == ["B-1", "B-2"]
        assert snapshot["ready"] == ["B-2"]  # its dependency is done
        assert snapshot["progress"] == [note]

        # keyed retry: the original reply, privately, nothing new journaled
        before = len(journal(server))
        await send(alice, "p/alice", "ledger_task", task_id="B-1", title="Build parser",
                   description="desc", project="p", suggested_owner="p/bob", idem_key="d1")
        again = await alice.recv(lambda f: f.get("type") == "ledger_task_posted"
                                 and f["task"]["task_id"] == "B-1" and f["task"]["version"] == 1)
        assert again["task"] == task
        await settled(server)
        assert len(journal(server)) == before
        await same_as_replay(server)
        await alice.close()
        await bob.close()
    # the board survives a restart
    async with running_hub(tmp_path) as server:
        carol = await joined(server.url, "p/carol")
        assert await board(carol, "p/carol") == snapshot
        await carol.close()


async def test_an_unexpected_causal_parent_fault_changes_nothing(tmp_path, monkeypatch):
    from hubd.state import board as bd

    def broken(frame):
        raise RuntimeError("parser bug")

    async with running_hub(tmp_path) as server:
        alice = await joined(server.url, "p/alice")
        monkeypatch.setattr(bd, "causal_parent", broken)
        await send(alice, "p/alice", "ledger_task", task_id="T", title="x", idem_key="k")
        err = await alice.recv_type("error")
        assert err["payload"] == "Causal parent validation failed; task was not changed."
        monkeypatch.undo()
        # the connection is usable and the same idem_key goes through once fixed
        await send(alice, "p/alice", "ledger_task", task_id="T", title="x", idem_key="k")
        assert (await alice.recv_type("ledger_task_posted"))["task"]["version"] == 1
        await same_as_replay(server)
        await alice.close()


async def test_capability_cards(tmp_path):
    async with running_hub(tmp_path) as server:
        alice = await joined(server.url, "p2/alice")
        bob = await joined(server.url, "p2/bob")
        await send(alice, "p2/alice", "advertise", description="reviewer", skills=["review", 5],
                   model="m-1", contracts=[{"task_class": "review",
                                            "input_schema": {"type": "object"}}, {"bad": 1}])
        advertised = await bob.recv_type("capability_advertised")
        card = advertised["card"]
        assert advertised["agent"] == "p2/alice" and card["project"] == "p2"
        assert card["skills"] == ["review", "5"] and card["contracts"][0]["task_class"] == "review"
        assert len(card["contracts"]) == 1 and "persistent" not in card
        for fields, text in (
                ({"persist": "yes"}, "Malformed frame: 'persist' must be a boolean."),
                ({"dispatchable": 1}, "Malformed frame: 'dispatchable' must be a boolean."),
                ({"agent": "p2/bob"}, "Capability registration for another identity requires "
                                      "the connection to be that identity or a recognised "
                                      "receiver sidecar.")):
            await send(alice, "p2/alice", "advertise", **fields)
            assert (await alice.recv_type("error"))["payload"] == text
        solo = await joined(server.url, "solo")
        await send(solo, "solo", "advertise", persist=True)
        assert "project-scoped seat" in (await solo.recv_type("error"))["payload"]

        # a -rx sidecar registers its seat persistently
        rx = await joined(server.url, "p2/alice-rx")
        await send(rx, "p2/alice-rx", "advertise", agent="p2/alice", persist=True,
                   dispatchable=False, description="from rx")
        persisted = await bob.recv(lambda f: f.get("type") == "capability_advertised"
                                   and f["card"].get("persistent") is True)
        assert persisted["card"]["dispatchable"] is False
        await send(bob, "p2/bob", "manifest_request", payload="manifest")
        [entry] = (await bob.recv_type("manifest_snapshot"))["manifest"]
        # the live card, with the registration merged in
        assert entry["description"] == "reviewer" and entry["persistent"] is True
        assert entry["dispatchable"] is False
        await alice.close()
        await rx.close()
        await bob.recv_type("presence_update", agent="p2/alice-rx", event="left")
        await send(bob, "p2/bob", "manifest_request")
        [entry] = (await bob.recv_type("manifest_snapshot"))["manifest"]
        assert entry["description"] == "from rx" and entry["persistent"] is True
        await same_as_replay(server)
        await bob.close()
        await solo.close()
    async with running_hub(tmp_path) as server:
        bob = await joined(server.url, "p2/bob")
        await send(bob, "p2/bob", "manifest_request")
        [entry] = (await bob.recv_type("manifest_snapshot"))["manifest"]
        assert entry["agent"] == "p2/alice" and entry["description"] == "from rx"
        await bob.close()


async def test_a_journal_failure_rolls_board_writes_back_privately(tmp_path):
    mnt = tmp_path / "small"
    _mount_tmpfs(mnt)
    try:
        # after a failed commit, mutations are refused for 0.2 s (production: 1 s)
        async with running_hub(mnt, timing=Timing(journal_retry_first=0.2)) as server:
            alice = await joined(server.url, "p/alice")
            bob = await joined(server.url, "p/bob")
            await send(alice, "p/alice", "ledger_task", task_id="T", title="fits")
            await bob.recv_type("ledger_task_posted")
            committed = server.hub.router.state.last_seq
            filler = _fill(mnt)
            big = "x" * 300_000
            # a progress note that cannot be committed: only its author hears
            await send(alice, "p/alice", "ledger_progress", task_id="T", payload=big)
            err = await alice.recv_type("error")
            assert err["payload"] == "Progress note was not journalled; mutation rolled back."
            # after the refusal backoff, a task write fails the same way
            deadline = asyncio.get_running_loop().time() + 15
            while True:
                await send(alice, "p/alice", "ledger_task", task_id="T2", title="big",
                           description=big, idem_key="k")
                err = await alice.recv_type("error")
                if "cannot write its journal" not in err["payload"]:
                    break
                assert asyncio.get_running_loop().time() < deadline, err
                await asyncio.sleep(0.3)
            assert err["payload"] == "Task 'T2' was not journalled; mutation rolled back."
            # nothing was broadcast, nothing half-applied (the reply to a read comes
            # after the Router has rebuilt its state from the journal)
            await bob.send_json(frame("p/bob", "board_request"))
            snap = await bob.recv_type("board_snapshot")
            assert server.hub.router.state.last_seq == committed
            assert await server.hub.load_state() == server.hub.router.state
            assert [t["task_id"] for t in snap["board"]["tasks"]] == ["T"]
            assert bob.seen("ledger_task_posted")[1:] == [] and bob.seen(
                "ledger_progress_posted") == []
            # storage recovers: the same idem_key goes through once
            filler.unlink()
            deadline = asyncio.get_running_loop().time() + 10
            while True:
                await send(alice, "p/alice", "ledger_task", task_id="T2", title="big",
                           description=big, idem_key="k")
                got = await alice.recv(lambda f: f.get("type") in ("ledger_task_posted", "error")
                                       and f.get("payload") != "Task 'T' declared by p/alice.")
                if got["type"] == "ledger_task_posted":
                    break
                assert asyncio.get_running_loop().time() < deadline, got
                await asyncio.sleep(0.1)
            assert got["task"]["task_id"] == "T2"
            await same_as_replay(server)
            await alice.close()
            await bob.close()
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)

"""A directed chat's local way, socket to journal to recipient, reads in at
most 6 files of the hub's own layers (doors, core, actors, handlers). The
way is recorded, not asserted by hand: a profiler notes every function of
those layers that runs for one chat, in the tasks that carry it (the sender's
Connection, the Router, the JournalWriter, the recipient's flush), on a real
in-process hub. The sans-IO libraries it uses (hubd/wire, hubd/state,
hubd/journal) are listed too but are not part of the way."""

import asyncio
import sys
from pathlib import Path

from tests.support.inproc import running_hub
from tests.support.wsprobe import WsProbe

HUBD = Path(__import__("hubd").__file__).resolve().parent
WAY = ("doors", "actors", "handlers", "core")
LIBRARIES = ("wire", "state", "journal")
# the outermost hub function of each task or callback that carries a chat
# (the JournalWriter's release runs in _reported, its thread's report to the loop)
CARRIERS = {("websocket.py", "run"), ("router.py", "run"), ("journal_writer.py", "run"),
            ("journal_writer.py", "_reported"), ("websocket.py", "_flush")}
# commands of the Router that are not this chat (the once-a-second tick)
NOT_THE_CHAT = {("router.py", "_tick")}


def record(way: set, libraries: set):
    def profile(frame, event, arg):
        if event != "call":
            return
        path = Path(frame.f_code.co_filename)
        if HUBD not in path.parents:
            return
        layer = path.relative_to(HUBD).parts[0]
        if layer not in WAY + LIBRARIES:
            return
        outermost = None
        current = frame
        while current is not None:
            at = Path(current.f_code.co_filename)
            if HUBD in at.parents:
                key = (at.name, current.f_code.co_name)
                if key in NOT_THE_CHAT:
                    return
                outermost = key
            current = current.f_back
        if outermost not in CARRIERS:
            return
        (way if layer in WAY else libraries).add(str(path.relative_to(HUBD.parent)))
    return profile


async def test_a_directed_chat_reads_in_at_most_six_files(tmp_path):
    # between two WebSocket agents; with the REDSYN door serving, its commit
    # hook (waking long polls) is on every commit too: hubd/doors/redsyn/door.py
    async with running_hub(tmp_path, redsyn=False) as server:
        alice = await WsProbe.open(server.url)
        await alice.recv_type("welcome")
        await alice.register("p/alice")
        bob = await WsProbe.open(server.url)
        await bob.recv_type("welcome")
        await bob.register("p/bob")
        await bob.recv_type("presence_update", agent="p/bob")
        await alice.chat("p/alice", "p/bob", "warm-up")
        await bob.recv_type("chat", payload="warm-up")
        await asyncio.sleep(0.05)

        way: set = set()
        libraries: set = set()
        sys.setprofile(record(way, libraries))
        try:
            await alice.chat("p/alice", "p/bob", "traced")
            got = await bob.recv_type("chat", payload="traced")
        finally:
            sys.setprofile(None)
        assert got["sender"] == "p/alice" and got["seq"] > 0
        print("way:", sorted(way), "\nlibraries:", sorted(libraries))
        assert "hubd/doors/websocket.py" in way and "hubd/handlers/chat.py" in way
        assert "hubd/actors/journal_writer.py" in way
        assert len(way) <= 6, sorted(way)
        await alice.close()
        await bob.close()

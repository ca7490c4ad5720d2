"""A peer that keeps refusing for now is not retried at once after a restart.

A real east forwards a chat to a hand-written west that answers every
forward `quota_exceeded` (a transient refusal: "not now"). East backs off
(4, 8, 16 s here: timing's forward_retry_first is 4 s) and journals the peer's retry schedule as it climbs
(`forward_retry`). East is then killed and started again: its link to west
comes up at once, but the forward goes to west only when the journaled retry
is due, and the next refusal continues the schedule where it was
(docs/federation.md, "Retries across a restart")."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time

from hubd.timing import Timing
from tests.support.federation import fake_peer_hub, make_pki, site_flags
from tests.support.procs import hubd_process
from tests.support.waiting import wait_for
from tests.support.wsprobe import joined

# the schedule level to restart at: its retry is due 12-20 s (16 s, jittered)
# after the refusal, well past the time a restart takes on a loaded machine
# (at production's 1 s start, attempt 4's 6-10 s was not, once in a CI run)
RESTART_AT_ATTEMPT = 3
SCHEDULE = Timing(forward_retry_first=4.0)


def retry_rows(db) -> list[dict]:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        rows = con.execute("SELECT payload FROM events WHERE kind = 'forward_retry' "
                           "ORDER BY seq").fetchall()
    finally:
        con.close()
    return [json.loads(p) for (p,) in rows]


def link_state(east) -> str:
    return east.get_json("/health")["message_forward"]["west"]["link"]


def test_a_refusing_peer_is_not_retried_at_once_after_a_restart(tmp_path):
    pki = make_pki(tmp_path / "pki", ["east", "west"])
    arrivals: list[tuple[float, str]] = []  # (wall time, forward_id) of each forward west got

    async def refuse_for_now(ws, frame):
        if frame.get("type") == "multihub_message_forward":
            arrivals.append((time.time(), frame["forward_id"]))
            await ws.send_json({"sender": "SynapseHub", "target": "east",
                                "type": "multihub_message_result",
                                "forward_id": frame["forward_id"], "disposition": "refused",
                                "reason_code": "quota_exceeded", "detail": "not now",
                                "answering_hub": "west", "result": {}})

    async def scenario():
        async with fake_peer_hub(pki, "west", 7, refuse_for_now,
                                 features=["forward_batch"]) as port:
            site = site_flags(pki, "east", None)
            east = hubd_process(tmp_path / "east", "--message-peer",
                                f"west=wss://127.0.0.1:{port}/", "--message-peer-pin",
                                f"west={pki.server_pin('west')}", *site.connect, hub_id="east",
                                timing=SCHEDULE)
            db = tmp_path / "east" / "hubd.db"
            await asyncio.to_thread(east.start)
            try:
                await asyncio.to_thread(wait_for, lambda: link_state(east) == "up", 20.0,
                                        "east's link to west")
                alice = await joined(east.url, "PROJ/alice")
                await alice.chat("PROJ/alice", "PROJ/bob@west", "when you can")
                await asyncio.to_thread(
                    wait_for, lambda: any(r["attempts"] == RESTART_AT_ATTEMPT
                                          for r in retry_rows(db)), 30.0,
                    f"east journaling attempt {RESTART_AT_ATTEMPT} of west's schedule")
                await alice.close()
                east.kill()
                [journaled] = [r for r in retry_rows(db) if r["attempts"] == RESTART_AT_ATTEMPT]
                assert journaled["peer"] == "west" and journaled["refused"] is True
                assert [r["attempts"] for r in retry_rows(db)] == \
                    list(range(1, RESTART_AT_ATTEMPT + 1))
                before_restart = len(arrivals)
                assert before_restart == RESTART_AT_ATTEMPT  # one forward, refused at each level

                await asyncio.to_thread(east.start)
                await asyncio.to_thread(wait_for, lambda: link_state(east) == "up", 20.0,
                                        "east's link to west after the restart")
                link_up = time.time()
                health = east.get_json("/health")["message_forward"]["west"]
                assert health["retry"] == {"attempts": RESTART_AT_ATTEMPT,
                                           "retry_at": journaled["retry_at"], "refused": True}
                assert health["pending"] == 1
                # the restart took less than the wait, so what follows shows it
                assert link_up < journaled["retry_at"] - 1.0, \
                    (link_up, journaled["retry_at"])
                await asyncio.to_thread(wait_for, lambda: len(arrivals) > before_restart,
                                        journaled["retry_at"] - time.time() + 15.0,
                                        "the forward after its journaled retry")
                again = arrivals[before_restart][0]
                assert again >= journaled["retry_at"] - 0.05, (again, journaled["retry_at"])
                # refused once more: the schedule goes on from where it was
                await asyncio.to_thread(
                    wait_for, lambda: retry_rows(db)[-1]["attempts"] == RESTART_AT_ATTEMPT + 1,
                    10.0, "the next level of the schedule")
            finally:
                east.stop()

    asyncio.run(scenario())

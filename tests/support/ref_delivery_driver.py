"""Drive the reference client's delivery API as a black box (JSON lines out).

Executed by the REFERENCE virtual environment's python, never imported by the
tests or by hubd (the reference package is AGPL and runs only as a separate
program). Two agents of the published client on one hub:

* the recipient `<ns>/bob`: SynapseAgent(delivery_capabilities=...) composed
  with DeliveryParticipantBridge and a participant that answers every turn;
* the sender `<ns>/alice`: request_who(), request_delivery(...) with the
  incarnation from the who_snapshot, request_delivery_status,
  cancel_delivery; report_delivery_stage is exercised by the bridge.

Prints one JSON object per line: {"event": "frame", "who": "alice"|"bob",
"frame": {...}}, {"event": "op", "name": ..., "operation_key": ...},
and finally {"event": "done"}.

--scenario reuse: alice requests job-1 (idempotency key idem-1), repeats it
unchanged (a retry), then sends job-2 with the same idempotency key and job-3
with a fresh one; {"event": "answer", "name": ..., "frame": ...} is the hub's
private answer to each.

--scenario full: a next_turn delivery the bridge runs to completed, then a
second one cancelled right after it is requested, waited for until it is
terminal: completed (the bridge ran the turn) or cancelled (it confirmed the
cancel first); {"event": "terminal", "stage": ...} says which.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path


def emit(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj, default=repr) + "\n")
    sys.stdout.flush()


async def wait_for(frames: list, pred, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for f in frames:
            if pred(f):
                return f
        await asyncio.sleep(0.02)
    raise TimeoutError("no matching frame")


async def across(args, alice, seen, bob_name: str) -> None:
    """--scenario across: alice and bob on two hubs; alice learns bob's
    incarnation from the peer's roster, requests across, and follows the
    stages with status requests (they are not pushed across hubs)."""
    remote = f"{bob_name}@{args.peer}"
    await alice.request_who(hub=args.peer)
    who = await wait_for(seen["alice"], lambda f: f.get("type") == "who_snapshot"
                         and f.get("remote_hub") == args.peer)
    inc = who["delivery_sessions"][remote]["incarnation"]
    emit({"event": "incarnation", "value": inc})
    key = await alice.request_delivery(target=remote, target_incarnation=inc, mode="next_turn",
                                       body="summarise the log", deadline=time.time() + 60,
                                       request_id="job-1", idempotency_key="idem-1",
                                       task_id="task-1")
    emit({"event": "op", "name": "job-1", "operation_key": key})
    answer = await wait_for(seen["alice"], lambda f: f.get("type") in (
        "delivery_status", "delivery_refused") and f.get("request_id") == "job-1")
    emit({"event": "answer", "frame": answer})
    if answer["type"] != "delivery_status":
        emit({"event": "done"})
        return
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        count = len(seen["alice"])
        await alice.request_delivery_status(answer["operation_key"])
        status, until = None, time.monotonic() + 5
        while status is None and time.monotonic() < until:
            # the answer, not a pushed stage notification (it has an audience)
            status = next((f for f in seen["alice"][count:] if f.get("type") in (
                "delivery_status", "delivery_refused") and "audience" not in f), None)
            await asyncio.sleep(0.02)
        if status is not None and status.get("stage") == "completed":
            emit({"event": "completed", "frame": status})
            break
        await asyncio.sleep(0.2)
    emit({"event": "done"})


async def reuse(alice, seen, bob_name: str, inc: str) -> None:
    """--scenario reuse: one idempotency key under two request ids."""
    deadline = time.time() + 60
    sends = [("job-1", "idem-1"), ("job-1", "idem-1"), ("job-2", "idem-1"), ("job-3", "idem-3")]
    for n, (rid, key) in enumerate(sends):
        count = len(seen["alice"])
        op = await alice.request_delivery(target=bob_name, target_incarnation=inc,
                                          mode="next_turn", body=f"work for {rid}",
                                          deadline=deadline, request_id=rid,
                                          idempotency_key=key, task_id=f"task-{rid}")
        emit({"event": "op", "name": rid, "operation_key": op})
        answer, until = None, time.monotonic() + 10
        while answer is None and time.monotonic() < until:
            answer = next((f for f in seen["alice"][count:] if f.get("type") in (
                "delivery_status", "delivery_refused") and "audience" not in f
                and f.get("request_id") == rid), None)
            await asyncio.sleep(0.02)
        emit({"event": "answer", "name": f"{n}:{rid}", "frame": answer})


async def stop(alice, bob, bridge, tasks) -> None:
    for agent in (alice, bob):
        agent.running = False
        try:
            await asyncio.wait_for(agent.connection.close(), 3)
        except Exception:  # a connection already gone: nothing left to close
            pass
    close = bridge.close()
    if asyncio.iscoroutine(close):
        await close
    for task in tasks:
        task.cancel()


async def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--uri", required=True)
    ap.add_argument("--ns", default="iop")
    ap.add_argument("--ledger", required=True)
    ap.add_argument("--scenario", default="full")
    ap.add_argument("--bob-uri", help="bob's hub, for --scenario across (default --uri)")
    ap.add_argument("--peer", help="bob's hub id as alice's hub names it (--scenario across)")
    args = ap.parse_args()

    from synapse_channel.client.agent import SynapseAgent  # reference venv only
    from synapse_channel.participants.delivery_bridge import DeliveryParticipantBridge
    from synapse_channel.participants.participant import (Participant, ParticipantChannel,
                                                          ParticipantHealth)

    bob_name, alice_name = f"{args.ns}/bob", f"{args.ns}/alice"
    seen = {"alice": [], "bob": []}

    class Answering(Participant):
        identity = bob_name
        channel = ParticipantChannel.API

        def health(self):
            return ParticipantHealth(bob_name, ParticipantChannel.API, True, "ready")

        async def take_turn(self, request):
            emit({"event": "turn", "topic_id": request.topic_id, "prompt": request.prompt})
            return {"kind": "turn_result", "participant": bob_name, "channel": "api",
                    "topic_id": request.topic_id, "answer": "done", "rationale": "",
                    "abstained": False, "is_error": False, "reason": "", "session": "",
                    "cost_usd": 0.0, "stop_reason": "end", "model": "none",
                    "input_tokens": 0, "output_tokens": 0, "rate_limit_utilisation": None}

    box: dict = {}

    async def on_bob(frame):
        seen["bob"].append(frame)
        emit({"event": "frame", "who": "bob", "frame": frame})
        result = box["bridge"].on_message(frame)
        if asyncio.iscoroutine(result):
            await result

    async def on_alice(frame):
        seen["alice"].append(frame)
        emit({"event": "frame", "who": "alice", "frame": frame})

    alice = SynapseAgent(alice_name, on_alice, uri=args.uri, verbose=False)
    tasks = [asyncio.create_task(alice.connect())]
    if not await alice.wait_until_ready(timeout=5):
        emit({"event": "not_ready"})
        return 1
    bob = SynapseAgent(bob_name, on_bob, uri=args.bob_uri or args.uri, verbose=False,
                       delivery_capabilities={"next_turn": "native", "follow_up": "emulated"})
    bridge = box["bridge"] = DeliveryParticipantBridge(bob, Answering(),
                                                       ledger_path=Path(args.ledger))
    started = bridge.start()
    if asyncio.iscoroutine(started):
        await started
    tasks.append(asyncio.create_task(bob.connect()))
    await bob.wait_until_ready(timeout=5)
    await wait_for(seen["bob"], lambda f: f.get("type") == "delivery_session")
    if args.scenario == "across":
        await across(args, alice, seen, bob_name)
        await stop(alice, bob, bridge, tasks)
        return 0

    await alice.request_who()
    who = await wait_for(seen["alice"], lambda f: f.get("type") == "who_snapshot")
    inc = who["delivery_sessions"][bob_name]["incarnation"]
    emit({"event": "incarnation", "value": inc})

    if args.scenario == "reuse":
        await reuse(alice, seen, bob_name, inc)
        emit({"event": "done"})
        await stop(alice, bob, bridge, tasks)
        return 0

    def stage_of(key, stage):
        return lambda f: (f.get("type") == "delivery_status" and f.get("operation_key") == key
                          and f.get("stage") == stage)

    key = await alice.request_delivery(target=bob_name, target_incarnation=inc, mode="next_turn",
                                       body="summarise the log", deadline=time.time() + 60,
                                       request_id="job-1", idempotency_key="idem-1",
                                       task_id="task-1")
    emit({"event": "op", "name": "job-1", "operation_key": key})
    await wait_for(seen["alice"], stage_of(key, "completed"))
    await alice.request_delivery_status(key)
    await asyncio.sleep(0.3)

    # a second delivery, cancelled by its sender at once (a request: only the
    # executor's report ends it)
    key2 = await alice.request_delivery(target=bob_name, target_incarnation=inc,
                                        mode="steer", allowed_fallbacks=("follow_up",),
                                        body="second", deadline=time.time() + 60,
                                        request_id="job-2", idempotency_key="idem-2",
                                        task_id="task-2")
    emit({"event": "op", "name": "job-2", "operation_key": key2})
    await alice.cancel_delivery(key2, mutation_id="cancel-2")
    # A cancel is only a request: the bridge either runs the turn anyway (it
    # had the offer before the cancel) and reports completed, or confirms the
    # cancel without starting it and reports cancelled. Either is terminal:
    # wait for it (long enough for a loaded machine), then ask for the status.
    terminal = lambda f: (f.get("type") == "delivery_status" and "audience" in f  # noqa: E731
                          and f.get("operation_key") == key2
                          and f.get("stage") in ("completed", "cancelled"))
    try:
        note = await wait_for(seen["alice"], terminal, timeout=20.0)
        emit({"event": "terminal", "name": "job-2", "stage": note["stage"]})
    except TimeoutError:
        emit({"event": "no_terminal", "name": "job-2"})
    await alice.request_delivery_status(key2)
    await asyncio.sleep(0.5)
    emit({"event": "done"})
    await stop(alice, bob, bridge, tasks)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))

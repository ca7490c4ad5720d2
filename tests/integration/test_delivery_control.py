"""Interrupt and steer on a real hubd process with principals: the control
grant (the seed's DELIVERY_CONTROL) and a live claim of the request's task
are both needed, and every refusal is unauthorised_requester with nothing
journaled (docs/delivery.md, "Control")."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

from hubd.journal import principals as store
from tests.support.delivery_driver import Agent, delivery_rows
from tests.support.procs import hubd_process

CONTROL_CAPS = {"interrupt": "native", "steer": "native", "next_turn": "native"}


async def claim(agent: Agent, task_id: str) -> None:
    await agent.send("claim", task_id=task_id, paths=[f"src/{task_id}"])
    await agent.probe.recv_type("claim_granted", task_id=task_id)


async def release(agent: Agent, task_id: str) -> None:
    await agent.send("release", task_id=task_id)
    await agent.probe.recv_type("release_granted", task_id=task_id)


def test_control_needs_the_grant_and_the_task_claim(tmp_path):
    db = tmp_path / "hubd.db"
    # the operator's command, as documented
    made = subprocess.run([sys.executable, "-m", "hubd", "principal", "add", "lead",
                           "--seat", "C/lead", "--control", "C/worker", "--db", str(db),
                           "--json"], capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout)["grants"]["control"] == ["C/worker"]
    store.add(db, "peer", ["C/peer"])
    store.add(db, "worker", ["C/worker", "C/other"])
    tokens = {name: store.new_token(db, name, "test") for name in ("lead", "peer", "worker")}
    proc = hubd_process(tmp_path / "hub", db=db).start()

    async def case():
        worker = await Agent.join(proc.url, "C/worker", recipient=True, caps=CONTROL_CAPS,
                                  auth=tokens["worker"])
        other = await Agent.join(proc.url, "C/other", recipient=True, caps=CONTROL_CAPS,
                                 auth=tokens["worker"])
        lead = await Agent.join(proc.url, "C/lead", auth=tokens["lead"])
        peer = await Agent.join(proc.url, "C/peer", auth=tokens["peer"])
        before = delivery_rows(proc.db)

        def refused(answer: dict, rid: str) -> None:
            assert (answer["type"], answer["reason_code"], answer["request_id"]) == \
                ("delivery_refused", "unauthorised_requester", rid), answer

        # the grant alone is not enough: lead does not hold T-1's claim yet
        refused(await lead.request("C/worker", worker.incarnation, "no-claim",
                                   mode="interrupt", task_id="T-1"), "no-claim")
        await claim(lead, "T-1")
        # a claim of another task does not count
        refused(await lead.request("C/worker", worker.incarnation, "other-task",
                                   mode="steer", task_id="T-9"), "other-task")
        # the grant names C/worker only
        refused(await lead.request("C/other", other.incarnation, "not-granted",
                                   mode="interrupt", task_id="T-1"), "not-granted")
        # the claim alone is not enough either: peer holds T-2, has no grant
        await claim(peer, "T-2")
        refused(await peer.request("C/worker", worker.incarnation, "no-grant",
                                   mode="steer", task_id="T-2"), "no-grant")
        # and a grant does not borrow another seat's claim
        refused(await lead.request("C/worker", worker.incarnation, "peers-claim",
                                   mode="steer", task_id="T-2"), "peers-claim")
        assert delivery_rows(proc.db) == before, "a refusal was journaled"

        # grant and claim: admitted as interrupt, offered to the worker
        admitted = await lead.request("C/worker", worker.incarnation, "ok", mode="interrupt",
                                      task_id="T-1")
        assert (admitted["stage"], admitted["selected_mode"], admitted["quality"]) == \
            ("queued", "interrupt", "native"), admitted
        offer = await worker.offer("ok")
        assert (offer["selected_mode"], offer["sender"]) == ("interrupt", "C/lead")

        # an authority refusal does not fall back: with a next_turn fallback
        # the peer's steer is refused, not downgraded
        refused(await peer.request("C/worker", worker.incarnation, "fallback", mode="steer",
                                   allowed_fallbacks=["next_turn"], task_id="T-2"),
                "fallback")
        # follow-up modes need neither grant nor claim
        plain = await peer.request("C/worker", worker.incarnation, "plain", task_id="T-x")
        assert (plain["stage"], plain["selected_mode"]) == ("queued", "next_turn")

        # once the claim is released, control is gone again
        await release(lead, "T-1")
        refused(await lead.request("C/worker", worker.incarnation, "released",
                                   mode="interrupt", task_id="T-1"), "released")
        for agent in (worker, other, lead, peer):
            await agent.close()

    try:
        proc.db = proc.argv[proc.argv.index("--db") + 1]
        asyncio.run(case())
    finally:
        proc.stop()


def test_the_shared_token_grants_no_control(tmp_path):
    proc = hubd_process(tmp_path, "--token", "s3cret").start()

    async def case():
        worker = await Agent.join(proc.url, "C/worker", recipient=True, caps=CONTROL_CAPS,
                                  auth="s3cret")
        lead = await Agent.join(proc.url, "C/lead", auth="s3cret")
        await claim(lead, "T-1")
        answer = await lead.request("C/worker", worker.incarnation, "shared", mode="interrupt",
                                    task_id="T-1")
        assert (answer["type"], answer["reason_code"]) == \
            ("delivery_refused", "unauthorised_requester"), answer
        for agent in (worker, lead):
            await agent.close()

    try:
        asyncio.run(case())
    finally:
        proc.stop()

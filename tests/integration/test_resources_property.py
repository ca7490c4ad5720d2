"""Property: random offers (good, refused by the decision, refused at the
wire) from two agents with hub restarts. Live state always equals a fresh
replay of the journal; a refused offer changes neither (nor the journal's
last seq); the resources a snapshot lists are the model's.

Real in-process hub, real sockets, real SQLite."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.inproc import running_hub, settled
from tests.support.wsprobe import WsProbe

AGENTS = ["p/a", "p/b"]
LIMIT = 2  # --max-offers-per-agent

offer = st.fixed_dictionaries(
    {"kind": st.sampled_from(["gpu", "cpu", "", 5]), "name": st.sampled_from(["x", "y", "z"])},
    optional={"capacity": st.sampled_from([1, 3, 0, "lots"]),
              "meta": st.sampled_from([{}, {"zone": "eu"}, [1]])})
actions = st.one_of(st.tuples(st.just("offer"), st.integers(0, 1), offer),
                    st.tuples(st.just("restart")))


def _accepted(fields: dict) -> bool:
    return isinstance(fields["kind"], str) and fields["kind"] != "" \
        and fields.get("capacity", 1) in (1, 3) and isinstance(fields.get("meta", {}), dict)


class Run:
    def __init__(self, folder: Path):
        self.folder = folder
        self.model: dict[tuple, dict] = {}

    async def start(self):
        self.cm = running_hub(self.folder, max_offers_per_agent=LIMIT)
        self.server = await self.cm.__aenter__()
        self.probes = {}
        for name in AGENTS:
            probe = await WsProbe.open(self.server.url)
            await probe.recv_type("welcome")
            await probe.register(name)
            await probe.recv_type("presence_update", agent=name)
            self.probes[name] = probe

    async def stop(self):
        for probe in self.probes.values():
            await probe.close()
        await self.cm.__aexit__(None, None, None)

    async def check(self):
        await settled(self.server)
        assert await self.server.hub.load_state() == self.server.hub.router.state
        probe = self.probes[AGENTS[0]]
        await probe.send_json({"sender": AGENTS[0], "target": "System", "type": "state_request"})
        snap = await probe.recv_type("state_snapshot")
        assert snap["snapshot"]["resources"] == [self.model[k] for k in sorted(self.model)]

    async def offer(self, agent: str, fields: dict):
        await settled(self.server)
        router = self.server.hub.router
        before_seq, before = router.state.last_seq, await self.server.hub.load_state()
        probe = self.probes[agent]
        await probe.send_json({"sender": agent, "target": "all", "type": "resource",
                               "payload": "", **fields})
        # (the other agent's offers reach this socket too: broadcasts)
        got = await probe.recv(lambda f: f.get("type") == "error" or (
            f.get("type") == "resource_offered" and f.get("agent") == agent))
        key = (agent, fields["kind"], fields["name"])
        mine = sum(1 for k in self.model if k[0] == agent)
        if _accepted(fields) and (key in self.model or mine < LIMIT):
            assert got["type"] == "resource_offered", (fields, got)
            self.model[key] = {"agent": agent, "kind": fields["kind"], "name": fields["name"],
                               "capacity": fields.get("capacity", 1),
                               "meta": fields.get("meta", {})}
        else:
            assert got["type"] == "error", (fields, got)
            await settled(self.server)
            assert router.state.last_seq == before_seq
            assert await self.server.hub.load_state() == before == router.state


async def scenario(folder: Path, steps) -> None:
    run = Run(folder)
    await run.start()
    try:
        for step in steps:
            if step[0] == "offer":
                await run.offer(AGENTS[step[1]], step[2])
            else:
                await run.check()
                before = run.server.hub.router.state
                await run.stop()
                await run.start()
                assert run.server.hub.router.state == before
            await run.check()
    finally:
        await run.stop()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.data_too_large])
@given(st.lists(actions, min_size=3, max_size=20))
def test_offers_state_equals_replay_and_refusals_change_nothing(steps):
    with tempfile.TemporaryDirectory() as folder:
        asyncio.run(scenario(Path(folder), steps))

"""Property: random sequences of directed chats to absent seats, the targets
connecting and leaving, pointers refused from a local agent, and hub
restarts give exactly the escalations the rule says (per episode: one per
threshold crossing with window 0, one in all with a window longer than the
run), and the Router's projection always equals a fresh replay of the
journal; a refused pointer leaves both unchanged.

Real in-process hub, real sockets, real SQLite.
"""

import asyncio
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.inproc import running_hub, settled
from tests.support.wsprobe import WsProbe

SENDER = "p/s"
TARGETS = ["p/g1", "p/g2"]

target = st.integers(0, len(TARGETS) - 1)
actions = st.one_of(
    *[st.tuples(st.just("chat"), target)] * 6,
    st.tuples(st.just("visit"), target),
    st.tuples(st.just("pointer"), st.sampled_from([
        {"target": "p/g1", "count": 1, "origin_hub_id": "x", "owner_hub_id": "test-hub"},
        {"target": "", "count": 1}, "junk", None])),
    st.tuples(st.just("restart")),
)


class Run:
    def __init__(self, folder: Path, threshold: int, window: float):
        self.folder, self.threshold, self.window = folder, threshold, window
        self.server = self.cm = self.sender = None
        self.counts = {t: 0 for t in TARGETS}  # the model: dead letters this episode
        self.last = {t: None for t in TARGETS}  # count at the last escalation this episode
        self.expected: list[tuple[str, int]] = []
        self.told: list[tuple[str, int]] = []

    async def start(self):
        self.cm = running_hub(self.folder, dead_letter_escalation_threshold=self.threshold,
                              dead_letter_escalation_window=self.window)
        self.server = await self.cm.__aenter__()
        self.sender = await WsProbe.open(self.server.url)
        await self.sender.recv_type("welcome")
        await self.sender.register(SENDER)
        await self.sender.recv_type("presence_update", agent=SENDER)

    async def stop(self):
        await self.collect()
        await self.sender.close()
        await self.cm.__aexit__(None, None, None)

    async def settle(self):
        await self.sender.send_json({"sender": SENDER, "type": "who_request", "target": "System"})
        await self.sender.recv_type("who_snapshot", timeout=10)
        await settled(self.server)

    async def collect(self):
        await self.settle()
        self.told += [(f["escalation_target"], f["escalation_count"])
                      for f in self.sender.seen("dead_letter_escalation")]
        self.sender.frames = [f for f in self.sender.frames
                              if f.get("type") != "dead_letter_escalation"]
        self.sender._cursor = len(self.sender.frames)

    async def check(self):
        await self.settle()
        assert await self.server.hub.load_state() == self.server.hub.router.state

    async def chat(self, name: str):
        await self.sender.chat(SENDER, name, "hello")
        self.counts[name] += 1
        count, last = self.counts[name], self.last[name]
        due = count >= self.threshold if last is None else (
            count - last >= self.threshold and self.window == 0)
        if due:
            self.last[name] = count
            self.expected.append((name, count))

    async def visit(self, name: str):
        probe = await WsProbe.open(self.server.url)
        await probe.recv_type("welcome")
        await probe.register(name)
        await probe.recv_type("presence_update", agent=name)
        await probe.close()
        await self.sender.recv_type("presence_update", agent=name)
        self.counts[name], self.last[name] = 0, None  # a new episode

    async def pointer(self, body):
        await self.check()
        router = self.server.hub.router
        before_seq, before = router.state.last_seq, await self.server.hub.load_state()
        frame = {"sender": SENDER, "target": "System", "type": "dead_letter_forwarding"}
        if body is not None:
            frame["forwarding"] = body
        await self.sender.send_json(frame)
        error = await self.sender.recv_type("error")
        assert error.get("error_code") in ("dead_letter_forwarding_refused", "invalid_field"), \
            error
        await self.settle()
        assert router.state.last_seq == before_seq
        assert await self.server.hub.load_state() == before == router.state


async def scenario(folder: Path, threshold: int, window: float, steps):
    run = Run(folder, threshold, window)
    await run.start()
    try:
        for step in steps:
            kind = step[0]
            if kind == "chat":
                await run.chat(TARGETS[step[1]])
            elif kind == "visit":
                await run.visit(TARGETS[step[1]])
            elif kind == "pointer":
                await run.pointer(step[1])
            elif kind == "restart":
                await run.check()
                before = run.server.hub.router.state
                await run.stop()
                await run.start()
                assert run.server.hub.router.state == before
            await run.check()
    finally:
        await run.stop()
    assert run.told == run.expected


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.data_too_large])
@given(st.integers(1, 3), st.sampled_from([0.0, 3600.0]), st.lists(actions, min_size=3,
                                                                     max_size=25))
def test_escalations_follow_the_rule_and_state_equals_replay(threshold, window, steps):
    with tempfile.TemporaryDirectory() as folder:
        asyncio.run(scenario(Path(folder), threshold, window, steps))

"""Property: random sequences of claim, renewal, release, expiry, disconnect
and hub restart over random path sets (with and without path_identity) never
leave two live grants with overlapping scopes, every scope denial names a
live lease that really overlaps, fencing epochs only grow, and the Router's
projection always equals a fresh replay of the journal.

Real in-process hub, real sockets, real SQLite; expiry is real time passing
(leases of a tenth of a second) followed by the hub's own sweep command.
"""

import asyncio
import tempfile
import time
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hubd.core.commands import TICK
from hubd.state import claims as cl
from hubd.state import scope as sc
from tests.support.inproc import running_hub, settled
from tests.support.wsprobe import WsProbe

AGENTS = ["p/a", "p/b", "p/c"]
TASKS = ["t1", "t2", "t3", "t4", "t5"]
WORKTREES = ["w1", "w2"]
PATHS = ["", ".", "a", "a/", "a/b", "a/b/c", "a/c", "A/b", "b", "b/x", "../x"]
LIMITS = cl.LeaseLimits(min_ttl=0.05, max_claims_per_agent=4, max_paths_per_claim=3)
SHORT = 0.1

agent = st.integers(0, len(AGENTS) - 1)
task = st.sampled_from(TASKS)


@st.composite
def identities(draw, paths):
    """None (a legacy claim) or a path_identity for these display paths."""
    if draw(st.integers(0, 2)) == 0 or any(p in ("../x",) for p in paths):
        return None
    rows = [{"git_path": p, "filesystem_path": p,
             "object_id": draw(st.sampled_from(["", "dev:1", "dev:2"])),
             "object_scope": draw(st.sampled_from(["", "", "C", "C/m", "D"]))} for p in paths]
    return {"version": 1, "worktree_path": draw(st.sampled_from(["/canon", "/other"])),
            "worktree_object_id": "fe:1",
            "filesystem_namespace": draw(st.sampled_from(["sha256:h1", "sha256:h2"])),
            "case_sensitive": draw(st.booleans()), "paths": rows}


@st.composite
def claims(draw):
    paths = draw(st.lists(st.sampled_from(PATHS), max_size=4))
    return ("claim", draw(agent), draw(task), draw(st.sampled_from(WORKTREES)), paths,
            draw(identities(paths)), draw(st.sampled_from([None, SHORT])),
            draw(st.sampled_from([None, None, "k1", "k2"])))


actions = st.one_of(
    claims(), claims(), claims(),
    st.tuples(st.just("renew"), task),
    st.tuples(st.just("release"), agent, task, st.sampled_from(["right", "stale", "none"])),
    st.tuples(st.just("release"), agent, task, st.just("right")),
    st.tuples(st.just("expire")),
    st.tuples(st.just("disconnect"), agent),
)
actions = st.one_of(*[actions] * 10, st.tuples(st.just("restart")))


class Run:
    def __init__(self, folder: Path):
        self.folder = folder
        self.server = None
        self.cm = None
        self.probes: dict[str, WsProbe] = {}
        self.max_epoch = 0
        self.grants: dict[int, dict] = {}  # epoch -> the grant frame that carried it

    async def start(self):
        self.cm = running_hub(self.folder, claims=LIMITS)
        self.server = await self.cm.__aenter__()

    async def stop(self):
        for probe in self.probes.values():
            await probe.close()
        self.probes.clear()
        await self.cm.__aexit__(None, None, None)

    async def probe(self, name: str) -> WsProbe:
        probe = self.probes.get(name)
        if probe is None or probe.closed is not None:
            probe = await WsProbe.open(self.server.url)
            await probe.recv_type("welcome")
            await probe.register(name)
            await probe.recv_type("presence_update", agent=name)
            self.probes[name] = probe
        probe._cursor = len(probe.frames)  # only what answers the next request
        return probe

    @property
    def state(self) -> cl.ClaimState:
        return cl.claims_of(self.server.hub.router.state)

    async def settle(self):
        for name, probe in list(self.probes.items()):
            await probe.send_json({"sender": name, "type": "who_request", "target": "System"})
            await probe.recv_type("who_snapshot", timeout=10)
        # commands queued without a socket (the sweep) are handled, and their
        # outcome handed to the writer, before this resolves
        await settled(self.server)

    async def check(self):
        await self.settle()
        router = self.server.hub.router
        assert await self.server.hub.load_state() == router.state
        now = time.time()
        live = [lease for lease in self.state.leases.values() if lease["lease_expires_at"] > now]
        for i, a in enumerate(live):
            for b in live[i + 1:]:
                assert not sc.overlaps(cl.spec_of(a), cl.spec_of(b)), (a, b)

    def saw_grant(self, granted: dict):
        epoch = granted["epoch"]
        if epoch in self.grants:
            assert self.grants[epoch] == granted  # a keyed replay: the very same verdict
        else:
            assert epoch > self.max_epoch
            self.max_epoch = epoch
            self.grants[epoch] = granted

    async def claim(self, who, task_id, worktree, paths, ident, ttl, idem_key):
        probe = await self.probe(who)
        frame = {"sender": who, "target": "System", "type": "claim", "payload": task_id,
                 "task_id": task_id, "worktree": worktree, "paths": paths}
        if ident is not None:
            frame["path_identity"] = ident
        if ttl is not None:
            frame["ttl_seconds"] = ttl
        if idem_key is not None:
            frame["idem_key"] = idem_key
        await probe.send_json(frame)
        reply = await probe.recv(lambda f: f.get("type") in ("claim_denied", "error") or (
            f.get("type") == "claim_granted" and f.get("owner") == who))
        if reply["type"] == "claim_granted":
            self.saw_grant(reply)
        elif reply["type"] == "claim_denied" and reply["reason_code"] == "SCOPE_CONFLICT":
            # the named lease is live and really overlaps what was asked for
            other = self.state.leases[reply["conflict_task_id"]]
            assert other["lease_expires_at"] > reply["timestamp"]
            request = cl.read_claim(frame, who, LIMITS)
            assert sc.overlaps(request.spec, cl.spec_of(other))
        elif reply["type"] == "error":
            assert reply.get("error_code") == "idempotency_conflict", reply

    async def renew(self, task_id):
        lease = self.state.leases.get(task_id)
        if lease is None:
            return
        await self.claim(lease["owner"], task_id, lease["worktree"], lease["paths"],
                         lease.get("path_identity"), None, None)

    async def release(self, who, task_id, epoch_kind):
        probe = await self.probe(who)
        frame = {"sender": who, "target": "System", "type": "release", "payload": task_id,
                 "task_id": task_id}
        lease = self.state.leases.get(task_id)
        if epoch_kind != "none" and lease is not None:
            frame["epoch"] = lease["epoch"] - (epoch_kind == "stale")
        await probe.send_json(frame)
        reply = await probe.recv(lambda f: f.get("type") == "release_denied" or (
            f.get("type") == "release_granted" and f.get("owner") == who))
        if reply["type"] == "release_granted":
            assert lease is not None and lease["owner"] == who
            assert epoch_kind != "stale"

    async def expire(self):
        soonest = [lease["lease_expires_at"] for lease in self.state.leases.values()]
        soonest = [t for t in soonest if t - time.time() < 1.0]
        if soonest:
            await asyncio.sleep(max(0.0, max(soonest) - time.time()) + 0.01)
        await self.server.hub.router.inbox.put(TICK)  # the lease sweep among the periodic work


async def scenario(folder: Path, steps):
    run = Run(folder)
    await run.start()
    try:
        for step in steps:
            kind = step[0]
            if kind == "claim":
                _, who, task_id, worktree, paths, ident, ttl, idem_key = step
                await run.claim(AGENTS[who], task_id, worktree, paths, ident, ttl, idem_key)
            elif kind == "renew":
                await run.renew(step[1])
            elif kind == "release":
                await run.release(AGENTS[step[1]], step[2], step[3])
            elif kind == "expire":
                await run.expire()
            elif kind == "disconnect":
                probe = run.probes.pop(AGENTS[step[1]], None)
                if probe is not None:
                    await probe.close()
            elif kind == "restart":
                await run.check()
                before = run.server.hub.router.state
                await run.stop()
                await run.start()
                assert run.server.hub.router.state == before
            await run.check()
    finally:
        await run.stop()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.data_too_large])
@given(st.lists(actions, min_size=5, max_size=40))
def test_no_two_live_grants_overlap_and_state_equals_replay(steps):
    with tempfile.TemporaryDirectory() as folder:
        asyncio.run(scenario(Path(folder), steps))

"""Claims agents for multi-host tests (run inside a site's network namespace;
they report on stdout as JSON lines):

    python -m tests.support.claim_driver claim --url URL --name P/a --task t-1 --paths src,docs
    python -m tests.support.claim_driver release --url URL --name P/a --task t-1 --epoch 3
    python -m tests.support.claim_driver state --url URL --name P/b
    python -m tests.support.claim_driver storm --url URL --prefix PROJ/west --agents 3 \
        --duration 25 --seed 7

`claim` prints the hub's answer (claim_granted or claim_denied); the lease
outlives the socket (it lasts its TTL). `release` prints release_granted or
release_denied. `state` prints the hub's active claims.

`storm` runs several agents at once, each on its own socket, for --duration
seconds: random task ids from a small pool, random paths from a small tree
(so scopes overlap often), short random TTLs, releasing some of what they
hold. One line per attempt: {"event": "claim"|"release", "agent", "task_id",
..., "sent", "recv", "answer": the answer's type or null, "frame": the answer}.
An agent whose socket breaks (its hub restarted) reports the attempt in flight
with answer null and error, reconnects and carries on. A final
{"event": "done"} line ends the output.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time

import aiohttp

# A small tree: with one or two of these per claim, scopes overlap often.
TREE = ("src", "src/core", "src/core/lease.py", "src/core/scope.py", "src/ui", "src/ui/app.ts",
        "docs", "docs/guide.md", "tests", "tests/test_core.py", "README.md")
WORKTREES = ("/repo", "/repo", "/repo", "/repo-b")


async def _session(url: str, name: str):
    session = aiohttp.ClientSession()
    ws = await session.ws_connect(url, ssl=False, heartbeat=10)
    await ws.send_str(json.dumps({"sender": name, "target": "System", "type": "heartbeat",
                                  "payload": "online"}))
    return session, ws


async def _until(ws, predicate, timeout: float) -> dict:
    async with asyncio.timeout(timeout):
        async for msg in ws:
            if msg.type != aiohttp.WSMsgType.TEXT:
                break
            frame = json.loads(msg.data)
            if predicate(frame):
                return frame
    raise TimeoutError("no answer")


async def run(args) -> int:
    session, ws = await _session(args.url, args.name)
    try:
        if args.command == "release":
            await ws.send_str(json.dumps({
                "sender": args.name, "target": "System", "type": "release", "payload": args.task,
                "task_id": args.task, "epoch": args.epoch}))
            answer = await _until(ws, lambda f: f.get("type") in ("release_granted",
                                                                  "release_denied")
                                  and f.get("task_id") == args.task, args.timeout)
        elif args.command == "claim":
            await ws.send_str(json.dumps({
                "sender": args.name, "target": "System", "type": "claim", "payload": args.task,
                "task_id": args.task, "worktree": "/repo", "paths": args.paths.split(","),
                "ttl_seconds": 300}))
            answer = await _until(ws, lambda f: f.get("type") in ("claim_granted", "claim_denied")
                                  and f.get("task_id") == args.task, args.timeout)
        else:
            await ws.send_str(json.dumps({"sender": args.name, "type": "state_request"}))
            answer = await _until(ws, lambda f: f.get("type") == "state_snapshot", args.timeout)
            answer = {"active_claims": answer["snapshot"]["active_claims"]}
        print(json.dumps(answer), flush=True)
    finally:
        await ws.close()
        await session.close()
    return 0


class _Agent:
    """One storm agent: one socket, one request in flight at a time."""

    def __init__(self, args, name: str, rng: random.Random):
        self.args, self.name, self.rng = args, name, rng
        self.session: aiohttp.ClientSession | None = None
        self.ws = None
        self.held: dict[str, dict] = {}  # task_id -> {epoch, expires}

    async def connect(self, deadline: float) -> bool:
        while time.time() < deadline:
            try:
                self.session, self.ws = await _session(self.args.url, self.name)
                return True
            except (aiohttp.ClientError, OSError, asyncio.TimeoutError):
                await self.drop()
                await asyncio.sleep(0.2)
        return False

    async def drop(self) -> None:
        if self.ws is not None:
            await self.ws.close()
        if self.session is not None:
            await self.session.close()
        self.session = self.ws = None

    async def ask(self, frame: dict, match) -> tuple[dict | None, str | None]:
        try:
            await self.ws.send_str(json.dumps(frame))
            return await _until(self.ws, match, self.args.timeout), None
        except TimeoutError:
            return None, "closed" if self.ws.closed else "timeout"
        except (aiohttp.ClientError, OSError, ConnectionError) as exc:
            return None, f"closed: {type(exc).__name__}"

    async def run(self, deadline: float) -> None:
        rng, args, name = self.rng, self.args, self.name
        if not await self.connect(deadline):
            return
        while time.time() < deadline:
            now = time.time()
            live = [t for t, h in self.held.items() if h["expires"] > now]
            record = {"agent": name}
            if live and rng.random() < args.release_prob:
                task = rng.choice(live)
                epoch = self.held.pop(task)["epoch"]
                record.update(event="release", task_id=task, epoch=epoch)
                frame = {"sender": name, "target": "System", "type": "release",
                         "payload": task, "task_id": task, "epoch": epoch}
                match = (lambda f, task=task: f.get("type") in ("release_granted",
                                                                "release_denied")
                         and f.get("task_id") == task
                         and (f.get("owner") == name or f.get("target") == name))
            else:
                task = f"t{rng.randrange(args.tasks)}"
                paths = sorted(rng.sample(TREE, rng.choice((1, 1, 2))))
                ttl = round(rng.uniform(args.ttl_min, args.ttl_max), 2)
                worktree = rng.choice(WORKTREES)
                record.update(event="claim", task_id=task, worktree=worktree, paths=paths,
                              ttl=ttl)
                frame = {"sender": name, "target": "System", "type": "claim", "payload": task,
                         "task_id": task, "worktree": worktree, "paths": paths,
                         "ttl_seconds": ttl}
                match = (lambda f, task=task: f.get("type") in ("claim_granted", "claim_denied")
                         and f.get("task_id") == task
                         and (f.get("type") == "claim_denied" or f.get("owner") == name))
            record["sent"] = time.time()
            answer, error = await self.ask(frame, match)
            record.update(recv=time.time(), answer=answer.get("type") if answer else None,
                          frame=answer, error=error)
            print(json.dumps(record), flush=True)
            if answer and answer["type"] == "claim_granted":
                self.held[task] = {"epoch": answer.get("epoch"),
                                   "expires": answer.get("lease_expires_at") or 0}
            if error is not None:
                # a broken or stale socket: start again on a fresh one
                await self.drop()
                if not await self.connect(deadline):
                    return
            await asyncio.sleep(rng.uniform(0, args.pause))
        await self.drop()


async def storm(args) -> int:
    rng = random.Random(args.seed)
    deadline = time.time() + args.duration
    agents = [_Agent(args, f"{args.prefix}-{i}", random.Random(rng.random()))
              for i in range(args.agents)]
    await asyncio.gather(*(a.run(deadline) for a in agents))
    print(json.dumps({"event": "done"}), flush=True)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=("claim", "release", "state", "storm"))
    parser.add_argument("--url", required=True)
    parser.add_argument("--name")
    parser.add_argument("--task")
    parser.add_argument("--epoch", type=int)
    parser.add_argument("--paths", default="src")
    parser.add_argument("--timeout", type=float, default=20.0)
    storm_ = parser.add_argument_group("storm")
    storm_.add_argument("--prefix", help="agent names are PREFIX-0, PREFIX-1, ...")
    storm_.add_argument("--agents", type=int, default=3)
    storm_.add_argument("--duration", type=float, default=20.0)
    storm_.add_argument("--seed", type=int, default=0)
    storm_.add_argument("--tasks", type=int, default=12, help="task ids t0..t(N-1)")
    storm_.add_argument("--ttl-min", type=float, default=5.0)
    storm_.add_argument("--ttl-max", type=float, default=10.0)
    storm_.add_argument("--release-prob", type=float, default=0.5)
    storm_.add_argument("--pause", type=float, default=0.3, help="most seconds between attempts")
    args = parser.parse_args()
    if args.command == "storm":
        if not args.prefix:
            parser.error("storm needs --prefix")
        return asyncio.run(storm(args))
    if not args.name:
        parser.error(f"{args.command} needs --name")
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())

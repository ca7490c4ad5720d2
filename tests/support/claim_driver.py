"""A one-shot claims agent for multi-host tests (runs inside a site's network
namespace and prints one JSON line):

    python -m tests.support.claim_driver claim --url URL --name P/a --task t-1 --paths src,docs
    python -m tests.support.claim_driver state --url URL --name P/b

`claim` prints the hub's answer (claim_granted or claim_denied); the lease
outlives the socket (it lasts its TTL). `state` prints the hub's active claims.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

import aiohttp


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
        if args.command == "claim":
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


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=("claim", "state"))
    parser.add_argument("--url", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--task")
    parser.add_argument("--paths", default="src")
    parser.add_argument("--timeout", type=float, default=20.0)
    return asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())

"""REDSYN benchmark: request -> reply round trips between REDSYN agents over
keep-alive HTTP, and the wake latency of a waiting long poll.

Each round starts a fresh hubd with a fresh journal (its own temporary
directory), makes one node per agent with `hubd redsyn login`, runs the
scenarios in this process (aiohttp client, keep-alive connections), and
stops the hub by its PID. Rounds interleave the variants; the table shows
medians over rounds.

  rt-w1    8 agents (4 askers, 4 answerers), one request in flight per asker
  rt-w16   8 agents, 16 requests in flight per asker
  wake     one long poll waiting; a message posted; the time from sending the
           POST to the poll's answer arriving

A round trip: the asker POSTs a request; the answerer's long poll returns it;
the answerer POSTs the reply (which closes the request); the asker's long poll
returns the reply and the asker acks it. Every step is journaled (takes are
leases) and committed before its answer.

    .venv/bin/python -m tests.bench.bench_redsyn                 # 3 rounds
    .venv/bin/python -m tests.bench.bench_redsyn --quick         # 1 round, 5 s
    .venv/bin/python -m tests.bench.bench_redsyn --json out.json

Measures; never asserts. There is no REDSYN reference to run beside it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import aiohttp  # noqa: E402

from tests.support.procs import hubd_process  # noqa: E402

PAIRS = 4
HEADERS = {"Content-Type": "application/json", "Redsyn-Version": "2026-09-25"}


def login(db: Path, person: str) -> str:
    out = subprocess.run([sys.executable, "-m", "hubd", "redsyn", "login", "--db", str(db),
                          "--person", person, "--name", "bench", "--json"],
                         capture_output=True, text=True, check=True, timeout=60)
    return json.loads(out.stdout)["token"]


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(p / 100 * len(values)))]


class Agent:
    def __init__(self, http: aiohttp.ClientSession, base: str, token: str, address: str):
        self.http, self.base, self.address = http, base, address
        self.headers = {**HEADERS, "Authorization": f"Bearer {token}"}

    async def post(self, document: dict) -> dict:
        async with self.http.post(self.base + "/messages", data=json.dumps(document),
                                  headers=self.headers) as answer:
            body = await answer.json()
            if answer.status not in (200, 201):
                raise RuntimeError(f"POST {answer.status}: {body}")
            return body

    async def take(self, wait: float = 30) -> list:
        async with self.http.get(f"{self.base}/inbox/{self.address}",
                                 params={"wait": str(wait), "lease": "300"},
                                 headers=self.headers) as answer:
            body = await answer.json()
            if answer.status != 200:
                raise RuntimeError(f"GET inbox {answer.status}: {body}")
            return body["items"]

    async def ack(self, ids: list) -> None:
        async with self.http.post(f"{self.base}/inbox/{self.address}/ack",
                                  data=json.dumps({"ids": ids}), headers=self.headers) as answer:
            await answer.read()


async def round_trips(base: str, tokens: dict, window: int, seconds: float) -> dict:
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    async with aiohttp.ClientSession(connector=connector) as http:
        askers = [Agent(http, base, tokens[f"a{i}"], f"bench/a/u{i}/ask") for i in range(PAIRS)]
        answerers = [Agent(http, base, tokens[f"b{i}"], f"bench/a/v{i}/answer")
                     for i in range(PAIRS)]
        latencies: list[float] = []
        started: dict[str, float] = {}
        done = 0
        measuring = False
        stop = asyncio.Event()

        async def send(asker: Agent, answerer: Agent) -> None:
            id_ = "q" + uuid.uuid4().hex
            started[id_] = time.perf_counter()
            await asker.post({"v": 1, "id": id_, "kind": "request", "from": asker.address,
                              "to": answerer.address,
                              "body": {"type": "text/plain", "text": "ping"}})

        async def answer_loop(answerer: Agent) -> None:
            while not stop.is_set():
                items = await answerer.take(wait=2)
                await asyncio.gather(*(answerer.post({
                    "v": 1, "id": "r" + e["id"], "kind": "reply", "from": answerer.address,
                    "reply_to": e["id"], "body": {"type": "text/plain", "text": "pong"}})
                    for e in items if e["kind"] == "request"))

        async def ask_loop(asker: Agent, answerer: Agent) -> None:
            nonlocal done
            await asyncio.gather(*(send(asker, answerer) for _ in range(window)))
            while not stop.is_set():
                items = await asker.take(wait=2)
                if not items:
                    continue
                now = time.perf_counter()
                for e in items:
                    began = started.pop(e["reply_to"], None)
                    if began is not None and measuring:
                        latencies.append(now - began)
                        done += 1
                await asker.ack([e["id"] for e in items])
                if not stop.is_set():
                    await asyncio.gather(*(send(asker, answerer) for _ in items))

        tasks = [asyncio.create_task(answer_loop(b)) for b in answerers]
        tasks += [asyncio.create_task(ask_loop(a, b)) for a, b in zip(askers, answerers)]
        await asyncio.sleep(1.0)  # warm-up
        measuring = True
        t0 = time.perf_counter()
        await asyncio.sleep(seconds)
        measuring = False
        elapsed = time.perf_counter() - t0
        count = done
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
    return {"round_trips_per_s": count / elapsed, "count": count,
            "p50_ms": pct(latencies, 50) * 1000, "p99_ms": pct(latencies, 99) * 1000}


async def wake_latency(base: str, tokens: dict, samples: int) -> dict:
    async with aiohttp.ClientSession() as http:
        sender = Agent(http, base, tokens["a0"], "bench/a/u0/poke")
        waiter = Agent(http, base, tokens["b0"], "bench/a/v0/wait")
        latencies = []
        for n in range(samples + 10):
            poll = asyncio.create_task(waiter.take(wait=30))
            await asyncio.sleep(0.03)  # the poll is waiting at the hub
            began = time.perf_counter()
            post = asyncio.create_task(sender.post({
                "v": 1, "id": f"w{n}-{uuid.uuid4().hex[:8]}", "kind": "request",
                "from": sender.address, "to": waiter.address,
                "body": {"type": "text/plain", "text": "wake"}}))
            items = await poll
            woke = time.perf_counter()
            await post
            await waiter.ack([e["id"] for e in items])
            if n >= 10:
                latencies.append(woke - began)
    return {"p50_ms": pct(latencies, 50) * 1000, "p99_ms": pct(latencies, 99) * 1000,
            "samples": len(latencies)}


def run_variant(variant: str, seconds: float, samples: int) -> dict:
    work = Path(tempfile.mkdtemp(prefix="bench-redsyn-"))
    try:
        db = work / "hubd.db"
        tokens = {}
        for i in range(PAIRS):
            tokens[f"a{i}"] = login(db, f"bench/a/u{i}")
            tokens[f"b{i}"] = login(db, f"bench/a/v{i}")
        hub = hubd_process(work, "--redsyn-messages-per-day", "100000000",
                           "--redsyn-max-pending-messages", "1000000", db=db,
                           hub_id="bench-redsyn").start()
        try:
            base = hub.http_url + "/redsyn/v1"
            cpu0 = _cpu(hub.pid)
            if variant == "wake":
                result = asyncio.run(wake_latency(base, tokens, samples))
            else:
                window = int(variant.split("-w")[1])
                result = asyncio.run(round_trips(base, tokens, window, seconds))
            result["hub_cpu_s"] = _cpu(hub.pid) - cpu0
        finally:
            hub.stop()
        return result
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--samples", type=int, default=300)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.seconds, args.samples = 1, 5.0, 100
    variants = ("rt-w1", "rt-w16", "wake")
    results: dict[str, list] = {v: [] for v in variants}
    for r in range(args.rounds):
        for variant in variants:
            result = run_variant(variant, args.seconds, args.samples)
            results[variant].append(result)
            print(f"round {r + 1} {variant}: " + ", ".join(
                f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}"
                for k, v in result.items()), flush=True)
    print()
    print(f"{'variant':8} {'rt/s':>10} {'p50 ms':>9} {'p99 ms':>9} {'hub cpu s':>10}")
    for variant in variants:
        rows = results[variant]
        med = {k: statistics.median(row[k] for row in rows) for k in rows[0]
               if isinstance(rows[0][k], (int, float))}
        rate = f"{med['round_trips_per_s']:.0f}" if "round_trips_per_s" in med else "-"
        print(f"{variant:8} {rate:>10} {med['p50_ms']:>9.2f} {med['p99_ms']:>9.2f} "
              f"{med['hub_cpu_s']:>10.2f}")
    print("goals: >= 2,000 round trips/s (rt-w16), wake p50 < 5 ms")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

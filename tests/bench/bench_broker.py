"""Broker door benchmark: send -> push latency and sends/s, beside the WebSocket door.

Each round starts a *fresh* hubd (fresh journal in its own temporary folder,
`--broker-no-rate-limit` so the 20 sends / 60 s per handle limit does not cap
the run) and measures, interleaved:

  broker-lat   two listening broker sessions; A sends to B one message at a time;
               latency = from writing the send line to B reading its push event
  ws-lat       the same over the WebSocket door: two agents, a directed chat, one
               at a time; latency = from sending the frame to the recipient reading it
  broker-rate  S sender connections (strict in-order lines each, so S requests in
               flight), each to its own listening receiver, which acks what it got
               every 100 pushes (the unread cap is 200); sends/s = sends answered ok
               per second of the measured phase

The client runs in this process on the same 2-core box as the hub. Measures;
never asserts. For example:

    python -m tests.bench.bench_broker                 # 3 rounds
    python -m tests.bench.bench_broker --rounds 1 --count 500 --rate-seconds 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import aiohttp  # noqa: E402

from tests.support.broker_client import BrokerClient  # noqa: E402
from tests.support.procs import connect_broker, hubd_process  # noqa: E402


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def broker_session(folder: Path, name: str, listen: bool) -> BrokerClient:
    c = await connect_broker(folder / "hubd.db")
    await c.call("session", event="session-start", client="other", cliSessionId=name,
                 host={"hostPid": 100000 + hash(name) % 100000, "hostStart": 1}, handle=name,
                 listen=listen)
    return c


async def broker_latency(folder: Path, count: int, warmup: int) -> list[float]:
    a = await broker_session(folder, "bench-a", True)
    b = await broker_session(folder, "bench-b", True)
    samples = []
    for i in range(warmup + count):
        started = time.perf_counter()
        id_ = a.take_id()
        await a.send_line({"v": 2, "id": id_, "type": "send", "threadId": None,
                           "to": "bench-b", "body": f"message {i}"})
        await b.event("push")
        elapsed = time.perf_counter() - started
        answer = await a.answer()
        assert answer["ok"], answer
        if i >= warmup:
            samples.append(elapsed)
        if i % 100 == 99:  # keep b's unread count under the cap
            inbox = await b.call("inbox", unreadOnly=True)
            ids = [m["messageId"] for t in inbox["threads"] for m in t["messages"]]
            if ids:
                await b.call("ack", ids=ids)
    await a.close()
    await b.close()
    return samples


async def ws_latency(url: str, count: int, warmup: int) -> list[float]:
    async with aiohttp.ClientSession() as http:
        receiver = await http.ws_connect(url)
        sender = await http.ws_connect(url)
        await receiver.receive()  # welcome
        await sender.receive()
        await receiver.send_str(json.dumps({"sender": "bench/r", "target": "System",
                                            "type": "heartbeat", "payload": "online"}))
        await sender.send_str(json.dumps({"sender": "bench/s", "target": "System",
                                          "type": "who_request", "payload": ""}))
        # wait until the receiver is registered (the sender sees it in a presence update)
        while True:
            frame = json.loads((await sender.receive()).data)
            if "bench/r" in (frame.get("online_agents") or []):
                break
        samples = []
        for i in range(warmup + count):
            started = time.perf_counter()
            await sender.send_str(json.dumps({"sender": "bench/s", "target": "bench/r",
                                              "type": "chat", "payload": f"message {i}"}))
            while True:
                frame = json.loads((await receiver.receive()).data)
                if frame.get("type") == "chat" and frame.get("sender") == "bench/s":
                    break
            if i >= warmup:
                samples.append(time.perf_counter() - started)
        await receiver.close()
        await sender.close()
        return samples


async def broker_rate(folder: Path, senders: int, seconds: float, window: int) -> float:
    pairs = []
    for i in range(senders):
        s = await broker_session(folder, f"bench-s{i}", False)
        r = await broker_session(folder, f"bench-r{i}", True)
        pairs.append((s, r))
    stop = asyncio.Event()
    answered = [0]
    measuring = [False]

    async def sender_loop(s: BrokerClient, target: str) -> None:
        # pipelined: up to `window` send lines in flight, answers read in order
        n = 0
        in_flight = 0
        while not stop.is_set():
            while in_flight < window:
                await s.send_line({"v": 2, "id": s.take_id(), "type": "send",
                                   "threadId": None, "to": target, "body": f"m{n}"})
                n += 1
                in_flight += 1
            answer = await s.answer(timeout=30)
            in_flight -= 1
            if answer["ok"]:
                if measuring[0]:
                    answered[0] += 1
            elif answer["error"]["code"] == "cap_inbox":
                await asyncio.sleep(0.001)
            else:
                raise RuntimeError(answer)

    async def receiver_loop(r: BrokerClient) -> None:
        got: list[int] = []
        while not stop.is_set():
            try:
                event = await r.event("push", timeout=1.0)
            except TimeoutError:
                continue
            got.append(event["payload"]["message"]["messageId"])
            if len(got) >= 100:
                ack_id = r.take_id()
                await r.send_line({"v": 2, "id": ack_id, "type": "ack", "ids": got})
                got = []

    async def drain_answers(r: BrokerClient) -> None:
        while not stop.is_set():
            try:
                await r.answer(timeout=1.0)
            except TimeoutError:
                continue

    tasks = []
    for i, (s, r) in enumerate(pairs):
        tasks.append(asyncio.ensure_future(sender_loop(s, f"bench-r{i}")))
        tasks.append(asyncio.ensure_future(receiver_loop(r)))
        tasks.append(asyncio.ensure_future(drain_answers(r)))
    await asyncio.sleep(1.0)  # warm up
    measuring[0] = True
    started = time.perf_counter()
    await asyncio.sleep(seconds)
    measuring[0] = False
    elapsed = time.perf_counter() - started
    stop.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    for s, r in pairs:
        await s.close()
        await r.close()
    return answered[0] / elapsed


def fresh_hub(workdir: Path):
    return hubd_process(workdir, "--broker-no-rate-limit", "--no-durable-ingress-quota",
                        hub_id="bench-broker").start()


async def main_async(args) -> int:
    results: dict[str, list] = {"broker-lat": [], "ws-lat": [], "broker-rate": []}
    for round_ in range(args.rounds):
        for kind in ("broker-lat", "ws-lat", "broker-rate"):
            workdir = Path(tempfile.mkdtemp(prefix="bench-broker-"))
            hub = fresh_hub(workdir)
            try:
                if kind == "broker-lat":
                    samples = await broker_latency(workdir, args.count, args.warmup)
                    results[kind].append((pct(samples, 0.5), pct(samples, 0.99)))
                elif kind == "ws-lat":
                    samples = await ws_latency(hub.url, args.count, args.warmup)
                    results[kind].append((pct(samples, 0.5), pct(samples, 0.99)))
                else:
                    results[kind].append(await broker_rate(workdir, args.senders,
                                                           args.rate_seconds, args.window))
            finally:
                hub.stop()
                shutil.rmtree(workdir, ignore_errors=True)
            last = results[kind][-1]
            shown = (f"p50 {last[0] * 1000:.3f} ms  p99 {last[1] * 1000:.3f} ms"
                     if kind != "broker-rate" else f"{last:,.0f} sends/s")
            print(f"round {round_ + 1} {kind:12s} {shown}", flush=True)
    print()
    print(f"{'':14s}{'p50 (median of rounds)':>26s}{'p99 (median of rounds)':>26s}")
    for kind in ("broker-lat", "ws-lat"):
        p50 = statistics.median(r[0] for r in results[kind]) * 1000
        p99 = statistics.median(r[1] for r in results[kind]) * 1000
        print(f"{kind:14s}{p50:>23.3f} ms{p99:>23.3f} ms")
    ratio = statistics.median(b[0] / w[0] for b, w in zip(results["broker-lat"],
                                                           results["ws-lat"]))
    print(f"broker/ws p50 ratio (median of paired rounds): {ratio:.2f}")
    print(f"broker-rate   {statistics.median(results['broker-rate']):,.0f} sends/s "
          f"({args.senders} senders x {args.window} in flight; goal >= 5,000)")
    print("goals: broker send->push p50 < 1 ms; >= 5,000 sends/s")
    if args.json:
        Path(args.json).write_text(json.dumps(results))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--count", type=int, default=2000, help="latency samples per run")
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--senders", type=int, default=8)
    parser.add_argument("--window", type=int, default=16,
                        help="send lines each sender keeps in flight (pipelined)")
    parser.add_argument("--rate-seconds", type=float, default=10.0)
    parser.add_argument("--json", help="write the raw figures here")
    return asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())

"""Multi-hub authority: forwarded claim round trips and watch lag. Measures and
prints; never asserts.

    .venv/bin/python -m tests.bench.bench_authority                   # (a) and (b), 3 rounds of (a)
    .venv/bin/python -m tests.bench.bench_authority --quick           # 1 round, smaller counts
    .venv/bin/python -m tests.bench.bench_authority --only a --pairs hubd
    .venv/bin/python -m tests.bench.bench_authority --only b --rates 200,1000,2000 --intervals 1,5
    .venv/bin/python -m tests.bench.bench_authority --json /tmp/authority.json

(a) Forwarded claims. A pair of real hubs over mutual TLS: east owns PROJ
    (`--namespace-owner PROJ=east`, serving policy granting west PROJ, wss://),
    west routes PROJ claims to it (`--namespace-owner PROJ=east --claim-peer
    east=wss://... --claim-peer-pin east=sha256:... --multihub-client-certfile/keyfile`).
    K sockets (1, then 8: the claims in flight) each run claim -> own
    claim_granted -> release (granted epoch) -> own release_granted, every
    task on its own path. Claim latency: from just before the claim is sent to
    the moment its claim_granted is read (on west: the grant east relayed).
    The same client then runs against east directly (a local claim) in the
    same round, so "forwarded" and "local" share a pair, a journal age and the
    box's load. Both hubds and the reference hub (0.99.38, its own venv, the
    same flags; both with --no-durable-ingress-quota and
    --max-claims-per-agent 100000), interleaved per round, fresh journals per
    round. Hub CPU per round trip is read from /proc for both hubs.

(b) Watch lag (hubd). East watches west (`--multihub-watch west=... 
    --multihub-watch-interval I`, I = 1 s -- the floor; a smaller value is
    raised to 1 -- and 5 s). A writer on west sends chats at R/s (paced every
    10 ms, to a sink socket, west with --private-directed-messages) so west
    journals a steady stream; every 0.25 s a marker agent on west claims a task
    of its own (namespace BENCH, which no owner map governs, so west grants it
    locally and east's authority is not involved). The marker's seq and
    journal time are read from west's journal (read-only); east's /health
    `multihub.watches.west.cursor` is polled every 50 ms. Lag = when the
    cursor was first seen at or past the marker's seq - the marker's journal
    ts (so it includes up to one interval of waiting, the pull, and up to 50 ms
    of polling resolution). Also: events/s west journaled, the offered rate,
    and east's remaining lag (events) at the end.

Figures on this 2-core shared box carry 20-25% A/A noise (see README.md); the
`other` column is the CPU used by anything but the two hubs and this process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import aiohttp  # noqa: E402

from tests.bench.loadgen import box_cpu_ticks, percentiles, proc_cpu_seconds  # noqa: E402
from tests.support.federation import make_pki, site_flags, write_serving_policy  # noqa: E402
from tests.support.procs import (HubProcess, free_port, hubd_process,  # noqa: E402
                                 reference_hub_process)

CAP = "100000"
BUSY = 0.3


# ----------------------------------------------------------------------------- sites

class Site:
    """Certificates and both serving policies, made once per benchmark."""

    def __init__(self, folder: Path):
        self.pki = make_pki(folder / "pki", ["east", "west"])
        self.east_policy = write_serving_policy(folder / "east-policy", self.pki,
                                                {"west": ["PROJ"]})
        self.west_policy = write_serving_policy(folder / "west-policy", self.pki,
                                                {"east": ["PROJ"]})


def claim_pair(kind: str, workdir: Path, site: Site) -> tuple[HubProcess, HubProcess]:
    """(east, west) for (a), not started: east owns PROJ, west forwards to it."""
    pki = site.pki
    east_port = free_port()
    common = ["--no-durable-ingress-quota", "--max-claims-per-agent", CAP,
              "--namespace-owner", "PROJ=east"]
    east_args = [*site_flags(pki, "east", site.east_policy).serve, *common]
    west_args = [*site_flags(pki, "west", None).connect, *common,
                 "--claim-peer", f"east=wss://127.0.0.1:{east_port}/",
                 "--claim-peer-pin", f"east={pki.server_pin('east')}"]
    if kind == "reference":
        east = reference_hub_process(workdir / "east", *east_args, port=east_port,
                                     hub_id="east", scheme="wss")
        west = reference_hub_process(workdir / "west", *west_args, hub_id="west")
    else:
        east = hubd_process(workdir / "east", *east_args, port=east_port, hub_id="east",
                            scheme="wss")
        west = hubd_process(workdir / "west", *west_args, hub_id="west")
    return east, west


def watch_pair(workdir: Path, site: Site, interval: float) -> tuple[HubProcess, HubProcess]:
    """(east, west) for (b), not started: east watches west."""
    pki = site.pki
    west_port = free_port()
    west = hubd_process(workdir / "west", *site_flags(pki, "west", site.west_policy).serve,
                        "--no-durable-ingress-quota", "--private-directed-messages",
                        port=west_port, hub_id="west", scheme="wss")
    east = hubd_process(workdir / "east", *site_flags(pki, "east", None).connect,
                        "--namespace-owner", "PROJ=east",
                        "--multihub-watch", f"west=wss://127.0.0.1:{west_port}/",
                        "--multihub-watch-pin", f"west={pki.server_pin('west')}",
                        "--multihub-watch-interval", f"{interval:g}", hub_id="east")
    return east, west


def stop(*hubs: HubProcess) -> None:
    for hub in hubs:
        try:
            hub.stop(timeout=10)
        except Exception:  # noqa: BLE001 - keep stopping the others
            hub.kill()


def cpu(*hubs: HubProcess) -> list[float]:
    return [proc_cpu_seconds(h.pid) or 0.0 for h in hubs]


class Box:
    """CPU used by anything but `pids` (and this process) between start and end."""

    def __init__(self, *hubs: HubProcess):
        self.hubs = hubs
        self.t = time.perf_counter()
        self.busy, _ = box_cpu_ticks()
        self.mine = sum(cpu(*hubs)) + time.process_time()

    def other(self) -> float:
        elapsed = time.perf_counter() - self.t
        busy, _ = box_cpu_ticks()
        mine = sum(cpu(*self.hubs)) + time.process_time()
        ticks = os.sysconf("SC_CLK_TCK")
        return round(((busy - self.busy) / ticks - (mine - self.mine)) / elapsed, 2)


# ----------------------------------------------------------------------------- (a)

async def _open(session: aiohttp.ClientSession, url: str, name: str):
    ws = await session.ws_connect(url, ssl=False, max_msg_size=0)
    await ws.send_json({"sender": name, "target": "System", "type": "heartbeat",
                        "payload": "online", "timestamp": time.time()})
    await ws.send_json({"sender": name, "target": "System", "type": "who_request",
                        "payload": "who"})
    await _until(ws, lambda f: f.get("type") == "who_snapshot", 15)
    return ws


async def _until(ws, match, timeout: float) -> dict:
    async with asyncio.timeout(timeout):
        while True:
            msg = await ws.receive()
            if msg.type != aiohttp.WSMsgType.TEXT:
                raise ConnectionError(f"socket closed ({msg.type})")
            frame = json.loads(msg.data)
            if match(frame):
                return frame


async def round_trips(url: str, tag: str, in_flight: int, count: int, warmup: int) -> dict:
    """`in_flight` sockets, each: claim -> granted -> release -> released, `count`
    measured round trips in all after `warmup` unmeasured ones per socket."""
    claim_lat, release_lat, problems = [], [], []
    refused = {"claim": 0, "release": 0}
    per = max(1, count // in_flight)

    async def worker(session, k: int) -> None:
        name = f"PROJ/{tag}-w{k}"
        ws = await _open(session, url, name)
        try:
            for n in range(warmup + per):
                task = f"{tag}-{k}-{n}"
                t0 = time.perf_counter()
                await ws.send_json({"sender": name, "target": "System", "type": "claim",
                                    "payload": task, "task_id": task, "worktree": "/bench",
                                    "paths": [f"b/{tag}/{k}/{n}.py"], "ttl_seconds": 600})
                f = await _until(ws, lambda f: f.get("task_id") == task and (
                    f.get("type") == "claim_denied" or (f.get("type") == "claim_granted"
                                                        and f.get("owner") == name)), 30)
                t1 = time.perf_counter()
                if f["type"] != "claim_granted":
                    problems.append(f.get("payload"))
                    refused["claim"] += 1
                    continue
                await ws.send_json({"sender": name, "target": "System", "type": "release",
                                    "payload": task, "task_id": task, "epoch": f["epoch"]})
                r = await _until(ws, lambda f: f.get("task_id") == task and f.get("type") in (
                    "release_granted", "release_denied") and (
                    f.get("owner") == name or f.get("target") == name), 30)
                t2 = time.perf_counter()
                if r["type"] != "release_granted":
                    problems.append(r.get("payload"))
                    refused["release"] += 1
                if n >= warmup:
                    claim_lat.append(t1 - t0)
                    release_lat.append(t2 - t1)
        finally:
            await ws.close()

    async with aiohttp.ClientSession() as session:
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(session, k) for k in range(in_flight)))
        elapsed = time.perf_counter() - t0
    attempts = in_flight * (warmup + per)
    granted = attempts - refused["claim"]
    return {"claim_ms": percentiles(claim_lat), "release_ms": percentiles(release_lat),
            "round_trips_per_s": round(granted / elapsed, 1), "n": len(claim_lat),
            "attempts": attempts, "claims_refused": refused["claim"],
            "releases_refused": refused["release"], "problem_samples": sorted(set(problems))[:3]}


def run_a(kind: str, site: Site, base: Path, rnd: int, args) -> list[dict]:
    workdir = base / f"a-r{rnd}-{kind}"
    east, west = claim_pair(kind, workdir, site)
    out = []
    try:
        east.start(ready_timeout=60)
        west.start(ready_timeout=60)
        counts = args.count_ref if kind == "reference" else args.count
        for in_flight in (1, 8):
            for path, hub in (("forwarded", west), ("local", east)):
                tag = f"r{rnd}{path[0]}{in_flight}"
                c0, box = cpu(east, west), Box(east, west)
                t0 = time.perf_counter()
                rec = asyncio.run(round_trips(hub.url, tag, in_flight, counts, args.warmup))
                elapsed = time.perf_counter() - t0
                c1 = cpu(east, west)
                total = rec["attempts"]
                rec.update(kind=kind, round=rnd, path=path, in_flight=in_flight,
                           east_cpu_ms_per_rt=round((c1[0] - c0[0]) / total * 1000, 3),
                           west_cpu_ms_per_rt=round((c1[1] - c0[1]) / total * 1000, 3),
                           other=box.other(), seconds=round(elapsed, 2))
                out.append(rec)
                print(line_a(rec), flush=True)
    except Exception as exc:  # noqa: BLE001
        out.append({"kind": kind, "round": rnd, "error": f"{type(exc).__name__}: {exc}; "
                    f"east: {east.log()[-300:]} west: {west.log()[-300:]}"})
        print(f"  a r{rnd} {kind:<9} ERROR {out[-1]['error'][:600]}", flush=True)
    finally:
        stop(west, east)
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    return out


def line_a(r: dict) -> str:
    c, rl = r["claim_ms"], r["release_ms"]
    flag = "  BOX-BUSY" if r["other"] > BUSY else ""
    return (f"  a r{r['round']} {r['kind']:<9} {r['path']:<9} x{r['in_flight']:<2} "
            f"n={r['n']:<5} {r['round_trips_per_s']:>7.1f} rt/s  claim p50 {c['p50']:>7} "
            f"p99 {c['p99']:>7} max {c['max']:>7} ms  release p50 {rl['p50']:>7} ms  "
            f"cpu/rt east {r['east_cpu_ms_per_rt']} west {r['west_cpu_ms_per_rt']} ms  "
            f"other {r['other']}  refused claims {r['claims_refused']}/{r['attempts']} "
            f"releases {r['releases_refused']}{flag}"
            + (f"  e.g. {r['problem_samples']}" if r["problem_samples"] else ""))


def summary_a(runs: list[dict]) -> dict:
    out = {}
    ok = [r for r in runs if "error" not in r]
    keys = sorted({(r["kind"], r["path"], r["in_flight"]) for r in ok},
                  key=lambda k: (k[0] != "reference", k[2], k[1]))
    print("\n(a) medians over rounds [min..max]: claim latency ms (send -> claim_granted)")
    print(f"  {'hub':<9} {'path':<9} {'in flight':>9} {'rt/s':>18} {'p50':>20} {'p99':>20} "
          f"{'max':>9} {'east+west cpu ms/rt':>20} {'claims refused':>15}")
    for kind, path, k in keys:
        rs = [r for r in ok if (r["kind"], r["path"], r["in_flight"]) == (kind, path, k)]

        def med(get):
            vals = [get(r) for r in rs]
            return statistics.median(vals), min(vals), max(vals)
        rate, p50, p99 = med(lambda r: r["round_trips_per_s"]), med(
            lambda r: r["claim_ms"]["p50"]), med(lambda r: r["claim_ms"]["p99"])
        mx = max(r["claim_ms"]["max"] for r in rs)
        hub_cpu = med(lambda r: r["east_cpu_ms_per_rt"] + r["west_cpu_ms_per_rt"])
        refused = sum(r["claims_refused"] for r in rs), sum(r["attempts"] for r in rs)
        out[f"{kind}/{path}/x{k}"] = {"rounds": len(rs), "rt_per_s": rate, "p50_ms": p50,
                                      "p99_ms": p99, "max_ms": mx, "cpu_ms_per_rt": hub_cpu,
                                      "claims_refused": refused}
        print(f"  {kind:<9} {path:<9} {k:>9} {spread(rate):>18} {spread(p50):>20} "
              f"{spread(p99):>20} {mx:>9} {spread(hub_cpu):>20} "
              f"{f'{refused[0]}/{refused[1]}':>15}")
    for kind in ("reference", "hubd"):
        for k in (1, 8):
            fw, lo = out.get(f"{kind}/forwarded/x{k}"), out.get(f"{kind}/local/x{k}")
            if fw and lo:
                print(f"  {kind} x{k}: forwarding adds {fw['p50_ms'][0] - lo['p50_ms'][0]:.2f} ms "
                      f"at p50 ({fw['p50_ms'][0] / lo['p50_ms'][0]:.1f}x local)")
    for k in (1, 8):
        ref, hub = out.get(f"reference/forwarded/x{k}"), out.get(f"hubd/forwarded/x{k}")
        if ref and hub:
            print(f"  forwarded x{k}: hubd / reference rt/s {hub['rt_per_s'][0] / ref['rt_per_s'][0]:.1f}x, "
                  f"p50 {ref['p50_ms'][0] / hub['p50_ms'][0]:.1f}x lower")
    return out


def spread(v: tuple) -> str:
    def f(x):
        return f"{x:.0f}" if abs(x) >= 100 else f"{x:.3g}"
    med, lo, hi = v
    return f"{f(med)} [{f(lo)}..{f(hi)}]"


# ----------------------------------------------------------------------------- (b)

def marker_row(db: Path, task: str) -> tuple[int, float] | None:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return conn.execute(
            "SELECT seq, ts FROM events WHERE kind = 'claim' AND "
            "json_extract(payload, '$.task_id') = ? ORDER BY seq DESC LIMIT 1",
            (task,)).fetchone()
    finally:
        conn.close()


def max_seq(db: Path) -> int:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return conn.execute("SELECT COALESCE(MAX(seq), 0) FROM events").fetchone()[0]
    finally:
        conn.close()


async def watch_lag(east: HubProcess, west: HubProcess, rate: float, seconds: float,
                    warmup: float) -> dict:
    db = Path(west.argv[west.argv.index("--db") + 1])
    loop = asyncio.get_running_loop()
    cursor_seen: list[tuple[float, int]] = []  # (wall time, east's cursor on west)
    markers: list[str] = []
    stop = asyncio.Event()
    sent = 0

    def health_cursor() -> int | None:
        try:
            return east.get_json("/health", timeout=2)["multihub"]["watches"]["west"]["cursor"]
        except (OSError, KeyError, ValueError):
            return None

    async def poll_health():
        while not stop.is_set():
            value = await loop.run_in_executor(None, health_cursor)
            if value is not None:
                cursor_seen.append((time.time(), value))
            await asyncio.sleep(0.05)

    async def drain(ws):
        async for _msg in ws:
            pass

    async with aiohttp.ClientSession() as session:
        sink = await _open(session, west.url, "BENCH/sink")
        writer = await _open(session, west.url, "BENCH/writer")
        marker = await _open(session, west.url, "BENCH/marker")
        drains = [asyncio.create_task(drain(ws)) for ws in (sink, writer)]

        async def write():
            nonlocal sent
            start = time.perf_counter()
            while not stop.is_set():
                due = int((time.perf_counter() - start) * rate)
                while sent < due:
                    await writer.send_str(json.dumps({
                        "sender": "BENCH/writer", "target": "BENCH/sink", "type": "chat",
                        "payload": f"event {sent} of a steady stream"}))
                    sent += 1
                await asyncio.sleep(0.01)

        async def mark():
            n = 0
            while not stop.is_set():
                task = f"m-{n}"
                await marker.send_json({"sender": "BENCH/marker", "target": "System",
                                        "type": "claim", "payload": task, "task_id": task,
                                        "worktree": "/bench", "paths": [f"m/{n}"],
                                        "ttl_seconds": 600})
                await _until(marker, lambda f: f.get("task_id") == task, 30)
                markers.append(task)
                n += 1
                await asyncio.sleep(0.25)

        tasks = [asyncio.create_task(c()) for c in (write, mark, poll_health)]
        await asyncio.sleep(warmup)
        t0, seq0, sent0 = time.time(), max_seq(db), sent
        measured_from = len(markers)
        c0, box = cpu(east, west), Box(east, west)
        await asyncio.sleep(seconds)
        t1, seq1, sent1 = time.time(), max_seq(db), sent
        c1 = cpu(east, west)
        other = box.other()
        measured = markers[measured_from:]
        # let the watch catch up with the last markers, then stop everything
        await asyncio.sleep(2 * float(east.argv[east.argv.index("--multihub-watch-interval") + 1])
                            + 1)
        stop.set()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for ws in (sink, writer, marker):
            await ws.close()
        for t in drains:
            t.cancel()
    lags, unseen = [], 0
    for task in measured:
        row = marker_row(db, task)
        if row is None:
            unseen += 1
            continue
        seq, ts = row
        seen = next((at for at, cur in cursor_seen if cur >= seq and at >= ts), None)
        if seen is None:
            unseen += 1
        else:
            lags.append(seen - ts)
    status = east.get_json("/health")["multihub"]["watches"]["west"]
    elapsed = t1 - t0
    return {"lag_ms": percentiles(lags), "markers": len(measured), "unseen": unseen,
            "offered_per_s": round((sent1 - sent0) / elapsed, 1),
            "journaled_per_s": round((seq1 - seq0) / elapsed, 1),
            "east_lag_events_at_end": status.get("lag_events"), "polls": status.get("polls"),
            "east_cpu": round((c1[0] - c0[0]) / elapsed, 3),
            "west_cpu": round((c1[1] - c0[1]) / elapsed, 3), "other": other,
            "last_error": status.get("last_error")}


def run_b(site: Site, base: Path, rate: float, interval: float, args) -> dict:
    workdir = base / f"b-{int(rate)}-{interval:g}"
    east, west = watch_pair(workdir, site, interval)
    try:
        west.start(ready_timeout=60)
        east.start(ready_timeout=60)
        rec = asyncio.run(watch_lag(east, west, rate, args.seconds, args.warmup_s))
        rec.update(rate=rate, interval=interval)
    except Exception as exc:  # noqa: BLE001
        rec = {"rate": rate, "interval": interval, "error": f"{type(exc).__name__}: {exc}; "
               f"east: {east.log()[-300:]} west: {west.log()[-300:]}"}
    finally:
        stop(east, west)
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    if "error" in rec:
        print(f"  b {rate:>6g}/s interval {interval:g}s ERROR {rec['error'][:600]}", flush=True)
    else:
        lag = rec["lag_ms"]
        flag = "  BOX-BUSY" if rec["other"] > BUSY else ""
        print(f"  b {rate:>6g}/s interval {interval:g}s  journaled {rec['journaled_per_s']:>7.1f} "
              f"ev/s (offered {rec['offered_per_s']})  lag p50 {lag['p50']} p99 {lag['p99']} "
              f"max {lag['max']} ms (n={lag['n']}, unseen {rec['unseen']})  east behind at "
              f"end {rec['east_lag_events_at_end']} ev  cpu east {rec['east_cpu']} west "
              f"{rec['west_cpu']}  other {rec['other']}{flag}", flush=True)
    return rec


# ----------------------------------------------------------------------------- main

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="forwarded claim round trips and watch lag")
    ap.add_argument("--only", choices=("a", "b"), default=None)
    ap.add_argument("--pairs", default="reference,hubd", help="(a): reference,hubd")
    ap.add_argument("--rounds", type=int, default=None, help="(a) rounds; default 3 (1 quick)")
    ap.add_argument("--count", type=int, default=None,
                    help="(a) measured round trips per hubd run (default 2000; 500 quick)")
    ap.add_argument("--count-ref", type=int, default=None,
                    help="(a) per reference run (default 400; 100 quick)")
    ap.add_argument("--warmup", type=int, default=5, help="(a) unmeasured round trips/socket")
    ap.add_argument("--rates", default="200,1000,2000", help="(b) events/s on west")
    ap.add_argument("--intervals", default="1,5", help="(b) watch intervals, seconds")
    ap.add_argument("--seconds", type=float, default=None, help="(b) measured s (15; 8 quick)")
    ap.add_argument("--warmup-s", type=float, default=3.0, help="(b) unmeasured seconds first")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--keep", action="store_true", help="keep the hubs' directories")
    ap.add_argument("--json", dest="json_out", default=None)
    args = ap.parse_args(argv)
    rounds = args.rounds or (1 if args.quick else 3)
    args.count = args.count or (500 if args.quick else 2000)
    args.count_ref = args.count_ref or (100 if args.quick else 400)
    args.seconds = args.seconds or (8.0 if args.quick else 15.0)
    kinds = [k for k in args.pairs.split(",") if k]
    base = Path(tempfile.mkdtemp(prefix="hubd-bench-authority-"))
    print(f"bench_authority: {os.cpu_count()} cpus, loadavg {os.getloadavg()[0]:.2f}", flush=True)
    result: dict = {"args": vars(args)}
    try:
        site = Site(base / "site")
        if args.only in (None, "a"):
            print(f"(a) forwarded vs local claim round trips, {rounds} round(s), hubd "
                  f"{args.count} / reference {args.count_ref} per run", flush=True)
            runs = []
            for rnd in range(1, rounds + 1):
                for kind in kinds:
                    runs += run_a(kind, site, base, rnd, args)
            result["a"] = {"runs": runs, "summary": summary_a(runs)}
        if args.only in (None, "b"):
            print(f"\n(b) watch lag, hubd: east watches west, {args.seconds:g} s per run",
                  flush=True)
            result["b"] = [run_b(site, base, float(rate), float(interval), args)
                           for interval in args.intervals.split(",")
                           for rate in args.rates.split(",")]
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=1, default=str))
        print(f"\nwrote {args.json_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

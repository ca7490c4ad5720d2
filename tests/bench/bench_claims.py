"""Claim + release throughput over 1,000 live claims: the reference hub and hubd,
side by side, interleaved, fresh journals. Measures and prints; never asserts.

    .venv/bin/python -m tests.bench.bench_claims                  # 3 rounds, 8 s each
    .venv/bin/python -m tests.bench.bench_claims --rounds 5 --duration 10 --json out.json
    .venv/bin/python -m tests.bench.bench_claims --quick          # 1 round, 4 s

Each round, for each hub (reference first, then hubd), bench_claims:
1. starts the hub with a fresh durable journal in a new temporary directory:
     reference  synapse hub --db <fresh> --hub-id bench-ref --metrics
                --no-durable-ingress-quota --max-claims-per-agent 100000
     hubd       python -m hubd --db <fresh> --hub-id bench-hubd --max-claims-per-agent 100000
   (the per-agent claim cap is raised on both: the setup holds 1,000 claims under one
   name, and the reference counts its cap per open host, which every worker shares);
2. runs the client in a separate process (this module, `client` mode):
   - a holder socket claims --live tasks (default 1,000), each on its own path
     (`live/<i>/f.py` in worktree `/bench`), and keeps them for the whole run, so every
     further claim is checked against 1,000 live leases;
   - --workers sockets (default 4) each keep --window tasks (default 8) going: claim
     `q<k>-<n>` on `work/<k>/<n>.py` in the same worktree, wait for its own
     claim_granted (task and owner matched), release it with the granted epoch, wait
     for release_granted; that is one pair. A pair's latency runs from the claim's send
     to its release_granted;
   - after --warmup seconds it measures for --duration seconds: pairs completed, their
     latency percentiles, and the hub's CPU time (from /proc) per pair;
3. stops the hub by its PID and deletes the directory.

Every grant and release is a broadcast on both hubs, so each socket reads every
pair's two frames; the client skips other workers' frames with one bytes.find and
decodes only its own. The client's own CPU share is printed: near 100% means the
figure is the harness's, not the hub's.
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
from pathlib import Path

if __package__ in (None, ""):  # run as a script
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import orjson  # noqa: E402

from tests.bench.loadgen import percentiles, proc_cpu_seconds  # noqa: E402
from tests.bench.rawclient import connect  # noqa: E402
from tests.support.procs import REPO, hubd_process, reference_hub_process  # noqa: E402

WORKTREE = "/bench"
CAP = "100000"


def _frame(obj: dict) -> bytes:
    return orjson.dumps(obj)


async def _registered(url: str, name: str, handler=None):
    """A raw socket with its name bound (a who_request answered after registration)."""
    answered = asyncio.get_running_loop().create_future()

    def setup(proto):
        def first(buf, s, e, t):
            if not answered.done() and b"who_snapshot" in buf[s:e]:
                answered.set_result(True)
            elif handler is not None and answered.done():
                handler(buf, s, e, t)
        proto.handler = first

    proto = await connect(url, setup=setup)
    proto.send_text(_frame({"sender": name, "target": "System", "type": "heartbeat",
                            "payload": "online", "timestamp": time.time()}))
    proto.send_text(_frame({"sender": name, "target": "System", "type": "who_request",
                            "payload": "who"}))
    await asyncio.wait_for(answered, 15)
    if handler is not None:
        proto.handler = handler
    return proto


async def hold_live_claims(url: str, n: int, window: int = 64):
    """One socket holding n claims (kept open for the whole run)."""
    name = "bench/holder"
    done = asyncio.get_running_loop().create_future()
    state = {"sent": 0, "granted": 0, "denied": 0}
    proto = None

    def send_next():
        i = state["sent"]
        state["sent"] += 1
        proto.send_text(_frame({"sender": name, "target": "System", "type": "claim",
                                "payload": f"live-{i}", "task_id": f"live-{i}",
                                "worktree": WORKTREE, "paths": [f"live/{i}/f.py"]}))

    def on_frame(buf, s, e, t):
        if buf.find(b'"live-', s, e) < 0:
            return
        f = orjson.loads(buf[s:e])
        kind = f.get("type")
        if kind == "claim_granted" and f.get("owner") == name:
            state["granted"] += 1
        elif kind in ("claim_denied", "error"):
            state["denied"] += 1
        else:
            return
        if state["sent"] < n:
            send_next()
        if state["granted"] + state["denied"] >= n and not done.done():
            done.set_result(None)

    proto = await _registered(url, name, on_frame)
    if n <= 0:
        return proto
    for _ in range(min(window, n)):
        send_next()
    await asyncio.wait_for(done, 120)
    if state["denied"]:
        raise RuntimeError(f"setup: {state['denied']} of {n} live claims were refused")
    return proto


class Worker:
    """One socket cycling claim -> release with `window` tasks in flight."""

    def __init__(self, k: int, window: int, shared: dict):
        self.k = k
        self.name = f"bench/w{k}"
        self.window = window
        self.shared = shared
        self.marker = f'"q{k}-'.encode()
        self.n = 0
        self.started: dict[str, float] = {}
        self.proto = None
        self.errors = 0

    def start_one(self) -> None:
        if self.shared["stop"]:
            return
        task = f"q{self.k}-{self.n}"
        self.n += 1
        self.started[task] = time.perf_counter()
        self.proto.send_text(_frame({"sender": self.name, "target": "System", "type": "claim",
                                     "payload": task, "task_id": task, "worktree": WORKTREE,
                                     "paths": [f"work/{self.k}/{self.n}.py"]}))

    def on_frame(self, buf, s, e, t) -> None:
        if buf.find(self.marker, s, e) < 0:
            return
        f = orjson.loads(buf[s:e])
        kind = f.get("type")
        task = f.get("task_id")
        if task not in self.started:
            return
        if kind == "claim_granted" and f.get("owner") == self.name:
            self.proto.send_text(_frame({"sender": self.name, "target": "System",
                                         "type": "release", "payload": task, "task_id": task,
                                         "epoch": f["epoch"]}))
        elif kind == "release_granted" and f.get("owner") == self.name:
            began = self.started.pop(task)
            now = time.perf_counter()
            self.shared["done"].append((now, now - began))
            self.start_one()
        elif kind in ("claim_denied", "release_denied", "error"):
            self.started.pop(task, None)
            self.errors += 1
            self.start_one()


async def client(url: str, live: int, workers: int, window: int, warmup: float,
                 duration: float, hub_pid: int | None) -> dict:
    t_setup = time.perf_counter()
    holder = await hold_live_claims(url, live)
    setup_s = time.perf_counter() - t_setup
    shared = {"stop": False, "done": []}
    crew = [Worker(k, window, shared) for k in range(workers)]
    for w in crew:
        w.proto = await _registered(url, w.name, w.on_frame)
    for w in crew:
        for _ in range(window):
            w.start_one()
    await asyncio.sleep(warmup)
    cpu0 = proc_cpu_seconds(hub_pid) if hub_pid else None
    me0 = time.process_time()
    t0 = time.perf_counter()
    await asyncio.sleep(duration)
    t1 = time.perf_counter()
    cpu1 = proc_cpu_seconds(hub_pid) if hub_pid else None
    me1 = time.process_time()
    shared["stop"] = True
    measured = [lat for (at, lat) in shared["done"] if t0 <= at < t1]
    # let what is in flight finish, then close
    deadline = time.perf_counter() + 10
    while any(w.started for w in crew) and time.perf_counter() < deadline:
        await asyncio.sleep(0.05)
    stuck = sum(len(w.started) for w in crew)
    for w in crew:
        await w.proto.close()
    await holder.close()
    pairs = len(measured)
    elapsed = t1 - t0
    out = {"pairs": pairs, "seconds": round(elapsed, 3),
           "pairs_per_s": round(pairs / elapsed, 1) if elapsed else 0.0,
           "lat_ms": percentiles(measured), "errors": sum(w.errors for w in crew),
           "stuck": stuck, "setup_live_claims_s": round(setup_s, 3),
           "client_cpu_util": round((me1 - me0) / elapsed, 3) if elapsed else None}
    if cpu0 is not None and cpu1 is not None and pairs:
        out["hub_cpu_util"] = round((cpu1 - cpu0) / elapsed, 3)
        out["hub_cpu_ms_per_pair"] = round((cpu1 - cpu0) / pairs * 1000, 4)
    return out


def start_hub(variant: str, workdir: Path):
    if variant == "reference":
        hub = reference_hub_process(workdir, "--no-durable-ingress-quota",
                                    "--max-claims-per-agent", CAP, hub_id="bench-ref")
    else:
        hub = hubd_process(workdir, "--max-claims-per-agent", CAP, hub_id="bench-hubd")
    return hub.start(ready_timeout=30)


def run_one(variant: str, args, base: Path, tag: str) -> dict:
    workdir = base / tag
    rec: dict = {"variant": variant, "loadavg_before": round(os.getloadavg()[0], 2)}
    try:
        hub = start_hub(variant, workdir)
    except Exception as exc:  # noqa: BLE001
        rec["error"] = f"hub did not start: {exc}"
        return rec
    try:
        cmd = [sys.executable, "-m", "tests.bench.bench_claims", "client", "--url", hub.url,
               "--live", str(args.live), "--workers", str(args.workers),
               "--window", str(args.window), "--warmup", str(args.warmup),
               "--duration", str(args.duration), "--hub-pid", str(hub.pid)]
        p = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True,
                           timeout=args.duration + args.warmup + 300)
        if p.returncode != 0 or not p.stdout.strip():
            rec["error"] = f"client exit {p.returncode}: {p.stderr.strip()[-500:]}"
            return rec
        rec.update(json.loads(p.stdout.strip().splitlines()[-1]))
        if not hub.alive():
            rec["error"] = f"hub exited during the run: {hub.log()[-500:]}"
        return rec
    finally:
        hub.stop(timeout=10)
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["client"]:
        ap = argparse.ArgumentParser(prog="bench_claims client")
        ap.add_argument("--url", required=True)
        ap.add_argument("--live", type=int, default=1000)
        ap.add_argument("--workers", type=int, default=4)
        ap.add_argument("--window", type=int, default=8)
        ap.add_argument("--warmup", type=float, default=2.0)
        ap.add_argument("--duration", type=float, default=8.0)
        ap.add_argument("--hub-pid", type=int, default=None)
        a = ap.parse_args(argv[1:])
        out = asyncio.run(client(a.url, a.live, a.workers, a.window, a.warmup, a.duration,
                                 a.hub_pid))
        print(json.dumps(out))
        return 0

    ap = argparse.ArgumentParser(description="claim+release pairs/s over 1,000 live claims: "
                                             "reference hub vs hubd, interleaved")
    ap.add_argument("--rounds", type=int, default=None, help="default 3 (1 with --quick)")
    ap.add_argument("--quick", action="store_true", help="1 round, 4 s measured")
    ap.add_argument("--live", type=int, default=1000, help="claims held during the run")
    ap.add_argument("--workers", type=int, default=4, help="claiming sockets")
    ap.add_argument("--window", type=int, default=8, help="tasks in flight per socket")
    ap.add_argument("--warmup", type=float, default=2.0, help="unmeasured seconds first")
    ap.add_argument("--duration", type=float, default=None, help="measured seconds (default 8)")
    ap.add_argument("--only", choices=("reference", "hubd"), default=None)
    ap.add_argument("--keep", action="store_true", help="keep the hubs' directories")
    ap.add_argument("--json", dest="json_out", default=None)
    args = ap.parse_args(argv)
    rounds = args.rounds or (1 if args.quick else 3)
    if args.duration is None:
        args.duration = 4.0 if args.quick else 8.0
    variants = [args.only] if args.only else ["reference", "hubd"]
    base = Path(tempfile.mkdtemp(prefix="hubd-bench-claims-"))
    print(f"bench_claims: {rounds} round(s), {args.live} live claims, {args.workers} workers x "
          f"window {args.window}, {args.warmup:g}+{args.duration:g} s, {os.cpu_count()} cpus, "
          f"loadavg {os.getloadavg()[0]:.2f}", flush=True)
    runs = []
    try:
        for rnd in range(1, rounds + 1):
            for variant in variants:
                rec = run_one(variant, args, base, f"r{rnd}-{variant}")
                rec["round"] = rnd
                runs.append(rec)
                if "error" in rec:
                    print(f"  round {rnd} {variant:<9} ERROR {rec['error'][:400]}", flush=True)
                    continue
                lat = rec["lat_ms"]
                print(f"  round {rnd} {variant:<9} {rec['pairs_per_s']:>9.1f} pairs/s  "
                      f"n={rec['pairs']:<6} p50 {lat['p50']} ms  p99 {lat['p99']} ms  "
                      f"hub cpu {rec.get('hub_cpu_util')}  "
                      f"{rec.get('hub_cpu_ms_per_pair')} ms/pair  "
                      f"client cpu {rec['client_cpu_util']}  errors {rec['errors']}  "
                      f"stuck {rec['stuck']}  (setup of {args.live} claims "
                      f"{rec['setup_live_claims_s']} s)", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    summary = {}
    for variant in variants:
        ok = [r for r in runs if r["variant"] == variant and "error" not in r]
        if ok:
            summary[variant] = {
                "rounds": len(ok),
                "pairs_per_s_median": statistics.median(r["pairs_per_s"] for r in ok),
                "pairs_per_s_all": [r["pairs_per_s"] for r in ok],
                "p50_ms_median": statistics.median(r["lat_ms"]["p50"] for r in ok),
                "p99_ms_median": statistics.median(r["lat_ms"]["p99"] for r in ok),
                "hub_cpu_ms_per_pair_median": statistics.median(
                    r.get("hub_cpu_ms_per_pair") or 0 for r in ok)}
    ratios = []
    for rnd in range(1, rounds + 1):
        pair = {r["variant"]: r for r in runs if r["round"] == rnd and "error" not in r}
        if "reference" in pair and "hubd" in pair and pair["reference"]["pairs_per_s"]:
            ratios.append(pair["hubd"]["pairs_per_s"] / pair["reference"]["pairs_per_s"])
    print()
    for variant, s in summary.items():
        print(f"  {variant:<9} median {s['pairs_per_s_median']:.1f} pairs/s over {s['rounds']} "
              f"round(s) {s['pairs_per_s_all']}; p50 {s['p50_ms_median']} ms, p99 "
              f"{s['p99_ms_median']} ms; hub {s['hub_cpu_ms_per_pair_median']} ms CPU/pair")
    if ratios:
        print(f"  hubd / reference: median {statistics.median(ratios):.1f}x per round "
              f"[{min(ratios):.1f}..{max(ratios):.1f}] over {len(ratios)} paired round(s)")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(
            {"runs": runs, "summary": summary, "ratios": ratios,
             "args": {k: v for k, v in vars(args).items()}}, indent=1))
        print(f"\nwrote {args.json_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

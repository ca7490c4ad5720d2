"""Side-by-side local benchmark: the reference hub against hubd, interleaved.

For each round, each scenario, and each hub variant (in the order reference, hubd,
hubd-private; reversed in even rounds, tests/bench/order.py) this starts a *fresh*
hub with a fresh durable journal in its own temporary directory, runs one load from a
separate client process (``tests.bench.loadgen``), reads the hub's CPU time from
/proc, stops the hub by its PID and deletes the directory. The table shows medians over rounds, and for
each hubd variant the median over rounds of the paired ratio hubd/reference
(hubd-principals: against hubd-private and hubd, when they ran).

    .venv/bin/python -m tests.bench.bench_local                 # 3 rounds, scenarios a,b
    .venv/bin/python -m tests.bench.bench_local --quick
    .venv/bin/python -m tests.bench.bench_local --only reference --rounds 3 --json out.json
    .venv/bin/python -m tests.bench.bench_local --scenarios a,b,c,d,e --rounds 5 --hubd-rev HEAD
    .venv/bin/python -m tests.bench.bench_local --only hubd,hubd-private,hubd-principals --rounds 6

Hubs as started:
  reference     synapse hub --db <fresh> --hub-id bench-ref --metrics --no-durable-ingress-quota
  hubd          python -m hubd --db <fresh> --hub-id bench-hubd --no-durable-ingress-quota
  hubd-private  python -m hubd --db <fresh> --hub-id bench-hubd --no-durable-ingress-quota --private-directed-messages
  hubd-principals  as hubd, on a journal that holds one principal (seats bench/*) and its
                token, made before the hub starts; the loadgen sends the token in every
                socket's first frame (--token). Principals force private routing, so its
                fair baseline is hubd-private (same routing, no token, no seat check).

Both hubs run with their ingress quota off (the reference's refuses chat 101+ per minute on
an open loopback hub; hubd's default, 6000 chats per principal per 60 s, refused chats in a
20000-chat run); --hubd-default-quota keeps hubd's on.

Measures; never asserts. Differences under ~25% are noise on the shared 2-core box.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: python tests/bench/bench_local.py
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.bench.order import in_turn  # noqa: E402
from tests.support.procs import REPO, HubProcess, hubd_process, reference_hub_process  # noqa: E402

VARIANTS = ("reference", "hubd", "hubd-private", "hubd-principals", "hubd-base", "hubd-base-private")
# without --only (and without --base-rev); the hubd-base* variants need --base-rev
DEFAULT_VARIANTS = ("reference", "hubd", "hubd-private")
# hubd variants that take --hubd-flags (the ones running the hubd under test, not hubd-base*)
HUBD_UNDER_TEST = ("hubd", "hubd-private", "hubd-principals")
# loadgen's names are <prefix>/<run>-s<i> and <prefix>/<run>-r<i>: hubd-principals' one
# principal may speak for every seat under the prefix
BENCH_PREFIX = "bench"
PRINCIPAL = "bench"

# name -> (label, senders, window, receipts, {variant kind: count})
SCENARIOS: dict[str, dict] = {
    "a": {"label": "4x8", "senders": 4, "window": 8, "receipts": False,
          "count": {"reference": 2000, "hubd": 20000}, "quick": {"reference": 1000, "hubd": 5000}},
    "b": {"label": "1x1+rcpt", "senders": 1, "window": 1, "receipts": True,
          "count": {"reference": 1000, "hubd": 1000}, "quick": {"reference": 300, "hubd": 300}},
    "c": {"label": "4x8+rcpt", "senders": 4, "window": 8, "receipts": True,
          "count": {"reference": 1000, "hubd": 10000}, "quick": {"reference": 500, "hubd": 2000}},
    "d": {"label": "1x1", "senders": 1, "window": 1, "receipts": False,
          "count": {"reference": 1000, "hubd": 1000}, "quick": {"reference": 300, "hubd": 300}},
    # capacity: enough in flight that a hub with group commit is not latency-bound
    "e": {"label": "4x64", "senders": 4, "window": 64, "receipts": False,
          "count": {"reference": 2000, "hubd": 40000}, "quick": {"reference": 1000, "hubd": 10000}},
}


def kind(variant: str) -> str:
    return "reference" if variant == "reference" else "hubd"


def make_hub(variant: str, workdir: Path, hubd_extra: list[str], hubd_src: Path | None,
             base_src: Path | None = None) -> HubProcess:
    """hubd-base* run hubd as committed at --base-rev, so one run compares a change with the
    commit before it, interleaved round by round."""
    if variant == "reference":
        return reference_hub_process(workdir, "--no-durable-ingress-quota", hub_id="bench-ref")
    if variant.startswith("hubd-base"):
        if base_src is None:
            raise ValueError(f"{variant} needs --base-rev")
        hubd_src = base_src
    if variant in ("hubd", "hubd-base", "hubd-principals"):
        hub = hubd_process(workdir, *hubd_extra, hub_id="bench-hubd")
    elif variant in ("hubd-private", "hubd-base-private"):
        hub = hubd_process(workdir, *hubd_extra, "--private-directed-messages", hub_id="bench-hubd")
    else:
        raise ValueError(variant)
    if hubd_src is not None:
        run_from_snapshot(hub, hubd_src)
    return hub


def provision_principal(db: Path, hubd_src: Path | None) -> str:
    """hubd-principals: make one principal (seats <BENCH_PREFIX>/*) and a token in the hub's
    fresh journal, before the hub starts; return the token. It runs in a child process with
    the same hubd the hub runs (the working tree, or the --hubd-rev snapshot first on
    sys.path), so the tables are the ones that hub reads."""
    code = ("import sys\n"
            + (f"sys.path.insert(0, {str(hubd_src)!r})\n" if hubd_src is not None else "")
            + "from hubd.journal import principals as p\n"
            "db, name, seat = sys.argv[1:4]\n"
            "p.add(db, name, [seat])\n"
            "print(p.new_token(db, name, 'loadgen'))\n")
    out = subprocess.run([sys.executable, "-c", code, str(db), PRINCIPAL, f"{BENCH_PREFIX}/*"], cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    if out.returncode != 0 or not out.stdout.strip():
        raise RuntimeError(f"could not make the principal: {out.stderr.strip()[-400:]}")
    return out.stdout.strip().splitlines()[-1]


def hub_db(hub: HubProcess) -> Path:
    return Path(hub.argv[hub.argv.index("--db") + 1])


def run_from_snapshot(hub: HubProcess, hubd_src: Path) -> HubProcess:
    """Run a hubd snapshot instead of the working tree: replace "-m hubd" by a runpy call with
    the snapshot first on sys.path (it wins over the editable install's finder)."""
    assert hub.argv[1:3] == ["-m", "hubd"], hub.argv
    code = (f"import runpy, sys; sys.path.insert(0, {str(hubd_src)!r}); "
            "runpy.run_module('hubd', run_name='__main__', alter_sys=True)")
    hub.argv = [hub.argv[0], "-c", code, *hub.argv[3:]]
    return hub


def snapshot_hubd(rev: str, dest: Path) -> str:
    """Export hubd/ and federation/ at a git revision into dest; return the short hash."""
    short = subprocess.run(["git", "rev-parse", "--short", rev], cwd=REPO, capture_output=True, text=True,
                           check=True).stdout.strip()
    dest.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "archive", rev, "hubd", "federation"], cwd=REPO, capture_output=True,
                             check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return short


def dir_bytes(path: Path, skip_wal: bool = False) -> int:
    """Bytes of the hub's files in its work dir (logs excluded; optionally WAL/SHM too)."""
    total = 0
    for p in path.rglob("*"):
        if skip_wal and p.name.endswith(("-wal", "-shm")):
            continue
        try:
            if p.is_file() and not p.name.endswith(".log"):
                total += p.stat().st_size
        except OSError:
            pass
    return total


def run_one(variant: str, scen: str, count: int, args, base: Path, tag: str) -> dict:
    sc = SCENARIOS[scen]
    workdir = base / tag
    rec: dict = {"variant": variant, "scenario": scen, "label": sc["label"], "count": count,
                 "loadavg_before": os.getloadavg()[0]}
    extra = [] if args.hubd_default_quota else ["--no-durable-ingress-quota"]
    if variant in HUBD_UNDER_TEST:
        extra += args.hubd_flags.split()
    hub = make_hub(variant, workdir, extra, args.hubd_src, args.base_src)
    base_bytes = 0
    token = None
    try:
        try:
            if variant == "hubd-principals":
                token = provision_principal(hub_db(hub), args.hubd_src)
            hub.start(ready_timeout=30)
        except Exception as e:  # noqa: BLE001 - e.g. hubd not runnable yet
            rec["error"] = f"hub did not start: {e}; log: {' '.join(hub.log()[-600:].split())}"
            return rec
        time.sleep(0.2)
        base_bytes = dir_bytes(workdir, skip_wal=True)
        cmd = [sys.executable, "-m", "tests.bench.loadgen", "--url", hub.url,
               "--senders", str(sc["senders"]), "--window", str(sc["window"]),
               "--warmup", str(args.warmup), "--procs", str(args.procs), "--client", args.client,
               "--hub-pid", str(hub.pid), "--prefix", BENCH_PREFIX, "--json"]
        if token is not None:
            cmd += ["--token", token]
        if args.duration and sc["senders"] > 1:
            cmd += ["--duration", str(args.duration)]
        else:
            cmd += ["--count", str(count)]
        if sc["receipts"]:
            cmd.append("--receipts")
        t0 = time.monotonic()
        p = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=args.timeout)
        rec["wall_s"] = round(time.monotonic() - t0, 2)
        if p.returncode != 0 or not p.stdout.strip():
            last = (p.stderr.strip().splitlines() or ["(no stderr)"])[-1]
            rec["error"] = f"loadgen exit {p.returncode}: {last}"
            rec["loadgen_stderr"] = p.stderr[-3000:]
            rec["hub_log_tail"] = hub.log()[-3000:]
            return rec
        rec.update(json.loads(p.stdout.strip().splitlines()[-1]))
        if not hub.alive():
            rec["error"] = f"hub exited during the run (code {hub.proc.returncode})"
            rec["hub_log_tail"] = hub.log()[-3000:]
        return rec
    except subprocess.TimeoutExpired:
        rec["error"] = f"loadgen timed out after {args.timeout}s"
        return rec
    finally:
        hub.stop(timeout=10)
        if rec.get("delivered"):
            # growth of the hub's files (journal + whatever WAL is left) per chat, after a clean stop
            chats = rec["delivered"] + args.warmup + SCENARIOS[scen]["senders"]  # measured + warm-up + probes
            rec["journal_bytes_per_msg"] = round((dir_bytes(workdir) - base_bytes) / chats, 1)
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)


def med(values):
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def fmt(v, nd=1):
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{nd}f}"
    return str(v)


def summarise(runs: list[dict], variants: list[str], scenarios: list[str]) -> list[dict]:
    rows = []
    for scen in scenarios:
        for var in variants:
            ok = [r for r in runs if r["variant"] == var and r["scenario"] == scen and "error" not in r]
            bad = [r for r in runs if r["variant"] == var and r["scenario"] == scen and "error" in r]
            if not ok and not bad:
                continue
            problems = {}
            for r in ok:
                for k in ("missing", "refused", "duplicates", "late", "unexpected", "malformed", "errors",
                          "receipts_negative", "receipt_missing", "closed_sockets"):
                    if r.get(k):
                        problems[k] = problems.get(k, 0) + r[k]
                if r.get("aborted"):
                    problems["aborted"] = problems.get("aborted", 0) + 1
            rows.append({
                "scenario": scen, "label": SCENARIOS[scen]["label"], "variant": var,
                "rounds_ok": len(ok), "rounds_failed": len(bad),
                "errors": [r["error"] for r in bad][:3],
                "msg_per_s": med([r["msg_per_s"] for r in ok]),
                "msg_per_s_all": [r["msg_per_s"] for r in ok],
                "p50": med([r["lat_ms"]["p50"] for r in ok]),
                "p90": med([r["lat_ms"]["p90"] for r in ok]),
                "p99": med([r["lat_ms"]["p99"] for r in ok]),
                "max": med([r["lat_ms"]["max"] for r in ok]),
                "receipt_p50": med([(r.get("receipt_lat_ms") or {}).get("p50") for r in ok]),
                "hub_ms_per_msg": med([r.get("hub_cpu_ms_per_msg") for r in ok]),
                "hub_cpu_util": med([r.get("hub_cpu_util") for r in ok]),
                "client_cpu_util": med([r.get("client_cpu_util") for r in ok]),
                "client_us_per_msg": med([r.get("client_cpu_us_per_msg") for r in ok]),
                "box_cpu_util": med([r.get("box_cpu_util") for r in ok]),
                "other_cores": med([r.get("other_cores") for r in ok]),
                "journal_bytes_per_msg": med([r.get("journal_bytes_per_msg") for r in ok]),
                "problems": problems,
            })
    return rows


def baseline_of(variant: str) -> str:
    """What a variant's ratios compare it with: the reference hub, or for a hubd variant run
    beside hubd-base* (--base-rev), the same variant at the base revision."""
    return {"hubd": "hubd-base", "hubd-private": "hubd-base-private"}.get(variant, "reference")


def baselines_of(variant: str, variants: list[str]) -> list[str]:
    """Every variant of this run that `variant`'s ratios compare it with.

    hubd-principals: hubd-private first (the same forced private routing, without the token
    and seat checks: the fair baseline), then hubd (the default routing), then the reference
    if it ran. Any other variant: its baseline_of if it ran, else the reference."""
    if variant == "reference":
        return []
    if variant == "hubd-principals":
        return [b for b in ("hubd-private", "hubd", "reference") if b in variants]
    against = baseline_of(variant)
    if against not in variants:
        against = "reference"
    return [] if against == variant else [against]


def ratios(runs: list[dict], variants: list[str], scenarios: list[str]) -> list[dict]:
    """Per-round paired ratios variant / each of its baselines (baselines_of), median over
    rounds. A pair is the two variants' runs of the same round and scenario."""
    out = []
    metrics = {"msg/s": lambda r: r["msg_per_s"], "p50": lambda r: r["lat_ms"]["p50"],
               "p99": lambda r: r["lat_ms"]["p99"], "cpu/msg": lambda r: r.get("hub_cpu_ms_per_msg")}
    for scen in scenarios:
        for var in variants:
            for against in baselines_of(var, variants):
                refs = {r["round"]: r for r in runs if r["variant"] == against and r["scenario"] == scen
                        and "error" not in r}
                mine = {r["round"]: r for r in runs if r["variant"] == var and r["scenario"] == scen
                        and "error" not in r}
                paired = sorted(set(refs) & set(mine))
                if not paired:
                    continue
                row = {"scenario": scen, "label": SCENARIOS[scen]["label"], "variant": var, "against": against,
                       "rounds": len(paired)}
                per_round: dict[str, list] = {}
                for name, get in metrics.items():
                    vals = []
                    for k in paired:
                        a, b = get(mine[k]), get(refs[k])
                        if a is not None and b:
                            vals.append(a / b)
                            per_round.setdefault(name, []).append((k, round(a / b, 3)))
                    row[name] = (round(statistics.median(vals), 3), round(min(vals), 3), round(max(vals), 3)) \
                        if vals else None
                row["per_round"] = per_round  # (round, ratio) per metric, for the JSON
                out.append(row)
    return out


def print_table(rows: list[dict], rat: list[dict]) -> None:
    hdr = ("scen", "hub", "ok", "msg/s", "p50 ms", "p90 ms", "p99 ms", "max ms", "rcpt p50",
           "hub ms/msg", "hub cpu", "client cpu", "client us/msg", "other", "B/msg", "problems")
    lines = [hdr]
    for r in rows:
        flags = dict(r["problems"])
        if r["rounds_failed"]:
            flags["failed_rounds"] = r["rounds_failed"]
        if (r["client_cpu_util"] or 0) > 0.85:
            flags["CLIENT-BOUND"] = True
        if (r["other_cores"] or 0) > 0.3:
            flags["BOX-BUSY"] = True
        lines.append((f"{r['scenario']} {r['label']}", r["variant"], str(r["rounds_ok"]), fmt(r["msg_per_s"], 0),
                      fmt(r["p50"], 2), fmt(r["p90"], 2), fmt(r["p99"], 2), fmt(r["max"], 1),
                      fmt(r["receipt_p50"], 2), fmt(r["hub_ms_per_msg"], 3),
                      fmt(None if r["hub_cpu_util"] is None else r["hub_cpu_util"] * 100, 0) + "%",
                      fmt(None if r["client_cpu_util"] is None else r["client_cpu_util"] * 100, 0) + "%",
                      fmt(r["client_us_per_msg"], 1),
                      fmt(r["other_cores"], 2),
                      fmt(r["journal_bytes_per_msg"], 0),
                      ", ".join(f"{k}={v}" for k, v in flags.items()) or "none"))
    widths = [max(len(str(l[i])) for l in lines) for i in range(len(hdr))]
    print()
    print("medians over rounds (hub cpu / client cpu = share of one core; other = cores used by other work "
          "on the box; B/msg = growth of the hub's files per chat):")
    for l in lines:
        print("  ".join(str(c).ljust(w) for c, w in zip(l, widths)).rstrip())
    for r in rows:
        if r["errors"]:
            print(f"  ! {r['scenario']} {r['variant']}: {r['errors'][0][:300]}")
    if rat:
        print()
        print("variant / baseline, median of per-round ratios [min..max]  "
              "(msg/s: higher is better; p50, p99, cpu/msg: lower is better; |ratio-1| < 0.25 is noise):")
        for r in rat:
            parts = []
            for name in ("msg/s", "p50", "p99", "cpu/msg"):
                v = r.get(name)
                parts.append(f"{name} {v[0]:.2f}x [{v[1]:.2f}..{v[2]:.2f}]" if v else f"{name} -")
            print(f"  {r['scenario']} {r['label']:<9} {r['variant'] + ' / ' + r['against']:<32} "
                  f"rounds {r['rounds']}:  " + ";  ".join(parts))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Interleaved local benchmark: reference hub vs hubd.")
    ap.add_argument("--rounds", type=int, default=None, help="default 3 (1 with --quick)")
    ap.add_argument("--quick", action="store_true", help="1 round (unless --rounds), smaller counts")
    ap.add_argument("--only", default=None,
                    help="reference | hubd (= hubd and hubd-private) | comma list of variants "
                         f"({', '.join(VARIANTS)}); default {','.join(DEFAULT_VARIANTS)}")
    ap.add_argument("--scenarios", default="a,b",
                    help="comma list: a=4x8, b=1x1 with receipts, c=4x8 with receipts, d=1x1, "
                         "e=4x64 (default a,b)")
    ap.add_argument("--count-ref", type=int, default=None, help="messages for the reference (loaded scenarios)")
    ap.add_argument("--count-hubd", type=int, default=None, help="messages for hubd (loaded scenarios)")
    ap.add_argument("--count-unloaded", type=int, default=None, help="messages for 1x1 scenarios (both hubs)")
    ap.add_argument("--duration", type=float, default=None,
                    help="loaded scenarios send for this many seconds instead of a count")
    ap.add_argument("--warmup", type=int, default=100, help="unmeasured messages before each run")
    ap.add_argument("--procs", type=int, default=1, help="client processes per run")
    ap.add_argument("--client", choices=("raw", "aiohttp"), default="raw",
                    help="loadgen client: raw (asyncio Protocols, lean; default) or aiohttp (the earlier one)")
    ap.add_argument("--timeout", type=float, default=600, help="per-run loadgen timeout, seconds")
    ap.add_argument("--keep", action="store_true", help="keep the hubs' temporary directories")
    ap.add_argument("--hubd-rev", default=None,
                    help="run hubd as committed at this git revision (e.g. HEAD) instead of the working "
                         "tree, which may be mid-edit")
    ap.add_argument("--base-rev", default=None,
                    help="git revision the hubd-base* variants run (e.g. the commit before a change); "
                         "with it, --only defaults to hubd,hubd-base and ratios compare with the base")
    ap.add_argument("--hubd-flags", default="",
                    help="extra flags for the hubd variants (hubd, hubd-private, hubd-principals; not "
                         "hubd-base*), e.g. \"--no-redsyn "
                         "--no-broker\" to leave out the doors a base revision did not have")
    ap.add_argument("--hubd-default-quota", action="store_true",
                    help="leave hubd's ingress quota on (default: off, like the reference's)")
    ap.add_argument("--json", dest="json_out", default=None, help="write all runs and the summary here")
    args = ap.parse_args(argv)

    rounds = args.rounds or (1 if args.quick else 3)
    if args.only is None and args.base_rev:
        variants = ["hubd-base", "hubd"]
    elif args.only is None:
        variants = list(DEFAULT_VARIANTS)
    elif args.only == "hubd":
        variants = ["hubd", "hubd-private"]
    else:
        variants = [v.strip() for v in args.only.split(",") if v.strip()]
    for v in variants:
        if v not in VARIANTS:
            ap.error(f"unknown variant {v!r}; choose from {', '.join(VARIANTS)}")
    scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    for s in scenarios:
        if s not in SCENARIOS:
            ap.error(f"unknown scenario {s!r}")

    def count_for(scen: str, variant: str) -> int:
        sc = SCENARIOS[scen]
        k = kind(variant)
        if sc["senders"] == 1 and args.count_unloaded:
            return args.count_unloaded
        if sc["senders"] > 1 and k == "reference" and args.count_ref:
            return args.count_ref
        if sc["senders"] > 1 and k == "hubd" and args.count_hubd:
            return args.count_hubd
        return (sc["quick"] if args.quick else sc["count"])[k]

    base = Path(tempfile.mkdtemp(prefix="hubd-bench-"))
    args.hubd_src = None
    args.base_src = None
    if args.base_rev:
        args.base_src = base / "hubd-base-src"
        base_version = snapshot_hubd(args.base_rev, args.base_src)
    hubd_version = "working tree"
    if args.hubd_rev and any(kind(v) == "hubd" for v in variants):
        args.hubd_src = base / "hubd-src"
        hubd_version = "git " + snapshot_hubd(args.hubd_rev, args.hubd_src)
    meta = {"started": time.strftime("%Y-%m-%d %H:%M:%S"), "host": platform.node(), "cpus": os.cpu_count(),
            "python": sys.version.split()[0], "rounds": rounds, "variants": variants, "scenarios": scenarios,
            "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "loadavg_start": os.getloadavg(), "git": _git_head(), "hubd": hubd_version,
            "hubd_base": ("git " + base_version) if args.base_rev else None}
    print(f"bench_local: {rounds} round(s), variants {variants}, scenarios {scenarios}, "
          f"hubd from {hubd_version}, {args.client} client, {os.cpu_count()} cpus, "
          f"loadavg {os.getloadavg()[0]:.2f}, temp {base}")
    if os.getloadavg()[0] > 0.5:
        print("  warning: the box is not idle (loadavg > 0.5); figures will be noisier")
    runs: list[dict] = []
    start_failures: dict[str, int] = {}
    try:
        for rnd in range(1, rounds + 1):
            for scen in scenarios:
                for var in in_turn(variants, rnd):
                    if start_failures.get(var, 0) >= 2:
                        continue  # does not start (e.g. hubd not runnable yet): stop trying
                    n = count_for(scen, var)
                    rec = run_one(var, scen, n, args, base, f"r{rnd}-{scen}-{var}")
                    rec["round"] = rnd
                    runs.append(rec)
                    if "error" in rec:
                        if rec["error"].startswith("hub did not start"):
                            start_failures[var] = start_failures.get(var, 0) + 1
                        print(f"  round {rnd} {scen} {SCENARIOS[scen]['label']:<9} {var:<15} ERROR {rec['error'][:300]}")
                    else:
                        lat = rec["lat_ms"]
                        bad = {k: rec[k] for k in ("missing", "refused", "duplicates", "late", "unexpected", "malformed",
                                                   "errors", "receipts_negative", "receipt_missing",
                                                   "closed_sockets", "aborted") if rec.get(k)}
                        print(f"  round {rnd} {scen} {SCENARIOS[scen]['label']:<9} {var:<15} "
                              f"n={rec['delivered']:<6} {rec['msg_per_s']:>8.0f} msg/s  p50 {lat['p50']:>7.2f}  "
                              f"p99 {lat['p99']:>7.2f} ms  hub {fmt(rec.get('hub_cpu_ms_per_msg'), 3)} ms/msg  "
                              f"client {rec['client_cpu_util']:.0%} {fmt(rec.get('client_cpu_us_per_msg'), 1)} us/msg  other {fmt(rec.get('other_cores'), 2)} cores  "
                              f"{bad or ''}", flush=True)
                        if bad and rec.get("samples"):
                            print(f"      e.g. {json.dumps(rec['samples'][0])[:300]}")
    except KeyboardInterrupt:
        print("interrupted; summarising what ran")
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    rows = summarise(runs, variants, scenarios)
    rat = ratios(runs, variants, scenarios)
    print_table(rows, rat)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"meta": meta, "runs": runs, "summary": rows, "ratios": rat}, f, indent=1)
        print(f"\nwrote {args.json_out}")
    return 0


def _git_head() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                              text=True, timeout=5).stdout.strip() or None
    except Exception:
        return None


if __name__ == "__main__":
    sys.exit(main())

"""A reference hub as the origin: forwarding throughput to a west of each kind.

Issue 22 item 1's measurement. East is always the reference hub (0.99.38),
which opens one pinned-mTLS peer link per forward and closes it once
answered; west is, in turn:

  hubd-base  hubd as committed at --base-rev (default d590ccf, before the fix)
  hubd       hubd from the working tree (or --hubd-rev)
  reference  the reference hub (the reference -> reference baseline)

Each run starts a fresh east and a fresh west (fresh journals), sends the
issue's load, and stops both by PID: 2 senders on east with 4 chats in flight
each (a chat is in flight until its receiver on west reads it), --count chats
in all (200), a chat counted undelivered if it has not arrived --deadline
seconds (60) after the first send (tests/support/forward_load.py). Each side
runs its own default flags plus the reference's policy files; the reference
hubs also run --no-durable-ingress-quota (their default 100 chats a minute
would refuse the load). Variants run interleaved, the order reversed every
other round (tests/bench/order.py).

    .venv/bin/python -m tests.bench.bench_reference_east                 # 3 rounds
    .venv/bin/python -m tests.bench.bench_reference_east --rounds 1 --only hubd,reference
    .venv/bin/python -m tests.bench.bench_reference_east --base-rev 39aaa41 --json /tmp/r.json

Measures; never asserts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):  # run as a script
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.bench.bench_local import (  # noqa: E402
    _git_head, fmt, med, run_from_snapshot, snapshot_hubd)
from tests.bench.order import in_turn  # noqa: E402
from tests.support.federation import Pki, make_pki, site_flags, write_serving_policy  # noqa: E402
from tests.support.forward_load import forward_load  # noqa: E402
from tests.support.procs import HubProcess, hubd_process, reference_hub_process  # noqa: E402

VARIANTS = ("hubd-base", "hubd", "reference")
SENDERS, WINDOW = 2, 4
REFERENCE_FLAGS = ("--no-durable-ingress-quota",)


def make_west(variant: str, workdir: Path, pki: Pki, policy: Path, sources: dict) -> HubProcess:
    serve = site_flags(pki, "west", policy).serve
    if variant == "reference":
        return reference_hub_process(workdir / "west", *REFERENCE_FLAGS, *serve, hub_id="west",
                                     scheme="wss")
    west = hubd_process(workdir / "west", *serve, hub_id="west", scheme="wss")
    return run_from_snapshot(west, sources[variant]) if sources.get(variant) else west


def run_one(variant: str, workdir: Path, pki: Pki, policy: Path, sources: dict, args) -> dict:
    west = make_west(variant, workdir, pki, policy, sources)
    east_site = site_flags(pki, "east", None)
    east = None
    record: dict = {"variant": variant, "loadavg_before": os.getloadavg()[0]}
    try:
        west.start()
        east = reference_hub_process(workdir / "east", *REFERENCE_FLAGS, *east_site.connect,
                                     *east_site.peer_flags(pki, "west", west.url), hub_id="east")
        east.start()
        result = asyncio.run(forward_load(east.url, west.url, "west", senders=SENDERS,
                                          window=WINDOW, per_sender=args.count // SENDERS,
                                          deadline=args.deadline))
        record.update(expected=result.expected, sent=result.sent, delivered=result.delivered,
                      undelivered=result.undelivered, duplicates=result.duplicates,
                      refusals=len(result.refusals), elapsed_s=round(result.elapsed, 2),
                      msg_per_s=round(result.msg_per_s, 1),
                      p50_ms=round(result.p50_ms, 1) if result.p50_ms is not None else None,
                      peer_links=west.log().count("peer link registered")
                      if variant != "reference" else None)
    except Exception as exc:  # noqa: BLE001 - a failed run is reported, the others go on
        record["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        for hub in (east, west):
            if hub is not None:
                hub.stop()
    return record


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--count", type=int, default=200, help="chats per run (split over 2 senders)")
    ap.add_argument("--deadline", type=float, default=60.0,
                    help="seconds after the first send; a chat not arrived by then is undelivered")
    ap.add_argument("--base-rev", default="d590ccf", help="hubd-base: hubd at this revision")
    ap.add_argument("--hubd-rev", default=None,
                    help="hubd at this revision (default: the working tree)")
    ap.add_argument("--only", default=",".join(VARIANTS))
    ap.add_argument("--json", default=None, help="write every run's record here")
    args = ap.parse_args()
    variants = [v for v in args.only.split(",") if v in VARIANTS]
    base = Path(tempfile.mkdtemp(prefix="bench-refeast-"))
    sources, revs = {}, {"hubd": _git_head() + ("" if args.hubd_rev else " (working tree)")}
    if "hubd-base" in variants:
        sources["hubd-base"] = base / "src-base"
        revs["hubd-base"] = snapshot_hubd(args.base_rev, sources["hubd-base"])
    if args.hubd_rev:
        sources["hubd"] = base / "src-hubd"
        revs["hubd"] = snapshot_hubd(args.hubd_rev, sources["hubd"])
    pki = make_pki(base / "pki", ["east", "west"])
    policy = write_serving_policy(base / "west-policy", pki, {"east": ["PROJ"]})
    runs = []
    try:
        for round_no in range(1, args.rounds + 1):
            for variant in in_turn(variants, round_no):
                record = run_one(variant, base / f"r{round_no}-{variant}", pki, policy, sources,
                                 args)
                record["round"] = round_no
                runs.append(record)
                print(json.dumps(record), flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(f"\nreference east -> west, {args.count} chats, {SENDERS} senders x {WINDOW} in flight, "
          f"{args.deadline:.0f} s deadline; {args.rounds} rounds; revisions {revs}")
    print(f"{'west':<10} {'msg/s (median)':>15} {'per round':>24} {'undelivered':>12} "
          f"{'p50 ms':>8}")
    by_variant = {}
    for variant in variants:
        ok = [r for r in runs if r["variant"] == variant and "error" not in r]
        by_variant[variant] = ok
        failed = len([r for r in runs if r["variant"] == variant and "error" in r])
        print(f"{variant:<10} {fmt(med([r['msg_per_s'] for r in ok])):>15} "
              f"{' '.join(fmt(r['msg_per_s']) for r in ok):>24} "
              f"{sum(r['undelivered'] for r in ok):>12} "
              f"{fmt(med([r['p50_ms'] for r in ok])):>8}"
              + (f"  ({failed} failed)" if failed else ""))
    for num, den in (("hubd", "hubd-base"), ("hubd", "reference")):
        pairs = [(a["msg_per_s"], b["msg_per_s"]) for a in by_variant.get(num, [])
                 for b in by_variant.get(den, []) if a["round"] == b["round"] and b["msg_per_s"]]
        if pairs:
            print(f"{num}/{den} msg/s, median of per-round ratios: "
                  f"{fmt(med([a / b for a, b in pairs]), 2)}x")
    if args.json:
        Path(args.json).write_text(json.dumps({"revisions": revs, "runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

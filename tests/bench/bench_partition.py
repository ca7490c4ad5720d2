"""Partition benchmark (bench_forward scenario p): two hubs in network
namespaces, the east-west link black-holed by an nftables drop rule for
--cut seconds while chats flow east -> west at --rate, then restored.

Per run (fresh namespaces, fresh journals, fresh processes, stopped by PID):

  1. east and west in their own namespaces on a veth pair (203.0.113.0/30);
     west serves wss:// with a serving policy granting east PROJ, east
     forwards PROJ/bob@west to it;
  2. a receiver PROJ/bob on west (mailbox replay from seq 0) and a sender
     PROJ/alice on east sending --rate chats/s on a fixed schedule
     (tests/support/chat_driver.py, one line per chat sent and received, with
     wall-clock times: both namespaces share the host clock);
  3. after --before seconds: `nft` drops everything between east and west
     (tests/support/netns.py block(): no error, no reset, the packets vanish);
  4. --cut seconds later the rule is deleted; sending goes on for --after s.

Figures: lost (sent, never received), duplicated (received twice), and
**drained s**: from deleting the rule until every chat sent before that
moment had arrived on west. Also the chats sent during the cut, the first
arrival after the restore, and east's silence closes of the link.

Variants, interleaved per round:
  wild      west bound to 0.0.0.0, east dials west's address;
  loopback  west bound to 127.0.0.1 behind a kernel port-forward (nft dnat
            8443 -> 127.0.0.1:8876 in west's namespace) with
            --advertised-host ADDR:8443, east dials ADDR:8443;
  baseline  (with --baseline-rev REV) wild, hubd from REV: the before/after.

    python -m tests.bench.bench_forward --scenarios p               # 3 rounds
    python -m tests.bench.bench_partition --rounds 1 --baseline-rev main

Needs root and nftables. Measures; never asserts. Goal: 0 lost, 0
duplicated, drained within 2 s of the restore, in every variant.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.bench.bench_local import snapshot_hubd  # noqa: E402
from tests.support.federation import make_pki, site_flags, write_serving_policy  # noqa: E402
from tests.support.netns import Topology, nft_available  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
PORT = 8876
OUTSIDE_PORT = 8443
GOAL_DRAIN_S = 2.0


def _env(hubd_src: Path | None) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = (f"{hubd_src}:" if hubd_src else "") + str(REPO)
    return env


def _driver(*args) -> list:
    return [sys.executable, "-m", "tests.support.chat_driver", *args]


def _get(topo, site, path) -> str:
    return topo.run(site, _driver("get", "--url", f"http://127.0.0.1:{PORT}{path}"),
                    timeout=10, env=_env(None)).stdout


def _wait(what, check, timeout=60.0):
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = check()
        except Exception:  # not listening yet
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.05)


def run_one(variant: str, args, pki, policy, work: Path, hubd_src: Path | None) -> dict:
    work.mkdir(parents=True)
    env = _env(hubd_src if variant == "baseline" else None)
    # `python -m` puts its working directory first on sys.path: the baseline
    # hubs run in the snapshot, the others in the working tree.
    hub_cwd = hubd_src if variant == "baseline" else REPO
    count = int(args.rate * (args.before + args.cut + args.after))
    with Topology() as topo:
        topo.link("east", "west", "203.0.113.0/30")
        addr = topo.addr("west", "east-west")
        west_flags = [*site_flags(pki, "west", policy).serve]
        if variant == "loopback":
            topo.forward_to_loopback("west", OUTSIDE_PORT, PORT)
            west_flags += ["--host", "127.0.0.1", "--advertised-host", f"{addr}:{OUTSIDE_PORT}"]
            east_dials = f"wss://{addr}:{OUTSIDE_PORT}/"
        else:
            west_flags += ["--host", "0.0.0.0"]
            east_dials = f"wss://{addr}:{PORT}/"
        common = ["--port", str(PORT), "--no-durable-ingress-quota", "--no-broker"]
        procs = {
            "west": topo.popen("west", [sys.executable, "-m", "hubd", *common, "--db",
                                        str(work / "west.db"), "--hub-id", "west", *west_flags],
                               cwd=hub_cwd, env=env, stdout=open(work / "west.log", "w"),
                               stderr=subprocess.STDOUT),
            "east": topo.popen("east", [
                sys.executable, "-m", "hubd", *common, "--host", "127.0.0.1", "--db",
                str(work / "east.db"), "--hub-id", "east", *site_flags(pki, "east", None).connect,
                "--message-peer", f"west={east_dials}",
                "--message-peer-pin", f"west={pki.server_pin('west')}"],
                cwd=hub_cwd, env=env, stdout=open(work / "east.log", "w"),
                stderr=subprocess.STDOUT),
        }
        _wait("east's link up", lambda: json.loads(_get(topo, "east", "/health"))
              ["message_forward"]["west"]["link"] == "up")
        receiver = topo.popen("west", _driver(
            "receive", "--url", f"wss://127.0.0.1:{PORT}/", "--name", "PROJ/bob", "--expect",
            str(count), "--timeout", str(args.before + args.cut + args.after + 60),
            "--linger", "2"), cwd=REPO, env=_env(None), stdout=subprocess.PIPE, text=True)
        assert json.loads(receiver.stdout.readline())["event"] == "ready"
        sender = topo.popen("east", _driver(
            "send", "--url", f"ws://127.0.0.1:{PORT}/", "--name", "PROJ/alice",
            "--target", "PROJ/bob@west", "--count", str(count), "--rate", str(args.rate),
            "--timeout", "90", "--log-sends"), cwd=REPO, env=_env(None),
            stdout=subprocess.PIPE, text=True)
        time.sleep(args.before)
        cut_at = time.time()
        topo.block("east", "west")
        time.sleep(args.cut)
        topo.unblock("east", "west")
        restored_at = time.time()
        sent_out, _ = sender.communicate(timeout=args.after + 150)
        recv_out, _ = receiver.communicate(timeout=args.after + 150)
        health = json.loads(_get(topo, "east", "/health"))["message_forward"]["west"]
        for proc in procs.values():
            topo.stop(proc)
    sent = {r["client_msg_id"]: r["t"] for r in map(json.loads, sent_out.splitlines())
            if r.get("event") == "sent_one"}
    recv_lines = [json.loads(line) for line in recv_out.splitlines()]
    arrived = {r["client_msg_id"]: r["t"] for r in recv_lines if r.get("event") == "chat"}
    done = recv_lines[-1] if recv_lines and recv_lines[-1].get("event") == "done" else {}
    before_restore = [cmid for cmid, t in sent.items() if t < restored_at]
    missing_at_restore = [cmid for cmid in before_restore
                          if cmid not in arrived or arrived[cmid] >= restored_at]
    last = max((arrived[c] for c in missing_at_restore if c in arrived), default=restored_at)
    first_after = min((t for t in arrived.values() if t >= restored_at), default=None)
    log = (work / "east.log").read_text() + (work / "west.log").read_text()
    return {
        "variant": variant, "sent": len(sent), "received": len(arrived),
        "lost": len(set(sent) - set(arrived)), "duplicated": done.get("duplicates"),
        "sent_during_cut": sum(1 for t in sent.values() if cut_at <= t < restored_at),
        "pending_at_restore": len(missing_at_restore),
        "drained_s": round(last - restored_at, 3)
        if all(c in arrived for c in missing_at_restore) else None,
        "first_after_restore_s": round(first_after - restored_at, 3) if first_after else None,
        "silence_closes": health.get("silence_closes"), "connects": health.get("connects"),
        "last_error": (health.get("last_error") or {}).get("cause"),
        "tracebacks": log.count("Traceback"),
    }


def line(r: dict) -> str:
    if "error" in r:
        return f"  {r['variant']:<9} ERROR {r['error']}"
    return (f"  {r['variant']:<9} sent {r['sent']:>4} (cut {r['sent_during_cut']:>3}) "
            f"lost {r['lost']:>3} dup {r['duplicated']} pending@restore "
            f"{r['pending_at_restore']:>3} drained {r['drained_s']} s first "
            f"{r['first_after_restore_s']} s  silence-closes {r['silence_closes']} "
            f"connects {r['connects']} tracebacks {r['tracebacks']}")


def summarise(runs: list[dict]) -> dict:
    out = {}
    for variant in dict.fromkeys(r["variant"] for r in runs):
        mine = [r for r in runs if r["variant"] == variant and "error" not in r]
        drains = [r["drained_s"] for r in mine if r["drained_s"] is not None]
        out[variant] = {
            "runs": len(mine), "lost": sum(r["lost"] for r in mine),
            "duplicated": sum(r["duplicated"] or 0 for r in mine),
            "drained_median_s": round(statistics.median(drains), 3) if drains else None,
            "drained_max_s": max(drains) if drains else None,
            "undrained_runs": len(mine) - len(drains),
        }
        s = out[variant]
        s["goal"] = "MET" if mine and s["lost"] == 0 and s["duplicated"] == 0 and \
            not s["undrained_runs"] and s["drained_max_s"] <= GOAL_DRAIN_S else "MISSED"
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rate", type=float, default=20.0, help="chats/s east -> west (20)")
    ap.add_argument("--before", type=float, default=5.0, help="seconds of flow before the cut")
    ap.add_argument("--cut", type=float, default=15.0, help="seconds the link is dropped (15)")
    ap.add_argument("--after", type=float, default=5.0, help="seconds of flow after the restore")
    ap.add_argument("--variants", default="wild,loopback")
    ap.add_argument("--baseline-rev", default=None,
                    help="also run variant 'baseline': west bound to 0.0.0.0, hubd from REV")
    ap.add_argument("--json", dest="json_out", default=None)
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args(argv)
    ok, why = nft_available()
    if not ok:
        print(f"bench_partition needs network namespaces and nftables: {why}")
        return 2
    variants = [v for v in args.variants.split(",") if v]
    base = Path(tempfile.mkdtemp(prefix="hubd-bench-partition-"))
    hubd_src = None
    if args.baseline_rev:
        hubd_src = base / "baseline-src"
        print(f"baseline: hubd {snapshot_hubd(args.baseline_rev, hubd_src)} "
              f"({args.baseline_rev})")
        variants.append("baseline")
    print(f"bench_partition: {args.rounds} round(s), {args.rate:g} chats/s, cut {args.cut:g} s "
          f"after {args.before:g} s, {args.after:g} s after; variants {variants}; "
          f"loadavg {os.getloadavg()[0]:.2f}", flush=True)
    runs = []
    try:
        pki = make_pki(base / "pki", ["east", "west"])
        policy = write_serving_policy(base / "west-policy", pki, {"east": ["PROJ"]})
        for rnd in range(1, args.rounds + 1):
            for variant in variants:
                try:
                    rec = run_one(variant, args, pki, policy, base / f"r{rnd}-{variant}",
                                  hubd_src)
                except Exception as exc:  # a run that failed is reported, the rest go on
                    rec = {"variant": variant, "error": f"{type(exc).__name__}: {exc}"}
                rec["round"] = rnd
                runs.append(rec)
                print(line(rec), flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    summary = summarise(runs)
    print(f"\n{'variant':<9} {'runs':>4} {'lost':>5} {'dup':>4} {'drained median s':>17} "
          f"{'max s':>6}  goal (0 lost, 0 dup, drained <= {GOAL_DRAIN_S:g} s)")
    for variant, s in summary.items():
        print(f"{variant:<9} {s['runs']:>4} {s['lost']:>5} {s['duplicated']:>4} "
              f"{s['drained_median_s']!s:>17} {s['drained_max_s']!s:>6}  {s['goal']}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"runs": runs, "summary": summary}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

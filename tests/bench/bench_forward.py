"""Forwarding benchmark: chats from hub ``east`` to seats on hub ``west``, reference vs hubd.

Each run starts a fresh hub pair (two processes, fresh durable journals in a new temporary
directory) and stops both by PID afterwards:

  west  serves wss:// with its server certificate and a serving policy granting east the
        namespace PROJ (``--tls-certfile --tls-keyfile --multihub-serving-policy``);
  east  forwards ``PROJ/seat@west`` to west (``--message-peer west=wss://127.0.0.1:PORT/
        --message-peer-pin west=sha256:... --multihub-client-certfile/-keyfile``).

Both hubs run with ``--no-durable-ingress-quota``; the reference additionally with
``--metrics``. Certificates come from ``python -m hubd certs peer-setup`` (made once per
benchmark, owner-only); the reference reads the same files.

Scenarios (run interleaved per round: reference, hubd, then hubd, reference in the next
round, so each runs first equally often, tests/bench/order.py):

  a  throughput: 4 senders on east x 8 in flight, each to its own receiver on west
     (``PROJ/<run>-r<i>@west``); count-based. msg/s, latency, CPU per message of each hub,
     and with --receipts how many forwards were ``pending`` first.
  b  latency at a fixed offered rate (open loop, paced sends): hubd 5,000 msg/s for 5 s; the
     reference 40 msg/s for 10 s (a rate it sustains), reported as such.
  c  recovery: west stopped (SIGTERM by PID), N chats sent from east while it is down (N = 20
     and 500), west restarted on the same port and journal after --down seconds; the time from
     west accepting connections (its port polled every 2 ms) until the last chat reached a
     receiver registered on west with mailbox replay (``mailbox: true, since_seq: 0``).
  p  partition (hubd only, network namespaces, root): the east-west link dropped by nftables
     for 15 s while 20 chats/s flow, then restored; lost, duplicated, and how long after the
     restore the backlog drained; west on 0.0.0.0 and west on loopback behind a port-forward
     with --advertised-host (tests/bench/bench_partition.py, which runs it; --partition-baseline
     REV adds hubd at REV as a before/after).

    .venv/bin/python -m tests.bench.bench_forward                  # 3 rounds, a,b,c
    .venv/bin/python -m tests.bench.bench_forward --quick          # 1 round, small counts
    .venv/bin/python -m tests.bench.bench_forward --only hubd --scenarios a,b --rounds 5
    .venv/bin/python -m tests.bench.bench_forward --hubd-rev HEAD --json /tmp/fwd.json
    .venv/bin/python -m tests.bench.bench_forward --base-rev 39aaa41 --scenarios a,c   # before/after

With --base-rev the variants are hubd-base (hubd as committed at that revision) and hubd
(the working tree, or --hubd-rev), interleaved per round; ratios are hubd / hubd-base.

Measures; never asserts. Goals for hubd are printed next to the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

if __package__ in (None, ""):  # run as a script: python tests/bench/bench_forward.py
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.bench import loadgen as lg  # noqa: E402
from tests.bench import rawclient  # noqa: E402
from tests.bench.order import in_turn  # noqa: E402
from tests.bench.bench_local import _git_head, fmt, med, run_from_snapshot, snapshot_hubd  # noqa: E402
from tests.support.federation import Pki, make_pki, site_flags, write_serving_policy  # noqa: E402
from tests.support.procs import REPO, HubProcess, free_port, hubd_process, reference_hub_process  # noqa: E402

VARIANTS = ("reference", "hubd", "hubd-base")
SCENARIOS = ("a", "b", "c", "p")
PROBE = 1_000_000  # (c) probe chats are numbered from here up
BUSY = 0.3  # other cores above this: the box was busy (figures compete for the 2 cores)

GOAL_RATE = 10_000        # (a) hubd msg/s
GOAL_RATIO = 100.0        # (a) hubd / reference msg/s
GOAL_P99_MS = 20.0        # (b) hubd p99 at 5,000 msg/s offered
GOAL_RECOVERY_S = 1.0     # (c) hubd, from west accepting connections to the last chat delivered

# per hub kind: (a) count, (b) total offered msg/s and seconds; quick values in brackets
COUNTS = {
    "a": {"reference": 600, "hubd": 30000},
    "a_quick": {"reference": 200, "hubd": 10000},
    "b": {"reference": (40, 10.0), "hubd": (5000, 5.0)},
    "b_quick": {"reference": (40, 5.0), "hubd": (5000, 3.0)},
}


# ----------------------------------------------------------------------------- hub pairs

class Site:
    """PKI and west's serving policy, made once per benchmark and shared by every pair."""

    def __init__(self, folder: Path):
        self.pki: Pki = make_pki(folder / "pki", ["east", "west"])
        self.policy = write_serving_policy(folder / "west-policy", self.pki, {"east": ["PROJ"]})
        self.west = site_flags(self.pki, "west", self.policy)
        self.east = site_flags(self.pki, "east", None)


def kind(variant: str) -> str:
    return "reference" if variant == "reference" else "hubd"


def make_pair(variant: str, workdir: Path, site: Site, hubd_src: Path | None,
              west_port: int | None = None, base_src: Path | None = None,
              hubd_flags: tuple = ()) -> tuple[HubProcess, HubProcess]:
    """(east, west), not started. West's port is fixed now, so east can be told its URL.
    hubd-base runs the snapshot of --base-rev; `hubd_flags` go to both hubs of
    the hubd variant only (--hubd-flags)."""
    if variant == "hubd-base":
        if base_src is None:
            raise ValueError("hubd-base needs --base-rev")
        hubd_src = base_src
    west_port = west_port or free_port()
    west_url = f"wss://127.0.0.1:{west_port}/"
    extra = list(hubd_flags) if variant == "hubd" else []
    west_args = [*site.west.serve, "--no-durable-ingress-quota", *extra]
    east_args = ["--no-durable-ingress-quota", *site.east.peer_flags(site.pki, "west", west_url),
                 *site.east.connect, *extra]
    if variant == "reference":
        # reference_hub_process adds --metrics
        west = reference_hub_process(workdir / "west", *west_args, port=west_port, hub_id="west",
                                     db=workdir / "west" / "west.db", scheme="wss")
        east = reference_hub_process(workdir / "east", *east_args, hub_id="east",
                                     db=workdir / "east" / "east.db")
    else:
        west = hubd_process(workdir / "west", *west_args, port=west_port, hub_id="west",
                            db=workdir / "west" / "west.db", scheme="wss")
        east = hubd_process(workdir / "east", *east_args, hub_id="east", db=workdir / "east" / "east.db")
        if hubd_src is not None:
            run_from_snapshot(west, hubd_src)
            run_from_snapshot(east, hubd_src)
    return east, west


def start_pair(east: HubProcess, west: HubProcess) -> None:
    west.start(ready_timeout=30)
    east.start(ready_timeout=30)


def stop_pair(*hubs: HubProcess) -> None:
    for hub in hubs:
        try:
            hub.stop(timeout=10)
        except Exception:  # noqa: BLE001 - keep stopping the others
            hub.kill()


def logs_tail(*hubs: HubProcess) -> str:
    return " | ".join(f"{h.argv[h.argv.index('--hub-id') + 1]}: {' '.join(h.log()[-500:].split())}"
                      for h in hubs)


# ----------------------------------------------------------------------------- a, b: loadgen

def commit_stats(hub: HubProcess) -> dict | None:
    """hubd's journal commit histogram from /metrics: commits, mean, and slow commits (a commit
    holds back every chat of its group: commit-before-publish)."""
    import re
    try:
        req = urllib.request.Request(hub.http_url + "/metrics")
        ctx = lg.ssl_client_context() if hub.scheme == "wss" else None
        text = urllib.request.urlopen(req, timeout=5, context=ctx).read().decode()
        buckets = {m.group(1): float(m.group(2)) for m in re.finditer(
            r'hubd_journal_commit_seconds_bucket\{le="([^"]+)"\} (\S+)', text)}
        total = buckets["+Inf"]
        seconds = float(re.search(r"hubd_journal_commit_seconds_sum (\S+)", text).group(1))
        events = float(re.search(r"hubd_journal_commit_batch_events_sum (\S+)", text).group(1))
    except (OSError, KeyError, AttributeError, ValueError):
        return None
    frames = {m.group(1): float(m.group(2)) for m in re.finditer(
        r'hubd_frames_received_total\{type="(multihub_message_forward(?:_batch)?|other)"\} (\S+)', text)}
    return {"commits": int(total), "mean_ms": round(seconds / total * 1000, 3) if total else None,
            "events_per_commit": round(events / total, 1) if total else None,
            # on the receiving hub: how many forward frames carried the run's chats
            "forward_frames_received": int(sum(frames.values())),
            "over_10ms": int(total - buckets.get("0.01", total)),
            "over_25ms": int(total - buckets.get("0.025", total)),
            "over_100ms": int(total - buckets.get("0.1", total))}


def py_spy_path(arg: str | None) -> str | None:
    for cand in (arg, shutil.which("py-spy"), "/tmp/refvenv/bin/py-spy"):
        if cand and os.path.exists(cand):
            return cand
    return None


def start_profiles(py_spy: str, hubs: dict[str, HubProcess], seconds: float, outdir: Path,
                   rate: int = 200) -> list:
    """py-spy record (raw, --gil: only samples where a thread holds the GIL) on each hub."""
    outdir.mkdir(parents=True, exist_ok=True)
    procs = []
    for name, hub in hubs.items():
        out = outdir / f"{name}.txt"
        procs.append((name, out, subprocess.Popen(
            [py_spy, "record", "-p", str(hub.pid), "-f", "raw", "-o", str(out), "-d", str(int(seconds)),
             "-r", str(rate), "--gil", "--nonblocking"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)))
    return procs


def summarise_profile(path: Path, top: int = 15) -> dict:
    """Top functions by own samples and by inclusive samples from a py-spy raw file."""
    own: dict[str, int] = {}
    incl: dict[str, int] = {}
    total = 0
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return {"samples": 0}
    for line in lines:
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        n = int(n)
        total += n
        frames = [f for f in stack.split(";") if not f.startswith(("process ", "thread "))]
        if not frames:
            continue
        own[frames[-1]] = own.get(frames[-1], 0) + n
        for f in set(frames):
            incl[f] = incl.get(f, 0) + n
    skip = ("asyncio/runners.py", "asyncio/base_events.py", "asyncio/events.py", "<frozen runpy>",
            "hubd/__main__.py", "hubd/cli.py", "threading.py", "<string>")
    pick = lambda d: [(k, round(v / total * 100, 1)) for k, v in sorted(d.items(), key=lambda kv: -kv[1])  # noqa: E731
                      if not any(x in k for x in skip)][:top]
    return {"samples": total, "self": pick(own), "inclusive": pick(incl)}


def run_load(variant: str, scen: str, args, site: Site, base: Path, tag: str, profile: bool = False) -> dict:
    workdir = base / tag
    k = "quick" if args.quick else ""
    rec: dict = {"variant": variant, "scenario": scen, "loadavg_before": os.getloadavg()[0]}
    east, west = make_pair(variant, workdir, site, args.hubd_src, base_src=args.base_src,
                           hubd_flags=tuple(args.hubd_flags.split()))
    try:
        try:
            start_pair(east, west)
        except Exception as e:  # noqa: BLE001
            rec["error"] = f"hubs did not start: {e}; {logs_tail(east, west)}"
            return rec
        cmd = [sys.executable, "-m", "tests.bench.loadgen", "--url", east.url, "--recv-url", west.url,
               "--target-suffix", "@west", "--prefix", "PROJ", "--hub-pid", str(east.pid),
               "--peer-hub-pid", str(west.pid), "--senders", "4", "--window", "8",
               "--warmup", str(args.warmup), "--client", "raw",
               # the reference parks colliding forwards for 1, 2, 4 ... s: wait for them
               "--msg-timeout", str(args.msg_timeout), "--drain-timeout", str(args.msg_timeout + 30),
               "--max-missing", "1000", "--json"]
        if scen == "a":
            count = args.count_ref if variant == "reference" and args.count_ref else \
                args.count_hubd if kind(variant) == "hubd" and args.count_hubd else \
                COUNTS["a_quick" if k else "a"][kind(variant)]
            if profile:  # long enough to cover py-spy's window at ~8k msg/s
                count = max(count, int(8000 * (args.profile_delay + args.profile_seconds + 2)))
            cmd += ["--count", str(count)]
            if args.receipts:
                cmd.append("--receipts")
        else:
            rate, seconds = COUNTS["b_quick" if k else "b"][kind(variant)]
            if variant == "reference" and args.rate_ref:
                rate = args.rate_ref
            if kind(variant) == "hubd" and args.rate_hubd:
                rate = args.rate_hubd
            if args.rate_seconds:
                seconds = args.rate_seconds
            if profile:
                seconds = max(seconds, args.profile_delay + args.profile_seconds + 1.5)
            count = int(rate * seconds)
            cmd += ["--rate", str(rate / 4), "--count", str(count)]
            rec["offered_target"] = rate
        rec["count"] = count
        t0 = time.monotonic()
        lg_proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        spies = []
        if profile:
            time.sleep(args.profile_delay)  # past the probe and the warm-up
            spies = start_profiles(args.py_spy, {"east": east, "west": west}, args.profile_seconds,
                                   workdir.parent / f"{tag}-profile", args.profile_rate)
        try:
            out, err = lg_proc.communicate(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            lg_proc.kill()
            lg_proc.communicate()
            raise
        p = subprocess.CompletedProcess(cmd, lg_proc.returncode, out, err)
        for name, path, spy in spies:
            try:
                spy.wait(timeout=args.profile_seconds + 30)
            except subprocess.TimeoutExpired:
                spy.kill()
            rec.setdefault("profile", {})[name] = summarise_profile(path)
            if args.keep:
                rec["profile"][name]["raw"] = str(path)
        rec["wall_s"] = round(time.monotonic() - t0, 2)
        if p.returncode != 0 or not p.stdout.strip():
            last = (p.stderr.strip().splitlines() or ["(no stderr)"])[-1]
            rec["error"] = f"loadgen exit {p.returncode}: {last}"
            rec["loadgen_stderr"] = p.stderr[-3000:]
            rec["hub_log_tail"] = logs_tail(east, west)
            return rec
        rec.update(json.loads(p.stdout.strip().splitlines()[-1]))
        if kind(variant) == "hubd":
            rec["journal_commits"] = {"east": commit_stats(east), "west": commit_stats(west)}
        for hub in (east, west):
            if not hub.alive():
                rec["error"] = f"a hub exited during the run (code {hub.proc.returncode})"
                rec["hub_log_tail"] = logs_tail(east, west)
        return rec
    except subprocess.TimeoutExpired:
        rec["error"] = f"loadgen timed out after {args.timeout}s"
        return rec
    finally:
        stop_pair(east, west)
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)


# ----------------------------------------------------------------------------- c: recovery

class Catcher:
    """One raw client socket that registers and collects the chats carrying a marker."""

    def __init__(self, name: str, marker: bytes):
        self.name = name
        self.marker = marker
        self.seen: dict[int, float] = {}   # chat number -> perf_counter when it arrived
        self.duplicates = 0
        self.replayed = 0
        self.frames: list[dict] = []       # error-like frames, for the record
        self.changed = asyncio.Event()
        self.proto: rawclient.WSClientProtocol | None = None

    def count_below(self, n: int) -> int:
        return sum(1 for k in self.seen if k < n)

    def on_frame(self, buf: bytes, s: int, e: int, t: float) -> None:
        i = buf.find(self.marker, s, e)
        if i < 0:
            if buf.find(b'"error"', s, e) >= 0 or buf.find(b"refused", s, e) >= 0:
                if len(self.frames) < 5:
                    self.frames.append(json.loads(buf[s:e]))
            return
        d = json.loads(buf[s:e])
        if d.get("type") != "chat":
            return
        i += len(self.marker)
        n = int(buf[i:buf.find(b".", i, e)])
        if n in self.seen:
            self.duplicates += 1
        else:
            self.seen[n] = t
            if d.get("replayed") and n < PROBE:
                self.replayed += 1
        self.changed.set()

    async def open(self, url: str, heartbeat: dict | None = None, timeout: float = 10.0) -> None:
        welcomed = asyncio.get_running_loop().create_future()

        def setup(p: rawclient.WSClientProtocol) -> None:
            def until_welcome(buf, s, e, t):
                d = json.loads(buf[s:e])
                if isinstance(d, dict) and d.get("type") == "welcome":
                    p.handler = self.on_frame
                    if not welcomed.done():
                        welcomed.set_result(t)
            p.handler = until_welcome

        self.proto = await rawclient.connect(url, timeout, setup=setup)
        await asyncio.wait_for(welcomed, timeout)
        frame = {"sender": self.name, "target": "System", "type": "heartbeat", "payload": "online"}
        frame.update(heartbeat or {})
        self.proto.send_text(json.dumps(frame).encode())

    def send_chat(self, target: str, marker: bytes, n: int) -> None:
        self.proto.send_text(json.dumps({
            "sender": self.name, "target": target, "type": "chat",
            "payload": f"{marker.decode()}{n}. recovery", "client_msg_id": f"rc{n}"}).encode())

    async def close(self) -> None:
        if self.proto is not None:
            await self.proto.close(timeout=1.0)


async def wait_port_fast(port: int, proc: subprocess.Popen, timeout: float) -> float:
    """Poll the port every 2 ms; perf_counter when a TCP connect first succeeds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"west exited with {proc.returncode} before listening")
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 1.0)
        except (OSError, asyncio.TimeoutError):
            await asyncio.sleep(0.002)
            continue
        t = time.perf_counter()
        writer.close()
        return t
    raise TimeoutError(f"west did not listen on {port} within {timeout}s")


async def recovery(east: HubProcess, west: HubProcess, pending: int, down: float, deliver_timeout: float) -> dict:
    run = secrets.token_hex(3)
    rname, sname = f"PROJ/{run}-rcv", f"PROJ/{run}-snd"
    marker = f"BMK{run}.".encode()
    out: dict = {"pending": pending, "down_s": down}
    receiver = Catcher(rname, marker)
    sender = Catcher(sname, b"BMK-none.")
    await receiver.open(west.url)
    await sender.open(east.url)
    # probe: one chat across until it arrives (the peer link, or the reference's per-forward
    # connection, works); probes are numbered from 1_000_000 up
    probe = PROBE
    deadline = time.monotonic() + 30
    while True:
        sender.send_chat(f"{rname}@west", marker, probe)
        t_end = time.monotonic() + 3
        while probe not in receiver.seen and time.monotonic() < t_end:
            await asyncio.sleep(0.01)
        if probe in receiver.seen:
            break
        probe += 1
        if time.monotonic() > deadline:
            raise RuntimeError(f"probe chat never crossed: {receiver.frames or sender.frames}")
    await receiver.close()
    receiver.seen.clear()
    receiver.duplicates = receiver.replayed = 0
    await asyncio.sleep(0.2)

    # west down
    west.stop(timeout=10)
    t_down = time.monotonic()
    for n in range(pending):
        sender.send_chat(f"{rname}@west", marker, n)
    await asyncio.sleep(max(0.0, t_down + down - time.monotonic()))

    # west back, same port and journal; the box's other load is read from here to the end
    box0 = lg.box_cpu_ticks()
    east0 = lg.proc_cpu_seconds(east.pid) or 0.0
    self0 = time.process_time()
    t_wall0 = time.perf_counter()
    log = open(west.log_path, "ab")
    west.proc = subprocess.Popen(west.argv, stdout=log, stderr=subprocess.STDOUT, env=west.env,
                                 start_new_session=True)
    log.close()
    t_up = await wait_port_fast(west.port, west.proc, 30)
    out["west_start_s"] = round(t_up - t_wall0, 3)
    # the receiver registers with mailbox replay as soon as a handshake succeeds
    receiver = Catcher(rname, marker)
    deadline = time.monotonic() + 30
    while True:
        try:
            await receiver.open(west.url, {"mailbox": True, "since_seq": 0}, timeout=5)
            break
        except (OSError, rawclient.HandshakeError, asyncio.TimeoutError, ValueError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.01)
    out["receiver_registered_s"] = round(time.perf_counter() - t_up, 3)
    t_stop = time.monotonic() + deliver_timeout
    while receiver.count_below(pending) < pending and time.monotonic() < t_stop:
        receiver.changed.clear()
        try:
            await asyncio.wait_for(receiver.changed.wait(), 0.5)
        except asyncio.TimeoutError:
            pass
    t_done = time.perf_counter()
    await asyncio.sleep(0.3)  # late duplicates
    box1 = lg.box_cpu_ticks()
    east1 = lg.proc_cpu_seconds(east.pid) or 0.0
    west_cpu = lg.proc_cpu_seconds(west.pid) or 0.0
    self1 = time.process_time()
    wall = time.perf_counter() - t_wall0
    times = [receiver.seen[n] for n in range(pending) if n in receiver.seen]
    out.update({
        "delivered": len(times),
        "missing": pending - len(times),
        "duplicates": receiver.duplicates,
        "replayed": receiver.replayed,
        "first_s": round(min(times) - t_up, 3) if times else None,
        "recovery_s": round(max(times) - t_up, 3) if len(times) == pending else None,
        "last_s": round(max(times) - t_up, 3) if times else None,
        "waited_s": round(t_done - t_up, 3),
        "east_cpu_s": round(east1 - east0, 3),
        "west_cpu_s": round(west_cpu, 3),  # the restarted process, all of it (startup included)
        "other_cores": round(max(0.0, (box1[0] - box0[0]) / lg.CLK_TCK - (east1 - east0) - west_cpu
                                 - (self1 - self0)) / max(wall, 1e-9), 2),
        "errors_seen": receiver.frames + sender.frames,
    })
    await receiver.close()
    await sender.close()
    return out


def run_recovery(variant: str, pending: int, args, site: Site, base: Path, tag: str) -> dict:
    workdir = base / tag
    rec: dict = {"variant": variant, "scenario": "c", "pending": pending, "loadavg_before": os.getloadavg()[0]}
    east, west = make_pair(variant, workdir, site, args.hubd_src, base_src=args.base_src,
                           hubd_flags=tuple(args.hubd_flags.split()))
    try:
        try:
            start_pair(east, west)
        except Exception as e:  # noqa: BLE001
            rec["error"] = f"hubs did not start: {e}; {logs_tail(east, west)}"
            return rec
        t0 = time.monotonic()
        rec.update(asyncio.run(asyncio.wait_for(
            recovery(east, west, pending, args.down, args.deliver_timeout),
            args.down + args.deliver_timeout + 120)))
        rec["wall_s"] = round(time.monotonic() - t0, 2)
        if rec.get("recovery_s") is None:
            rec["error"] = (f"{rec.get('missing')} of {pending} chats not delivered within "
                            f"{args.deliver_timeout}s of west accepting connections")
            rec["hub_log_tail"] = logs_tail(east, west)
        return rec
    except Exception as e:  # noqa: BLE001
        rec["error"] = f"{type(e).__name__}: {e}"
        rec["hub_log_tail"] = logs_tail(east, west)
        return rec
    finally:
        stop_pair(east, west)
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)


# ----------------------------------------------------------------------------- reporting

PROBLEMS = ("missing", "refused", "duplicates", "late", "unexpected", "malformed", "errors",
            "receipts_negative", "receipt_missing", "closed_sockets")


def busy(r: dict) -> bool:
    return (r.get("other_cores") or 0) > BUSY


def run_line(r: dict) -> str:
    head = f"  round {r['round']} {r['scenario']}{'' if r['scenario'] != 'c' else str(r.get('pending'))}"
    head = f"{head:<16} {r['variant']:<10}"
    if "error" in r and r["scenario"] != "c":
        return f"{head} ERROR {r['error'][:300]}"
    flag = "  BOX-BUSY" if busy(r) else ""
    if r["scenario"] == "c":
        if r.get("first_s") is None and "error" in r:
            return f"{head} ERROR {r['error'][:300]}"
        return (f"{head} {r.get('delivered')}/{r['pending']} delivered, first {fmt(r.get('first_s'), 3)} s, "
                f"last {fmt(r.get('last_s'), 3)} s after west listened (west start "
                f"{fmt(r.get('west_start_s'), 2)} s, receiver registered +{fmt(r.get('receiver_registered_s'), 3)} s, "
                f"{r.get('replayed')} replayed, dup {r.get('duplicates')})  other {fmt(r.get('other_cores'), 2)}"
                f"{flag}{'  ' + r['error'] if 'error' in r else ''}")
    lat = r["lat_ms"]
    bad = {k: r[k] for k in PROBLEMS if r.get(k)}
    s = (f"{head} n={r['delivered']:<6} {r['msg_per_s']:>8.0f} msg/s  p50 {lat['p50']:>8.2f}  "
         f"p99 {lat['p99']:>9.2f}  max {lat['max']:>9.1f} ms  east {fmt(r.get('hub_cpu_ms_per_msg'), 3)} "
         f"west {fmt(r.get('peer_hub_cpu_ms_per_msg'), 3)} ms/msg  client {r['client_cpu_util']:.0%}  "
         f"other {fmt(r.get('other_cores'), 2)}")
    if r.get("offered_msg_per_s") is not None:
        s += f"  offered {r['offered_msg_per_s']:.0f}/s (lag p99 {r['send_lag_ms']['p99']} ms)"
    if r.get("receipts"):
        s += f"  pending-first {r.get('forward_pending', 0)}"
    jc = r.get("journal_commits") or {}
    if jc.get("east") and jc.get("west"):
        s += (f"  commits >25ms e/w {jc['east']['over_25ms']}/{jc['west']['over_25ms']} "
              f"(max bucket >100ms {jc['east']['over_100ms']}/{jc['west']['over_100ms']})"
              f"  commits e/w {jc['east']['commits']}/{jc['west']['commits']}"
              f"  forward frames {jc['west'].get('forward_frames_received')}")
    return s + flag + (f"  {bad}" if bad else "")


def num(v: float) -> str:
    """Three significant digits, no exponent."""
    if v is None:
        return "-"
    a = abs(v)
    if a >= 100 or a == 0:
        return f"{v:.0f}"
    if a >= 10:
        return f"{v:.1f}"
    if a >= 1:
        return f"{v:.2f}"
    return f"{v:.3f}" if a >= 0.01 else f"{v:.2g}"


def spread(vals: list) -> str:
    vals = [v for v in vals if v is not None]
    if not vals:
        return "-"
    m = statistics.median(vals)
    return f"{num(m)} [{num(min(vals))}..{num(max(vals))}]" if len(vals) > 1 else num(m)


def table(lines: list[tuple]) -> None:
    widths = [max(len(str(l[i])) for l in lines) for i in range(len(lines[0]))]
    for l in lines:
        print("  " + "  ".join(str(c).ljust(w) for c, w in zip(l, widths)).rstrip())


def paired(runs: list[dict], scen: str, get, pending: int | None = None) -> list[float]:
    """Per-round ratios hubd / its baseline (hubd-base when it ran, else the reference)."""
    def pick(var):
        return {r["round"]: r for r in runs if r["variant"] == var and r["scenario"] == scen
                and "error" not in r and (pending is None or r.get("pending") == pending)}
    ref, hub = pick(baseline(runs)), pick("hubd")
    out = []
    for k in sorted(set(ref) & set(hub)):
        a, b = get(hub[k]), get(ref[k])
        if a is not None and b:
            out.append(a / b)
    return out


def baseline(runs: list[dict]) -> str:
    return "hubd-base" if any(r["variant"] == "hubd-base" for r in runs) else "reference"


def report(runs: list[dict], variants: list[str], scenarios: list[str], pendings: list[int]) -> dict:
    summary: dict = {"a": {}, "b": {}, "c": {}, "goals": []}
    ok = lambda var, scen: [r for r in runs if r["variant"] == var and r["scenario"] == scen  # noqa: E731
                            and "error" not in r]
    failed = lambda var, scen: [r for r in runs if r["variant"] == var and r["scenario"] == scen  # noqa: E731
                                and "error" in r]

    def problems(rs):
        out: dict = {}
        for r in rs:
            for k in PROBLEMS:
                if r.get(k):
                    out[k] = out.get(k, 0) + r[k]
        return out

    for scen in ("a", "b"):
        if scen not in scenarios:
            continue
        print()
        if scen == "a":
            print("(a) throughput, 4 senders on east x 8 in flight, each to its receiver on west - medians [min..max]")
        else:
            print("(b) latency at a fixed offered rate (open loop) - medians [min..max]")
        hdr = ["hub", "ok", "busy", "msg/s", "p50 ms", "p99 ms", "max ms", "east ms/msg", "west ms/msg",
               "east cpu", "west cpu", "client cpu", "other"]
        if scen == "a":
            hdr.append("pending-first")
        if scen == "b":
            hdr[3:3] = ["offered/s"]
            hdr.append("lag p99 ms")
        hdr += ["commits>25ms e/w", "problems"]
        lines = [tuple(hdr)]
        for var in variants:
            rs = ok(var, scen)
            if not rs and not failed(var, scen):
                continue
            row = {"rounds_ok": len(rs), "rounds_failed": len(failed(var, scen)),
                   "busy_runs": sum(busy(r) for r in rs),
                   "msg_per_s": med([r["msg_per_s"] for r in rs]),
                   "p50": med([r["lat_ms"]["p50"] for r in rs]),
                   "p99": med([r["lat_ms"]["p99"] for r in rs]),
                   "max": med([r["lat_ms"]["max"] for r in rs]),
                   "east_ms_per_msg": med([r.get("hub_cpu_ms_per_msg") for r in rs]),
                   "west_ms_per_msg": med([r.get("peer_hub_cpu_ms_per_msg") for r in rs]),
                   "east_cpu_util": med([r.get("hub_cpu_util") for r in rs]),
                   "west_cpu_util": med([r.get("peer_hub_cpu_util") for r in rs]),
                   "client_cpu_util": med([r.get("client_cpu_util") for r in rs]),
                   "other_cores": med([r.get("other_cores") for r in rs]),
                   "forward_pending": med([r.get("forward_pending") for r in rs if r.get("receipts")]),
                   "offered": med([r.get("offered_msg_per_s") for r in rs]),
                   "lag_p99": med([(r.get("send_lag_ms") or {}).get("p99") for r in rs]),
                   "problems": problems(rs),
                   "errors": [r["error"][:300] for r in failed(var, scen)][:3]}
            summary[scen][var] = row
            pct = lambda v: "-" if v is None else f"{v * 100:.0f}%"  # noqa: E731
            line = [var, f"{row['rounds_ok']}" + (f" (+{row['rounds_failed']} failed)" if row["rounds_failed"] else ""),
                    str(row["busy_runs"]), spread([r["msg_per_s"] for r in rs]),
                    spread([r["lat_ms"]["p50"] for r in rs]), spread([r["lat_ms"]["p99"] for r in rs]),
                    spread([r["lat_ms"]["max"] for r in rs]),
                    spread([r.get("hub_cpu_ms_per_msg") for r in rs]),
                    spread([r.get("peer_hub_cpu_ms_per_msg") for r in rs]),
                    pct(row["east_cpu_util"]), pct(row["west_cpu_util"]), pct(row["client_cpu_util"]),
                    spread([r.get("other_cores") for r in rs])]
            if scen == "a":
                line.append(spread([r.get("forward_pending") for r in rs if r.get("receipts")]))
            if scen == "b":
                line[3:3] = [spread([r.get("offered_msg_per_s") for r in rs])]
                line.append(fmt(row["lag_p99"], 2))
            jcs = [r.get("journal_commits") or {} for r in rs]
            if any(j.get("east") and j.get("west") for j in jcs):
                row["slow_commits"] = [sum((j.get(h) or {}).get("over_25ms", 0) for j in jcs) for h in ("east", "west")]
                line.append("%d/%d" % tuple(row["slow_commits"]))
            else:
                line.append("-")
            line.append(", ".join(f"{k}={v}" for k, v in row["problems"].items()) or "none")
            lines.append(tuple(line))
        table(lines)
        for var in variants:
            for e in summary[scen].get(var, {}).get("errors", []):
                print(f"  ! {var}: {e}")
        rat = {}
        for name, get in (("msg/s", lambda r: r["msg_per_s"]), ("p50", lambda r: r["lat_ms"]["p50"]),
                          ("p99", lambda r: r["lat_ms"]["p99"]),
                          ("east cpu/msg", lambda r: r.get("hub_cpu_ms_per_msg")),
                          ("west cpu/msg", lambda r: r.get("peer_hub_cpu_ms_per_msg"))):
            if scen == "b" and name == "msg/s":
                continue  # the offered rates differ by design
            vals = paired(runs, scen, get)
            if vals:
                rat[name] = (round(statistics.median(vals), 4), round(min(vals), 4), round(max(vals), 4))
        summary[scen]["ratios"] = rat
        if rat:
            print(f"  hubd / {baseline(runs)}, paired per round, median [min..max]: " + ";  ".join(
                f"{k} {num(v[0])}x [{num(v[1])}..{num(v[2])}]" for k, v in rat.items()))
            if scen == "b":
                print("  (the reference is offered a rate it sustains, hubd the goal's 5,000 msg/s: the latency "
                      "ratios compare different loads)")

    if "c" in scenarios:
        print()
        print("(c) recovery: seconds from west accepting connections until the chats sent while it was down "
              "reached a receiver on west (mailbox replay) - medians [min..max]")
        lines = [("hub", "pending", "ok", "busy", "last chat s", "first chat s", "west start s",
                  "receiver reg s", "replayed", "dup", "other", "problems")]
        for n in pendings:
            for var in variants:
                rs = [r for r in runs if r["variant"] == var and r["scenario"] == "c" and r.get("pending") == n]
                good = [r for r in rs if "error" not in r]
                if not rs:
                    continue
                row = {"rounds_ok": len(good), "rounds_failed": len(rs) - len(good),
                       "busy_runs": sum(busy(r) for r in good),
                       "recovery_s": med([r.get("recovery_s") for r in good]),
                       "recovery_all": [r.get("recovery_s") for r in good],
                       "first_s": med([r.get("first_s") for r in good]),
                       "other_cores": med([r.get("other_cores") for r in good]),
                       "errors": [r["error"][:300] for r in rs if "error" in r][:3]}
                summary["c"].setdefault(str(n), {})[var] = row
                prob = {}
                for r in rs:
                    for k in ("missing", "duplicates"):
                        if r.get(k):
                            prob[k] = prob.get(k, 0) + r[k]
                lines.append((var, str(n), f"{len(good)}" + (f" (+{len(rs) - len(good)} failed)" if len(rs) > len(good) else ""),
                              str(row["busy_runs"]), spread([r.get("recovery_s") for r in good]),
                              spread([r.get("first_s") for r in good]),
                              spread([r.get("west_start_s") for r in good]),
                              spread([r.get("receiver_registered_s") for r in good]),
                              spread([r.get("replayed") for r in good]),
                              spread([r.get("duplicates") for r in good]),
                              spread([r.get("other_cores") for r in good]),
                              ", ".join(f"{k}={v}" for k, v in prob.items()) or "none"))
        table(lines)
        for n in pendings:
            for var in variants:
                for e in summary["c"].get(str(n), {}).get(var, {}).get("errors", []):
                    print(f"  ! {var} pending {n}: {e}")
            vals = paired(runs, "c", lambda r: r.get("recovery_s"), pending=n)
            if vals:
                summary["c"].setdefault(str(n), {})["ratio"] = round(statistics.median(vals), 4)
                print(f"  pending {n}: hubd / {baseline(runs)} recovery time {num(statistics.median(vals))}x "
                      f"[{num(min(vals))}..{num(max(vals))}] ({baseline(runs)} takes "
                      f"{num(1 / statistics.median(vals))}x as long)")

    # goals
    goals = []
    a = summary["a"].get("hubd")
    if a and a["msg_per_s"] is not None:
        goals.append(("(a) hubd >= 10,000 msg/s", f"{a['msg_per_s']:.0f} msg/s", a["msg_per_s"] >= GOAL_RATE,
                      f"{a['msg_per_s'] / GOAL_RATE:.2f}x the goal"))
    rat = summary["a"].get("ratios", {}).get("msg/s")
    if rat:
        goals.append(("(a) hubd >= 100x the reference", f"{rat[0]:.0f}x", rat[0] >= GOAL_RATIO,
                      f"{rat[0] / GOAL_RATIO:.2f}x the goal"))
    b = summary["b"].get("hubd")
    if b and b["p99"] is not None:
        goals.append((f"(b) hubd p99 < 20 ms at {b['offered'] or 0:.0f} msg/s offered", f"{b['p99']:.2f} ms",
                      b["p99"] < GOAL_P99_MS, f"{b['p99'] / GOAL_P99_MS:.2f}x the limit"))
    for n in pendings:
        c = summary["c"].get(str(n), {}).get("hubd")
        if c and c["recovery_s"] is not None:
            goals.append((f"(c) hubd recovery < 1 s, {n} pending", f"{c['recovery_s']:.3f} s",
                          c["recovery_s"] < GOAL_RECOVERY_S, f"{c['recovery_s'] / GOAL_RECOVERY_S:.2f}x the limit"))
    if goals:
        print()
        print("goals (hubd, medians over rounds):")
        table([(g[0], g[1], "MET" if g[2] else "MISSED", g[3]) for g in goals])
    summary["goals"] = [{"goal": g[0], "value": g[1], "met": g[2], "note": g[3]} for g in goals]
    nbusy = sum(busy(r) for r in runs if "error" not in r)
    if nbusy:
        print(f"\n{nbusy} of {len(runs)} runs had other work above {BUSY} cores (BOX-BUSY): rerun those for "
              "cleaner figures (--retry-busy).")
    return summary


# ----------------------------------------------------------------------------- main

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Forwarding benchmark east -> west: reference hub vs hubd.")
    ap.add_argument("--rounds", type=int, default=None, help="default 3 (1 with --quick)")
    ap.add_argument("--quick", action="store_true",
                    help="1 round (unless --rounds), smaller counts, recovery with 20 pending and 10 s down")
    ap.add_argument("--only", default=None, help="one hub kind, or a comma list of variants "
                    f"({', '.join(VARIANTS)})")
    ap.add_argument("--base-rev", default=None,
                    help="git revision hubd-base runs (the commit before a change); with it the "
                         "variants default to hubd-base,hubd")
    ap.add_argument("--scenarios", default="a,b,c", help="comma list of a (throughput), b (fixed rate), "
                    "c (recovery); default a,b,c")
    ap.add_argument("--receipts", action="store_true",
                    help="(a) with receipt_requested: count forwards that were 'pending' first")
    ap.add_argument("--count-ref", type=int, default=None, help="(a) messages for the reference (default 600)")
    ap.add_argument("--count-hubd", type=int, default=None, help="(a) messages for hubd (default 30000)")
    ap.add_argument("--rate-ref", type=float, default=None, help="(b) msg/s offered to the reference (40)")
    ap.add_argument("--rate-hubd", type=float, default=None, help="(b) msg/s offered to hubd (5000)")
    ap.add_argument("--rate-seconds", type=float, default=None,
                    help="(b) seconds of sending (default: 10 reference, 5 hubd)")
    ap.add_argument("--recovery-pending", default=None,
                    help="(c) comma list of chats sent while west is down (default 20,500; --quick 20)")
    ap.add_argument("--down", type=float, default=None, help="(c) seconds west stays down (20; --quick 10)")
    ap.add_argument("--deliver-timeout", type=float, default=120.0,
                    help="(c) give up this long after west is back")
    ap.add_argument("--warmup", type=int, default=100, help="(a, b) unmeasured chats before each run")
    ap.add_argument("--msg-timeout", type=float, default=60.0,
                    help="(a, b) a chat not delivered after this is missing (the reference's retries "
                         "take up to ~35 s)")
    ap.add_argument("--retry-busy", type=int, default=0,
                    help="rerun a run up to this many times while other work used > 0.3 cores")
    ap.add_argument("--timeout", type=float, default=900, help="per-run loadgen timeout, seconds")
    ap.add_argument("--keep", action="store_true", help="keep the hubs' temporary directories")
    ap.add_argument("--hubd-flags", default="",
                    help="extra flags for both hubs of the hubd variant, e.g. \"--no-redsyn "
                         "--no-broker\" to leave out the other doors' per-chat hooks")
    ap.add_argument("--hubd-rev", default=None,
                    help="run hubd as committed at this git revision (e.g. HEAD), not the working tree")
    ap.add_argument("--profile", action="store_true",
                    help="after the rounds, one extra (uncounted) hubd run of a and of b with py-spy "
                         "recording both hubs; prints the top functions")
    ap.add_argument("--py-spy", default=None, help="py-spy binary (default: on PATH, or /tmp/refvenv/bin/py-spy)")
    ap.add_argument("--profile-seconds", type=float, default=5.0, help="py-spy duration per hub")
    ap.add_argument("--profile-rate", type=int, default=200,
                    help="py-spy samples per second (1000 for a long run compared function by function)")
    ap.add_argument("--profile-delay", type=float, default=1.5,
                    help="seconds after loadgen starts before py-spy attaches (probe and warm-up)")
    ap.add_argument("--json", dest="json_out", default=None, help="write all runs and the summary here")
    ap.add_argument("--partition-baseline", default=None, metavar="REV",
                    help="(p) also run the partition with hubd at REV (e.g. main)")
    args = ap.parse_args(argv)
    if args.profile:
        args.py_spy = py_spy_path(args.py_spy)
        if args.py_spy is None:
            ap.error("--profile needs py-spy (--py-spy PATH)")

    rounds = args.rounds or (1 if args.quick else 3)
    if args.only:
        variants = [v.strip() for v in args.only.split(",") if v.strip()]
    elif args.base_rev:
        variants = ["hubd-base", "hubd"]
    else:
        variants = ["reference", "hubd"]
    for v in variants:
        if v not in VARIANTS:
            ap.error(f"unknown variant {v!r}; choose from {', '.join(VARIANTS)}")
    scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    for s in scenarios:
        if s not in SCENARIOS:
            ap.error(f"unknown scenario {s!r}; choose from a, b, c, p")
    if "p" in scenarios:
        from tests.bench import bench_partition

        scenarios.remove("p")
        partition = ["--rounds", str(args.rounds or (1 if args.quick else 3))]
        if args.partition_baseline:
            partition += ["--baseline-rev", args.partition_baseline]
        if args.json_out:
            partition += ["--json", f"{args.json_out}.partition.json"]
        bench_partition.main(partition)
        if not scenarios:
            return 0
    pendings = [int(x) for x in (args.recovery_pending or ("20" if args.quick else "20,500")).split(",")]
    if args.down is None:
        args.down = 10.0 if args.quick else 20.0

    base = Path(tempfile.mkdtemp(prefix="hubd-bench-fwd-"))
    args.hubd_src = None
    args.base_src = None
    base_version = None
    if args.base_rev:
        args.base_src = base / "hubd-base-src"
        base_version = "git " + snapshot_hubd(args.base_rev, args.base_src)
    hubd_version = "working tree"
    if args.hubd_rev and "hubd" in variants:
        args.hubd_src = base / "hubd-src"
        hubd_version = "git " + snapshot_hubd(args.hubd_rev, args.hubd_src)
    meta = {"started": time.strftime("%Y-%m-%d %H:%M:%S"), "host": platform.node(), "cpus": os.cpu_count(),
            "python": sys.version.split()[0], "rounds": rounds, "variants": variants, "scenarios": scenarios,
            "recovery_pending": pendings,
            "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "loadavg_start": os.getloadavg(), "git": _git_head(), "hubd": hubd_version,
            "hubd_base": base_version}
    print(f"bench_forward: {rounds} round(s), hubs {variants}, scenarios {scenarios}, hubd from {hubd_version}, "
          f"hubd-base from {base_version or '-'}, "
          f"{os.cpu_count()} cpus, loadavg {os.getloadavg()[0]:.2f}, temp {base}", flush=True)
    if os.getloadavg()[0] > 0.5:
        print("  warning: the box is not idle (loadavg > 0.5); figures will be noisier")
    runs: list[dict] = []
    try:
        site = Site(base)
        jobs = []
        for rnd in range(1, rounds + 1):
            for scen in scenarios:
                if scen == "c":
                    for n in pendings:
                        for var in in_turn(variants, rnd):
                            jobs.append((rnd, scen, var, n))
                else:
                    for var in in_turn(variants, rnd):
                        jobs.append((rnd, scen, var, None))
        for rnd, scen, var, n in jobs:
            for attempt in range(args.retry_busy + 1):
                tag = f"r{rnd}-{scen}{n or ''}-{var}-{attempt}"
                if scen == "c":
                    rec = run_recovery(var, n, args, site, base, tag)
                else:
                    rec = run_load(var, scen, args, site, base, tag)
                rec["round"] = rnd
                rec["attempt"] = attempt
                print(run_line(rec), flush=True)
                if "error" not in rec and busy(rec) and attempt < args.retry_busy:
                    rec["superseded"] = True
                    runs.append(rec)
                    print("      box busy: running it again", flush=True)
                    continue
                runs.append(rec)
                break
        if args.profile and "hubd" in variants:
            for scen in [s for s in scenarios if s in ("a", "b")]:
                rec = run_load("hubd", scen, args, site, base, f"profile-{scen}", profile=True)
                rec["round"] = "profile"
                rec["profiled"] = True
                print(run_line(rec) + "  (py-spy attached: not counted)", flush=True)
                runs.append(rec)
    except KeyboardInterrupt:
        print("interrupted; summarising what ran")
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    counted = [r for r in runs if not r.get("superseded") and not r.get("profiled")]
    summary = report(counted, variants, scenarios, pendings)
    for r in runs:
        if r.get("profiled") and r.get("profile"):
            print(f"\nprofile of hubd during scenario {r['scenario']} (py-spy --gil, "
                  f"{args.profile_seconds:g} s; % of GIL-holding samples):")
            for hub, prof in r["profile"].items():
                print(f"  {hub}: {prof.get('samples', 0)} samples")
                print("    own time:   " + "; ".join(f"{k} {v}%" for k, v in prof.get("self", [])[:12]))
                print("    inclusive:  " + "; ".join(f"{k} {v}%" for k, v in prof.get("inclusive", [])[:15]))
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"meta": meta, "runs": runs, "summary": summary}, f, indent=1, default=str)
        print(f"\nwrote {args.json_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

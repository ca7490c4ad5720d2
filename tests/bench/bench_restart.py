"""Restart time with and without snapshots (issue 29): process start to
/readyz 200 on a journal of 1M (or --events N) chats. Measures and prints;
never asserts.

    .venv/bin/python -m tests.bench.bench_restart                     # 1M chats, 3 starts each
    .venv/bin/python -m tests.bench.bench_restart --events 10000000   # 10M (minutes to build)
    .venv/bin/python -m tests.bench.bench_restart --keep /tmp/j1m     # keep (and reuse) the journal

1. Builds the journal directly through the journal layer (`JournalStore.append`,
   50,000 rows per transaction), not through a hub: the rows are what hubd
   writes for bench_local's traffic (loadgen: sender i sends directed chats
   with a client_msg_id to receiver i, online; 16 pairs): kind `chat`, the
   frame as the hub stamps it (sender, target, type, payload, timestamp,
   client_msg_id, client_timestamp, hub_id, msg_id, seq), the route
   `{"recipients": [target], "boxes": {}, "retry": 1}`, the principal of an
   open loopback hub. Replaying them builds the projection a hub that took
   the same chats would have built (same kinds, routes and frames; only the
   clock and payload text differ), in a fraction of the time (1M rows: ~10 s
   against 35-62 s through a hub).
2. Starts `python -m hubd` on it with `--snapshot-every 0` (no snapshot is
   taken while measuring) and times process start to the first /readyz 200,
   --starts times, without a snapshot; the hub's log lines split it into
   phases (to `listening`: Python, imports, the journal opened; the load;
   to ready), and the hub's CPU seconds at ready (utime + stime: less
   sensitive than wall time to a machine shared with other work).
3. Writes its snapshot with the code a hub's snapshot worker runs, for the
   configuration the hub's flags make (one replay of the whole journal),
   and times it.
4. The same starts again, now from the snapshot (and a tail of 0 events).
5. The floor: the same start on an empty journal.

The hubs start with their modules' bytecode, as an installed hubd does (pip
compiles what it installs): it is compiled once into the run's folder
(PYTHONPYCACHEPREFIX) before the first start. A checkout run with
PYTHONDONTWRITEBYTECODE=1 (the container image's setting, and this
machine's agents') would otherwise compile hubd's and federation's ~180
modules from source at every start, 0.5-1.5 s of it here, which no deployed
hub does; --no-bytecode measures that.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import datetime
from pathlib import Path

if __package__ in (None, ""):  # run as a script
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import orjson  # noqa: E402

from hubd.journal import snapshots  # noqa: E402
from hubd.journal.store import JournalStore  # noqa: E402
from tests.bench.loadgen import proc_cpu_seconds  # noqa: E402
from tests.support.procs import REPO, hubd_process  # noqa: E402

HUB_ID = "bench-hub"
PAIRS = 16
ROWS_PER_COMMIT = 50_000
PRINCIPAL = "open-host:127.0.0.1"
BODY = "x" * 160  # about bench_local's chat size


def build(db: Path, events: int) -> float:
    started = time.perf_counter()
    os.close(os.open(db, os.O_CREAT | os.O_WRONLY, 0o600))
    store = JournalStore(db)
    store.set_meta("hub_id", HUB_ID)
    ts = time.time() - events / 1000
    route = orjson.dumps({"recipients": [], "boxes": {}, "retry": 1})
    rows = []
    for seq in range(1, events + 1):
        pair = seq % PAIRS
        sender, target = f"bench/run-s{pair}", f"bench/run-r{pair}"
        ts += 0.001
        frame = {"sender": sender, "target": target, "type": "chat",
                 "payload": f"BMKrun.{pair}.{seq} {BODY}", "timestamp": ts,
                 "client_msg_id": f"crun.{pair}.{seq}", "client_timestamp": ts - 0.0005,
                 "hub_id": HUB_ID, "msg_id": seq, "seq": seq}
        rows.append((seq, ts, "chat", orjson.dumps(frame).decode(),
                     route.replace(b"[]", f'["{target}"]'.encode()).decode(), PRINCIPAL))
        if len(rows) == ROWS_PER_COMMIT:
            store.append(rows)
            rows = []
    if rows:
        store.append(rows)
    store.close()
    return time.perf_counter() - started


def logged_at(log: str, message: str) -> float:
    """The wall time of the hub's first log line saying `message`."""
    stamp = re.search(rf"^(\S+) \[\w+ *\] {message}", log, re.M).group(1)
    return datetime.fromisoformat(stamp).timestamp()


def bytecode_env(folder: Path | None) -> dict[str, str]:
    """The hubs' environment: with hubd's and federation's bytecode compiled
    into `folder` (now, once), or (None) compiling them from source at every start."""
    if folder is None:
        return {"PYTHONDONTWRITEBYTECODE": "1", "PYTHONPYCACHEPREFIX": ""}
    env = {"PYTHONDONTWRITEBYTECODE": "", "PYTHONPYCACHEPREFIX": str(folder)}  # "": unset
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(REPO / "hubd"),
                    str(REPO / "federation")], env={**os.environ, **env}, check=True)
    return env


def start_to_ready(folder: Path, db: Path, *args: str,
                   env: dict | None = None) -> tuple[float, dict]:
    """Seconds from process start to /readyz 200, and the hub's replay line
    with the phases: to `listening` (Python, imports, the journal opened),
    the load, and from the load to ready."""
    hub = hubd_process(folder, "--snapshot-every", "0", *args, db=db, hub_id=HUB_ID, env=env)
    hub.ready_path = None
    started, wall = time.perf_counter(), time.time()
    hub.start(ready_timeout=3600)  # the port opens before the replay
    url = f"{hub.http_url}/readyz"
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as answer:
                if answer.status == 200:
                    break
        except OSError:
            pass
        time.sleep(0.005)
    seconds = time.perf_counter() - started
    cpu = proc_cpu_seconds(hub.pid)
    hub.stop()
    log = hub.log()
    line = re.findall(r"journal replayed .*", log)[-1]
    facts = dict(re.findall(r"(\w+)=(\S+)", line))
    listening, replayed = logged_at(log, "listening"), logged_at(log, "journal replayed")
    facts["phases"] = (listening - wall, replayed - listening, wall + seconds - replayed)
    facts["cpu"] = cpu
    hub.log_path.unlink()
    return seconds, facts


def snapshot(db: Path) -> str:
    """Write the journal's first snapshot with the code a hub's snapshot
    worker runs (hubd/journal/restore.py take), in this process, for the
    configuration `python -m hubd --db DB --hub-id bench-hub` builds: one
    replay of the whole journal (a hub would replay it at its start, then
    its worker again)."""
    from hubd.cli import load
    from hubd.composition import plugins_for
    from hubd.core.plugin import Installed
    from hubd.hub import fresh_state
    from hubd.journal.restore import policy_for, take

    _, config = load(["--db", str(db), "--hub-id", HUB_ID])
    installed = Installed(plugins_for(config))
    fresh = lambda: fresh_state(installed, config)  # noqa: E731
    taken = take(db, fresh, policy_for(db, HUB_ID, fresh, config.snapshot_max_bytes),
                 config.snapshot_keep)
    return (f"seq {taken.seq}, {taken.bytes:,} bytes, {taken.applied:,} events replayed, "
            f"{taken.seconds:.1f} s")


def series(label: str, folder: Path, db: Path, starts: int, env: dict) -> None:
    times, facts = [], []
    for _ in range(starts):
        seconds, fact = start_to_ready(folder, db, env=env)
        times.append(seconds)
        facts.append(fact)
    phases = [statistics.median(f["phases"][i] for f in facts) for i in range(3)]
    print(f"{label:<28} start->readyz median {statistics.median(times):7.3f} s "
          f"(runs {', '.join(f'{t:.3f}' for t in times)}); medians: to listening "
          f"{phases[0]:.3f} s, load {phases[1]:.3f} s, to ready {phases[2]:.3f} s; "
          f"CPU to ready {statistics.median(f['cpu'] for f in facts):.3f} s; "
          f"from_snapshot={facts[-1].get('from_snapshot')} applied={facts[-1].get('applied')} "
          f"(load average {os.getloadavg()[0]:.1f})", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--starts", type=int, default=3)
    parser.add_argument("--no-baseline", action="store_true",
                        help="skip the starts without a snapshot (minutes each at 10M)")
    parser.add_argument("--no-bytecode", action="store_true",
                        help="start the hubs compiling hubd from source each time "
                             "(PYTHONDONTWRITEBYTECODE=1 on a checkout), not as installed")
    parser.add_argument("--keep", metavar="DIR", help="build the journal here and keep it "
                        "(reused when it already holds --events chats)")
    args = parser.parse_args()
    folder = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench-restart-"))
    folder.mkdir(parents=True, exist_ok=True)
    db = folder / "hubd.db"
    try:
        if not db.exists():
            print(f"building a journal of {args.events:,} chats ...", flush=True)
            print(f"built in {build(db, args.events):.1f} s, "
                  f"{db.stat().st_size / 1e6:.0f} MB", flush=True)
        shutil.rmtree(snapshots.snapshot_dir(db), ignore_errors=True)
        env = bytecode_env(None if args.no_bytecode else folder / "bytecode")
        empty = folder / "empty"
        empty.mkdir(exist_ok=True)
        if not (empty / "hubd.db").exists():
            build(empty / "hubd.db", 0)  # a restart's journal exists (made by the first start)
        series("empty journal (the floor)", empty, empty / "hubd.db", args.starts, env)
        if not args.no_baseline:
            series(f"{args.events:,} chats, no snapshot", folder, db, args.starts, env)
        print("snapshot:", snapshot(db), flush=True)
        newest = snapshots.listed(snapshots.snapshot_dir(db))[0]
        print(f"snapshot file {newest.path.name}: {newest.path.stat().st_size / 1e6:.1f} MB",
              flush=True)
        series(f"{args.events:,} chats, snapshot", folder, db, args.starts, env)
    finally:
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()

"""A seeded hostile-input run against the REDSYN and broker doors of a real
hub, interleaved with valid round trips (issue 30; the engine and what it
sends: tests/support/hostile_doors.py). Prints a summary; exits 1 when the
run has findings (a 5xx other than a documented 503, a broker `internal`, an
unanswered request, a traceback in the hub's log, a round trip that did not
complete). For example:

    python -m tests.bench.hostile_doors --seed 1 --duration 60
    python -m tests.bench.hostile_doors --seed 7 --duration 60 --keep /tmp/run7
    python -m tests.bench.hostile_doors --seed 1 --duration 30 --flood 300
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.support.hostile_doors import run  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of hostile input")
    parser.add_argument("--redsyn-workers", type=int, default=4)
    parser.add_argument("--broker-workers", type=int, default=3)
    parser.add_argument("--pairs", type=int, default=3, help="valid round-trip pairs per door")
    parser.add_argument("--flood", type=int, default=0, metavar="N",
                        help="also hold N broker connections that never authenticate")
    parser.add_argument("--keep", metavar="DIR", help="run in DIR and keep it (journal, log)")
    args = parser.parse_args()
    workdir = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="hostile-"))
    try:
        summary = asyncio.run(run(args.seed, args.duration, workdir,
                                  redsyn_workers=args.redsyn_workers,
                                  broker_workers=args.broker_workers, pairs=args.pairs,
                                  flood=args.flood))
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    for line in summary.lines():
        print(line)
    return 1 if summary.findings() else 0


if __name__ == "__main__":
    sys.exit(main())

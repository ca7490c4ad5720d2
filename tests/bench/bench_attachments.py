"""Attachment upload and read throughput of 64 MiB, the reference hub and hubd
side by side (issue 23), and how far an upload raises the hub's resident
memory. Measures and prints; never asserts.

    .venv/bin/python -m tests.bench.bench_attachments            # 64 MiB, window 8
    .venv/bin/python -m tests.bench.bench_attachments --mib 16 --window 16

An object is at most 8 MiB on both hubs, so 64 MiB is eight 8 MiB objects,
uploaded one after another by one signed connection (begin, 256 chunks of
32 KiB with up to --window chunks in flight, commit), then read back the same
way (32 KiB reads, --window in flight) and compared. Both hubs run with the
same flags and files (tests/support/signed_site.py: token, identity binding,
per-message auth, ACL, role grants, --attachment-root), fresh directories.
The hub's resident memory (VmRSS from /proc) is sampled every 50 ms; the rise
is the peak during the upload minus the value before it.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import hmac
import os
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import orjson  # noqa: E402
import pybase64  # noqa: E402

from hubd.wire.digests import signed_json  # noqa: E402
from tests.support.signed_site import (ATTACH_ACL, MAC_SECRET, SignedProbe,  # noqa: E402
                                       begin_fields, envelope, start_signed_hub)

OBJECT = 8 * 1024 * 1024
CHUNK = 32 * 1024
ROLES = {"p/bench": ["p/attachment-read", "p/attachment-write", "p/attachment-admin"]}


def signed_text(frame: dict, kid: str) -> str:
    """The frame with its `auth` (tests/support/signed_site.py `mac`), as
    text to send. The load generator's own cost: json.dumps for the MAC and
    again for sending took ~40% of its process at ~600 chunks/s, enough to
    make it, not the hub, the limit; this takes orjson (signed_json is
    json.dumps byte for byte: tests/unit/test_delivery_rules.py)."""
    frame = dict(frame, auth={"alg": "hmac-sha256", "kid": kid,
                              "nonce": secrets.token_urlsafe(18),
                              "sequence": time.time_ns() // 1000, "timestamp": time.time()})
    frame["auth"]["value"] = hmac.new(MAC_SECRET.encode(), signed_json(frame),
                                      hashlib.sha256).hexdigest()
    return orjson.dumps(frame).decode()


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


async def pipelined(conn: SignedProbe, frames: list[dict], window: int) -> list[dict]:
    """Send the frames with at most `window` unanswered; the answers in order."""
    answers, sent = [], 0
    seat = conn.seat
    while len(answers) < len(frames):
        while sent < len(frames) and sent - len(answers) < window:
            await conn.probe.send_text(signed_text(frames[sent], seat.mac_kid))
            sent += 1
        got = await conn.probe.recv(lambda f: f.get("type") in ("attachment_result", "error"),
                                    timeout=60)
        if got.get("ok") is not True:
            raise RuntimeError(f"refused: {got}")
        answers.append(got)
    return answers


async def one_hub(kind: str, total: int, window: int) -> dict:
    folder = Path(tempfile.mkdtemp(prefix=f"bench-attach-{kind}-"))
    # the reference limits each agent's frame rate (hubd has no such limit):
    # raised out of reach (its "0 disables" still refused an uncontended upload
    # with "Rate limit exceeded." on a quiet machine), or the run ends there
    unlimited = ("--rate", "100000", "--burst", "100000", "--host-rate", "100000",
                 "--host-burst", "100000") if kind == "reference" else ()
    # every chunk and read is a signed frame whose nonce stays in the replay
    # ledger for the auth window: 64 MiB is ~4,100 of them within seconds
    unlimited += ("--message-auth-replay-capacity", "100000")
    site = start_signed_hub(kind, folder, ROLES, ATTACH_ACL, attachments=True,
                            reference_files=False, extra=unlimited)
    pid = site.proc.pid
    samples: list[int] = []

    async def sample():
        while True:
            samples.append(rss_kib(pid))
            await asyncio.sleep(0.05)

    try:
        conn = await SignedProbe.open(site.proc.url, site.seats["p/bench"])
        objects = [os.urandom(OBJECT) for _ in range(total // OBJECT)]
        before = rss_kib(pid)
        sampler = asyncio.create_task(sample())
        started = time.perf_counter()
        digests = []
        for data in objects:
            begun = await conn.ask("attachment_begin", **begin_fields(data))
            upload_id = begun["upload_id"]
            await pipelined(conn, [envelope("p/bench", "attachment_chunk", scope="p",
                                            upload_id=upload_id, offset=off,
                                            body=pybase64.b64encode_as_string(data[off:off + CHUNK]))
                                   for off in range(0, len(data), CHUNK)], window)
            committed = await conn.ask("attachment_commit", scope="p", upload_id=upload_id)
            digests.append(committed["metadata"]["digest"])
        upload_s = time.perf_counter() - started
        sampler.cancel()
        peak = max(samples + [before])
        started = time.perf_counter()
        for data, digest in zip(objects, digests):
            answers = await pipelined(conn, [envelope("p/bench", "attachment_read", scope="p",
                                                      digest=digest, offset=off)
                                             for off in range(0, len(data), CHUNK)], window)
            back = b"".join(pybase64.b64decode(a["body"]) for a in answers)
            if hashlib.sha256(back).hexdigest() != digest:
                raise RuntimeError("read back differs")
        read_s = time.perf_counter() - started
        await conn.close()
        mib = total / (1024 * 1024)
        return {"hub": kind, "mib": mib, "upload_mib_s": mib / upload_s,
                "read_mib_s": mib / read_s, "rss_rise_mib": (peak - before) / 1024}
    finally:
        site.proc.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=64, help="total, a multiple of 8")
    ap.add_argument("--window", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=1,
                    help="interleaved rounds (reference, hubd, reference, ...); medians compared")
    ap.add_argument("--only", choices=("reference", "hubd"), default=None,
                    help="run one hub only (e.g. to profile it); no comparison")
    args = ap.parse_args()
    kinds = (args.only,) if args.only else ("reference", "hubd")
    results: dict[str, list[dict]] = {kind: [] for kind in kinds}
    for round_ in range(args.rounds):
        for kind in kinds:
            r = asyncio.run(one_hub(kind, args.mib * 1024 * 1024, args.window))
            results[kind].append(r)
            print(f"round {round_ + 1} {r['hub']:>9}: {r['mib']:.0f} MiB  "
                  f"upload {r['upload_mib_s']:7.2f} MiB/s  read {r['read_mib_s']:7.2f} MiB/s  "
                  f"resident memory +{r['rss_rise_mib']:.1f} MiB", flush=True)
    if args.only:
        return 0
    ref, hubd = results["reference"], results["hubd"]
    for key, label in (("upload_mib_s", "upload"), ("read_mib_s", "read")):
        ratios = sorted(h[key] / r[key] for r, h in zip(ref, hubd))
        print(f"hubd / reference {label}: median {statistics.median(ratios):.2f}x "
              f"(per round {', '.join(f'{x:.2f}' for x in ratios)})")
    rises = [h["rss_rise_mib"] for h in hubd]
    print(f"hubd resident memory rise: {min(rises):.1f}..{max(rises):.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())

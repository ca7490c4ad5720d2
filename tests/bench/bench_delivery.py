"""Session-bound delivery (wire v3) benchmark: the reference hub against hubd, interleaved.

For each round, each scenario and each hub (reference, hubd; the order reversed in even
rounds, tests/bench/order.py) this starts a *fresh* hub with a fresh durable journal in its
own temporary directory, runs one load from a separate client process (this module with
``--client``: raw WebSocket on asyncio Protocols, tests/bench/rawclient.py, JSON with
orjson), reads the hub's CPU time from /proc, stops the hub by its PID and deletes the
directory. The table shows medians over rounds and the median of the per-round paired
ratio hubd/reference.

The load speaks the v3 delivery wire as observed (docs/reference-observed.md section 8,
docs/delivery.md):

* recipients register a delivery session on their registering heartbeat
  (``protocol_version: 7``, a 64-hex ``delivery_session_token``,
  ``delivery_capabilities: {"follow_up": "native", "next_turn": "emulated"}``) and read
  their incarnation from the hub's ``delivery_session`` answer. Each is the executor of
  what it is offered, like a fast participant: on a ``delivery_offer`` it reports
  ``delivery_boundary``, waits for that report's private status, then ``delivery_ack``,
  waits, then ``delivery_outcome`` ``completed`` (``--pipelined``: all three in one write);
* senders (``protocol_version: 7``) send ``delivery_request`` (mode ``follow_up``, no
  fallbacks, a 64-byte body, deadline now + 600 s) to one recipient's incarnation, keep at
  most W in flight, and take a request as done when the ``completed`` notification
  (``delivery_status`` with ``audience``) arrives. The private ``delivery_status`` answer
  (stage ``queued``) is the admission.

Scenarios (senders x window, recipients):

  u   rt 1x1      one sender, window 1, one recipient: unloaded round-trip latency
  l   rt 4x16     4 senders x 16 in flight, 2 recipients (32 unfinished per recipient):
                  round-trip throughput (request -> completed) and admission latency under it
  a   adm 8x32    admissions only: the recipients do not execute, so every admitted request
                  stays queued. 8 senders x 32 in flight, each sender's requests spread over
                  enough recipients that no cap is reached (16 unfinished per sender per
                  incarnation, 128 per incarnation, hubd's 16,384 in all): admissions/s and
                  the request -> queued latency
  f   rt fixed    open loop, l's shape (4 senders, 2 recipients): requests on a fixed
                  schedule at --rate-factor (10) x the reference's closed-loop l round trips/s
                  measured earlier in the same round (or --rate R), offered to hubd only.
                  Round-trip and admission latencies run from each request's *scheduled*
                  send time, so a hub that falls behind shows its queueing (no coordinated
                  omission); a due request that would pass the 16-per-sender cap waits in the
                  client (held), its clock running. Send lag (when the client saw a request
                  due - its scheduled time) says whether the client kept its schedule (flag
                  SEND-LAG above 2 ms p99); `held at most` how far the hub let it fall behind.

The caps hold: scenario l has at most 16 unfinished per sender (its window) and 32 per
recipient; scenario a sends at most 16 per (sender, recipient) and 128 per recipient, and
counts ``recipient_queue_full`` refusals if any happen.

Hubs as started:
  reference  synapse hub --db <fresh> --hub-id bench-ref --metrics --no-durable-ingress-quota
  hubd       python -m hubd --db <fresh> --hub-id bench-hubd --no-durable-ingress-quota

    .venv/bin/python -m tests.bench.bench_delivery                  # 3 rounds, scenarios u,l,a,f
    .venv/bin/python -m tests.bench.bench_delivery --only hubd --scenarios f --rate 800   # hubd alone at 800 rt/s
    .venv/bin/python -m tests.bench.bench_delivery --rounds 5 --json /tmp/dlv.json
    .venv/bin/python -m tests.bench.bench_delivery --quick          # 1 round, short runs
    .venv/bin/python -m tests.bench.bench_delivery --only hubd --scenarios l --duration 20 --keep

Measures; never asserts. Differences under ~25% are noise on the shared 2-core box.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import math
import os
import platform
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: python tests/bench/bench_delivery.py
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import orjson  # noqa: E402

from tests.bench import loadgen as lg  # noqa: E402
from tests.bench.bench_local import (dir_bytes, fmt, med, run_from_snapshot,  # noqa: E402
                                     snapshot_hubd)
from tests.bench.order import in_turn  # noqa: E402
from tests.support.procs import REPO, HubProcess, hubd_process, reference_hub_process  # noqa: E402

VARIANTS = ("reference", "hubd", "hubd-base")  # hubd-base: hubd at --base-rev
HUB_IDS = {"reference": "bench-ref", "hubd": "bench-hubd", "hubd-base": "bench-hubd"}
CAPS = {"follow_up": "native", "next_turn": "emulated"}
PER_SENDER = 16       # unfinished per sender within one recipient incarnation
PER_INCARNATION = 128  # unfinished per recipient incarnation
TOTAL_CAP = 16_384     # hubd's bound on unfinished work in all

SCENARIOS: dict[str, dict] = {
    "u": {"label": "rt 1x1", "kind": "rt", "senders": 1, "window": 1, "recipients": 1},
    "l": {"label": "rt 4x16", "kind": "rt", "senders": 4, "window": 16, "recipients": 2},
    "a": {"label": "adm 8x32", "kind": "adm", "senders": 8, "window": 32, "recipients": None},
    # open loop: l's shape, requests on a fixed schedule at --rate-factor x the reference's
    # closed-loop l round trips/s measured earlier in the same round (hubd variants only)
    "f": {"label": "rt fixed", "kind": "rt", "senders": 4, "window": PER_SENDER, "recipients": 2,
          "fixed": True},
}
FIXED_VARIANTS = ("hubd", "hubd-base")  # the reference sets the rate; it is not offered it
# seconds of measured load (rt scenarios), admissions (adm), per hub; --quick in brackets
DURATION = {"u": 8.0, "l": 10.0, "f": 10.0}
QUICK_DURATION = {"u": 3.0, "l": 4.0, "f": 4.0}
RATE_FACTOR = 10.0  # issue 11's goal: hubd at 10x the reference's throughput
ADM_COUNT = {"reference": 2000, "hubd": 12000}
QUICK_ADM_COUNT = {"reference": 500, "hubd": 3000}

_now = time.perf_counter
_dumps = orjson.dumps
_loads = orjson.loads


# ============================================================================ the client process

class Side:
    """One WebSocket of the load, registered under its own name."""

    def __init__(self, shared: "Shared", name: str):
        self.shared = shared
        self.name = name
        self.proto = None
        self.frames_seen: list = []  # before the load starts (registration)
        self.ready: asyncio.Future | None = None

    async def open(self, url: str, register: dict, until, then: dict | None = None) -> dict:
        """Connect, wait for the welcome, send the registering heartbeat (and `then`, if
        given), wait for the first frame `until(frame)` accepts; return it."""
        from tests.bench import rawclient

        loop = asyncio.get_running_loop()
        welcomed = loop.create_future()
        self.ready = loop.create_future()

        def setup(p):
            def early(buf, s, e, t):
                try:
                    d = _loads(buf[s:e])
                except ValueError:
                    return
                if not isinstance(d, dict):
                    return
                if d.get("type") == "welcome" and not welcomed.done():
                    welcomed.set_result(d)
                elif welcomed.done() and not self.ready.done() and until(d):
                    self.ready.set_result(d)
                    p.handler = self.on_frame
                elif d.get("type") in lg.ERROR_TYPES:
                    self.shared.sample(f"{d.get('type')} at {self.name} while registering", d)

            def lost(proto):
                for f in (welcomed, self.ready):
                    if not f.done():
                        f.set_exception(RuntimeError(
                            f"{self.name}: closed while registering (code {proto.close_code}); "
                            f"samples {self.shared.samples}"))
                if not self.shared.closing:
                    self.shared.count("closed_sockets")
                    self.shared.sample(f"socket closed at {self.name}", {"code": proto.close_code})

            p.handler = early
            p.on_lost = lost

        self.proto = await rawclient.connect(url, 15.0, setup=setup)
        await asyncio.wait_for(welcomed, 15.0)
        frame = {"sender": self.name, "target": "System", "type": "heartbeat", "payload": "online",
                 "timestamp": time.time()}
        frame.update(register)
        self.proto.send_text(_dumps(frame))
        if then is not None:
            self.proto.send_text(_dumps({"sender": self.name, "target": "System", "payload": "", **then}))
        return await asyncio.wait_for(self.ready, 15.0)

    def send(self, frame: dict) -> None:
        self.proto.send_text(_dumps(frame))

    def on_frame(self, buf: bytes, s: int, e: int, t: float) -> None:
        raise NotImplementedError


class Recipient(Side):
    """A delivery session that executes every offer: boundary, ack, completed."""

    def __init__(self, shared, name, execute: bool, pipelined: bool):
        super().__init__(shared, name)
        self.token = secrets.token_hex(32)
        self.incarnation: str | None = None
        self.execute = execute
        self.pipelined = pipelined
        self.offers = 0

    async def register(self, url: str, hub_id: str) -> None:
        d = await self.open(url, {"protocol_version": 7, "delivery_session_token": self.token,
                                  "delivery_capabilities": CAPS},
                            lambda f: f.get("type") == "delivery_session")
        self.incarnation = d["incarnation"]
        want = hashlib.sha256(f"{hub_id}\x00{self.name}\x00{self.token}".encode()).hexdigest()
        if self.incarnation != want:
            self.shared.sample("incarnation differs from sha256(hub_id NUL name NUL token)",
                               {"got": self.incarnation, "want": want})

    def _report(self, verb: str, stage: str, d: dict, evidence: dict) -> bytes:
        key = d["operation_key"]
        return self.proto.masker.frame(_dumps({
            "sender": self.name, "target": "System", "type": verb, "payload": "",
            "protocol_version": 3, "operation_key": key, "request_id": d["request_id"],
            "task_id": d["task_id"], "mutation_id": f"bench:{stage}:{key}", "stage": stage,
            "evidence": evidence}))

    def boundary(self, d):
        return self._report("delivery_boundary", "boundary_delivered", d, {"boundary": "turn"})

    def ack(self, d):
        return self._report("delivery_ack", "acknowledged", d, {"receipt_id": "r"})

    def outcome(self, d):
        return self._report("delivery_outcome", "completed", d,
                            {"executor_ref": "bench", "outcome_code": "ok"})

    def on_frame(self, buf, s, e, t):
        d = _loads(buf[s:e])
        typ = d.get("type")
        sh = self.shared
        if typ == "delivery_offer":
            self.offers += 1
            sh.count("offers")
            if not self.execute:
                return
            if self.pipelined:
                self.proto.transport.write(self.boundary(d) + self.ack(d) + self.outcome(d))
            else:
                self.proto.transport.write(self.boundary(d))
        elif typ == "delivery_status" and "audience" not in d:  # the answer to a report
            if self.pipelined or not self.execute:
                return
            stage = d.get("stage")
            if stage == "boundary_delivered":
                self.proto.transport.write(self.ack(d))
            elif stage == "acknowledged":
                self.proto.transport.write(self.outcome(d))
            elif stage != "completed":
                sh.count("unexpected")
                sh.sample(f"report answered with stage {stage} at {self.name}", d)
        elif typ == "delivery_status":  # a notification to the recipient (a cancel): none here
            sh.count("unexpected")
            sh.sample(f"notification at recipient {self.name}", d)
        elif typ == "delivery_refused" or typ in lg.ERROR_TYPES:
            sh.count("report_refused" if typ == "delivery_refused" else "errors")
            sh.sample(f"{typ} at {self.name}", d)
        # anything else (presence, who): ignored


class Sender(Side):
    """Sends delivery_request with at most `window` in flight; one is in flight until its
    completed notification (rt) or its queued answer (adm)."""

    def __init__(self, shared, name, idx: int, window: int, kind: str,
                 targets: list[Recipient], per_target: int | None):
        super().__init__(shared, name)
        self.idx = idx
        self.window = window
        self.kind = kind
        self.targets = targets
        self.per_target = per_target  # adm: each request to the next target, at most this many each
        self.next_seq = 0
        self.inflight: dict[str, tuple[float, bool]] = {}   # rid -> (t_send, recorded)
        self.unadmitted: dict[str, tuple[float, bool]] = {}  # rid -> (t_send, recorded)
        self.budget: int | None = None
        self.deadline: float | None = None
        self.recorded = False
        self.sent = 0
        self.done_fut: asyncio.Future | None = None
        self.deadline_abs = time.time() + 600
        self.body = "bench delivery body " + "x" * 44  # 64 bytes

    async def register(self, url: str) -> dict:
        """Register as a v3 session, then ask who: the snapshot (answered after the
        registration, on the same socket) must list every recipient's delivery session."""
        who = await self.open(url, {"protocol_version": 7}, lambda f: f.get("type") == "who_snapshot",
                              then={"type": "who_request"})
        sessions = who.get("delivery_sessions") or {}
        for r in self.targets:
            if (sessions.get(r.name) or {}).get("incarnation") != r.incarnation:
                self.shared.count("who_mismatch")
                self.shared.sample(f"who_snapshot at {self.name} lacks {r.name}'s session",
                                   {"delivery_sessions": sessions.get(r.name)})
        return who

    def start(self, n: int | None, recorded: bool, deadline: float | None) -> asyncio.Future:
        self.budget, self.recorded, self.deadline, self.sent = n, recorded, deadline, 0
        self.rate = None
        self.done_fut = asyncio.get_running_loop().create_future()
        self.pump()
        return self.done_fut

    def start_fixed(self, rate: float, t_start: float, until: float) -> asyncio.Future:
        """Open loop: request k is due at t_start + k / rate, for every k due before
        `until`, whatever is in flight. Its latencies are measured from that scheduled
        time, so a late send (the client, or the per-sender cap holding it) counts as
        queueing, not as a shorter round trip (no coordinated omission). The hub's cap
        of 16 unfinished per sender is kept by holding due requests here (`held`)."""
        self.budget, self.recorded, self.deadline, self.sent = None, True, None, 0
        self.rate, self.t_start, self.until = rate, t_start, until
        self.scheduled = 0
        self.backlog: list[float] = []  # scheduled times of due requests not yet sent
        # per request: when the client saw it due - its scheduled time (the client's own
        # lateness; time held back by the cap is not in it, `held` says that)
        self.lag: list[float] = []
        self.held = 0  # the most due requests held back at once by the per-sender cap
        self.done_fut = asyncio.get_running_loop().create_future()
        self.pump()
        return self.done_fut

    def next_due(self) -> float | None:
        """When the next scheduled request falls due (None once the schedule is over)."""
        t = self.t_start + self.scheduled / self.rate
        return t if t < self.until else None

    def _finish(self) -> None:
        if self.done_fut is not None and not self.done_fut.done():
            self.done_fut.set_result(None)

    def busy(self) -> bool:
        return bool(self.inflight) or bool(self.unadmitted)

    def _request(self, seq: int, ts: float) -> tuple[str, bytes]:
        if self.per_target is None:
            tgt = self.targets[0]
        else:
            tgt = self.targets[seq % len(self.targets)]
        rid = f"s{self.idx}-{seq}"
        return rid, self.proto.masker.frame(_dumps({
            "sender": self.name, "target": tgt.name, "type": "delivery_request",
            "payload": "", "timestamp": ts, "protocol_version": 3, "request_id": rid,
            "idempotency_key": f"k-{rid}", "target_incarnation": tgt.incarnation,
            "mode": "follow_up", "allowed_fallbacks": [], "task_id": f"t-{rid}",
            "body": self.body, "deadline": self.deadline_abs}))

    def _pump_fixed(self) -> None:
        now = _now()
        while True:  # what has fallen due since the last pump
            t = self.next_due()
            if t is None or t > now:
                break
            self.backlog.append(t)
            self.lag.append(now - t)  # how late the client noticed it was due
            self.scheduled += 1
        room = self.window - len(self.inflight)
        k = min(room, len(self.backlog))
        if k > 0:
            ts = time.time()
            out = []
            for i in range(k):
                t_sched = self.backlog[i]
                rid, data = self._request(self.next_seq, ts)
                self.next_seq += 1
                out.append(data)
                ent = (t_sched, True)
                self.inflight[rid] = ent
                self.unadmitted[rid] = ent
            del self.backlog[:k]
            self.proto.transport.write(out[0] if k == 1 else b"".join(out))
            self.sent += k
            self.shared.sent += k
        if len(self.backlog) > self.held:
            self.held = len(self.backlog)
        if self.next_due() is None and not self.backlog:
            self._finish()

    def pump(self) -> None:
        if self.done_fut is None or self.done_fut.done():
            return
        if self.rate is not None:
            self._pump_fixed()
            return
        if self.deadline is not None and _now() >= self.deadline:
            self._finish()
            return
        k = self.window - len(self.inflight)
        if self.budget is not None:
            k = min(k, self.budget - self.sent)
        if k > 0:
            out = []
            rids = []
            ts = time.time()
            for _ in range(k):
                rid, data = self._request(self.next_seq, ts)
                self.next_seq += 1
                rids.append(rid)
                out.append(data)
            t = _now()
            ent = (t, self.recorded)
            for rid in rids:
                self.inflight[rid] = ent
                self.unadmitted[rid] = ent
            self.proto.transport.write(out[0] if k == 1 else b"".join(out))
            self.sent += k
            self.shared.sent += k if self.recorded else 0
        if self.budget is not None and self.sent >= self.budget:
            self._finish()

    def on_frame(self, buf, s, e, t):
        d = _loads(buf[s:e])
        typ = d.get("type")
        sh = self.shared
        if typ == "delivery_status":
            rid = d.get("request_id")
            if "audience" not in d:  # the private answer to our request: admission
                ent = self.unadmitted.pop(rid, None)
                if ent is None:
                    sh.count("unexpected")
                    sh.sample(f"answer for no request at {self.name}", d)
                    return
                if d.get("stage") != "queued":
                    sh.count("unexpected")
                    sh.sample(f"admitted as {d.get('stage')}", d)
                if ent[1]:
                    sh.adm_lat.append(t - ent[0])
                    sh.admitted += 1
                    sh.last_adm = t
                if self.kind == "adm":
                    self.inflight.pop(rid, None)
                    sh.dirty.add(self)
                return
            stage = d.get("stage")
            if stage == "completed":
                ent = self.inflight.pop(rid, None)
                if ent is None:
                    sh.count("unexpected")
                    sh.sample(f"completed for no request at {self.name}", d)
                    return
                if ent[1]:
                    sh.rt_lat.append(t - ent[0])
                    sh.completed += 1
                    sh.last_done = t
                sh.dirty.add(self)
            elif stage in ("boundary_delivered", "acknowledged"):
                sh.notes += 1
            else:
                sh.count("unexpected")
                sh.sample(f"notification stage {stage} at {self.name}", d)
        elif typ == "delivery_refused":
            rid = d.get("request_id")
            code = d.get("reason_code")
            ent = self.inflight.pop(rid, None)
            self.unadmitted.pop(rid, None)
            sh.count("refused_" + str(code))
            sh.sample(f"delivery_refused at {self.name}", d)
            if ent is not None:
                sh.dirty.add(self)
        elif typ in lg.ERROR_TYPES:
            sh.count("errors")
            sh.sample(f"{typ} at {self.name}", d)


class Shared:
    def __init__(self) -> None:
        self.counters: dict[str, int] = {}
        self.samples: list = []
        self.closing = False
        self.rt_lat: list[float] = []
        self.adm_lat: list[float] = []
        self.completed = 0
        self.admitted = 0
        self.notes = 0
        self.sent = 0
        self.last_done = 0.0
        self.last_adm = 0.0
        self.dirty: set = set()

    def count(self, k: str, n: int = 1) -> None:
        self.counters[k] = self.counters.get(k, 0) + n

    def sample(self, kind: str, d) -> None:
        if len(self.samples) < 8:
            self.samples.append({"kind": kind, "frame": d if isinstance(d, dict) else repr(d)[:300]})


def _after_chunk(shared: Shared):
    def run():
        if shared.dirty:
            dirty = list(shared.dirty)
            shared.dirty.clear()
            for snd in dirty:
                snd.pump()
    return run


async def client_main(cfg: dict) -> dict:
    """One load: connect, register, warm up, measure, drain. cfg keys: url, hub_id, hub_pid,
    kind, senders, window, recipients, duration, count, warmup, pipelined, run."""
    shared = Shared()
    kind = cfg["kind"]
    run = cfg["run"]
    S, W = cfg["senders"], cfg["window"]
    if kind == "rt":
        R = cfg["recipients"]
    else:  # admissions only: enough recipients that no cap is reached
        per_sender = math.ceil(cfg["count"] / S) + math.ceil(cfg["warmup"] / S)
        R = max(1, math.ceil(per_sender / PER_SENDER))
    recipients = [Recipient(shared, f"bench/{run}-r{j}", execute=(kind == "rt"),
                            pipelined=cfg["pipelined"]) for j in range(R)]
    if kind == "rt":
        senders = [Sender(shared, f"bench/{run}-s{i}", i, W, kind, [recipients[i % R]], None)
                   for i in range(S)]
    else:
        senders = [Sender(shared, f"bench/{run}-s{i}", i, W, kind, recipients, PER_SENDER)
                   for i in range(S)]
    after = _after_chunk(shared)
    result: dict = {}
    try:
        for r in recipients:  # one at a time: the reference registers slowly under a burst
            await r.register(cfg["url"], cfg["hub_id"])
        for snd in senders:
            await snd.register(cfg["url"])
        for x in (*recipients, *senders):
            x.proto.chunk_end = after
        # warm-up, unmeasured (rt: round trips; adm: admissions, counted against the caps)
        if cfg["warmup"]:
            per = [cfg["warmup"] // S + (1 if i < cfg["warmup"] % S else 0) for i in range(S)]
            await asyncio.gather(*(snd.start(n, False, None) for snd, n in zip(senders, per)))
            await _drain(senders, 30.0)
        # (counters keep registration and warm-up problems too)
        # measured phase
        cpu0 = time.process_time()
        hub0 = lg.proc_cpu_seconds(cfg["hub_pid"])
        box0 = lg.box_cpu_ticks()
        t0 = _now()
        shared.last_done = shared.last_adm = t0
        if cfg.get("rate"):
            await _fixed_rate(senders, cfg["rate"], t0, t0 + cfg["duration"])
        elif kind == "rt":
            deadline = t0 + cfg["duration"]
            await asyncio.gather(*(snd.start(None, True, deadline) for snd in senders))
        else:
            per = [cfg["count"] // S + (1 if i < cfg["count"] % S else 0) for i in range(S)]
            await asyncio.gather(*(snd.start(n, True, None) for snd, n in zip(senders, per)))
        t_sent = _now()
        drained = await _drain(senders, 30.0)
        t_end = _now()
        cpu1 = time.process_time()
        hub1 = lg.proc_cpu_seconds(cfg["hub_pid"])
        box1 = lg.box_cpu_ticks()
        lost = sum(1 for snd in senders for ent in snd.inflight.values() if ent[1])
        unadm = sum(1 for snd in senders for ent in snd.unadmitted.values() if ent[1])
        result = {
            "recipients": R,
            "sent": shared.sent,
            "completed": shared.completed,
            "admitted": shared.admitted,
            "notifications": shared.notes,
            "missing": lost if kind == "rt" else unadm,
            "drained": drained,
            "rt_elapsed": max(shared.last_done - t0, 1e-9),
            "adm_elapsed": max(shared.last_adm - t0, 1e-9),
            "send_elapsed": t_sent - t0,
            "wall": t_end - t0,
            "rt_lat": shared.rt_lat,
            "adm_lat": shared.adm_lat,
            "client_cpu": cpu1 - cpu0,
            "hub_cpu": lg.cpu_delta(hub0, hub1),
            "box_busy": box1[0] - box0[0],
            "box_total": box1[1] - box0[1],
            "counters": dict(shared.counters),
            "samples": shared.samples,
        }
        if cfg.get("rate"):
            result["send_lag"] = [x for snd in senders for x in snd.lag]
            result["held_max"] = max(snd.held for snd in senders)
    finally:
        shared.closing = True
        closers = [x.proto.close(timeout=1.0) for x in (*senders, *recipients) if x.proto is not None]
        await asyncio.gather(*closers, return_exceptions=True)
    return result


async def _fixed_rate(senders: list[Sender], rate: float, t0: float, until: float) -> None:
    """Offer `rate` requests/s in all, each sender rate/S on its own schedule, offset
    so the senders interleave evenly; a ticker sends what falls due (completions
    also pump, freeing held requests at once)."""
    n = len(senders)
    done = [snd.start_fixed(rate / n, t0 + i / rate, until) for i, snd in enumerate(senders)]
    while not all(f.done() for f in done):
        for snd in senders:
            snd.pump()
        due = [t for t in (snd.next_due() for snd in senders if not snd.done_fut.done())
               if t is not None]
        wait = (min(due) - _now()) if due else 0.005
        await asyncio.sleep(max(0.0, wait))


async def _drain(senders: list[Sender], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while any(s.busy() for s in senders):
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.005)
    return True


def summarise_client(cfg: dict, raw: dict) -> dict:
    ncpu = os.cpu_count() or 1
    kind = cfg["kind"]
    ops = raw["completed"] if kind == "rt" else raw["admitted"]
    elapsed = raw["rt_elapsed"] if kind == "rt" else raw["adm_elapsed"]
    wall = raw["wall"]
    box_s = raw["box_busy"] / lg.CLK_TCK
    hub = raw["hub_cpu"]
    rec = {
        "kind": kind, "recipients": raw["recipients"], "sent": raw["sent"], "ops": ops,
        "completed": raw["completed"], "admitted": raw["admitted"],
        "notifications": raw["notifications"], "missing": raw["missing"],
        "ops_per_s": round(ops / elapsed, 1) if ops else 0.0,
        "adm_per_s": round(raw["admitted"] / raw["adm_elapsed"], 1) if raw["admitted"] else 0.0,
        "rt_lat_ms": lg.percentiles(raw["rt_lat"]),
        "adm_lat_ms": lg.percentiles(raw["adm_lat"]),
        "wall_s": round(wall, 3),
        "hub_cpu_ms_per_op": round(hub / ops * 1000, 4) if hub is not None and ops else None,
        "hub_cpu_util": round(hub / wall, 3) if hub is not None else None,
        "client_cpu_util": round(raw["client_cpu"] / wall, 3),
        "client_cpu_us_per_op": round(raw["client_cpu"] / ops * 1e6, 1) if ops else None,
        "box_cpu_util": round(raw["box_busy"] / raw["box_total"] * ncpu, 3) if raw["box_total"] else None,
        "other_cores": round(max(0.0, box_s - (hub or 0) - raw["client_cpu"]) / wall, 3),
        "counters": raw["counters"], "samples": raw["samples"],
    }
    if cfg.get("rate"):
        rec["offered_per_s"] = cfg["rate"]
        rec["send_lag_ms"] = lg.percentiles(raw["send_lag"])
        rec["held_max"] = raw["held_max"]
    return rec


def client_entry(cfg_json: str) -> int:
    cfg = json.loads(cfg_json)
    raw = asyncio.run(client_main(cfg))
    print(json.dumps(summarise_client(cfg, raw)))
    return 0


# ============================================================================ the orchestrator

def make_hub(variant: str, workdir: Path, hubd_src: Path | None, hubd_flags: list[str],
             base_src: Path | None = None) -> HubProcess:
    if variant == "reference":
        return reference_hub_process(workdir, "--no-durable-ingress-quota", hub_id=HUB_IDS[variant])
    if variant == "hubd-base":
        hubd_src = base_src
    hub = hubd_process(workdir, "--no-durable-ingress-quota", *hubd_flags,
                       hub_id=HUB_IDS[variant])
    if hubd_src is not None:
        run_from_snapshot(hub, hubd_src)
    return hub


def run_one(variant: str, scen: str, args, base: Path, tag: str, rate: float | None = None) -> dict:
    sc = SCENARIOS[scen]
    workdir = base / tag
    rec: dict = {"variant": variant, "scenario": scen, "label": sc["label"],
                 "loadavg_before": round(os.getloadavg()[0], 2)}
    if sc.get("fixed") and not rate:
        rec["error"] = ("no rate to offer: scenario l did not measure the reference in this run "
                        "(run l with the reference, or give --rate)")
        return rec
    hub = make_hub(variant, workdir, args.hubd_src, args.hubd_flags.split(), args.base_src)
    try:
        try:
            hub.start(ready_timeout=30)
        except Exception as e:  # noqa: BLE001
            rec["error"] = f"hub did not start: {e}; log: {' '.join(hub.log()[-600:].split())}"
            return rec
        time.sleep(0.2)
        base_bytes = dir_bytes(workdir, skip_wal=True)
        if sc["kind"] == "rt":
            dur = args.duration or (QUICK_DURATION if args.quick else DURATION)[scen]
            count = None
            warm = 0 if sc["senders"] == 1 and args.warmup == 0 else max(args.warmup, sc["senders"])
        else:
            dur = None
            count = args.adm_count or (QUICK_ADM_COUNT if args.quick else ADM_COUNT)[
                "reference" if variant == "reference" else "hubd"]
            warm = sc["senders"] * 2
            count = min(count, TOTAL_CAP - warm - 64)
        cfg = {"url": hub.url, "hub_id": HUB_IDS[variant], "hub_pid": hub.pid, "kind": sc["kind"],
               "senders": sc["senders"], "window": sc["window"], "recipients": sc["recipients"],
               "duration": dur, "count": count, "warmup": warm, "pipelined": args.pipelined,
               "run": secrets.token_hex(3), "rate": rate if sc.get("fixed") else None}
        rec["cfg"] = {k: v for k, v in cfg.items() if k not in ("url", "hub_pid")}
        cmd = [sys.executable, "-m", "tests.bench.bench_delivery", "--client", json.dumps(cfg)]
        t0 = time.monotonic()
        p = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=args.timeout)
        rec["wall_s"] = round(time.monotonic() - t0, 2)
        if p.returncode != 0 or not p.stdout.strip():
            last = (p.stderr.strip().splitlines() or ["(no stderr)"])[-1]
            rec["error"] = f"client exit {p.returncode}: {last}"
            rec["client_stderr"] = p.stderr[-3000:]
            rec["hub_log_tail"] = hub.log()[-3000:]
            return rec
        rec.update(json.loads(p.stdout.strip().splitlines()[-1]))
        rec["loadavg_after"] = round(os.getloadavg()[0], 2)
        if not hub.alive():
            rec["error"] = f"hub exited during the run (code {hub.proc.returncode})"
            rec["hub_log_tail"] = hub.log()[-3000:]
        return rec
    except subprocess.TimeoutExpired:
        rec["error"] = f"client timed out after {args.timeout}s"
        return rec
    finally:
        try:
            hub.stop(timeout=10)
        except AssertionError as e:  # a hubd handler raised: record it, keep measuring
            rec.setdefault("error", f"hub log shows a failed handler: {str(e)[-600:]}")
        if rec.get("ops"):
            rec["journal_bytes_per_op"] = round((dir_bytes(workdir) - base_bytes) / rec["ops"], 1)
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)


def fixed_rate(runs: list[dict], rnd: int, factor: float) -> float | None:
    """factor x the reference's closed-loop l round trips/s: this round's figure, else
    the latest earlier round's."""
    refs = [r for r in runs if r["variant"] == "reference" and r["scenario"] == "l"
            and "error" not in r and r.get("ops_per_s") and r["round"] <= rnd]
    if not refs:
        return None
    return round(factor * max(refs, key=lambda r: r["round"])["ops_per_s"], 1)


PROBLEM_KEYS = ("missing",)


def problems_of(r: dict) -> dict:
    out = {}
    if r.get("missing"):
        out["missing"] = r["missing"]
    for k, v in (r.get("counters") or {}).items():
        if k != "offers" and v:
            out[k] = v
    return out


def summarise(runs, variants, scenarios):
    rows = []
    for scen in scenarios:
        for var in variants:
            ok = [r for r in runs if r["variant"] == var and r["scenario"] == scen and "error" not in r]
            bad = [r for r in runs if r["variant"] == var and r["scenario"] == scen and "error" in r]
            if not ok and not bad:
                continue
            probs: dict = {}
            for r in ok:
                for k, v in problems_of(r).items():
                    probs[k] = probs.get(k, 0) + v
            kind = SCENARIOS[scen]["kind"]
            rows.append({
                "scenario": scen, "label": SCENARIOS[scen]["label"], "variant": var, "kind": kind,
                "rounds_ok": len(ok), "rounds_failed": len(bad), "errors": [r["error"] for r in bad][:3],
                "ops_per_s": med([r["ops_per_s"] for r in ok]),
                "ops_per_s_all": [r["ops_per_s"] for r in ok],
                "n": med([r["ops"] for r in ok]),
                "rt_p50": med([r["rt_lat_ms"]["p50"] for r in ok]),
                "rt_p99": med([r["rt_lat_ms"]["p99"] for r in ok]),
                "rt_max": med([r["rt_lat_ms"]["max"] for r in ok]),
                "adm_per_s": med([r["adm_per_s"] for r in ok]),
                "adm_p50": med([r["adm_lat_ms"]["p50"] for r in ok]),
                "adm_p99": med([r["adm_lat_ms"]["p99"] for r in ok]),
                "hub_ms_per_op": med([r.get("hub_cpu_ms_per_op") for r in ok]),
                "hub_cpu_util": med([r.get("hub_cpu_util") for r in ok]),
                "client_cpu_util": med([r.get("client_cpu_util") for r in ok]),
                "client_us_per_op": med([r.get("client_cpu_us_per_op") for r in ok]),
                "other_cores": med([r.get("other_cores") for r in ok]),
                "loadavg": med([r.get("loadavg_before") for r in ok]),
                "bytes_per_op": med([r.get("journal_bytes_per_op") for r in ok]),
                "offered": med([r.get("offered_per_s") for r in ok]),
                "rate_source": next((r["rate_source"] for r in ok if r.get("rate_source")), None),
                "kept_up": med([r["ops_per_s"] / r["offered_per_s"] for r in ok
                                if r.get("offered_per_s")]),
                "send_lag_p99": med([(r.get("send_lag_ms") or {}).get("p99") for r in ok]),
                "rt_p99_all": [r["rt_lat_ms"]["p99"] for r in ok],
                "problems": probs,
            })
    return rows


RATIO_METRICS = {
    "ops/s": lambda r: r["ops_per_s"],
    "p50": lambda r: (r["rt_lat_ms"] if r["kind"] == "rt" else r["adm_lat_ms"])["p50"],
    "p99": lambda r: (r["rt_lat_ms"] if r["kind"] == "rt" else r["adm_lat_ms"])["p99"],
    "cpu/op": lambda r: r.get("hub_cpu_ms_per_op"),
}


RATIO_PAIRS = (("hubd", "reference"), ("hubd-base", "reference"), ("hubd", "hubd-base"))


def ratios(runs, scenarios):
    """Per-round paired ratios variant / baseline, median [min..max] over rounds."""
    out = []
    ok = [r for r in runs if "error" not in r]
    for scen in scenarios:
        for var, against in RATIO_PAIRS:
            refs = {r["round"]: r for r in ok if r["variant"] == against and r["scenario"] == scen}
            mine = {r["round"]: r for r in ok if r["variant"] == var and r["scenario"] == scen}
            paired = sorted(set(refs) & set(mine))
            if not paired:
                continue
            row = {"scenario": scen, "label": SCENARIOS[scen]["label"], "rounds": len(paired),
                   "variant": var, "against": against}
            for name, get in RATIO_METRICS.items():
                vals = [get(mine[k]) / get(refs[k]) for k in paired
                        if get(mine[k]) is not None and get(refs[k])]
                row[name] = (round(statistics.median(vals), 3), round(min(vals), 3),
                             round(max(vals), 3)) if vals else None
            out.append(row)
    return out


def verdict(rows, rat) -> list[str]:
    """The issue's goal: >= 10x the reference's round-trip throughput, with p99 < 20 ms."""
    lines = []
    by = {(r["scenario"], r["variant"]): r for r in rows}
    rr = {r["scenario"]: r for r in rat if (r["variant"], r["against"]) == ("hubd", "reference")}
    for scen in ("l", "a"):
        if scen not in rr or not rr[scen].get("ops/s"):
            continue
        x = rr[scen]["ops/s"][0]
        what = "round trips/s" if scen == "l" else "admissions/s"
        lines.append(f"{SCENARIOS[scen]['label']}: hubd/reference {what} {x:.1f}x "
                     f"(goal >= 10x: {'met' if x >= 10 else 'NOT met'})")
    h = by.get(("f", "hubd"))
    if h is not None and h["offered"]:
        ok = h["rt_p99"] is not None and h["rt_p99"] < 20 and (h["kept_up"] or 0) >= 0.97
        lines.append(
            f"{h['label']}: hubd offered {h['offered']:.0f} round trips/s ({h['rate_source']}, "
            f"open loop) completed {h['ops_per_s']:.0f}/s "
            f"({(h['kept_up'] or 0) * 100:.0f}% of offered); request -> completed p50 "
            f"{fmt(h['rt_p50'], 2)} p99 {fmt(h['rt_p99'], 2)} ms (rounds: "
            f"{', '.join(fmt(x, 1) for x in h['rt_p99_all'])}); request -> queued p50 "
            f"{fmt(h['adm_p50'], 2)} p99 {fmt(h['adm_p99'], 2)} ms "
            f"(goal: p99 < 20 ms at that rate: {'met' if ok else 'NOT met'})")
    for scen in ("u", "l", "a"):
        h = by.get((scen, "hubd"))
        if h is None:
            continue
        p99 = h["rt_p99"] if h["kind"] == "rt" else h["adm_p99"]
        if p99 is not None:
            lat = "request -> completed" if h["kind"] == "rt" else "request -> queued"
            lines.append(f"{h['label']}: hubd {lat} p99 {p99:.2f} ms "
                         f"(goal < 20 ms: {'met' if p99 < 20 else 'NOT met'})")
    return lines


def print_table(rows, rat) -> None:
    hdr = ("scen", "hub", "ok", "n", "offered", "ops/s", "rt p50", "rt p99", "rt max", "adm/s", "adm p50", "adm p99",
           "hub ms/op", "hub cpu", "client cpu", "client us/op", "other", "load", "B/op", "problems")
    lines = [hdr]
    for r in rows:
        flags = dict(r["problems"])
        if r["rounds_failed"]:
            flags["failed_rounds"] = r["rounds_failed"]
        if (r["client_cpu_util"] or 0) > 0.85:
            flags["CLIENT-BOUND"] = True
        if (r["other_cores"] or 0) > 0.3:
            flags["BOX-BUSY"] = True
        if (r["send_lag_p99"] or 0) > 2.0:  # the client sent late against its schedule
            flags["SEND-LAG"] = f"{r['send_lag_p99']:.1f}ms"
        pct = lambda v: fmt(None if v is None else v * 100, 0) + "%"  # noqa: E731
        lines.append((f"{r['scenario']} {r['label']}", r["variant"], str(r["rounds_ok"]), fmt(r["n"], 0),
                      fmt(r["offered"], 0), fmt(r["ops_per_s"], 0), fmt(r["rt_p50"], 2), fmt(r["rt_p99"], 2), fmt(r["rt_max"], 1),
                      fmt(r["adm_per_s"], 0), fmt(r["adm_p50"], 2), fmt(r["adm_p99"], 2),
                      fmt(r["hub_ms_per_op"], 3), pct(r["hub_cpu_util"]), pct(r["client_cpu_util"]),
                      fmt(r["client_us_per_op"], 0), fmt(r["other_cores"], 2), fmt(r["loadavg"], 2),
                      fmt(r["bytes_per_op"], 0),
                      ", ".join(f"{k}={v}" for k, v in flags.items()) or "none"))
    widths = [max(len(str(l[i])) for l in lines) for i in range(len(hdr))]
    print()
    print("medians over rounds. ops/s: round trips (request -> completed notification) per second in rt "
          "scenarios, admissions (request -> queued answer) in adm; latencies in ms; hub ms/op = hub CPU "
          "per op; hub/client cpu = share of one core; other = cores used by other work; load = 1-min "
          "loadavg before the run; B/op = journal growth per op:")
    for l in lines:
        print("  ".join(str(c).ljust(w) for c, w in zip(l, widths)).rstrip())
    for r in rows:
        if r["errors"]:
            print(f"  ! {r['scenario']} {r['variant']}: {r['errors'][0][:300]}")
    if rat:
        print()
        print("variant / baseline, median of per-round paired ratios [min..max]  (ops/s: higher is better; "
              "p50, p99 (rt or adm latency), cpu/op: lower is better; |ratio-1| < 0.25 is noise):")
        for r in rat:
            parts = []
            for name in RATIO_METRICS:
                v = r.get(name)
                parts.append(f"{name} {v[0]:.2f}x [{v[1]:.2f}..{v[2]:.2f}]" if v else f"{name} -")
            print(f"  {r['scenario']} {r['label']:<9} {r['variant'] + ' / ' + r['against']:<22} "
                  f"rounds {r['rounds']}:  " + ";  ".join(parts))
    print()
    print("goal (issue 11): >= 10x the reference's throughput with p99 under 20 ms")
    for line in verdict(rows, rat):
        print("  " + line)


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["--client"]:
        return client_entry(argv[1])
    ap = argparse.ArgumentParser(description="Interleaved delivery (wire v3) benchmark: reference vs hubd.")
    ap.add_argument("--rounds", type=int, default=None, help="default 3 (1 with --quick)")
    ap.add_argument("--quick", action="store_true", help="1 round (unless --rounds), short runs")
    ap.add_argument("--only", default=None, help="comma list of reference, hubd, hubd-base")
    ap.add_argument("--base-rev", default=None,
                    help="also run hubd as committed at this revision (variant hubd-base), e.g. the "
                         "commit before a change; ratios then include hubd / hubd-base")
    ap.add_argument("--scenarios", default="u,l,a,f", help="comma list of u, l, a, f (default all)")
    ap.add_argument("--duration", type=float, default=None, help="seconds of measured load, rt scenarios")
    ap.add_argument("--adm-count", type=int, default=None, help="admissions per adm run (both hubs)")
    ap.add_argument("--rate-factor", type=float, default=RATE_FACTOR,
                    help="scenario f offers hubd this many times the reference's l round trips/s "
                         "(default 10, the issue's goal)")
    ap.add_argument("--rate", type=float, default=None,
                    help="scenario f: offer this many round trips/s instead (no reference needed)")
    ap.add_argument("--warmup", type=int, default=40, help="unmeasured round trips before each rt run")
    ap.add_argument("--pipelined", action="store_true",
                    help="the executor sends boundary, ack and outcome in one write instead of waiting "
                         "for each report's answer")
    ap.add_argument("--timeout", type=float, default=300, help="per-run client timeout, seconds")
    ap.add_argument("--keep", action="store_true", help="keep the hubs' temporary directories")
    ap.add_argument("--hubd-rev", default=None, help="run hubd as committed at this revision")
    ap.add_argument("--hubd-flags", default="", help="extra flags for hubd")
    ap.add_argument("--json", dest="json_out", default=None, help="write all runs and the summary here")
    args = ap.parse_args(argv)

    rounds = args.rounds or (1 if args.quick else 3)
    if args.only is not None:
        variants = [v.strip() for v in args.only.split(",")]
    else:
        variants = ["reference", "hubd"] + (["hubd-base"] if args.base_rev else [])
    for v in variants:
        if v not in VARIANTS:
            ap.error(f"unknown hub {v!r}")
    scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    for s in scenarios:
        if s not in SCENARIOS:
            ap.error(f"unknown scenario {s!r}")
    if "f" in scenarios and not args.rate:
        if "reference" not in variants or "l" not in scenarios or scenarios.index("l") > scenarios.index("f"):
            ap.error("scenario f offers a multiple of the reference's l round trips/s: run l before f "
                     "with the reference, or give --rate")
    base = Path(tempfile.mkdtemp(prefix="hubd-bench-dlv-"))
    args.hubd_src = None
    args.base_src = None
    base_version = None
    if "hubd-base" in variants:
        if not args.base_rev:
            ap.error("hubd-base needs --base-rev")
        args.base_src = base / "hubd-base-src"
        base_version = "git " + snapshot_hubd(args.base_rev, args.base_src)
    hubd_version = "working tree"
    if args.hubd_rev and "hubd" in variants:
        args.hubd_src = base / "hubd-src"
        hubd_version = "git " + snapshot_hubd(args.hubd_rev, args.hubd_src)
    meta = {"started": time.strftime("%Y-%m-%d %H:%M:%S"), "host": platform.node(), "cpus": os.cpu_count(),
            "python": sys.version.split()[0], "rounds": rounds, "variants": variants, "scenarios": scenarios,
            "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "loadavg_start": os.getloadavg(), "hubd": hubd_version, "hubd_base": base_version}
    print(f"bench_delivery: {rounds} round(s), hubs {variants}, scenarios {scenarios}, hubd from "
          f"{hubd_version}{', hubd-base from ' + base_version if base_version else ''}, executor {'pipelined' if args.pipelined else 'sequential'}, "
          f"{os.cpu_count()} cpus, loadavg {' '.join(f'{x:.2f}' for x in os.getloadavg())}, temp {base}")
    if os.getloadavg()[0] > 0.5:
        print("  warning: the box is not idle (loadavg > 0.5); figures will be noisier")
    runs: list[dict] = []
    fails: dict[str, int] = {}
    try:
        for rnd in range(1, rounds + 1):
            for scen in scenarios:
                rate = None
                if SCENARIOS[scen].get("fixed"):
                    rate = args.rate or fixed_rate(runs, rnd, args.rate_factor)
                for var in in_turn(variants, rnd):
                    if fails.get(var, 0) >= 2:
                        continue
                    if SCENARIOS[scen].get("fixed") and var not in FIXED_VARIANTS:
                        continue
                    rec = run_one(var, scen, args, base, f"r{rnd}-{scen}-{var}", rate)
                    rec["round"] = rnd
                    if rate:
                        rec["rate_source"] = ("--rate" if args.rate else
                                              f"{args.rate_factor:g} x reference l")
                    runs.append(rec)
                    if "error" in rec:
                        if rec["error"].startswith("hub did not start"):
                            fails[var] = fails.get(var, 0) + 1
                        print(f"  round {rnd} {scen} {SCENARIOS[scen]['label']:<9} {var:<9} "
                              f"ERROR {rec['error'][:400]}", flush=True)
                        if rec.get("client_stderr"):
                            print("      " + rec["client_stderr"][-800:].replace("\n", "\n      "))
                        continue
                    rt, adm = rec["rt_lat_ms"], rec["adm_lat_ms"]
                    probs = problems_of(rec)
                    if rec.get("offered_per_s"):
                        print(f"  round {rnd} {scen} offered {rec['offered_per_s']:.0f} rt/s "
                              f"({rec['rate_source']}), send lag p50 "
                              f"{fmt(rec['send_lag_ms']['p50'], 2)} p99 {fmt(rec['send_lag_ms']['p99'], 2)} ms, "
                              f"held at most {rec['held_max']}", flush=True)
                    print(f"  round {rnd} {scen} {SCENARIOS[scen]['label']:<9} {var:<9} n={rec['ops']:<6} "
                          f"{rec['ops_per_s']:>7.0f} ops/s  rt p50 {fmt(rt['p50'], 2):>6} p99 {fmt(rt['p99'], 2):>6}  "
                          f"adm {rec['adm_per_s']:>7.0f}/s p50 {fmt(adm['p50'], 2):>6} p99 {fmt(adm['p99'], 2):>6} ms  "
                          f"hub {fmt(rec.get('hub_cpu_ms_per_op'), 3)} ms/op {fmt(rec.get('hub_cpu_util'), 2)}  "
                          f"client {fmt(rec.get('client_cpu_util'), 2)} {fmt(rec.get('client_cpu_us_per_op'), 0)} us/op  "
                          f"other {fmt(rec.get('other_cores'), 2)}  load {rec['loadavg_before']:.2f}  "
                          f"{probs or ''}", flush=True)
                    if probs and rec.get("samples"):
                        print(f"      e.g. {json.dumps(rec['samples'][0])[:400]}")
    except KeyboardInterrupt:
        print("interrupted; summarising what ran")
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    rows = summarise(runs, variants, scenarios)
    rat = ratios(runs, scenarios)
    print_table(rows, rat)
    meta["loadavg_end"] = os.getloadavg()
    if args.json_out:
        for r in runs:  # keep the file small: the latency lists are summarised already
            r.pop("rt_lat", None)
            r.pop("adm_lat", None)
        with open(args.json_out, "w") as f:
            json.dump({"meta": meta, "runs": runs, "summary": rows, "ratios": rat}, f, indent=1)
        print(f"\nwrote {args.json_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Load generator for Synapse-wire hubs (hubd or the reference hub).

N sender sockets and N receiver sockets, paired: sender ``i`` sends directed chats
to receiver ``i`` with at most ``window`` messages in flight. A message is in
flight from the send call until *its* receiver reads the chat frame. In receipt
mode (``receipt_requested``) the sender's ``delivery_receipt`` is tracked on its
own (receipt latency, negative/missing receipts) and does not hold the window.

The hub's default compatibility routing delivers every directed chat to every
socket, so each socket sees all chats. Receivers find their own chats cheaply:
frames arrive as undecoded bytes and are matched with ``bytes.find`` on a marker
carried in the payload (``BMK<run>.<pair>.<seq>.``); only the frames that match
(one per message) are parsed with ``json.loads`` to check ``type``/``target``.
Frames without any marker (welcome, presence, receipts, errors) are parsed.

Run as a program::

    python -m tests.bench.loadgen --url ws://127.0.0.1:8765/ --senders 4 --window 8 --count 20000
    python -m tests.bench.loadgen --url ws://127.0.0.1:8765/ --unloaded --count 500 --receipts

It prints one summary line (and JSON with ``--json``). ``run_load(cfg)`` is the
library entry point used by ``bench_local``. This is a measuring tool, never a
test: nothing here asserts on timings.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import multiprocessing as mp
import os
import secrets
import sys
import time
from dataclasses import asdict, dataclass

import aiohttp

MARK = b"BMK"
TEXT = aiohttp.WSMsgType.TEXT
BINARY = aiohttp.WSMsgType.BINARY
ERROR_TYPES = {"error", "chat_refused", "name_conflict", "auth_denied", "recipient_liveness_warning",
               "rate_limited"}
CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass
class LoadConfig:
    url: str
    senders: int = 4                 # pairs: this many sender and this many receiver sockets
    window: int = 8                  # in-flight messages per sender
    count: int = 2000                # measured messages in total (ignored with duration)
    duration: float | None = None    # seconds of sending instead of a count
    receipts: bool = False           # set receipt_requested; track receipts (window is still per chat)
    payload_size: int = 64           # bytes of payload (marker included)
    warmup: int = 100                # unmeasured messages in total, sent before the measured phase
    msg_timeout: float = 10.0        # a message not completed after this is counted missing
    drain_timeout: float = 20.0      # how long to wait for in-flight messages after the last send
    procs: int = 1                   # client processes (pairs are split between them)
    verify: bool = True              # json-parse each matched chat and check type/target
    prefix: str = "bench"            # name prefix: <prefix>/<run>-s<i>, <prefix>/<run>-r<i>
    hub_pid: int | None = None       # read this process's CPU time over the measured phase
    connect_timeout: float = 15.0
    keepalive: float = 30.0          # receivers send who_request this often (stale-recipient gate)
    max_missing: int = 200           # stop sending once this many measured messages went missing
    client: str = "raw"              # "raw": tests/bench/rawclient.py (asyncio Protocols); "aiohttp"
    # Cross-hub (forwarding) runs: senders connect to ``url``, receivers to ``recv_url``, and the
    # chat target is the receiver's name plus ``target_suffix`` (e.g. "@west"); the receiver
    # still checks that the chat it gets is addressed to its own (local) name.
    recv_url: str | None = None      # receivers' hub (None: the same hub as the senders)
    target_suffix: str = ""          # appended to the receiver name in the chat target
    peer_hub_pid: int | None = None  # a second hub (the receivers') whose CPU time is read too
    # Open loop: each sender sends ``rate`` messages per second on a fixed schedule during the
    # measured phase, whatever is in flight (raw client only). ``window`` then only applies to
    # the probe and warm-up.
    rate: float | None = None
    # A secured hub (principals, or a shared --token): every socket's first frame (its
    # registration heartbeat) carries this token, and the welcome comes after it (before it
    # on a hub with principals but no shared --token, which welcomes at connect). Without a
    # token the client waits for the welcome first (an open hub sends it on connect).
    token: str | None = None


def registration_frame(name: str, token: str | None = None) -> str:
    """The heartbeat that registers a socket under ``name``; with a token, the first frame
    of a secured hub (the token is JSON-escaped, though hubd's tokens need no escaping)."""
    frame = '{"sender":"%s","target":"System","type":"heartbeat","payload":"online"' % name
    if token is not None:
        frame += ',"token":' + json.dumps(token)
    return frame + "}"


def ssl_client_context():
    """TLS for wss:// benchmark clients: encrypted, not verified (the hubs use self-signed
    certificates; a benchmark client trusts the loopback port it was given)."""
    import ssl
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


# ----------------------------------------------------------------------------- helpers

def proc_cpu_seconds(pid: int) -> float | None:
    """utime + stime of a process (all its threads) from /proc/<pid>/stat."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    fields = data[data.rindex(b")") + 2:].split()
    # after "(comm) " the fields start at index 3 (state); utime is field 14, stime 15
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def hubs_cpu(cfg: "LoadConfig") -> tuple[float | None, float | None]:
    """CPU seconds so far of the hub (cfg.hub_pid) and of the peer hub (cfg.peer_hub_pid)."""
    return (proc_cpu_seconds(cfg.hub_pid) if cfg.hub_pid else None,
            proc_cpu_seconds(cfg.peer_hub_pid) if cfg.peer_hub_pid else None)


def cpu_delta(a: float | None, b: float | None) -> float | None:
    return (b - a) if a is not None and b is not None else None


def box_cpu_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine from /proc/stat."""
    with open("/proc/stat") as f:
        vals = [int(v) for v in f.readline().split()[1:]]
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0)
    total = sum(vals[:8])
    return total - idle, total


def percentiles(values: list[float]) -> dict:
    """Nearest-rank percentiles in milliseconds."""
    if not values:
        return {"n": 0, "min": None, "p50": None, "p90": None, "p99": None, "max": None, "mean": None}
    v = sorted(values)
    n = len(v)

    def q(p: float) -> float:
        return round(v[min(n - 1, max(0, math.ceil(p * n) - 1))] * 1000, 3)

    return {"n": n, "min": round(v[0] * 1000, 3), "p50": q(0.50), "p90": q(0.90), "p99": q(0.99),
            "max": round(v[-1] * 1000, 3), "mean": round(sum(v) / n * 1000, 3)}


# ----------------------------------------------------------------------------- one pair

class Pair:
    """One sender socket and its receiver socket."""

    def __init__(self, idx: int, run: str, cfg: LoadConfig, shared: "Shared"):
        self.idx = idx
        self.cfg = cfg
        self.shared = shared
        self.sname = f"{cfg.prefix}/{run}-s{idx}"
        self.rname = f"{cfg.prefix}/{run}-r{idx}"
        self.key = MARK + f"{run}.{idx}.".encode()
        head = f"BMK{run}.{idx}."
        pad = max(0, cfg.payload_size - len(head) - 8)
        self._pad = "." + "x" * pad
        self._tmpl_head = '{"sender":"%s","target":"%s","type":"chat","payload":"%s' % (
            self.sname, self.rname + cfg.target_suffix, head)
        self._tmpl_mid = '","client_msg_id":"c%s.%d.' % (run, idx)
        self._tmpl_tail = '"' + (',"receipt_requested":true' if cfg.receipts else "") + "}"
        self.cmid_prefix = f"c{run}.{idx}."
        self.sws: aiohttp.ClientWebSocketResponse | None = None
        self.rws: aiohttp.ClientWebSocketResponse | None = None
        self.sem = asyncio.Semaphore(cfg.window)
        # in flight until the receiver reads the chat: seq -> (t_send, recorded)
        self.inflight: dict[int, tuple[float, bool]] = {}
        # receipt mode: waiting for the sender's delivery_receipt: seq -> (t_send, recorded)
        self.rpending: dict[int, tuple[float, bool]] = {}
        self.done: set[int] = set()
        self.rdone: set[int] = set()
        self.timed_out: set[int] = set()
        self.next_seq = 0
        self.measure_from = 1 << 62
        self.stop_sending = False
        self.c = shared.counters

    def frame(self, seq: int) -> str:
        return f"{self._tmpl_head}{seq}{self._pad}{self._tmpl_mid}{seq}{self._tmpl_tail}"

    async def connect(self, session: aiohttp.ClientSession) -> None:
        self.rws = await self._open(session, self.rname, self.cfg.recv_url or self.cfg.url)
        self.sws = await self._open(session, self.sname, self.cfg.url)

    async def _open(self, session: aiohttp.ClientSession, name: str, url: str) -> aiohttp.ClientWebSocketResponse:
        ws = await session.ws_connect(url, autoping=True, heartbeat=None, compress=0,
                                      decode_text=False, max_msg_size=16 * 1024 * 1024,
                                      ssl=ssl_client_context() if url.startswith("wss:") else None)
        token = self.cfg.token
        if token is not None:  # secured hub: nothing comes before the first frame, the token's
            await ws.send_str(registration_frame(name, token))
        deadline = time.monotonic() + self.cfg.connect_timeout
        refusal = None
        while True:  # open hub: the welcome comes first, before registration
            msg = await ws.receive(timeout=max(0.1, deadline - time.monotonic()))
            if msg.type not in (TEXT, BINARY):
                raise RuntimeError(f"{name}: socket closed before welcome: {msg.type} {msg.data!r} {msg.extra!r}"
                                   + (f" after {refusal}" if refusal else ""))
            d = json.loads(msg.data)
            if d.get("type") == "welcome":
                break
            if isinstance(d, dict) and d.get("type") in ERROR_TYPES:
                refusal = f"{d.get('type')}: {d.get('payload')!r}"
        if token is None:
            await ws.send_str(registration_frame(name))
        return ws

    # -- bookkeeping -------------------------------------------------------------------

    def busy(self) -> bool:
        return bool(self.inflight or self.rpending)

    def _chat_anomaly(self, seq: int) -> None:
        if seq < self.measure_from:
            return
        if seq in self.done:
            self.c["duplicates"] += 1
        elif seq in self.timed_out:
            self.c["late"] += 1
        else:
            self.c["unexpected"] += 1

    def _receipt_anomaly(self, seq: int) -> None:
        if seq < self.measure_from:
            return
        if seq in self.rdone:
            self.c["duplicate_receipts"] += 1
        elif seq in self.timed_out:
            self.c["late_receipts"] += 1
        else:
            self.c["unexpected_receipts"] += 1

    def sweep(self, now: float) -> None:
        limit = now - self.cfg.msg_timeout
        for seq, ent in list(self.inflight.items()):
            if ent[0] < limit:
                self._expire(seq)
        for seq, ent in list(self.rpending.items()):
            if ent[0] < limit:
                self._expire_receipt(seq)

    def _expire(self, seq: int, refused: bool = False) -> None:
        ent = self.inflight.pop(seq)
        self.timed_out.add(seq)
        if ent[1]:
            self.c["refused" if refused else "missing"] += 1
        self.sem.release()
        self.shared.maybe_idle()

    def _expire_receipt(self, seq: int) -> None:
        ent = self.rpending.pop(seq)
        self.timed_out.add(seq)
        if ent[1]:
            self.c["receipt_missing"] += 1
        self.shared.maybe_idle()

    def expire_all(self) -> None:
        for seq in list(self.inflight):
            self._expire(seq)
        for seq in list(self.rpending):
            self._expire_receipt(seq)

    # -- socket readers ----------------------------------------------------------------

    async def receiver_loop(self) -> None:
        ws = self.rws
        key = self.key
        klen = len(key)
        inflight = self.inflight
        done = self.done
        sem = self.sem
        now = time.perf_counter
        verify = self.cfg.verify
        rname = self.rname
        c = self.c
        sh = self.shared
        lat = sh.lat
        other = sh.other_frame
        frames = 0
        try:
            async for msg in ws:
                frames += 1
                if msg.type is not TEXT and msg.type is not BINARY:
                    continue
                s = msg.data
                i = s.find(key)
                if i >= 0:
                    t = now()
                    i += klen
                    seq = int(s[i:s.find(b".", i)])
                    ent = inflight.get(seq)
                    if ent is None:
                        self._chat_anomaly(seq)
                        continue
                    if verify:
                        d = json.loads(s)
                        if d.get("type") != "chat" or d.get("target") != rname:
                            if seq >= self.measure_from:
                                c["malformed"] += 1
                                sh.sample("malformed", d)
                            continue
                    del inflight[seq]
                    done.add(seq)
                    if ent[1]:
                        lat.append(t - ent[0])
                        c["delivered"] += 1
                        if t > sh.last_done:
                            sh.last_done = t
                    sem.release()
                    if not inflight:
                        sh.maybe_idle()
                elif s.find(MARK) < 0:
                    other(s, rname)
                # else: another pair's chat (compatibility routing) - ignore
        finally:
            sh.frames += frames
            if not sh.closing:
                sh.note_close(rname, ws)

    async def sender_loop(self) -> None:
        ws = self.sws
        rpending = self.rpending
        now = time.perf_counter
        receipts = self.cfg.receipts
        cmid_prefix = self.cmid_prefix
        plen = len(cmid_prefix)
        sh = self.shared
        other = sh.other_frame
        c = self.c
        frames = 0
        try:
            async for msg in ws:
                frames += 1
                if msg.type is not TEXT and msg.type is not BINARY:
                    continue
                s = msg.data
                if receipts and s.find(b'"delivery_receipt"') >= 0:
                    t = now()
                    d = json.loads(s)
                    cmid = d.get("client_msg_id") or ""
                    if d.get("type") != "delivery_receipt" or not cmid.startswith(cmid_prefix):
                        other(s, self.sname)
                        continue
                    seq = int(cmid[plen:])
                    if d.get("forward_state") == "pending":  # a forward not answered yet:
                        ent = rpending.get(seq)              # its settled receipt follows
                        if ent is not None and ent[1]:
                            c["forward_pending"] += 1
                        continue
                    ent = rpending.pop(seq, None)
                    if ent is None:
                        self._receipt_anomaly(seq)
                        continue
                    self.rdone.add(seq)
                    if ent[1]:
                        sh.rlat.append(t - ent[0])
                        if d.get("delivered") is True:
                            c["receipts_ok"] += 1
                        else:
                            c["receipts_negative"] += 1
                            sh.sample("negative_receipt", d)
                    if not rpending:
                        sh.maybe_idle()
                elif s.find(MARK) < 0:
                    if other(s, self.sname) and self.inflight:
                        # An error frame names no message (e.g. a quota refusal). Hubs answer in
                        # order, so it refers to the oldest chat in flight: count that one as
                        # refused and free its slot instead of waiting for the timeout.
                        self._expire(next(iter(self.inflight)), refused=True)
                # else: our own echo or another pair's chat - ignore
        finally:
            sh.frames += frames
            if not sh.closing:
                sh.note_close(self.sname, ws)

    async def keepalive_loop(self) -> None:
        """Receivers that only receive turn 'stale' on the reference after 90 s: poke them."""
        while True:
            await asyncio.sleep(self.cfg.keepalive)
            try:
                await self.rws.send_str('{"sender":"%s","target":"System","type":"who_request","payload":""}'
                                        % self.rname)
            except Exception:
                return

    # -- sending -----------------------------------------------------------------------

    async def send(self, n: int | None, recorded: bool, deadline: float | None) -> None:
        ws = self.sws
        sem = self.sem
        inflight = self.inflight
        rpending = self.rpending
        receipts = self.cfg.receipts
        now = time.perf_counter
        frame = self.frame
        sent = 0
        while n is None or sent < n:
            await sem.acquire()
            if self.stop_sending or (deadline is not None and now() >= deadline):
                sem.release()
                break
            seq = self.next_seq
            self.next_seq += 1
            data = frame(seq)
            t = now()
            inflight[seq] = (t, recorded)
            if receipts:
                rpending[seq] = (t, recorded)
            await ws.send_str(data)
            sent += 1
        if recorded:
            self.c["sent"] += sent


class Shared:
    """State shared by the pairs of one client process."""

    def __init__(self) -> None:
        self.counters = {k: 0 for k in (
            "sent", "delivered", "missing", "refused", "duplicates", "late", "unexpected", "malformed", "errors",
            "receipts_ok", "receipts_negative", "receipt_missing", "duplicate_receipts", "late_receipts",
            "unexpected_receipts", "closed_sockets", "forward_pending")}
        self.lat: list[float] = []
        self.rlat: list[float] = []
        self.last_done = 0.0
        self.frames = 0
        self.samples: list = []
        self.pairs: list[Pair] = []
        self.idle = asyncio.Event()
        self.closing = False
        self.recording = False
        self.aborted: str | None = None

    def maybe_idle(self) -> None:
        if not any(p.busy() for p in self.pairs):
            self.idle.set()

    def sample(self, kind: str, d) -> None:
        if len(self.samples) < 8:
            self.samples.append({"kind": kind, "frame": d if isinstance(d, dict) else repr(d)[:300]})

    def other_frame(self, s: bytes, who: str) -> bool:
        """Parse a frame that is not one of our chats; True if it is an error-like frame."""
        try:
            d = json.loads(s)
        except ValueError:
            self.sample("unparsable", s)
            return False
        if not isinstance(d, dict):
            return False
        t = d.get("type")
        if t in ERROR_TYPES or d.get("duplicate") is True:
            if self.recording:
                self.counters["errors"] += 1
            self.sample(f"{t} at {who}", d)
            return True
        return False

    def note_close(self, who: str, ws) -> None:
        self.counters["closed_sockets"] += 1
        self.sample(f"socket closed at {who}", {"close_code": ws.close_code})
        for p in self.pairs:  # nothing more will arrive on this pair; do not wait for timeouts
            if who in (p.sname, p.rname):
                p.stop_sending = True


# ----------------------------------------------------------------------------- one process

async def _client_main(cfg: LoadConfig, run: str, pair_ids: list[int], counts: list[int],
                       warm_counts: list[int], sync=None) -> dict:
    """One client process: the raw client (default) or the aiohttp one."""
    if cfg.client == "raw":
        from tests.bench import rawclient
        return await rawclient.client_main(cfg, run, pair_ids, counts, warm_counts, sync)
    if cfg.client != "aiohttp":
        raise ValueError(f"unknown client {cfg.client!r}")
    return await _client_main_aiohttp(cfg, run, pair_ids, counts, warm_counts, sync)


async def _client_main_aiohttp(cfg: LoadConfig, run: str, pair_ids: list[int], counts: list[int],
                               warm_counts: list[int], sync=None) -> dict:
    """Connect the given pairs, warm up, run the measured phase, return raw results.

    ``sync``: None (single process) or a callable that blocks until every client
    process is ready to start the measured phase.
    """
    shared = Shared()
    pairs = [Pair(i, run, cfg, shared) for i in pair_ids]
    shared.pairs = pairs
    conn = aiohttp.TCPConnector(limit=0, force_close=True)
    tasks: list[asyncio.Task] = []
    result: dict = {}
    async with aiohttp.ClientSession(connector=conn) as session:
        try:
            await asyncio.wait_for(asyncio.gather(*(p.connect(session) for p in pairs)), cfg.connect_timeout)
            for p in pairs:
                tasks.append(asyncio.create_task(p.receiver_loop()))
                tasks.append(asyncio.create_task(p.sender_loop()))
                tasks.append(asyncio.create_task(p.keepalive_loop()))

            async def sweeper():
                while True:
                    await asyncio.sleep(0.25)
                    t = time.perf_counter()
                    for p in pairs:
                        p.sweep(t)
                    lost = shared.counters["missing"] + shared.counters["refused"]
                    if lost >= cfg.max_missing and not shared.aborted:
                        shared.aborted = f"stopped sending after {lost} missing or refused messages"
                        for p in pairs:
                            p.stop_sending = True
            tasks.append(asyncio.create_task(sweeper()))

            # Readiness probe: one message per pair until it comes through (registration
            # is asynchronous on the hub; with private routing an unregistered target drops it).
            deadline = time.monotonic() + cfg.connect_timeout
            for p in pairs:
                while True:
                    seq = p.next_seq
                    await p.send(1, False, None)
                    t_end = time.monotonic() + 1.0
                    while seq in p.inflight and time.monotonic() < t_end:
                        await asyncio.sleep(0.005)
                    if seq in p.done:
                        break
                    if seq in p.inflight:  # lost (e.g. receiver not yet registered): free the slot
                        p._expire(seq)
                    if seq in p.rpending:
                        p._expire_receipt(seq)
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"pair {p.idx}: probe chat never reached {p.rname}; "
                                           f"samples={shared.samples}")
            # Warm-up phase (not measured)
            await asyncio.gather(*(p.send(w, False, None) for p, w in zip(pairs, warm_counts)))
            await _drain(shared, pairs, cfg.drain_timeout)

            if sync is not None:
                await asyncio.to_thread(sync)
            # Measured phase
            for p in pairs:
                p.measure_from = p.next_seq
            shared.recording = True
            cpu0 = time.process_time()
            hub0, peer0 = hubs_cpu(cfg)
            box0 = box_cpu_ticks()
            t0 = time.perf_counter()
            t0_mono = time.monotonic()
            shared.last_done = t0
            deadline_send = t0 + cfg.duration if cfg.duration else None
            await asyncio.gather(*(p.send(None if cfg.duration else n, True, deadline_send)
                                   for p, n in zip(pairs, counts)))
            t_sent = time.perf_counter()
            drained = await _drain(shared, pairs, cfg.drain_timeout)
            t_end = time.perf_counter()
            cpu1 = time.process_time()
            hub1, peer1 = hubs_cpu(cfg)
            box1 = box_cpu_ticks()
            if not drained:
                for p in pairs:
                    p.expire_all()
            shared.recording = False
            result = {
                "counters": dict(shared.counters),
                "lat": shared.lat,
                "rlat": shared.rlat,
                "t0": t0_mono,
                "elapsed": max(shared.last_done - t0, 1e-9),
                "send_elapsed": t_sent - t0,
                "wall": t_end - t0,
                "client_cpu": cpu1 - cpu0,
                "hub_cpu": cpu_delta(hub0, hub1),
                "peer_hub_cpu": cpu_delta(peer0, peer1),
                "box_busy": box1[0] - box0[0],
                "box_total": box1[1] - box0[1],
                "frames": 0,
                "samples": shared.samples,
                "aborted": shared.aborted,
            }
        finally:
            shared.closing = True
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for p in pairs:
                for ws in (p.sws, p.rws):
                    if ws is not None and not ws.closed:
                        await ws.close()
    if result:
        result["frames"] = shared.frames
    return result


async def _drain(shared: Shared, pairs: list[Pair], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while any(p.busy() for p in pairs):
        shared.idle.clear()
        if any(p.busy() for p in pairs):
            try:
                await asyncio.wait_for(shared.idle.wait(), max(0.01, min(0.5, deadline - time.monotonic())))
            except asyncio.TimeoutError:
                pass
        if time.monotonic() > deadline:
            return False
    return True


def _worker(cfg: LoadConfig, run: str, pair_ids, counts, warm, barrier, conn) -> None:
    try:
        res = asyncio.run(_client_main(cfg, run, pair_ids, counts, warm, sync=barrier.wait))
        conn.send(("ok", res))
    except BaseException as e:  # noqa: BLE001 - report anything to the parent
        try:
            barrier.abort()
        except Exception:
            pass
        conn.send(("error", f"{type(e).__name__}: {e}"))
    finally:
        conn.close()


def _split(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def run_load(cfg: LoadConfig) -> dict:
    """Run one load and return the summary (see ``summarise``)."""
    run = secrets.token_hex(3)
    ids = list(range(cfg.senders))
    counts = _split(cfg.count, cfg.senders)
    warm = [max(0, w) for w in _split(cfg.warmup, cfg.senders)]
    procs = max(1, min(cfg.procs, cfg.senders))
    if procs == 1:
        if cfg.rate and cfg.client != "raw":
            raise ValueError("--rate needs the raw client")
        raw = [asyncio.run(_client_main(cfg, run, ids, counts, warm))]
        hub_cpu = raw[0]["hub_cpu"]
        box = (raw[0]["box_busy"], raw[0]["box_total"])
    else:
        ctx = mp.get_context("fork")
        barrier = ctx.Barrier(procs + 1)
        workers = []
        for k in range(procs):
            mine = ids[k::procs]
            parent, child = ctx.Pipe(duplex=False)
            wcfg = LoadConfig(**{**asdict(cfg), "hub_pid": None, "peer_hub_pid": None})
            pr = ctx.Process(target=_worker, args=(wcfg, run, mine, [counts[i] for i in mine],
                                                   [warm[i] for i in mine], barrier, child), daemon=True)
            pr.start()
            child.close()
            workers.append((pr, parent))
        hub0 = hub1 = peer0 = peer1 = None
        box0 = box1 = (0, 0)
        try:
            barrier.wait(timeout=cfg.connect_timeout + cfg.drain_timeout + 60)
            hub0, peer0 = hubs_cpu(cfg)
            box0 = box_cpu_ticks()
        except Exception:
            pass
        raw = []
        errors = []
        for pr, parent in workers:
            try:
                status, payload = parent.recv()
            except EOFError:
                status, payload = "error", "client process died"
            (raw.append(payload) if status == "ok" else errors.append(payload))
            pr.join()
        hub1, peer1 = hubs_cpu(cfg)
        box1 = box_cpu_ticks()
        if errors:
            raise RuntimeError("; ".join(errors))
        hub_cpu = cpu_delta(hub0, hub1)
        box = (box1[0] - box0[0], box1[1] - box0[1])
        for r in raw:
            r["peer_hub_cpu"] = None
        raw[0]["peer_hub_cpu"] = cpu_delta(peer0, peer1)
    return summarise(cfg, raw, hub_cpu, box, procs)


def summarise(cfg: LoadConfig, raw: list[dict], hub_cpu: float | None, box: tuple[int, int], procs: int) -> dict:
    counters: dict[str, int] = {}
    lat: list[float] = []
    rlat: list[float] = []
    for r in raw:
        for k, v in r["counters"].items():
            counters[k] = counters.get(k, 0) + v
        lat += r["lat"]
        rlat += r["rlat"]
    start = min(r["t0"] for r in raw)
    end = max(r["t0"] + r["elapsed"] for r in raw)
    elapsed = max(end - start, 1e-9)
    delivered = counters["delivered"]
    client_cpu = sum(r["client_cpu"] for r in raw)
    wall = max(r["wall"] for r in raw)
    peer_cpu = next((r["peer_hub_cpu"] for r in raw if r.get("peer_hub_cpu") is not None), None)
    hubs_total = (hub_cpu or 0.0) + (peer_cpu or 0.0)
    lag = [x for r in raw for x in r.get("send_lag", ())]
    out = {
        "url": cfg.url,
        "recv_url": cfg.recv_url, "target_suffix": cfg.target_suffix or None,
        "rate_per_sender": cfg.rate,
        "senders": cfg.senders, "window": cfg.window, "receipts": cfg.receipts,
        "count": None if cfg.duration else cfg.count, "duration": cfg.duration, "procs": procs,
        "client": cfg.client,
        **counters,
        "elapsed_s": round(elapsed, 4),
        "msg_per_s": round(delivered / elapsed, 1) if delivered else 0.0,
        "lat_ms": percentiles(lat),
        "receipt_lat_ms": percentiles(rlat) if cfg.receipts else None,
        "frames_received": sum(r["frames"] for r in raw),
        "client_cpu_s": round(client_cpu, 3),
        "client_cpu_us_per_msg": round(client_cpu / delivered * 1e6, 1) if delivered else None,
        # share of one core used by the busiest client process (1.0 = saturated)
        "client_cpu_util": round(max(r["client_cpu"] / max(r["wall"], 1e-9) for r in raw), 3),
        "hub_cpu_s": round(hub_cpu, 3) if hub_cpu is not None else None,
        "hub_cpu_ms_per_msg": round(hub_cpu / delivered * 1000, 4) if hub_cpu is not None and delivered else None,
        "hub_cpu_util": round(hub_cpu / wall, 3) if hub_cpu is not None else None,
        "peer_hub_cpu_s": round(peer_cpu, 3) if peer_cpu is not None else None,
        "peer_hub_cpu_ms_per_msg": round(peer_cpu / delivered * 1000, 4) if peer_cpu is not None and delivered
        else None,
        "peer_hub_cpu_util": round(peer_cpu / wall, 3) if peer_cpu is not None else None,
        "box_cpu_util": round(box[0] / box[1], 3) if box[1] else None,
        # cores busy with something other than the hub(s) and this client (other work on the box)
        "other_cores": round(max(0.0, box[0] / CLK_TCK - client_cpu - hubs_total) / wall, 2)
        if box[1] and hub_cpu is not None else None,
        "samples": [s for r in raw for s in r["samples"]][:8],
        # open loop (rate): how late each write left against its schedule, and what was offered
        "send_lag_ms": percentiles(lag) if cfg.rate else None,
        "offered_msg_per_s": round(sum(r["counters"].get("sent", 0) for r in raw)
                                   / max(max(r["send_elapsed"] for r in raw), 1e-9), 1) if cfg.rate else None,
        "aborted": "; ".join(r["aborted"] for r in raw if r.get("aborted")) or None,
    }
    return out


def format_summary(r: dict) -> str:
    lat = r["lat_ms"]
    bad = {k: r[k] for k in ("missing", "refused", "duplicates", "late", "unexpected", "malformed", "errors",
                             "receipts_negative", "receipt_missing", "closed_sockets") if r.get(k)}
    s = (f"[{r.get('client', 'aiohttp')}] {r['senders']}x{r['window']}{' +receipts' if r['receipts'] else ''}: "
         f"{r['delivered']}/{r['sent']} in {r['elapsed_s']:.2f}s = {r['msg_per_s']:.0f} msg/s; "
         f"latency ms p50 {lat['p50']} p90 {lat['p90']} p99 {lat['p99']} max {lat['max']}")
    if r.get("receipt_lat_ms") and r["receipt_lat_ms"]["n"]:
        rl = r["receipt_lat_ms"]
        s += f"; receipt p50 {rl['p50']} p99 {rl['p99']}"
    s += f"; client cpu {r['client_cpu_util']:.0%} of a core ({r['client_cpu_us_per_msg']} us/msg)"
    if r.get("hub_cpu_ms_per_msg") is not None:
        s += f"; hub cpu {r['hub_cpu_ms_per_msg']:.3f} ms/msg ({r['hub_cpu_util']:.0%})"
    if r.get("peer_hub_cpu_ms_per_msg") is not None:
        s += f"; peer hub cpu {r['peer_hub_cpu_ms_per_msg']:.3f} ms/msg ({r['peer_hub_cpu_util']:.0%})"
    if r.get("offered_msg_per_s") is not None:
        s += (f"; offered {r['offered_msg_per_s']:.0f} msg/s (send lag p99 {r['send_lag_ms']['p99']} "
              f"max {r['send_lag_ms']['max']} ms)")
    if r.get("forward_pending"):
        s += f"; {r['forward_pending']} forwards pending first"
    if r.get("box_cpu_util") is not None:
        s += f"; box {r['box_cpu_util']:.0%} busy"
    if r.get("other_cores") is not None:
        s += f" (other work {r['other_cores']:.2f} cores)"
    s += f"; problems {bad or 'none'}"
    if r.get("aborted"):
        s += f"; ABORTED: {r['aborted']}"
    return s


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", required=True, help="ws://host:port/ of the hub (the senders' hub)")
    ap.add_argument("--recv-url", default=None,
                    help="ws:// or wss:// of the receivers' hub (cross-hub runs; default: --url)")
    ap.add_argument("--target-suffix", default="",
                    help="appended to the receiver name in each chat's target, e.g. @west")
    ap.add_argument("--peer-hub-pid", type=int, default=None, help="also measure this PID's CPU (the "
                    "receivers' hub)")
    ap.add_argument("--rate", type=float, default=None,
                    help="open loop: each sender sends this many msg/s on a fixed schedule (raw client)")
    ap.add_argument("--senders", type=int, default=4)
    ap.add_argument("--window", type=int, default=8)
    ap.add_argument("--count", type=int, default=2000, help="measured messages in total")
    ap.add_argument("--duration", type=float, default=None, help="send for this many seconds instead")
    ap.add_argument("--unloaded", action="store_true", help="1 sender, window 1 (unloaded latency)")
    ap.add_argument("--receipts", action="store_true", help="set receipt_requested and wait for receipts")
    ap.add_argument("--payload-size", type=int, default=64)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--msg-timeout", type=float, default=10.0)
    ap.add_argument("--drain-timeout", type=float, default=20.0)
    ap.add_argument("--procs", type=int, default=1, help="client processes")
    ap.add_argument("--client", choices=("raw", "aiohttp"), default="raw",
                    help="raw: WebSocket on asyncio Protocols (tests/bench/rawclient.py, lean); "
                         "aiohttp: the aiohttp client (the earlier harness)")
    ap.add_argument("--no-verify", action="store_true", help="do not json-parse matched chats")
    ap.add_argument("--hub-pid", type=int, default=None, help="measure this PID's CPU over the run")
    ap.add_argument("--max-missing", type=int, default=200, help="stop after this many missing messages")
    ap.add_argument("--prefix", default="bench")
    ap.add_argument("--token", default=None,
                    help="secured hub: send this token in every socket's first frame (the "
                         "registration heartbeat); the welcome follows it")
    ap.add_argument("--json", action="store_true", help="print the full result as JSON")
    a = ap.parse_args(argv)
    cfg = LoadConfig(url=a.url, senders=1 if a.unloaded else a.senders, window=1 if a.unloaded else a.window,
                     count=a.count, duration=a.duration, receipts=a.receipts, payload_size=a.payload_size,
                     warmup=a.warmup, msg_timeout=a.msg_timeout, drain_timeout=a.drain_timeout,
                     procs=a.procs, verify=not a.no_verify, prefix=a.prefix, hub_pid=a.hub_pid,
                     max_missing=a.max_missing, client=a.client, recv_url=a.recv_url,
                     target_suffix=a.target_suffix, peer_hub_pid=a.peer_hub_pid, rate=a.rate,
                     token=a.token)
    r = run_load(cfg)
    if a.json:
        print(json.dumps(r))
    else:
        print(format_summary(r))
        if r["samples"]:
            print("samples:", json.dumps(r["samples"])[:2000])
    return 0


if __name__ == "__main__":
    sys.exit(main())

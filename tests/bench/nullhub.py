"""A do-nothing hub to measure the load generator's own ceiling.

It speaks just enough of the wire for ``loadgen``: a welcome on connect, the
first frame with a ``sender`` registers, every chat is relayed byte-for-byte to
every registered socket (the compatibility routing of the reference hub; with
``--private`` only to the target and the sender), and ``receipt_requested``
gets an immediate ``delivery_receipt``. No journal, no stamping, no checks: one
WebSocket frame is encoded once and written to every transport. Whatever rate
``loadgen`` reaches against it is an upper bound for what the harness can show
on this box (the client and this hub share the 2 cores, as with a real hub).

    python -m tests.bench.nullhub --port 18999 [--private]
    python -m tests.bench.loadgen --url ws://127.0.0.1:18999/ --count 50000
    python -m tests.bench.nullhub --selftest     # both in one go, prints the ceiling

Not a hub implementation and not used by hubd; a measuring aid only.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import json
import os
import signal
import struct
import subprocess
import sys

GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


def encode_frame(payload: bytes, opcode: int = 0x1) -> bytes:
    n = len(payload)
    if n < 126:
        head = struct.pack("!BB", 0x80 | opcode, n)
    elif n < 65536:
        head = struct.pack("!BBH", 0x80 | opcode, 126, n)
    else:
        head = struct.pack("!BBQ", 0x80 | opcode, 127, n)
    return head + payload


def unmask(data: bytes, key: bytes) -> bytes:
    n = len(data)
    k = (key * (n // 4 + 1))[:n]
    return (int.from_bytes(data, "little") ^ int.from_bytes(k, "little")).to_bytes(n, "little")


class Hub:
    def __init__(self, private: bool, batch: bool = True) -> None:
        self.private = private
        self.batch = batch
        self.clients: dict[str, "Conn"] = {}
        self.msg_id = 0


class Conn(asyncio.Protocol):
    def __init__(self, hub: Hub) -> None:
        self.hub = hub
        self.buf = bytearray()
        self.upgraded = False
        self.name: str | None = None
        self.transport: asyncio.Transport | None = None
        self.out: list[bytes] = []
        self.flush_scheduled = False

    def connection_made(self, transport) -> None:
        self.transport = transport

    def write(self, frame: bytes) -> None:
        """Queue a frame; like hubd, everything queued in one loop iteration leaves in one write."""
        if not self.hub.batch:
            self.transport.write(frame)
            return
        self.out.append(frame)
        if not self.flush_scheduled:
            self.flush_scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        self.flush_scheduled = False
        out = self.out
        if out:
            self.out = []
            if not self.transport.is_closing():
                self.transport.write(out[0] if len(out) == 1 else b"".join(out))

    def connection_lost(self, exc) -> None:
        if self.name and self.hub.clients.get(self.name) is self:
            del self.hub.clients[self.name]

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if not self.upgraded:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(self.buf[:end]).decode("latin-1")
            del self.buf[:end + 4]
            key = ""
            for line in head.split("\r\n")[1:]:
                k, _, v = line.partition(":")
                if k.strip().lower() == "sec-websocket-key":
                    key = v.strip()
            accept = base64.b64encode(hashlib.sha1(key.encode() + GUID).digest()).decode()
            self.transport.write((
                "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                f"Sec-WebSocket-Accept: {accept}\r\n\r\n").encode())
            self.upgraded = True
            self.transport.write(encode_frame(json.dumps(
                {"sender": "SynapseHub", "target": "self", "type": "welcome", "payload": "Welcome",
                 "hub_id": "nullhub", "protocol_version": 7}).encode()))
        buf = self.buf
        while True:
            if len(buf) < 2:
                return
            b0, b1 = buf[0], buf[1]
            n = b1 & 0x7F
            pos = 2
            if n == 126:
                if len(buf) < 4:
                    return
                n = struct.unpack_from("!H", buf, 2)[0]
                pos = 4
            elif n == 127:
                if len(buf) < 10:
                    return
                n = struct.unpack_from("!Q", buf, 2)[0]
                pos = 10
            masked = b1 & 0x80
            if len(buf) < pos + (4 if masked else 0) + n:
                return
            if masked:
                key = bytes(buf[pos:pos + 4])
                pos += 4
                payload = unmask(bytes(buf[pos:pos + n]), key)
            else:
                payload = bytes(buf[pos:pos + n])
            del buf[:pos + n]
            opcode = b0 & 0x0F
            if opcode == 0x8:  # close
                self.transport.write(encode_frame(payload[:2], 0x8))
                self.transport.close()
                return
            if opcode == 0x9:  # ping
                self.transport.write(encode_frame(payload, 0xA))
                continue
            if opcode in (0x1, 0x2):
                self.on_text(payload)

    def on_text(self, payload: bytes) -> None:
        hub = self.hub
        if self.name is None:
            d = json.loads(payload)
            self.name = d.get("sender")
            hub.clients[self.name] = self
            return
        if b'"type":"chat"' not in payload:
            return
        frame = encode_frame(payload)
        if hub.private:
            d = json.loads(payload)
            for nm in (d.get("target"), self.name):
                c = hub.clients.get(nm)
                if c is not None:
                    c.write(frame)
        else:
            for c in hub.clients.values():
                c.write(frame)
        if b'"receipt_requested":true' in payload:
            d = json.loads(payload)
            hub.msg_id += 1
            self.write(encode_frame(json.dumps({
                "type": "delivery_receipt", "sender": "SynapseHub", "target": self.name,
                "client_msg_id": d.get("client_msg_id"), "message_target": d.get("target"),
                "delivered": d.get("target") in hub.clients, "message_id": hub.msg_id,
                "payload": "delivered"}).encode()))


async def serve(port: int, private: bool, batch: bool = True) -> None:
    loop = asyncio.get_running_loop()
    hub = Hub(private, batch)
    server = await loop.create_server(lambda: Conn(hub), "127.0.0.1", port)
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    async with server:
        await stop.wait()


def _parse_shape(shape: str) -> tuple[int, int, bool]:
    """'4x8' -> (4, 8, False); '4x8+rcpt' -> (4, 8, True)."""
    base, _, extra = shape.partition("+")
    senders, _, window = base.partition("x")
    return int(senders), int(window), extra == "rcpt"


def selftest(a) -> int:
    """Start one nullhub per routing and run loadgen with each client against it, interleaved.

    Prints every run, then medians per shape/routing/client side by side: the harness
    ceiling (what loadgen can show at all on this box) before (aiohttp) and after (raw).
    """
    import statistics

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.path.insert(0, root)
    from tests.bench.loadgen import LoadConfig, format_summary, run_load
    from tests.support.procs import free_port, wait_port

    routings = ["private"] if a.private else [r.strip() for r in a.routing.split(",") if r.strip()]
    clients = [c.strip() for c in a.clients.split(",") if c.strip()]
    shapes = [s.strip() for s in a.shapes.split(",") if s.strip()]
    hubs: dict[str, subprocess.Popen] = {}
    ports: dict[str, int] = {}
    runs: list[dict] = []
    print(f"nullhub selftest: routings {routings}, clients {clients}, shapes {shapes}, rounds {a.rounds}, "
          f"{'unbatched (one write per frame)' if a.unbatched else 'batched (one write per socket per loop turn)'}"
          f" nullhub, {os.cpu_count()} cpus, loadavg {os.getloadavg()[0]:.2f}", flush=True)
    try:
        for routing in routings:
            port = free_port()
            argv = [sys.executable, "-m", "tests.bench.nullhub", "--port", str(port)]
            argv += ["--private"] if routing == "private" else []
            argv += ["--unbatched"] if a.unbatched else []
            hubs[routing] = subprocess.Popen(argv, cwd=root)
            ports[routing] = port
        for routing, proc in hubs.items():
            wait_port("127.0.0.1", ports[routing], 10, proc)
        for rnd in range(1, a.rounds + 1):
            for shape in shapes:
                senders, window, rcpt = _parse_shape(shape)
                n = 2000 if senders == 1 else a.count * max(1, window // 8) // (2 if rcpt else 1)
                for routing in routings:
                    for client in clients:
                        cfg = LoadConfig(url=f"ws://127.0.0.1:{ports[routing]}/", senders=senders, window=window,
                                         count=n, receipts=rcpt, hub_pid=hubs[routing].pid, client=client,
                                         procs=a.procs)
                        try:
                            r = run_load(cfg)
                        except Exception as e:  # noqa: BLE001 - report and go on
                            print(f"  round {rnd} {shape} {routing} {client}: ERROR {type(e).__name__}: {e}",
                                  flush=True)
                            continue
                        r.update(round=rnd, shape=shape, routing=routing)
                        runs.append(r)
                        print(f"  round {rnd} {routing:<7} " + format_summary(r), flush=True)
    finally:
        for proc in hubs.values():
            proc.send_signal(signal.SIGTERM)
        for proc in hubs.values():
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def med(vals):
        vals = [v for v in vals if v is not None]
        return statistics.median(vals) if vals else None

    def f(v, nd=0, suffix=""):
        return "-" if v is None else f"{v:.{nd}f}{suffix}"

    hdr = ("shape", "routing", "client", "msg/s", "p50 ms", "p99 ms", "client cpu", "client us/msg",
           "hub cpu", "other", "problems")
    lines = [hdr]
    best: dict[tuple, dict] = {}
    for shape in shapes:
        for routing in routings:
            for client in clients:
                rs = [r for r in runs if r["shape"] == shape and r["routing"] == routing and r["client"] == client]
                if not rs:
                    continue
                row = {"msg_per_s": med([r["msg_per_s"] for r in rs])}
                best[(shape, routing, client)] = row
                probs = sum(r.get(k, 0) or 0 for r in rs for k in ("missing", "duplicates", "malformed", "errors",
                                                                    "unexpected", "closed_sockets"))
                lines.append((shape, routing, client, f(row["msg_per_s"]),
                              f(med([r["lat_ms"]["p50"] for r in rs]), 2), f(med([r["lat_ms"]["p99"] for r in rs]), 2),
                              f(med([r["client_cpu_util"] * 100 for r in rs]), 0, "%"),
                              f(med([r["client_cpu_us_per_msg"] for r in rs]), 1),
                              f(med([(r["hub_cpu_util"] or 0) * 100 for r in rs]), 0, "%"),
                              f(med([r["other_cores"] for r in rs]), 2),
                              str(probs or "none")))
    widths = [max(len(str(l[i])) for l in lines) for i in range(len(hdr))]
    print(f"\nharness ceiling against nullhub, medians of {a.rounds} round(s) "
          "(cpu = share of one core; other = cores used by other work on the box):")
    for l in lines:
        print("  ".join(str(c).ljust(w) for c, w in zip(l, widths)).rstrip())
    if "aiohttp" in clients and "raw" in clients:
        print()
        for shape in shapes:
            for routing in routings:
                b, r = best.get((shape, routing, "aiohttp")), best.get((shape, routing, "raw"))
                if b and r and b["msg_per_s"]:
                    print(f"  {shape:<9} {routing:<7} raw / aiohttp: {r['msg_per_s'] / b['msg_per_s']:.2f}x msg/s")
    if a.json_out:
        with open(a.json_out, "w") as fh:
            json.dump(runs, fh, indent=1)
        print(f"\nwrote {a.json_out}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description="Do-nothing hub for measuring the load generator's ceiling.")
    ap.add_argument("--port", type=int, default=18999)
    ap.add_argument("--private", action="store_true", help="relay directed chats to target + sender only")
    ap.add_argument("--unbatched", action="store_true",
                    help="one transport write per frame (like the reference) instead of one per socket "
                         "per loop iteration (like hubd)")
    ap.add_argument("--selftest", action="store_true",
                    help="start nullhubs, run loadgen against them with each client, print the ceilings")
    ap.add_argument("--count", type=int, default=40000, help="--selftest: messages at 4x8 (scaled with the window)")
    ap.add_argument("--rounds", type=int, default=1, help="--selftest: interleaved rounds")
    ap.add_argument("--clients", default="aiohttp,raw", help="--selftest: loadgen clients to compare")
    ap.add_argument("--routing", default="default,private", help="--selftest: default (broadcast), private")
    ap.add_argument("--shapes", default="4x8,4x64,1x1", help="--selftest: senders x window[+rcpt], comma list")
    ap.add_argument("--procs", type=int, default=1, help="--selftest: client processes")
    ap.add_argument("--json", dest="json_out", default=None, help="--selftest: write every run here")
    a = ap.parse_args()
    if a.selftest:
        return selftest(a)
    asyncio.run(serve(a.port, a.private, not a.unbatched))
    return 0


if __name__ == "__main__":
    sys.exit(main())

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
import time

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
    def __init__(self, private: bool) -> None:
        self.private = private
        self.clients: dict[str, "Conn"] = {}
        self.msg_id = 0


class Conn(asyncio.Protocol):
    def __init__(self, hub: Hub) -> None:
        self.hub = hub
        self.buf = bytearray()
        self.upgraded = False
        self.name: str | None = None
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport

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
                    c.transport.write(frame)
        else:
            for c in hub.clients.values():
                c.transport.write(frame)
        if b'"receipt_requested":true' in payload:
            d = json.loads(payload)
            hub.msg_id += 1
            self.transport.write(encode_frame(json.dumps({
                "type": "delivery_receipt", "sender": "SynapseHub", "target": self.name,
                "client_msg_id": d.get("client_msg_id"), "message_target": d.get("target"),
                "delivered": d.get("target") in hub.clients, "message_id": hub.msg_id,
                "payload": "delivered"}).encode()))


async def serve(port: int, private: bool) -> None:
    loop = asyncio.get_running_loop()
    hub = Hub(private)
    server = await loop.create_server(lambda: Conn(hub), "127.0.0.1", port)
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    async with server:
        await stop.wait()


def selftest(count: int, private: bool) -> int:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    from tests.bench.loadgen import LoadConfig, format_summary, run_load
    from tests.support.procs import free_port, wait_port

    port = free_port()
    argv = [sys.executable, "-m", "tests.bench.nullhub", "--port", str(port)] + (["--private"] if private else [])
    proc = subprocess.Popen(argv, cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    try:
        wait_port("127.0.0.1", port, 10, proc)
        for senders, window, n, rc in ((4, 8, count, False), (4, 8, count // 2, True), (1, 1, 2000, False)):
            r = run_load(LoadConfig(url=f"ws://127.0.0.1:{port}/", senders=senders, window=window, count=n,
                                    receipts=rc, hub_pid=proc.pid))
            print(("private " if private else "") + format_summary(r), flush=True)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description="Do-nothing hub for measuring the load generator's ceiling.")
    ap.add_argument("--port", type=int, default=18999)
    ap.add_argument("--private", action="store_true", help="relay directed chats to target + sender only")
    ap.add_argument("--selftest", action="store_true", help="start a nullhub, run loadgen against it, print")
    ap.add_argument("--count", type=int, default=40000, help="messages for --selftest")
    a = ap.parse_args()
    if a.selftest:
        return selftest(a.count, a.private)
    asyncio.run(serve(a.port, a.private))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A small agent program for multi-host tests: it runs inside a site's network
namespace (where the test process cannot open sockets) and reports on stdout
as JSON lines.

    python -m tests.support.chat_driver send --url URL --name P/a --target P/b@west \
        --count 200 --prefix east- [--rate 100]
    python -m tests.support.chat_driver receive --url URL --name P/b --expect 400 [--timeout 60]
        (send and receive take --verify: check a wss:// hub's certificate against the
        default trust store, which SSL_CERT_FILE replaces, as an agent would)
    python -m tests.support.chat_driver get --url http://127.0.0.1:8876/metrics
    python -m tests.support.chat_driver answer --url URL --name P/b --verdict agree \
        --text "yes" [--timeout 60]
        (answers the first chat carrying a broker tag `[murmur m<id>` with a chat
        `m<id> <verdict>: <text>` back to its sender, as docs/broker.md defines)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import urllib.request

import aiohttp


def emit(**fields) -> None:
    print(json.dumps(fields), flush=True)


async def _open(url: str, name: str, verify: bool = False, **extra):
    import ssl

    session = aiohttp.ClientSession()
    ws = await session.ws_connect(url, ssl=ssl.create_default_context() if verify else False,
                                  max_msg_size=0, heartbeat=10)
    frame = {"sender": name, "target": "System", "type": "heartbeat", "payload": "online"}
    frame.update(extra)
    await ws.send_str(json.dumps(frame))
    return session, ws


async def send(args) -> int:
    session, ws = await _open(args.url, args.name, args.verify)
    receipts: dict[str, dict] = {}

    async def read():
        async for msg in ws:
            if msg.type != aiohttp.WSMsgType.TEXT:
                break
            frame = json.loads(msg.data)
            if frame.get("type") == "delivery_receipt":
                receipts[frame.get("client_msg_id")] = frame
            elif frame.get("type") == "error":
                emit(event="error", payload=frame.get("payload"))

    reader = asyncio.create_task(read())
    gap = 1.0 / args.rate if args.rate else 0.0
    start = time.monotonic()
    for i in range(args.count):
        cmid = f"{args.prefix}{i}"
        await ws.send_str(json.dumps({"sender": args.name, "target": args.target, "type": "chat",
                                      "payload": f"chat {cmid}", "client_msg_id": cmid,
                                      "receipt_requested": True}))
        if args.log_sends:
            emit(event="sent_one", client_msg_id=cmid, t=time.time())
        if gap:  # a fixed schedule: a slow send does not lower the rate
            await asyncio.sleep(max(0.0, start + (i + 1) * gap - time.monotonic()))
    emit(event="sent", count=args.count)
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        settled = [r for r in receipts.values() if r.get("forward_state") != "pending"]
        if len(settled) >= args.count:
            break
        await asyncio.sleep(0.1)
    states: dict[str, int] = {}
    for receipt in receipts.values():
        states[receipt.get("forward_state", "local")] = states.get(
            receipt.get("forward_state", "local"), 0) + 1
    emit(event="receipts", states=states, count=len(receipts))
    reader.cancel()
    await ws.close()
    await session.close()
    return 0


async def receive(args) -> int:
    session, ws = await _open(args.url, args.name, args.verify, mailbox=True, since_seq=0)
    seen: dict[str, int] = {}
    deadline = time.monotonic() + args.timeout
    emit(event="ready")
    try:
        while time.monotonic() < deadline and len(seen) < args.expect:
            try:
                msg = await asyncio.wait_for(ws.receive(), deadline - time.monotonic())
            except asyncio.TimeoutError:
                break
            if msg.type != aiohttp.WSMsgType.TEXT:
                break
            frame = json.loads(msg.data)
            if frame.get("type") != "chat" or frame.get("target") != args.name:
                continue
            cmid = frame.get("client_msg_id")
            seen[cmid] = seen.get(cmid, 0) + 1
            if seen[cmid] == 1:
                emit(event="chat", client_msg_id=cmid, sender=frame.get("sender"),
                     seq=frame.get("seq"), t=time.time())
        # linger to catch duplicates
        end = time.monotonic() + args.linger
        while time.monotonic() < end:
            try:
                msg = await asyncio.wait_for(ws.receive(), end - time.monotonic())
            except asyncio.TimeoutError:
                break
            if msg.type != aiohttp.WSMsgType.TEXT:
                break
            frame = json.loads(msg.data)
            if frame.get("type") == "chat" and frame.get("target") == args.name:
                cmid = frame.get("client_msg_id")
                seen[cmid] = seen.get(cmid, 0) + 1
    finally:
        emit(event="done", unique=len(seen), duplicates=sum(n - 1 for n in seen.values()))
        await ws.close()
        await session.close()
    return 0


async def answer(args) -> int:
    import re

    session, ws = await _open(args.url, args.name)
    emit(event="ready")
    try:
        async with asyncio.timeout(args.timeout):
            while True:
                msg = await ws.receive()
                if msg.type != aiohttp.WSMsgType.TEXT:
                    emit(event="closed")
                    return 1
                frame = json.loads(msg.data)
                if frame.get("type") != "chat" or frame.get("target") != args.name:
                    continue
                found = re.search(r"\[murmur m(\d+)", str(frame.get("payload")))
                if found is None:
                    continue
                emit(event="asked", sender=frame.get("sender"), message_id=int(found.group(1)))
                reply = {"sender": args.name, "target": frame["sender"], "type": "chat",
                         "payload": f"m{found.group(1)} {args.verdict}: {args.text}"}
                await ws.send_str(json.dumps(reply))
                emit(event="answered")
                await asyncio.sleep(args.linger)
                return 0
    finally:
        await ws.close()
        await session.close()


async def hello(args) -> int:
    """Register and say how the hub answered: joined, or refused and closed."""
    session, ws = await _open(args.url, args.name)
    try:
        while True:
            msg = await asyncio.wait_for(ws.receive(), 10)
            if msg.type != aiohttp.WSMsgType.TEXT:
                closing = msg.type == aiohttp.WSMsgType.CLOSE
                emit(event="closed", code=msg.data if closing else ws.close_code)
                return 0
            frame = json.loads(msg.data)
            if frame.get("type") == "presence_update" and frame.get("agent") == args.name:
                emit(event="joined")
                return 0
            if frame.get("type") == "auth_denied":
                emit(event="auth_denied", payload=frame.get("payload"))
    finally:
        await ws.close()
        await session.close()


def get(args) -> int:
    import ssl

    context = ssl._create_unverified_context() if args.url.startswith("https") else None
    with urllib.request.urlopen(args.url, timeout=5, context=context) as resp:
        sys.stdout.write(resp.read().decode())
    return 0


def main() -> int:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("send")
    s.add_argument("--url", required=True)
    s.add_argument("--name", required=True)
    s.add_argument("--target", required=True)
    s.add_argument("--count", type=int, default=100)
    s.add_argument("--prefix", default="m")
    s.add_argument("--rate", type=float, default=0.0)
    s.add_argument("--timeout", type=float, default=90.0)
    s.add_argument("--log-sends", action="store_true",
                   help="one line per chat sent, with its wall-clock time (benchmarks)")
    s.add_argument("--verify", action="store_true")
    r = sub.add_parser("receive")
    r.add_argument("--url", required=True)
    r.add_argument("--name", required=True)
    r.add_argument("--expect", type=int, required=True)
    r.add_argument("--timeout", type=float, default=90.0)
    r.add_argument("--linger", type=float, default=1.0)
    r.add_argument("--verify", action="store_true")
    h = sub.add_parser("hello")
    h.add_argument("--url", required=True)
    h.add_argument("--name", required=True)
    g = sub.add_parser("get")
    g.add_argument("--url", required=True)
    a = sub.add_parser("answer")
    a.add_argument("--url", required=True)
    a.add_argument("--name", required=True)
    a.add_argument("--verdict", default="agree")
    a.add_argument("--text", default="yes")
    a.add_argument("--timeout", type=float, default=60.0)
    a.add_argument("--linger", type=float, default=1.0)
    args = parser.parse_args()
    if args.command == "get":
        return get(args)
    runs = {"send": send, "receive": receive, "answer": answer, "hello": hello}
    return asyncio.run(runs[args.command](args))


if __name__ == "__main__":
    sys.exit(main())

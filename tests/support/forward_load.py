"""A closed-loop load of forwarded chats: senders on an origin hub, each
keeping `window` chats in flight to its own receiver on a peer hub (a chat is
in flight from its send until its receiver reads it). Works against any
hub pair that speaks the wire (hubd or the reference hub on either side);
used by the interop throughput test and tests/bench/bench_reference_east.py.

Every socket is read all along: the hubs broadcast directed chats to every
socket by default (compatibility routing), so a receiver picks its own chats
by target and marker, and a sender's echoes and refusals are read (refusals
counted) instead of piling up.
"""

from __future__ import annotations

import asyncio
import secrets
import statistics
from dataclasses import dataclass, field

from tests.support.wsprobe import ProbeTimeout, WsProbe, joined

REFUSALS = ("error", "chat_refused", "name_conflict", "auth_denied", "rate_limited")


@dataclass
class LoadResult:
    expected: int  # senders x per_sender
    sent: int  # sent before the deadline (the window holds the rest back)
    delivered: int  # distinct chats that reached their receiver in time
    duplicates: int
    refusals: list  # refusal frames the senders got
    elapsed: float  # seconds from the first send to the last arrival (or the deadline)
    latencies_ms: list = field(default_factory=list)

    @property
    def undelivered(self) -> int:
        return self.expected - self.delivered

    @property
    def msg_per_s(self) -> float:
        return self.delivered / self.elapsed if self.elapsed > 0 else 0.0

    @property
    def p50_ms(self) -> float | None:
        return statistics.median(self.latencies_ms) if self.latencies_ms else None

    def summary(self) -> str:
        p50 = f"{self.p50_ms:.1f}" if self.p50_ms is not None else "-"
        return (f"{self.delivered}/{self.expected} delivered ({self.sent} sent) in "
                f"{self.elapsed:.2f} s ({self.msg_per_s:.1f} msg/s, p50 {p50} ms), "
                f"{self.duplicates} duplicates, "
                f"{len(self.refusals)} refusals {self.refusals[:3]}")


async def forward_load(origin_url: str, peer_url: str, peer_hub: str, *, senders: int = 2,
                       window: int = 4, per_sender: int = 50, deadline: float = 30.0,
                       project: str = "PROJ") -> LoadResult:
    """Send `per_sender` chats from each of `senders` seats on the origin to
    its receiver `PROJECT/<run>-r<i>@peer_hub`, `window` in flight each; stop
    waiting `deadline` seconds after the first send. One chat per pair
    crosses first, untimed (the route is up and every receiver is heard)."""
    run = secrets.token_hex(3)
    pairs = [(f"{project}/{run}-s{i}", f"{project}/{run}-r{i}") for i in range(senders)]
    receivers = [await joined(peer_url, receiver) for _, receiver in pairs]
    origins = [await joined(origin_url, sender) for sender, _ in pairs]
    try:
        for i, (origin, (sender, receiver)) in enumerate(zip(origins, pairs)):
            await origin.chat(sender, f"{receiver}@{peer_hub}", f"{run}.warm.{i}")
        for i, (probe, (_, receiver)) in enumerate(zip(receivers, pairs)):
            await probe.recv(_chat_to(receiver, f"{run}.warm.{i}"), timeout=30)
        return await _measure(run, pairs, origins, receivers, peer_hub, window, per_sender,
                              deadline)
    finally:
        for probe in (*origins, *receivers):
            await probe.close()


def _chat_to(name: str, marker: str):
    return lambda f: f.get("type") == "chat" and f.get("target") == name and \
        isinstance(f.get("payload"), str) and f["payload"].startswith(marker)


async def _measure(run: str, pairs: list[tuple[str, str]], origins: list[WsProbe],
                   receivers: list[WsProbe], peer_hub: str, window: int, per_sender: int,
                   deadline: float) -> LoadResult:
    loop = asyncio.get_running_loop()
    slots = [asyncio.Semaphore(window) for _ in origins]
    sent_at: dict[str, float] = {}
    arrived: dict[str, float] = {}
    duplicates = 0
    refusals: list = []
    expected = len(pairs) * per_sender
    end = loop.time() + deadline

    async def send(i: int, origin: WsProbe) -> None:
        sender, receiver = pairs[i]
        for n in range(per_sender):
            await slots[i].acquire()
            marker = f"{run}.{i}.{n}."
            sent_at[marker] = loop.time()
            await origin.chat(sender, f"{receiver}@{peer_hub}", marker)

    async def receive(i: int, probe: WsProbe) -> None:
        nonlocal duplicates
        mine = _chat_to(pairs[i][1], f"{run}.{i}.")
        got = 0
        while got < per_sender and loop.time() < end:
            try:
                chat = await probe.recv(mine, timeout=max(0.01, end - loop.time()))
            except ProbeTimeout:
                return
            if chat["payload"] in arrived:
                duplicates += 1
                continue
            arrived[chat["payload"]] = loop.time()
            got += 1
            slots[i].release()

    async def watch(origin: WsProbe) -> None:
        while loop.time() < end:
            try:
                refusals.append(await origin.recv(lambda f: f.get("type") in REFUSALS,
                                                  timeout=max(0.01, end - loop.time())))
            except ProbeTimeout:
                return

    start = loop.time()
    receiving = [asyncio.create_task(receive(i, r)) for i, r in enumerate(receivers)]
    watching = [asyncio.create_task(watch(o)) for o in origins]
    sending = [asyncio.create_task(send(i, o)) for i, o in enumerate(origins)]
    await asyncio.gather(*receiving)
    for task in (*sending, *watching):
        task.cancel()
    for outcome in await asyncio.gather(*sending, *watching, return_exceptions=True):
        if isinstance(outcome, Exception):  # a cancelled task's CancelledError is not one
            raise outcome
    last = max(arrived.values()) if len(arrived) == expected else end
    return LoadResult(expected=expected, sent=len(sent_at), delivered=len(arrived),
                      duplicates=duplicates,
                      refusals=[f.get("payload") or f.get("type") for f in refusals],
                      elapsed=last - start,
                      latencies_ms=[(arrived[m] - sent_at[m]) * 1000 for m in arrived])

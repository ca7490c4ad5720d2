"""Agents registering under a token, for the identity and grant tests: the
first frame carries the token (nothing comes before it on a secured hub)."""

from __future__ import annotations

import time

from tests.support.wsprobe import WsProbe


async def connect(url: str, name: str, token: str | None, **extra) -> WsProbe:
    """A socket whose first frame registers `name` with `token`."""
    probe = await WsProbe.open(url)
    frame = {"sender": name, "target": "System", "type": "heartbeat", "payload": "online",
             "timestamp": time.time(), **extra}
    if token is not None:
        frame["token"] = token
    await probe.send_json(frame)
    return probe


async def online(url: str, name: str, token: str | None, **extra) -> WsProbe:
    """As connect, once the hub has announced the name."""
    probe = await connect(url, name, token, **extra)
    await probe.recv_type("presence_update", agent=name, event="joined")
    return probe


async def refused(probe: WsProbe) -> dict:
    """The auth_denied the hub answered with, once it closed the socket (4010)."""
    denied = await probe.recv_type("auth_denied")
    closed = await probe.wait_closed()
    assert closed.code == 4010, closed
    return denied

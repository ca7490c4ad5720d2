"""The commands on the Router's one bounded inbox.

A door (WebSocket today; REDSYN over HTTP and the Unix-socket broker next)
turns its protocol into these and nothing else: it names its endpoint by id,
never hands the Router a socket. Commands are immutable tuples: cheap to make
on the hot path (one per inbound frame) and safe to share.

Where a caller waits for an answer, the answer travels as a future inside the
command (`Call.reply`): the Router resolves it once the command is handled.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable, NamedTuple


class Opened(NamedTuple):
    """A door admitted an endpoint (on a hub with a token: after it proved
    it). The Router opens its session and answers with the welcome."""

    endpoint: int
    # the principal's name (docs/identity.md): what the ingress quota charges
    # and the journal records; open-host:<address> on an open hub
    principal: str
    # the remote address, for the per-host connection bound
    peer_host: str
    # the DER client certificate the endpoint presented over TLS, if any (a
    # peer hub's link is recognised by it)
    peer_cert: bytes | None = None
    # the digest of the token it proved (None on an open hub): a revoked
    # token's sessions are found by it
    credential: str | None = None


class Inbound(NamedTuple):
    """One decoded frame from an endpoint (a dict that passed the wire bounds)."""

    endpoint: int
    frame: dict
    size: int


class Closed(NamedTuple):
    """The endpoint went away; its session ends and its name is freed."""

    endpoint: int


class Call(NamedTuple):
    """Run `fn(router)` as an ordinary command (timers, background tasks that
    report back). If `reply` is given it gets fn's result, or its exception."""

    fn: Callable[[Any], Any]
    reply: asyncio.Future | None = None


class Wake(NamedTuple):
    """Nothing to do: wakes the Router so it drains its control queue."""


WAKE = Wake()

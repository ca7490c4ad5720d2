"""A real hub (actors, journal, aiohttp listener) running inside the test's
event loop, on an ephemeral loopback port with its journal in a temp folder."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import replace
from pathlib import Path

from hubd.actors.journal_writer import Flush
from hubd.config import HubConfig
from hubd.core.commands import Request
from hubd.server import HubServer


def test_config(tmp_path: Path, **overrides) -> HubConfig:
    base = HubConfig(host="127.0.0.1", port=0, db=tmp_path / "hub.db", hub_id="test-hub",
                     quota=None)
    return replace(base, **overrides)


@contextlib.asynccontextmanager
async def running_hub(tmp_path: Path, allow_crashes: bool = False, **overrides):
    """allow_crashes: the test makes a handler raise on purpose; otherwise any
    handler that raised fails the test (a crash is a bug even if the hub coped)."""
    server = HubServer(test_config(tmp_path, **overrides))
    await server.start()
    try:
        yield server
    finally:
        if server.hub.ready or (server._run is not None and not server._run.done()):
            await server.stop()
    if not allow_crashes:
        assert server.hub.metrics.handler_crashes == 0, "a handler raised (see the log)"


async def flushed(server: HubServer) -> None:
    """Everything handed to the journal writer so far is committed and released."""
    done = asyncio.get_running_loop().create_future()
    await server.hub.writer.inbox.put(Flush(done))
    await done


async def settled(server: HubServer) -> None:
    """The Router has handled what was queued for it (a request queued behind
    it is answered) and the writer has committed what that produced."""
    handled = asyncio.get_running_loop().create_future()
    await server.hub.router.inbox.put(Request(None, "hub.health", {}, handled))
    await handled
    await flushed(server)

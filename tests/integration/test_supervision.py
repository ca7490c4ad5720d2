"""Supervision on a real hub: its actors run in one TaskGroup, so an actor
that dies of an exception nobody expected stops the hub with exit code 1 and
says so in the log, after failing what it held (the journal makes the restart
correct). The defect is planted in the forward outbox's mailbox: an event of
no known kind, as a bug in a poster would make."""

import asyncio

from structlog.testing import capture_logs

from federation.config import build_federation_config
from federation.actors.outbox_messages import TICK
from tests.support.inproc import running_hub
from tests.support.procs import free_port

PIN = "sha256:" + "a" * 64


def federation(port: int):
    return build_federation_config(
        message_peers=[f"west=wss://127.0.0.1:{port}/"], message_peer_pins=[f"west={PIN}"],
        message_peer_token=None, client_certfile=None, client_keyfile=None, forward_ttl=60,
        tls_certfile=None, tls_keyfile=None, serving_policy=None, hub_id="east")


async def test_an_outbox_that_dies_stops_the_hub_with_exit_code_1(tmp_path):
    # west's port has nobody listening: the link stays down, which is not a failure
    config = {"hub_id": "east", "federation": federation(free_port())}
    with capture_logs() as logs:
        async with running_hub(tmp_path, **config) as server:
            outbox = server.hub.federation.forwarding.outboxes["west"]
            await asyncio.sleep(0.2)
            assert not server._run.done()  # a peer that is down stops nothing
            outbox.mailbox.events.append("not an event")
            outbox.mailbox.post(TICK)
            code = await asyncio.wait_for(server.wait(), 10)
    assert code == 1
    failed = [e for e in logs if e["event"] == "actor failed; stopping the hub"]
    assert failed and "unknown event" in failed[0]["error"]

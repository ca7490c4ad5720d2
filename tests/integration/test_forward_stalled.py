"""A peer link that is up while nothing succeeds: real hubd processes. West
refusing every forward past its ingress quota (a transient refusal east keeps
retrying with backoff) is reported stalled; a peer that never answers a
roster request gives the asker an error at the roster timeout."""

import asyncio
import json
import time

from hubd.timing import Timing
from tests.support.federation import fake_peer_hub, make_pki, site_flags, write_serving_policy
from tests.support.procs import hubd_process
from tests.support.wsprobe import joined
from tests.support.waiting import wait_for


def test_up_link_without_success_is_stalled_in_health_and_metrics(tmp_path):
    pki = make_pki(tmp_path / "pki", ["east", "west"])
    policy = write_serving_policy(tmp_path / "west-policy", pki, {"east": ["PROJ"]})
    west = hubd_process(tmp_path / "west", *site_flags(pki, "west", policy).serve,
                        "--durable-ingress-events", "3", "--durable-ingress-window", "3600",
                        hub_id="west", scheme="wss")
    west.start()
    east = hubd_process(tmp_path / "east", *site_flags(pki, "east", None).connect,
                        "--message-peer", f"west=wss://127.0.0.1:{west.port}/",
                        "--message-peer-pin", f"west={pki.server_pin('west')}", hub_id="east",
                        # stalled after a second and a half without success (production: ten)
                        timing=Timing(stalled_after=1.5))
    east.start()
    try:
        async def send():
            alice = await joined(east.url, "PROJ/alice")
            for i in range(8):
                await alice.chat("PROJ/alice", "PROJ/bob@west", f"m{i}", client_msg_id=f"m{i}")
            await alice.close()

        asyncio.run(send())

        def entry():
            return json.loads(east.get_text("/health"))["message_forward"]["west"]

        first = wait_for(lambda: entry()["last_success"] and entry(), timeout=20)
        assert first["link"] == "up" and first["stalled"] is False
        stalled = wait_for(lambda: entry()["stalled"] and entry(), timeout=60)
        assert stalled["link"] == "up" and stalled["pending"] == 5
        assert stalled["stalled_since"] == max(stalled["up_since"], stalled["last_success"])
        health = json.loads(east.get_text("/health"))
        assert health["status"] == "degraded" and health["reasons"] == [
            "message peer west: forwards stalled (the link is up, nothing settles) since "
            f"{stalled['stalled_since']}"], health["reasons"]
        metrics = east.get_text("/metrics")
        assert 'hubd_peer_link_stalled{peer="west"} 1.0' in metrics
        assert 'hubd_forward_total{outcome="retried",peer="west"}' in metrics
        inbound = [line for line in metrics.splitlines()
                   if line.startswith('hubd_peer_last_inbound_timestamp_seconds{peer="west"}')]
        assert inbound and float(inbound[0].split()[-1]) >= stalled["last_success"]
    finally:
        east.stop()
        west.stop()


def test_a_roster_the_peer_never_answers_is_an_error_at_the_roster_timeout(tmp_path):
    """A hand-written hubd-like west takes east's link and forwards but never
    answers a `who` forward. The asker hears an error when the roster timeout
    runs out (the seed's ten seconds by default; --roster-timeout shortens it
    here), not before, and east answers other askers meanwhile."""
    pki = make_pki(tmp_path / "pki", ["east", "west"])
    asked = []

    async def silent_on_rosters(ws, frame):
        if frame.get("type") == "multihub_message_forward" and frame.get("kind") == "who":
            asked.append(frame)

    async def scenario():
        async with fake_peer_hub(pki, "west", 7, silent_on_rosters,
                                 features=["forward_batch"]) as port:
            east = hubd_process(tmp_path / "east", *site_flags(pki, "east", None).connect,
                                "--message-peer", f"west=wss://127.0.0.1:{port}/",
                                "--message-peer-pin", f"west={pki.server_pin('west')}",
                                "--roster-timeout", "1.5", hub_id="east")
            await asyncio.to_thread(east.start)
            try:
                await asyncio.to_thread(wait_for, lambda: json.loads(east.get_text(
                    "/health"))["message_forward"]["west"]["link"] == "up", 20.0)
                alice = await joined(east.url, "PROJ/alice")
                started = time.monotonic()
                await alice.send_json({"sender": "PROJ/alice", "type": "who_request",
                                       "hub": "west"})
                # not answered before the timeout; the hub serves other requests
                await alice.send_json({"sender": "PROJ/alice", "type": "who_request"})
                local = await alice.recv_type("who_snapshot", timeout=1.0)
                assert "remote_hub" not in local
                error = await alice.recv_type("error", timeout=10)
                waited = time.monotonic() - started
                await alice.close()
                return error, waited
            finally:
                east.stop()

    error, waited = asyncio.run(scenario())
    assert [f["sender_seat"] for f in asked] == ["PROJ/alice"]
    assert "Hub 'west' did not answer the roster request" in error["payload"]
    assert "no answer within 1.5s" in error["payload"]
    assert 1.5 <= waited < 5.0, waited  # the 0.5 s sweep ticks it, not a 10 s default

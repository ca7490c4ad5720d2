"""Wire-version negotiation on peer links (issue 24 item 8; docs/federation.md,
"Wire versions between hubs"): a real hubd east links over mutual TLS to a
real hubd west (the same version: no warning) or to a hand-written west whose
welcome says an older, newer or no version. East warns once (across a
reconnect), shows the negotiated version on /health and /metrics, and
refuses a feature the negotiated version does not have before sending it."""

from __future__ import annotations

import asyncio
import json


import pytest

from hubd.timing import Timing
from hubd.wire.envelope import PROTOCOL_VERSION
from tests.support.delivery_driver import Agent
from tests.support.federation import (fake_peer_hub, make_pki, site_flags,
                                     write_serving_policy)
from tests.support.procs import hubd_process
from tests.support.waiting import wait_for

WARNING = "peer wire version differs"
FAST = Timing(link_backoff_first=0.05, link_backoff_max=0.2)


@pytest.fixture
def pki(tmp_path):
    return make_pki(tmp_path / "pki", ["east", "west", "dst"])


def versions_of(hub) -> dict:
    return hub.get_json("/health")["peer_versions"]["west"]


def warnings_in(hub) -> list[str]:
    return [line for line in hub.log().splitlines() if WARNING in line]


def test_two_hubd_hubs_negotiate_the_same_version_without_a_warning(tmp_path, pki):
    policy = write_serving_policy(tmp_path / "west-policy", pki, {"east": ["PROJ"]})
    west = hubd_process(tmp_path / "west", *site_flags(pki, "west", policy).serve,
                        hub_id="west", scheme="wss").start()
    try:
        site = site_flags(pki, "east", None)
        east = hubd_process(tmp_path / "east", *site.peer_flags(pki, "west", west.url),
                            *site.connect, hub_id="east").start()
        try:
            wait_for(lambda: versions_of(east)["negotiated"] is not None, what="east's link")
            assert versions_of(east) == {"ours": PROTOCOL_VERSION,
                                         "advertised": PROTOCOL_VERSION,
                                         "negotiated": PROTOCOL_VERSION, "relation": "same",
                                         "warnings": {}}
            assert east.metric('hubd_peer_negotiated_version{peer="west"}') == PROTOCOL_VERSION
            assert east.get_json("/health")["message_forward"]["west"][
                "negotiated_protocol_version"] == PROTOCOL_VERSION
            assert warnings_in(east) == []
            # west negotiated east's registration the same way
            wait_for(lambda: "east" in (west.get_json("/health").get("peer_versions_inbound")
                                        or {}), what="east registered on west")
            assert west.get_json("/health")["peer_versions_inbound"]["east"]["relation"] == \
                "same"
            assert west.metric('hubd_peer_inbound_negotiated_version{peer="east"}') == \
                PROTOCOL_VERSION
            assert warnings_in(west) == []
        finally:
            east.stop()
    finally:
        west.stop()


@pytest.mark.parametrize("advertised,relation,negotiated,roster_refused", [
    (4, "older", 4, True), (PROTOCOL_VERSION + 3, "newer", PROTOCOL_VERSION, False),
    (None, "silent", 1, True)], ids=["older", "newer", "silent"])
def test_a_skewed_peer_is_warned_once_shown_and_gated(tmp_path, pki, advertised, relation,
                                                      negotiated, roster_refused):
    seen: list[dict] = []
    registrations = []

    async def on_frame(ws, frame):
        seen.append(frame)
        if frame.get("type") == "heartbeat" and frame.get("sender") == "east":
            registrations.append(frame)
            if len(registrations) == 1:
                await ws.close()  # east redials: the same welcome, no second warning
        elif frame.get("type") == "multihub_message_forward" and frame.get("kind") == "who":
            await ws.send_json({"type": "multihub_message_result", "sender": "west",
                                "forward_id": frame["forward_id"], "disposition": "accepted",
                                "answering_hub": "west", "reason_code": "", "detail": "",
                                "result": {"online_agents": ["PROJ/bob"]}})

    async def scenario():
        async with fake_peer_hub(pki, "west", advertised, on_frame, mtls=True) as port:
            site = site_flags(pki, "east", None)
            east = hubd_process(tmp_path / "east", "--message-peer",
                                f"west=wss://127.0.0.1:{port}/", "--message-peer-pin",
                                f"west={pki.server_pin('west')}", *site.connect,
                                hub_id="east", timing=FAST)
            await asyncio.to_thread(east.start)
            try:
                def reconnected():
                    health = east.get_json("/health")["message_forward"]["west"]
                    return health["connects"] >= 2 and health["link"] == "up"
                await asyncio.to_thread(wait_for, reconnected, 20.0, "east's second link")
                return east, await checks(east)
            finally:
                east.stop()

    async def checks(east):
        health = versions_of(east)
        metrics = (east.metric('hubd_peer_negotiated_version{peer="west"}'),
                   east.metric(f'hubd_peer_version_warnings_total{{peer="west",'
                               f'relation="{relation}"}}'),
                   east.metric('hubd_peer_advertised_version{peer="west"}'))
        alice = await Agent.join(east.url, "PROJ/alice")
        await alice.send("who_request", hub="west")
        answer = await alice.probe.recv(lambda f: f.get("type") in ("error", "who_snapshot"), 10)
        await alice.close()
        return health, metrics, answer

    east, (health, metrics, answer) = asyncio.run(scenario())
    assert len(registrations) >= 2
    # both registrations were sent over mutual TLS (the fake requires the client certificate)
    assert all(r.get("protocol_version") == PROTOCOL_VERSION for r in registrations)
    assert health == {"ours": PROTOCOL_VERSION, "advertised": advertised,
                      "negotiated": negotiated, "relation": relation,
                      "warnings": {relation: 1}}
    assert metrics == (negotiated, 1, advertised or 0)
    told = warnings_in(east)
    assert len(told) == 1, told
    for fact in ("peer=west", f"relation={relation}", f"negotiated={negotiated}"):
        assert fact in told[0], told
    rosters = [f for f in seen if f.get("kind") == "who"]
    if roster_refused:
        assert answer["type"] == "error" and answer["reason_code"] == "peer_version_too_old", \
            answer
        assert "below 5" in answer["payload"]
        assert rosters == []  # refused before anything was sent
    else:
        assert answer["type"] == "who_snapshot" and answer["online_agents"] == ["PROJ/bob@west"]
        assert len(rosters) == 1


def test_an_attachment_read_is_refused_below_wire_v6(tmp_path, pki):
    """A signed hubd `dst` whose message peer `west` advertises wire v5: the
    agent's cross-hub attachment read (a v6 feature) is refused with
    peer_version_too_old and nothing reaches west."""
    from tests.support.signed_site import ATTACH_ACL, SignedProbe, start_signed_hub

    seen: list[dict] = []

    async def on_frame(ws, frame):
        seen.append(frame)

    async def scenario():
        async with fake_peer_hub(pki, "west", 5, on_frame, mtls=True) as port:
            flags = (*site_flags(pki, "dst", None).connect, "--message-peer",
                     f"west=wss://127.0.0.1:{port}/", "--message-peer-pin",
                     f"west={pki.server_pin('west')}")
            reader = await asyncio.to_thread(
                start_signed_hub, "hubd", tmp_path, {"p/reader": ["p/attachment-read"]},
                ATTACH_ACL, extra=flags, hub_id="dst", folder="dst", reference_files=False)
            try:
                await asyncio.to_thread(
                    wait_for, lambda: reader.proc.get_json("/health")["peer_versions"]["west"][
                        "negotiated"] == 5, 20.0, "dst's link to west")
                agent = await SignedProbe.open(reader.proc.url, reader.seats["p/reader"])
                got = await agent.ask("attachment_peer_request", source_hub="west",
                                      action="info", scope="p", digest="a" * 64)
                await agent.close()
                return got
            finally:
                reader.proc.stop()

    got = asyncio.run(scenario())
    assert (got["type"], got["ok"], got["reason_code"], got["source_hub"]) == \
        ("attachment_peer_result", False, "peer_version_too_old", "west"), got
    assert "below 6" in got["detail"]
    assert [f for f in seen if f.get("type") == "attachment_peer_request"] == []



def test_a_peer_registering_with_an_older_version_is_warned_once(tmp_path, pki):
    """A hand-written east registers its link with a real west over mutual TLS
    (its client certificate, west's serving policy) saying wire version 4,
    twice: west warns once and shows it."""
    import aiohttp

    from federation.tls import peer_client_context

    policy = write_serving_policy(tmp_path / "west-policy", pki, {"east": ["PROJ"]})
    west = hubd_process(tmp_path / "west", *site_flags(pki, "west", policy).serve,
                        hub_id="west", scheme="wss").start()

    async def register_twice():
        context = peer_client_context(pki.file("east", "client", "cert"),
                                      pki.file("east", "client", "key"))
        async with aiohttp.ClientSession() as http:
            for _ in range(2):
                async with http.ws_connect(west.url, ssl=context) as ws:
                    await ws.receive_json(timeout=5)  # the welcome
                    await ws.send_json({"sender": "east", "target": "System",
                                        "type": "heartbeat", "payload": "online",
                                        "protocol_version": 4})
                    await ws.send_json({"sender": "east", "target": "all",
                                        "type": "multihub_log_request", "payload": "",
                                        "after_seq": 0, "limit": 1})
                    while (await ws.receive_json(timeout=5)).get("type") != \
                            "multihub_log_snapshot":
                        pass

    try:
        asyncio.run(register_twice())
        inbound = west.get_json("/health")["peer_versions_inbound"]["east"]
        assert inbound == {"ours": PROTOCOL_VERSION, "advertised": 4, "negotiated": 4,
                           "relation": "older", "warnings": {"older": 1}}
        assert west.metric('hubd_peer_inbound_negotiated_version{peer="east"}') == 4
        assert west.metric('hubd_peer_inbound_version_warnings_total{peer="east",'
                           'relation="older"}') == 1
        told = warnings_in(west)
        assert len(told) == 1 and "peer=east" in told[0] and "relation=older" in told[0], told
    finally:
        west.stop()


def test_the_one_shot_follower_reports_the_negotiation(tmp_path, pki):
    """`hubd multihub follow --json` against a hand-written peer over mutual TLS
    that advertises wire version 4: the pull succeeds, stdout is the JSON view
    with `peer_version`, the warning goes to stderr."""
    import subprocess
    import sys

    async def on_frame(ws, frame):
        if frame.get("type") == "multihub_log_request":
            await ws.send_json({"type": "multihub_log_snapshot", "sender": "SynapseHub",
                                "target": frame.get("sender"), "payload": "", "events": [],
                                "next_cursor": 0, "log_end_seq": 0})

    async def scenario():
        async with fake_peer_hub(pki, "west", 4, on_frame, mtls=True) as port:
            return await asyncio.to_thread(subprocess.run, [
                sys.executable, "-m", "hubd", "multihub", "follow", "--peer-uri",
                f"wss://127.0.0.1:{port}/", "--peer-id", "west", "--local-id", "east",
                "--pin", pki.server_pin("west"), "--client-certfile",
                pki.file("east", "client", "cert"), "--client-keyfile",
                pki.file("east", "client", "key"), "--json", "--timeout", "10"],
                capture_output=True, text=True, timeout=60)

    done = asyncio.run(scenario())
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert document["peer_version"] == {"ours": PROTOCOL_VERSION, "advertised": 4,
                                        "negotiated": 4, "relation": "older",
                                        "warnings": {"older": 1}}
    assert WARNING in done.stderr and "relation=older" in done.stderr

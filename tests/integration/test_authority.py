"""Namespace authority with real hub processes over mTLS: claims routed to
their owner, refusals naming it, and a misconfigured second owner turning into
a journaled partition (refusing even locally) and a journaled heal."""

import asyncio
import json
import sqlite3

import pytest

from hubd.timing import Timing
from tests.support.federation import make_pki, site_flags, write_serving_policy
from tests.support.procs import free_port, hubd_process
from tests.support.wsprobe import WsProbe
from tests.support.waiting import wait_for

# a hub that watches a peer polls it five times a second (production: every 30 s)
QUICK_WATCH = Timing(watch_interval=0.2)


def rows(hub_dir, kind):
    db = sqlite3.connect(hub_dir / "hubd.db")
    try:
        return [json.loads(p) for (p,) in db.execute(
            "SELECT payload FROM events WHERE kind = ? ORDER BY seq", (kind,))]
    finally:
        db.close()


async def agent(url, name):
    probe = await WsProbe.open(url)
    await probe.register(name)
    await probe.recv_type("presence_update", agent=name, timeout=10)
    return probe


def route_up(hub, peer):
    """Wait until hub's claim route to peer is up (its /health). A claim made
    while the route is still dialling (just after a start) is refused at once
    naming the owner (forward_error "closed"), by design; a test that means to
    reach the owner waits for the route first."""
    wait_for(lambda: hub.get_json("/health")["multihub"]["claim_routes"][peer]["link"] == "up",
             what=f"claim route to {peer} up")


async def claim(probe, name, task_id, paths, **extra):
    await probe.send_json({"sender": name, "target": "System", "type": "claim",
                           "payload": task_id, "task_id": task_id, "worktree": "/repo",
                           "paths": paths, "ttl_seconds": 120, **extra})
    return await probe.recv(lambda f: f.get("type") in ("claim_granted", "claim_denied")
                            and f.get("task_id") == task_id
                            and (f.get("type") == "claim_denied" or f.get("owner") == name),
                            timeout=15)


@pytest.fixture
def sites(tmp_path):
    pki = make_pki(tmp_path / "pki", ["east", "west", "north"])
    ports = {hub: free_port() for hub in ("east", "west", "north")}
    url = {hub: f"wss://127.0.0.1:{port}/" for hub, port in ports.items()}
    procs = {}

    def start(hub, grants, *extra):
        policy = write_serving_policy(tmp_path / f"{hub}-policy", pki, grants)
        site = site_flags(pki, hub, policy)
        proc = hubd_process(tmp_path / hub, *site.serve, *site.connect, *extra, hub_id=hub,
                            port=ports[hub], scheme="wss", timing=QUICK_WATCH)
        procs[hub] = proc.start()
        return proc

    def route(flag, peer):
        return [f"--{flag}", f"{peer}={url[peer]}", f"--{flag}-pin",
                f"{peer}={pki.server_pin(peer)}"]

    yield start, route, url
    for proc in procs.values():
        proc.stop()


def test_claims_route_to_the_owner_and_a_second_owner_partitions(tmp_path, sites):
    start, route, url = sites
    # east owns PROJ and watches north; west routes PROJ claims to east;
    # north is misconfigured and believes it owns PROJ too.
    east = start("east", {"west": ["PROJ"], "north": ["PROJ"]}, "--namespace-owner", "PROJ=east",
                 *route("multihub-watch", "north"))
    west = start("west", {"east": ["PROJ"]}, "--namespace-owner", "PROJ=east",
                 *route("claim-peer", "east"))
    start("north", {"east": ["PROJ"]}, "--namespace-owner", "PROJ=north")
    route_up(west, "east")

    async def scenario():
        amy = await agent(url["west"], "PROJ/amy")
        bob = await agent(url["east"], "PROJ/bob")
        granted = await claim(amy, "PROJ/amy", "t-1", ["src/core"])
        assert granted["type"] == "claim_granted" and granted["hub_id"] == "west"
        assert granted["target"] == "PROJ/amy"  # relayed privately
        # the lease is east's: its epoch and expiry, in east's state
        await bob.send_json({"sender": "PROJ/bob", "type": "state_request"})
        leases = (await bob.recv_type("state_snapshot"))["snapshot"]["active_claims"]
        assert [(c["task_id"], c["owner"], c["epoch"]) for c in leases] == \
            [("t-1", "PROJ/amy", granted["epoch"])]
        conflict = await claim(bob, "PROJ/bob", "t-2", ["src/core/x.py"])
        assert conflict["type"] == "claim_denied"
        assert conflict["reason_code"] == "SCOPE_CONFLICT"
        # a conflicting claim from west is refused by the owner, in the owner's words
        second = await claim(amy, "PROJ/amy", "t-3", ["src"])
        assert second["type"] == "claim_denied" and second["owner_hub_id"] == "east"
        assert "conflicts with 't-1'" in second["payload"]
        # ungoverned namespace: refused on west, naming no owner
        other = await agent(url["west"], "OTHER/zed")
        ungoverned = await claim(other, "OTHER/zed", "o-1", ["x"])
        assert ungoverned["type"] == "claim_denied" and ungoverned["ownership"] == "ungoverned"
        # release is routed to the owner too
        await amy.send_json({"sender": "PROJ/amy", "type": "release", "task_id": "t-1",
                             "epoch": granted["epoch"]})
        released = await amy.recv_type("release_granted", timeout=15)
        assert released["owner_hub_id"] == "east"

        # north grants PROJ on its own: east sees it asserting and refuses PROJ
        nora = await agent(url["north"], "PROJ/nora")
        rogue = await claim(nora, "PROJ/nora", "n-1", ["docs"])
        assert rogue["type"] == "claim_granted"
        partitions = wait_for(lambda: rows(tmp_path / "east", "multihub_partition"))
        assert partitions[0]["contesting_hubs"] == ["north"]
        assert partitions[0]["transition"] == "entered"
        refused = await claim(bob, "PROJ/bob", "t-4", ["elsewhere"])
        assert refused["type"] == "claim_denied" and refused["ownership"] == "partitioned"
        # north lets go; east heals only after a successful refresh shows it
        await nora.send_json({"sender": "PROJ/nora", "type": "release", "task_id": "n-1",
                              "epoch": rogue["epoch"]})
        await nora.recv_type("release_granted")
        heals = wait_for(lambda: rows(tmp_path / "east", "multihub_heal"))
        assert heals[0]["previous_contesting_hubs"] == ["north"]
        assert heals[0]["observation_refreshed"] is True
        again = await claim(bob, "PROJ/bob", "t-5", ["elsewhere"])
        assert again["type"] == "claim_granted"
        for p in (amy, bob, other, nora):
            await p.close()

    asyncio.run(scenario())
    health = east.get_json("/health")["multihub"]
    assert health["partitioned"] == [] and health["watches"]["north"]["last_success"]
    metrics = east.get_text("/metrics")
    assert 'hubd_peer_quarantined{peer="north"} 0.0' in metrics
    assert 'hubd_watch_lag_events{peer="north"}' in metrics


def test_partition_survives_restart_and_owner_down_fails_closed(tmp_path, sites):
    start, route, url = sites
    east = start("east", {"west": ["PROJ"], "north": ["PROJ"]}, "--namespace-owner", "PROJ=east",
                 *route("multihub-watch", "north"))
    start("west", {"east": ["PROJ"]}, "--namespace-owner", "PROJ=east",
          *route("claim-peer", "east"))
    north = start("north", {"east": ["PROJ"]}, "--namespace-owner", "PROJ=north")

    async def rogue_claim():
        nora = await agent(url["north"], "PROJ/nora")
        granted = await claim(nora, "PROJ/nora", "n-1", ["docs"])
        await nora.close()
        return granted

    assert asyncio.run(rogue_claim())["type"] == "claim_granted"
    wait_for(lambda: rows(tmp_path / "east", "multihub_partition"))
    assert 'hubd_namespace_partitioned{namespace="PROJ"} 1.0' in east.get_text("/metrics")
    north.stop()  # the contestant goes away: a failed poll must not heal
    east.stop()
    east.start()
    # /health says why east is degraded: the partition, and the watch it cannot poll
    health = east.get_json("/health")
    assert health["status"] == "degraded", health
    assert "namespace PROJ: partitioned (two hubs claim to own it); claims in it are " \
           "refused until it heals" in health["reasons"], health["reasons"]
    assert any(r.startswith("watch of north: link down") for r in health["reasons"])

    async def after_restart():
        bob = await agent(url["east"], "PROJ/bob")
        refused = await claim(bob, "PROJ/bob", "t-1", ["a"])
        assert refused["type"] == "claim_denied" and refused["ownership"] == "partitioned"
        await bob.close()
        # the owner is down: a claim from west is refused naming it
        east.stop()
        amy = await agent(url["west"], "PROJ/amy")
        down = await claim(amy, "PROJ/amy", "t-2", ["b"])
        assert down["type"] == "claim_denied" and down["owner_hub_id"] == "east"
        await amy.close()

    asyncio.run(after_restart())
    assert rows(tmp_path / "east", "multihub_heal") == []


def test_multihub_follow_prints_a_peers_observed_claims(tmp_path, sites):
    import subprocess
    import sys

    start, route, url = sites
    start("east", {"west": ["PROJ"]}, "--namespace-owner", "PROJ=east")

    async def work():
        bob = await agent(url["east"], "PROJ/bob")
        assert (await claim(bob, "PROJ/bob", "build", ["src"]))["type"] == "claim_granted"
        await bob.close()
    asyncio.run(work())
    pki_dir = tmp_path / "pki"
    pin = json.loads(subprocess.run([sys.executable, "-m", "hubd", "certs", "pin",
                                     str(pki_dir / "east-server.pem"), "--json"],
                                    check=True, capture_output=True, text=True).stdout)["sha256"]
    base = [sys.executable, "-m", "hubd", "multihub", "follow", "--peer-uri", url["east"],
            "--peer-id", "east", "--pin", pin, "--local-id", "west"]
    granted = subprocess.run(base + ["--client-certfile", str(pki_dir / "west-client.pem"),
                                     "--client-keyfile", str(pki_dir / "west-client.key")],
                             capture_output=True, text=True, timeout=60)
    assert granted.returncode == 0, granted.stderr
    assert "observing peer 'east'" in granted.stdout
    assert "build -> PROJ/bob @ east" in granted.stdout
    # without the client certificate the peer serves nothing, and says why
    anonymous = subprocess.run(base, capture_output=True, text=True, timeout=60)
    assert anonymous.returncode == 0 and "0 observed claims" in anonymous.stdout
    assert "does not grant this hub" in anonymous.stderr
    wrong_pin = subprocess.run([*base[:-4], "--pin", "sha256:" + "0" * 64, "--local-id", "west"],
                               capture_output=True, text=True, timeout=60)
    assert wrong_pin.returncode == 2 and "pin" in wrong_pin.stderr


def test_every_claim_verb_reaches_the_owner_and_the_claimants_snapshot_shows_its_lease(
        tmp_path, sites):
    """task_update, checkpoint, handoff and wait_request on a lease the owning
    hub granted are decided by that owner (they used to be answered "not found"
    by the claimant's hub), and the claimant's hub lists the lease in its
    state_snapshot as the owner has it, across a restart too."""
    start, route, url = sites
    start("east", {"west": ["PROJ"]}, "--namespace-owner", "PROJ=east")
    west = start("west", {"east": ["PROJ"]}, "--namespace-owner", "PROJ=east",
                 *route("claim-peer", "east"))
    route_up(west, "east")

    async def snapshot(probe, name):
        await probe.send_json({"sender": name, "type": "state_request"})
        claims = (await probe.recv_type("state_snapshot", timeout=10))["snapshot"]
        return {c["task_id"]: c for c in claims["active_claims"]}

    async def scenario():
        amy = await agent(url["west"], "PROJ/amy")
        cat = await agent(url["west"], "PROJ/cat")
        bob = await agent(url["east"], "PROJ/bob")
        granted = await claim(amy, "PROJ/amy", "t-1", ["src/core"])
        assert granted["type"] == "claim_granted" and granted["owner_hub_id"] == "east"
        mine = (await snapshot(amy, "PROJ/amy"))["t-1"]
        owners = (await snapshot(bob, "PROJ/bob"))["t-1"]
        assert mine["owner_hub_id"] == "east"
        assert {k: mine[k] for k in owners} == {**owners, "holder_online": True,
                                                "holder_offline_seconds": None}
        assert owners["holder_online"] is False  # amy is not on east

        await amy.send_json({"sender": "PROJ/amy", "type": "task_update", "id": "t-1",
                             "status": "working", "note": "halfway",
                             "epoch": granted["epoch"]})
        updated = await amy.recv(lambda f: f.get("type") in ("task_updated", "error")
                                 and f.get("task_id") == "t-1", timeout=15)
        assert updated["type"] == "task_updated", updated
        assert updated["target"] == "PROJ/amy" and updated["owner_hub_id"] == "east"
        assert updated["status"] == "working" and updated["version"] == 1
        await amy.send_json({"sender": "PROJ/amy", "type": "checkpoint", "id": "t-1",
                             "checkpoint": "step 3 of 5", "epoch": granted["epoch"]})
        saved = await amy.recv(lambda f: f.get("type") in ("checkpoint_saved",
                                                           "checkpoint_denied"), timeout=15)
        assert saved["type"] == "checkpoint_saved" and saved["version"] == 2, saved
        mine = (await snapshot(amy, "PROJ/amy"))["t-1"]
        owners = (await snapshot(bob, "PROJ/bob"))["t-1"]
        assert (mine["status"], mine["note"], mine["checkpoint"], mine["version"]) == \
            ("working", "halfway", "step 3 of 5", 2)
        assert (owners["status"], owners["checkpoint"], owners["version"]) == \
            ("working", "step 3 of 5", 2)
        # an update the owner refuses is refused in its words
        await amy.send_json({"sender": "PROJ/amy", "type": "task_update", "id": "t-1",
                             "status": "claimed"})
        refused = await amy.recv(lambda f: f.get("type") == "error"
                                 and f.get("task_id") == "t-1", timeout=15)
        assert "working" in refused["payload"] and refused["owner_hub_id"] == "east"

        await cat.send_json({"sender": "PROJ/cat", "type": "wait_request", "id": "t-1"})
        waiting = await cat.recv(lambda f: f.get("type") in ("wait_granted", "wait_denied"),
                                 timeout=15)
        assert waiting["type"] == "wait_granted" and waiting["holder"] == "PROJ/amy", waiting

        await amy.send_json({"sender": "PROJ/amy", "type": "handoff", "id": "t-1",
                             "to_agent": "PROJ/cat", "note": "yours"})
        handed = await amy.recv(lambda f: f.get("type") in ("handoff_granted", "handoff_denied"),
                                timeout=15)
        assert handed["type"] == "handoff_granted", handed
        assert handed["owner"] == "PROJ/cat" and handed["epoch"] > granted["epoch"]
        cats = (await snapshot(cat, "PROJ/cat"))["t-1"]
        assert (cats["owner"], cats["epoch"], cats["owner_hub_id"]) == \
            ("PROJ/cat", handed["epoch"], "east")
        assert (await snapshot(bob, "PROJ/bob"))["t-1"]["owner"] == "PROJ/cat"
        for p in (amy, bob):
            await p.close()
        await cat.close()
        return handed["epoch"]

    epoch = asyncio.run(scenario())
    assert [r["verb"] for r in rows(tmp_path / "west", "multihub_remote_lease")] == \
        ["claim", "task_update", "checkpoint", "handoff"]
    west.stop()
    west.start()
    route_up(west, "east")

    async def after_restart():
        cat = await agent(url["west"], "PROJ/cat")
        listed = (await snapshot(cat, "PROJ/cat"))["t-1"]
        assert (listed["owner"], listed["epoch"]) == ("PROJ/cat", epoch)
        await cat.send_json({"sender": "PROJ/cat", "type": "release", "task_id": "t-1",
                             "epoch": epoch})
        released = await cat.recv_type("release_granted", timeout=15)
        assert released["owner_hub_id"] == "east"
        assert "t-1" not in await snapshot(cat, "PROJ/cat")
        await cat.close()

    asyncio.run(after_restart())
    health = west.get_json("/health")["multihub"]["claim_forwarder"]
    assert health["answered"] == 1 and health["in_flight"] == 0 and health["refused_full"] == 0


def test_one_link_per_peer_carries_forwards_claims_and_the_watch(tmp_path, sites):
    """A peer that is this hub's message peer, claim route and watched peer at
    once gets one mTLS link, not three: the owner sees one peer connection."""
    start, route, url = sites
    east = start("east", {"west": ["PROJ"]}, "--namespace-owner", "PROJ=east")
    west = start("west", {"east": ["PROJ"]}, "--namespace-owner", "PROJ=east",
                 *route("claim-peer", "east"), *route("multihub-watch", "east"),
                 *route("message-peer", "east"))
    route_up(west, "east")

    async def scenario():
        amy = await agent(url["west"], "PROJ/amy")
        bob = await agent(url["east"], "PROJ/bob")
        granted = await claim(amy, "PROJ/amy", "t-1", ["src"])
        assert granted["type"] == "claim_granted" and granted["owner_hub_id"] == "east"
        await amy.send_json({"sender": "PROJ/amy", "type": "chat", "target": "PROJ/bob@east",
                             "payload": "over the one link", "receipt_requested": True})
        chat = await bob.recv(lambda f: f.get("type") == "chat"
                              and f.get("payload") == "over the one link", timeout=15)
        assert chat["sender"] == "PROJ/amy@west"
        receipt = await amy.recv(lambda f: f.get("type") == "delivery_receipt"
                                 and f.get("forward_state") == "accepted", timeout=15)
        assert receipt["delivered"] is True
        wait_for(lambda: west.get_json("/health")["multihub"]["watches"]["east"]["last_success"])
        # east registered exactly one peer hub link from west (it used to be three)
        assert east.log().count("peer link registered") == 1
        assert west.log().count("peer link up") == 1
        health = west.get_json("/health")
        assert health["message_forward"]["east"]["connects"] == 1
        assert health["multihub"]["claim_routes"]["east"]["connects"] == 1
        await amy.close()
        await bob.close()

    asyncio.run(scenario())



def test_a_forwarded_claim_refused_by_the_owner_carries_its_stable_reason_code(tmp_path,
                                                                              sites):
    """The claimant on west hears an owner's refusal as a claimant on the
    owner does: the same reason_code, conflict task and holder, and text
    (d590ccf relayed the text only, as the reference does)."""
    start, route, url = sites
    start("east", {"west": ["PROJ"]}, "--namespace-owner", "PROJ=east",
          "--max-claims-per-agent", "2")
    west = start("west", {"east": ["PROJ"]}, "--namespace-owner", "PROJ=east",
                 *route("claim-peer", "east"))
    route_up(west, "east")
    same = ("reason_code", "conflict_task_id", "holder", "payload", "task_id")

    async def scenario():
        bob = await agent(url["east"], "PROJ/bob")
        carl = await agent(url["east"], "PROJ/carl")
        amy = await agent(url["west"], "PROJ/amy")
        assert (await claim(bob, "PROJ/bob", "t-1", ["src/core"]))["type"] == "claim_granted"
        for task, paths, code in (("t-1", ["elsewhere"], "LEASE_LIVE"),
                                  ("t-2", ["src/core/x.py"], "SCOPE_CONFLICT")):
            local = await claim(carl, "PROJ/carl", task, paths)
            forwarded = await claim(amy, "PROJ/amy", task, paths)
            assert (local["type"], local["reason_code"]) == ("claim_denied", code)
            assert {k: forwarded.get(k) for k in same} == {k: local.get(k) for k in same}
            assert (forwarded["conflict_task_id"], forwarded["holder"]) == ("t-1", "PROJ/bob")
            assert (forwarded["hub_id"], forwarded["owner_hub_id"]) == ("west", "east")
        # a refusal without a conflict: amy's own quota, counted on the owner
        for task in ("q-1", "q-2"):
            assert (await claim(amy, "PROJ/amy", task, [task]))["type"] == "claim_granted"
        over = await claim(amy, "PROJ/amy", "q-3", ["q-3"])
        assert (over["type"], over["reason_code"]) == ("claim_denied", "QUOTA_EXCEEDED")
        assert "conflict_task_id" not in over and "holds the maximum 2 claims" in over["payload"]
        for p in (amy, bob, carl):
            await p.close()

    asyncio.run(scenario())
    # the owner journaled its denials' evidence with the same codes
    assert [r["reason_code"] for r in rows(tmp_path / "east", "claim_denial")] == \
        ["LEASE_LIVE", "LEASE_LIVE", "SCOPE_CONFLICT", "SCOPE_CONFLICT", "QUOTA_EXCEEDED"]

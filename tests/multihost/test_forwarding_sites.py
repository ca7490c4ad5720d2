"""Three hubs in three network namespaces joined by veth links: chats flow
east->west and north->west while the east-west link is cut and restored.
Every chat arrives once, and east's Prometheus backlog rises and falls."""

import json
import time

from tests.support.federation import make_pki, site_flags, write_serving_policy
from tests.support.netns import Topology, require_netns
from tests.support.sitecmd import REPO, driver, env, python

PORT = 8876
PER_SENDER = 150


def metric(topo, site, name, peer):
    out = topo.run(site, driver("get", "--url", f"http://127.0.0.1:{PORT}/metrics"),
                   timeout=10).stdout
    for line in out.splitlines():
        if line.startswith(f'{name}{{peer="{peer}"}}'):
            return float(line.rsplit(" ", 1)[1])
    return None


def wait_ready(topo, site, scheme="http", timeout=30):
    deadline = time.monotonic() + timeout
    while True:
        result = topo.run(site, driver("get", "--url", f"{scheme}://127.0.0.1:{PORT}/readyz"),
                          check=False, timeout=10)
        if result.returncode == 0:
            return
        assert time.monotonic() < deadline, f"{site} not ready: {result.stderr[-500:]}"
        time.sleep(0.2)


def lines(proc, timeout):
    out, _ = proc.communicate(timeout=timeout)
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def test_cut_and_restore_east_west_link(tmp_path):
    require_netns()
    pki = make_pki(tmp_path / "pki", ["east", "west", "north"])
    policy = write_serving_policy(tmp_path / "west-policy", pki,
                                  {"east": ["PROJ"], "north": ["PROJ"]})
    with Topology() as topo:
        topo.link("east", "west", "203.0.113.0/30")
        topo.link("north", "west", "203.0.113.4/30")
        # these hubs have no use for a broker door
        common = ["--host", "0.0.0.0", "--port", str(PORT), "--no-durable-ingress-quota",
                  "--no-broker"]
        hubs = {}
        west = site_flags(pki, "west", policy)
        hubs["west"] = topo.popen("west", python(
            "-m", "hubd", *common, "--db", str(tmp_path / "west.db"), "--hub-id", "west",
            *west.serve), cwd=REPO, env=env(), stdout=open(tmp_path / "west.log", "w"),
            stderr=open(tmp_path / "west.err", "w"))
        for origin, link in (("east", "east-west"), ("north", "north-west")):
            flags = site_flags(pki, origin, None).connect + [
                "--message-peer", f"west=wss://{topo.addr('west', link)}:{PORT}/",
                "--message-peer-pin", f"west={pki.server_pin('west')}"]
            hubs[origin] = topo.popen(origin, python(
                "-m", "hubd", *common, "--db", str(tmp_path / f"{origin}.db"), "--hub-id",
                origin, *flags), cwd=REPO, env=env(), stdout=open(tmp_path / f"{origin}.log", "w"),
                stderr=open(tmp_path / f"{origin}.err", "w"))
        wait_ready(topo, "west", "https")
        wait_ready(topo, "east")
        wait_ready(topo, "north")

        import subprocess
        receiver = topo.popen("west", driver(
            "receive", "--url", f"wss://127.0.0.1:{PORT}/", "--name", "PROJ/bob",
            "--expect", str(2 * PER_SENDER), "--timeout", "120", "--linger", "2"),
            cwd=REPO, env=env(), stdout=subprocess.PIPE, text=True)
        assert json.loads(receiver.stdout.readline())["event"] == "ready"
        senders = {origin: topo.popen(origin, driver(
            "send", "--url", f"ws://127.0.0.1:{PORT}/", "--name", f"PROJ/{origin}-agent",
            "--target", "PROJ/bob@west", "--count", str(PER_SENDER), "--prefix", f"{origin}-",
            "--rate", "40", "--timeout", "120"), cwd=REPO, env=env(), stdout=subprocess.PIPE,
            text=True) for origin in ("east", "north")}

        time.sleep(1.0)
        topo.cut("east", "east-west")
        peak = 0.0
        for _ in range(12):
            time.sleep(0.25)
            peak = max(peak, metric(topo, "east", "synapse_message_forward_pending", "west") or 0)
        assert peak > 0, "east's backlog did not rise while its link to west was cut"
        topo.restore("east", "east-west")

        sent = {origin: lines(proc, 150) for origin, proc in senders.items()}
        received = lines(receiver, 150)
        done = received[-1]
        assert done["event"] == "done"
        assert done["unique"] == 2 * PER_SENDER, done
        assert done["duplicates"] == 0, done
        chats = [r for r in received if r["event"] == "chat"]
        assert {c["client_msg_id"] for c in chats} == {
            f"{o}-{i}" for o in ("east", "north") for i in range(PER_SENDER)}
        for origin, out in sent.items():
            receipts = [r for r in out if r["event"] == "receipts"][0]
            # a forward resent after the cut is answered `duplicate`: west had it
            states = receipts["states"]
            assert states.get("accepted", 0) + states.get("duplicate", 0) == PER_SENDER, \
                (origin, receipts)
        deadline = time.monotonic() + 20
        while metric(topo, "east", "synapse_message_forward_pending", "west") != 0:
            assert time.monotonic() < deadline, "east's backlog did not drain"
            time.sleep(0.2)
        assert metric(topo, "east", "hubd_peer_link_up", "west") == 1
    for hub in ("east", "west", "north"):
        log = (tmp_path / f"{hub}.err").read_text()
        assert "handler failed" not in log and "Traceback" not in log, log[-3000:]

"""A broker session on east asks a seat on west (two hubs in network
namespaces, forwarding both ways over mTLS) and gets the answer in its thread."""

import json
import subprocess
import time

from tests.support.federation import make_pki, site_flags, write_serving_policy
from tests.support.netns import Topology, require_netns
from tests.support.procs import connect_broker
from tests.support.sitecmd import REPO, env, python

PORT = 8876


def wait_ready(topo, site, timeout=30):
    deadline = time.monotonic() + timeout
    while True:
        result = topo.run(site, python("-m", "tests.support.chat_driver", "get", "--url",
                                       f"https://127.0.0.1:{PORT}/readyz"),
                          check=False, timeout=10)
        if result.returncode == 0:
            return
        assert time.monotonic() < deadline, f"{site} not ready: {result.stderr[-500:]}"
        time.sleep(0.2)


async def test_broker_session_asks_a_seat_on_a_peer_hub(tmp_path):
    require_netns()
    pki = make_pki(tmp_path / "pki", ["east", "west"])
    # west serves east's forwards into PROJ; east serves west's answers into local
    west_policy = write_serving_policy(tmp_path / "west-policy", pki, {"east": ["PROJ"]})
    east_policy = write_serving_policy(tmp_path / "east-policy", pki, {"west": ["local"]})
    with Topology() as topo:
        topo.link("east", "west", "198.51.100.0/30")
        common = ["--host", "0.0.0.0", "--port", str(PORT), "--no-durable-ingress-quota"]
        procs = {}
        for site, other, policy in (("east", "west", east_policy), ("west", "east", west_policy)):
            flags = site_flags(pki, site, policy)
            (tmp_path / site).mkdir()
            procs[site] = topo.popen(site, python(
                "-m", "hubd", *common, "--db", str(tmp_path / site / "hub.db"), "--hub-id", site,
                *flags.serve, *flags.connect,
                "--message-peer", f"{other}=wss://{topo.addr(other, 'east-west')}:{PORT}/",
                "--message-peer-pin", f"{other}={pki.server_pin(other)}"),
                cwd=REPO, env=env(), stdout=open(tmp_path / f"{site}.log", "w"),
                stderr=subprocess.STDOUT)
        wait_ready(topo, "east")
        wait_ready(topo, "west")
        bob = topo.popen("west", python(
            "-m", "tests.support.chat_driver", "answer", "--url", f"wss://127.0.0.1:{PORT}/",
            "--name", "PROJ/bob", "--verdict", "disagree", "--text", "not before Friday"),
            cwd=REPO, env=env(), stdout=subprocess.PIPE, text=True)
        assert json.loads(bob.stdout.readline())["event"] == "ready"

        # the Unix socket is a file: reachable from this namespace
        asker = await connect_broker(tmp_path / "east" / "hub.db")
        await asker.call("session", event="session-start", client="claude",
                         cliSessionId="far-1", host={"hostPid": 77, "hostStart": 1},
                         handle="asker", listen=True)
        with_unknown = await asker.request("send", threadId=None, to="PROJ/bob@nowhere",
                                           body="x")
        assert with_unknown["error"]["code"] == "unknown_handle"
        sent = await asker.call("send", threadId=None, to="PROJ/bob@west",
                                body="Can we ship on Thursday?")
        assert sent["deliveries"] == [{"to": "PROJ/bob@west", "state": "sent"}]
        push = (await asker.event("push", timeout=60))["payload"]["message"]
        assert push["from"] == "PROJ/bob@west"
        assert push["threadId"] == sent["threadId"] and push["replyTo"] == sent["messageId"]
        assert push["verdict"] == "disagree" and push["body"] == "not before Friday"
        asked = [json.loads(line) for line in bob.communicate(timeout=30)[0].splitlines()]
        assert {"event": "asked", "sender": "local/asker@east",
                "message_id": sent["messageId"]} in asked
        waited = await asker.call("wait", threadId=sent["threadId"], until="all_replied",
                                  timeoutMs=1000)
        assert waited["conditionMet"] is True
        assert waited["matrix"][0]["handle"] == "PROJ/bob@west"
        await asker.close()
        for proc in procs.values():
            proc.terminate()
            proc.wait(10)
        for site in ("east", "west"):
            assert "handler failed" not in (tmp_path / f"{site}.log").read_text()

"""`hubd site setup` for two machines: each hub in a network namespace of its
own, reached at its own address, the setup given their URLs (their hosts go
into the server certificates). Each hub's folder is copied to "its machine"
as the setup says and started there with `hubd --config`, with no hand
edit; a chat crosses both ways, the agents verifying their hub's certificate
with SSL_CERT_FILE."""

from __future__ import annotations

import shutil
import subprocess

from tests.support.netns import Topology, require_netns
from tests.support.sites import chat_across, links_up
from tests.support.sitecmd import REPO, env, python
from tests.support.waiting import wait_for

PORT = 8876


def test_two_machines_start_from_the_setup_and_chat_both_ways(tmp_path):
    require_netns()
    with Topology() as topo:
        topo.link("east", "west", "203.0.113.8/30")
        address = {site: topo.addr(site, "east-west") for site in ("east", "west")}
        url = {site: f"wss://{address[site]}:{PORT}/" for site in address}
        operator = tmp_path / "operator"
        operator.mkdir()
        done = subprocess.run(python("-m", "hubd", "site", "setup", "--hub",
                                     f"east={url['east']}", "--hub", f"west={url['west']}"),
                              cwd=operator, capture_output=True, text=True, timeout=120, env=env())
        assert done.returncode == 0, done.stderr
        assert "copy its folder there first" in done.stdout, done.stdout
        hubs, logs = {}, {}
        for site in ("east", "west"):
            machine = tmp_path / f"{site}-machine"
            shutil.copytree(operator / "sites" / site, machine / site)  # modes kept, as scp -p
            logs[site] = open(tmp_path / f"{site}.log", "w")
            hubs[site] = topo.popen(site, python("-m", "hubd", "--config", f"{site}/hubd.toml"),
                                    cwd=machine, env=env(), stdout=logs[site],
                                    stderr=subprocess.STDOUT)

        def run_in(site):
            return lambda argv, **kw: topo.run(site, argv, check=False, cwd=REPO, **kw)

        wait_for(lambda: links_up(run_in("east"), url["east"], ["west"])
                 and links_up(run_in("west"), url["west"], ["east"]), 60, "both links up")
        ca = operator / "sites" / "public" / "ca.pem"
        # an agent on each hub's machine (an open hub admits local agents only;
        # others need a token or principals): the chat is forwarded, the reply too
        local = f"wss://127.0.0.1:{PORT}/"
        alice = (run_in("east"), local, "PROJ/alice")
        bob = (run_in("west"), local, "PROJ/bob")
        there = chat_across(ca, alice, bob, "PROJ/bob@west")
        assert there["sender"] == "PROJ/alice@east", there
        back = chat_across(ca, bob, alice, "PROJ/alice@east")
        assert back["sender"] == "PROJ/bob@west", back
        for site, proc in hubs.items():
            assert proc.poll() is None, f"{site} exited"
            assert topo.stop(proc) == 0
    for site, log in logs.items():
        log.close()
        text = (tmp_path / f"{site}.log").read_text()
        assert "Traceback" not in text and "non-loopback bind" in text, text[-3000:]

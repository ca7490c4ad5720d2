"""An open hub (no --token, no principals) admits agents from loopback only,
with real hubs and agents in network namespaces (docs/identity.md): an agent
on another host is refused (auth_denied, 4010) while one on the hub's own host
joins; --open-network admits both."""

import json
import time

from tests.support.netns import Topology
from tests.support.sitecmd import REPO, driver, env, python

PORT = 8876


def hello(topo, site, url, name):
    out = topo.run(site, driver("hello", "--url", url, "--name", name), timeout=30).stdout
    return [json.loads(line) for line in out.splitlines()]


def ready(topo, site, timeout=30.0):
    deadline = time.monotonic() + timeout
    while topo.run(site, driver("get", "--url", f"http://127.0.0.1:{PORT}/readyz"),
                   check=False, timeout=10).returncode != 0:
        assert time.monotonic() < deadline, "the hub did not get ready"
        time.sleep(0.1)


def test_an_open_hub_admits_loopback_agents_only_unless_opened(tmp_path):
    with Topology() as topo:
        topo.link("east", "west", "198.51.100.0/30")
        west_addr = topo.addr("west", "east-west")
        for opened in (False, True):
            flags = ["--open-network"] if opened else []
            hub = topo.popen("west", python(
                "-m", "hubd", "--db", str(tmp_path / f"west-{opened}.db"), "--hub-id", "west",
                "--host", "0.0.0.0", "--port", str(PORT), "--no-broker", *flags),
                cwd=REPO, env=env(), stdout=open(tmp_path / "west.log", "a"),
                stderr=open(tmp_path / "west.err", "a"))
            try:
                topo.wait_tcp("east", west_addr, PORT, proc=hub)
                ready(topo, "west")
                local = hello(topo, "west", f"ws://127.0.0.1:{PORT}/", "PROJ/local")
                assert local == [{"event": "joined"}], local
                remote = hello(topo, "east", f"ws://{west_addr}:{PORT}/", "PROJ/remote")
                if opened:
                    assert remote == [{"event": "joined"}], remote
                else:
                    assert remote[0]["event"] == "auth_denied" and \
                        "loopback" in remote[0]["payload"], remote
                    assert remote[-1] == {"event": "closed", "code": 4010}, remote
            finally:
                topo.stop(hub)
        assert "admitted from loopback only" in (tmp_path / "west.err").read_text() + \
            (tmp_path / "west.log").read_text()

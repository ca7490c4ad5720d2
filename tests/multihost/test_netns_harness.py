"""The network-namespace harness itself, on real namespaces, veths and bridges.

No mocks and no assertions on durations: waits are polling loops with
generous deadlines, and a "failed" connect may be a timeout, a refusal or an
unreachable error, whichever the kernel gives.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

from support import netns  # noqa: E402
from support.netns import Topology  # noqa: E402

PY = sys.executable  # the venv interpreter running pytest (has aiohttp)
ECHO_PORT = 7000

ECHO_SERVER = textwrap.dedent(r"""
    import socketserver, sys
    class H(socketserver.StreamRequestHandler):
        def handle(self):
            for line in self.rfile:
                self.wfile.write(line)
                self.wfile.flush()
    class S(socketserver.ThreadingTCPServer):
        allow_reuse_address = True
        daemon_threads = True
    S((sys.argv[1], int(sys.argv[2])), H).serve_forever()
""")

ECHO_CLIENT = textwrap.dedent(r"""
    import socket, sys
    with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10) as s:
        s.sendall(sys.argv[3].encode() + b"\n")
        f = s.makefile("rb")
        sys.stdout.write(f.readline().decode())
""")


def _netns_list() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def _gone(pid: int) -> bool:
    """True once pid no longer exists (or is only a zombie awaiting its reaper)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def _poll(pred, deadline: float = 60.0, interval: float = 0.05):
    end = time.monotonic() + deadline
    while True:
        value = pred()
        if value or time.monotonic() > end:
            return value
        time.sleep(interval)


def _echo(topo: Topology, site: str, host: str, text: str) -> str:
    res = topo.run(site, [PY, "-c", ECHO_CLIENT, host, str(ECHO_PORT), text], check=False, timeout=60)
    return res.stdout.strip() if res.returncode == 0 else f"<failed: {res.stderr.strip()[-200:]}>"


def _three_sites(topo: Topology) -> None:
    topo.network("lan", "192.0.2.0/24", ["a", "b", "c"])
    topo.network("wan", "198.51.100.0/24", ["b", "c"])


# ----------------------------------------------------------------- no root needed

def test_only_documentation_ranges_are_accepted():
    for bad in ("10.0.0.0/24", "192.168.1.0/24", "198.51.0.0/16", "2001:db8::/64"):
        with pytest.raises(ValueError):
            netns._doc_subnet(bad)
    with pytest.raises(ValueError):
        netns._doc_subnet("192.0.2.0/31")
    assert str(netns._doc_subnet("203.0.113.4/30")) == "203.0.113.4/30"
    with pytest.raises(ValueError):
        netns._check_name("site", "has space")


# ----------------------------------------------------------------- real namespaces

@pytest.fixture
def topo():
    netns.require_netns()
    with Topology() as t:
        yield t


@pytest.mark.netns
def test_sites_networks_addresses_and_teardown():
    netns.require_netns()
    with Topology() as topo:
        _three_sites(topo)
        names = set(topo.namespaces())
        assert names <= _netns_list()
        assert len(names) == 5  # three sites, two bridges
        assert all(n.startswith(f"hubd-{os.getpid()}-") for n in names)

        assert topo.addr("a", "lan") == "192.0.2.1"
        assert topo.addr("c", "wan") == "198.51.100.2"
        assert topo.addrs("b") == {"lan": "192.0.2.2", "wan": "198.51.100.1"}
        with pytest.raises(KeyError, match="not on network 'wan'"):
            topo.addr("a", "wan")

        # One connected route per network, nothing else (no default route).
        routes_a = topo.run("a", ["ip", "-4", "route"]).stdout.strip().splitlines()
        assert len(routes_a) == 1 and routes_a[0].startswith("192.0.2.0/24 ")
        routes_b = topo.run("b", ["ip", "-4", "route"]).stdout
        assert "192.0.2.0/24" in routes_b and "198.51.100.0/24" in routes_b
        assert "default" not in routes_b
        # /etc/hosts is the host's own: nothing is written per namespace.
        assert topo.run("a", ["cat", "/etc/hosts"]).stdout == Path("/etc/hosts").read_text()
        assert not any(Path("/etc/netns", n).exists() for n in names)

        # a is not on wan and nothing routes between networks.
        assert topo.probe_tcp("a", topo.addr("b", "wan"), ECHO_PORT) == "ENETUNREACH"
    assert not (names & _netns_list())


@pytest.mark.netns
def test_echo_over_shared_network_cut_and_restore(topo):
    _three_sites(topo)
    a_lan = topo.addr("a", "lan")
    server = topo.popen("a", [PY, "-c", ECHO_SERVER, "0.0.0.0", ECHO_PORT])
    topo.wait_tcp("b", a_lan, ECHO_PORT, proc=server)

    assert _echo(topo, "b", a_lan, "hello from b") == "hello from b"
    assert _echo(topo, "c", a_lan, "hello from c") == "hello from c"

    topo.cut("a", "lan")
    assert not topo.is_up("a", "lan")
    # From b: silence (timeout) or EHOSTUNREACH once ARP gives up.
    assert topo.probe_tcp("b", a_lan, ECHO_PORT, timeout=2) is not None
    assert topo.probe_tcp("c", a_lan, ECHO_PORT, timeout=2) is not None
    # a itself lost its route to the LAN.
    assert topo.probe_tcp("a", topo.addr("b", "lan"), ECHO_PORT) == "ENETUNREACH"
    # Only a was cut: b and c still reach each other on the LAN.
    assert topo.probe_tcp("b", topo.addr("c", "lan"), ECHO_PORT) == "ECONNREFUSED"

    topo.restore("a", "lan")
    assert topo.is_up("a", "lan")
    topo.wait_tcp("b", a_lan, ECHO_PORT, timeout=60)
    assert _echo(topo, "b", a_lan, "back again") == "back again"
    assert _echo(topo, "c", a_lan, "c too") == "c too"


@pytest.mark.netns
def test_second_network_carries_traffic_independently(topo):
    _three_sites(topo)
    c_wan = topo.addr("c", "wan")
    server = topo.popen("c", [PY, "-c", ECHO_SERVER, c_wan, ECHO_PORT])
    topo.wait_tcp("b", c_wan, ECHO_PORT, proc=server)
    assert _echo(topo, "b", c_wan, "over wan") == "over wan"

    # Cutting c off the LAN leaves the WAN path up.
    topo.cut("c", "lan")
    assert _echo(topo, "b", c_wan, "still over wan") == "still over wan"
    topo.cut("b", "wan")
    assert topo.probe_tcp("b", c_wan, ECHO_PORT) == "ENETUNREACH"
    topo.restore("b", "wan")
    topo.wait_tcp("b", c_wan, ECHO_PORT, timeout=60)


@pytest.mark.netns
def test_established_connection_survives_a_cut(topo):
    """A cut is silence, not a reset: queued data is delivered after restore."""
    _three_sites(topo)
    a_lan = topo.addr("a", "lan")
    server = topo.popen("a", [PY, "-c", ECHO_SERVER, a_lan, ECHO_PORT])
    topo.wait_tcp("b", a_lan, ECHO_PORT, proc=server)

    with topo.socket("b") as s:
        s.settimeout(30)
        s.connect((a_lan, ECHO_PORT))
        s.sendall(b"before\n")
        assert s.recv(100) == b"before\n"

        topo.cut("a", "lan")
        s.sendall(b"during\n")  # buffered locally, retransmitted later
        s.settimeout(1.0)
        with pytest.raises(TimeoutError):
            s.recv(100)
        topo.restore("a", "lan")

        s.settimeout(120)  # retransmission backoff decides when it arrives
        assert s.recv(100) == b"during\n"


@pytest.mark.netns
def test_point_to_point_link(topo):
    name = topo.link("x", "y", "203.0.113.8/30")
    assert name == "x-y"
    assert (topo.addr("x", name), topo.addr("y", name)) == ("203.0.113.9", "203.0.113.10")
    assert topo.subnet(name) == "203.0.113.8/30"
    y = topo.addr("y", name)
    server = topo.popen("y", [PY, "-c", ECHO_SERVER, y, ECHO_PORT])
    topo.wait_tcp("x", y, ECHO_PORT, proc=server)
    assert _echo(topo, "x", y, "p2p") == "p2p"

    topo.cut("y", name)  # downs both ends of the pair
    assert not topo.is_up("x", name)
    assert topo.probe_tcp("x", y, ECHO_PORT) == "ENETUNREACH"
    topo.restore("y", name)
    topo.wait_tcp("x", y, ECHO_PORT, timeout=60)
    assert _echo(topo, "x", y, "p2p again") == "p2p again"


@pytest.mark.netns
def test_block_and_unblock_with_nftables(topo):
    netns.require_nft()
    _three_sites(topo)
    a_lan, b_lan = topo.addr("a", "lan"), topo.addr("b", "lan")
    srv_a = topo.popen("a", [PY, "-c", ECHO_SERVER, "0.0.0.0", ECHO_PORT])
    srv_b = topo.popen("b", [PY, "-c", ECHO_SERVER, "0.0.0.0", ECHO_PORT])
    topo.wait_tcp("c", a_lan, ECHO_PORT, proc=srv_a)
    topo.wait_tcp("c", b_lan, ECHO_PORT, proc=srv_b)

    topo.block("a", "b")
    assert topo.is_up("a", "lan") and topo.is_up("b", "lan")  # links stay up
    assert topo.probe_tcp("b", a_lan, ECHO_PORT, timeout=2) is not None
    assert topo.probe_tcp("a", b_lan, ECHO_PORT, timeout=2) is not None
    # b's WAN address is blocked too: the rule is per site, not per network.
    assert topo.probe_tcp("a", topo.addr("b", "wan"), ECHO_PORT, timeout=2) is not None
    # Third parties are unaffected.
    assert _echo(topo, "c", a_lan, "c to a") == "c to a"
    assert _echo(topo, "c", b_lan, "c to b") == "c to b"

    topo.unblock("a", "b")
    topo.wait_tcp("b", a_lan, ECHO_PORT, timeout=60)
    assert _echo(topo, "b", a_lan, "unblocked") == "unblocked"
    assert _echo(topo, "a", b_lan, "both ways") == "both ways"
    topo.unblock("a", "b")  # no-op when not blocked


@pytest.mark.netns
def test_popen_processes_are_killed_at_exit():
    netns.require_netns()
    with Topology(term_timeout=2.0) as topo:
        topo.add_site("a")
        sleeper = topo.popen("a", ["sleep", "3600"])
        stubborn = topo.popen("a", [PY, "-c",
                                    "import signal, sys, time\n"
                                    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                                    "print('ready', flush=True)\n"
                                    "time.sleep(3600)\n"], stdout=subprocess.PIPE, text=True)
        shell = topo.popen("a", ["sh", "-c", "sleep 3600 & echo $!; wait"],
                           stdout=subprocess.PIPE, text=True)
        grandchild = int(shell.stdout.readline())
        assert stubborn.stdout.readline().strip() == "ready"
        # A process not started by popen() but living in the namespace.
        daemon = topo.run("a", ["sh", "-c", "setsid sleep 3600 >/dev/null 2>&1 < /dev/null & echo $!"])
        orphan = int(daemon.stdout)
        assert sleeper.poll() is None and stubborn.poll() is None
        assert not _gone(grandchild) and not _gone(orphan)
        names = topo.namespaces()
        # The PID is the program's own: ip netns exec replaced itself.
        assert sleeper.pid in netns._netns_pids(topo.ns("a"))

    assert sleeper.returncode == -signal.SIGTERM
    assert stubborn.returncode == -signal.SIGKILL
    assert shell.returncode is not None
    assert _poll(lambda: _gone(grandchild)), "grandchild of a popen() process survived"
    assert _poll(lambda: _gone(orphan)), "process left inside the namespace survived"
    assert not (set(names) & _netns_list())
    for p in (stubborn, shell):
        p.stdout.close()


@pytest.mark.netns
def test_teardown_on_exception_and_at_interpreter_exit():
    netns.require_netns()
    with pytest.raises(RuntimeError, match="boom"):
        with Topology(["a", "b"]) as topo:
            names = set(topo.namespaces())
            proc = topo.popen("a", ["sleep", "3600"])
            raise RuntimeError("boom")
    assert proc.returncode is not None
    assert not (names & _netns_list())

    # A topology that is never closed is torn down by the atexit hook.
    script = textwrap.dedent(f"""
        import json, sys
        sys.path.insert(0, {str(TESTS)!r})
        from support.netns import Topology
        t = Topology()
        t.network("lan", "192.0.2.0/24", ["a", "b"])
        p = t.popen("a", ["sleep", "3600"])
        print(json.dumps({{"names": t.namespaces(), "pid": p.pid}}), flush=True)
    """)
    res = subprocess.run([PY, "-c", script], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    info = json.loads(res.stdout)
    assert len(info["names"]) == 3
    assert not (set(info["names"]) & _netns_list())
    assert _poll(lambda: _gone(info["pid"]))


@pytest.mark.netns
def test_bind_loopback_and_site_address(topo):
    _three_sites(topo)
    prog = textwrap.dedent(r"""
        import errno, json, socket, sys
        out = {}
        for host in ("127.0.0.1", sys.argv[1]):
            srv = socket.create_server((host, 7100))
            with socket.create_connection((host, 7100), timeout=5) as c:
                conn, peer = srv.accept()
                c.sendall(b"ping")
                out[host] = conn.recv(4).decode()
                conn.close()
            srv.close()
        try:
            socket.create_server((sys.argv[2], 7100)).close()
            out["foreign"] = "bound"
        except OSError as exc:
            out["foreign"] = errno.errorcode[exc.errno]
        lo = socket.create_server(("127.0.0.1", 7200))  # for the isolation check
        print(json.dumps(out), flush=True)
        sys.stdin.read()
    """)
    a_lan = topo.addr("a", "lan")
    p = topo.popen("a", [PY, "-c", prog, a_lan, topo.addr("b", "lan")],
                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    result = json.loads(p.stdout.readline())
    assert result == {"127.0.0.1": "ping", a_lan: "ping", "foreign": "EADDRNOTAVAIL"}
    # Each site has its own loopback: a's 127.0.0.1:7200 is not b's.
    assert topo.probe_tcp("a", "127.0.0.1", 7200) is None
    assert topo.probe_tcp("b", "127.0.0.1", 7200) == "ECONNREFUSED"
    p.stdin.close()
    assert p.wait(30) == 0
    p.stdout.close()


AIOHTTP_SERVER = textwrap.dedent(r"""
    import sys
    from aiohttp import web
    async def hello(request):
        return web.json_response({"remote": request.remote, "served_by": sys.argv[3]})
    app = web.Application()
    app.router.add_get("/hello", hello)
    web.run_app(app, host=sys.argv[1], port=int(sys.argv[2]), print=None)
""")

AIOHTTP_CLIENT = textwrap.dedent(r"""
    import asyncio, json, sys
    import aiohttp
    async def main():
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as s:
            async with s.get(sys.argv[1]) as r:
                r.raise_for_status()
                print(json.dumps(await r.json()))
    asyncio.run(main())
""")


@pytest.mark.netns
def test_aiohttp_server_reachable_from_another_namespace(topo):
    _three_sites(topo)
    c_wan = topo.addr("c", "wan")
    server = topo.popen("c", [PY, "-c", AIOHTTP_SERVER, c_wan, 8080, "c"])
    topo.wait_tcp("b", c_wan, 8080, proc=server)

    res = topo.run("b", [PY, "-c", AIOHTTP_CLIENT, f"http://{c_wan}:8080/hello"])
    assert json.loads(res.stdout) == {"remote": topo.addr("b", "wan"), "served_by": "c"}

    # Also from the test process itself, through a socket living in site a.
    c_lan = topo.addr("c", "lan")
    server_lan = topo.popen("c", [PY, "-c", AIOHTTP_SERVER, c_lan, 8080, "c-lan"])
    topo.wait_tcp("a", c_lan, 8080, proc=server_lan)

    async def fetch() -> dict:
        sock = topo.socket("a")
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, (c_lan, 8080))
        reader, writer = await asyncio.open_connection(sock=sock)
        writer.write(f"GET /hello HTTP/1.1\r\nHost: {c_lan}\r\nConnection: close\r\n\r\n".encode())
        raw = await asyncio.wait_for(reader.read(), 30)
        writer.close()
        return json.loads(raw.split(b"\r\n\r\n", 1)[1])

    assert asyncio.run(fetch()) == {"remote": topo.addr("a", "lan"), "served_by": "c-lan"}
    assert topo.stop(server) is not None

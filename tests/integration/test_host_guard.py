"""The DNS-rebinding guard over real HTTP: which Host headers a loopback hub
answers, with and without --advertised-host (the non-loopback binds are in
tests/multihost/test_advertised_host.py, in network namespaces)."""

import asyncio
import json

import aiohttp

from hubd.http.host_trust import parse_advertised
from tests.support.inproc import running_hub
from tests.support.procs import hubd_process
from tests.support.redsyn_client import login
from tests.support.wsprobe import WsProbe


async def raw_status(port: int, host_lines: list[str], path: str = "/health",
                     upgrade: bool = False, headers: tuple[str, ...] = ()) -> int:
    """The HTTP status for a request carrying exactly these Host header lines."""
    return (await raw_answer(port, host_lines, path, upgrade, headers))[0]


async def raw_answer(port: int, host_lines: list[str], path: str = "/health",
                     upgrade: bool = False, headers: tuple[str, ...] = ()) -> tuple[int, bytes]:
    """The status and body of a request carrying exactly these Host lines."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = [f"GET {path} HTTP/1.1"] + [f"Host: {h}" for h in host_lines] + list(headers)
    if upgrade:
        head += ["Upgrade: websocket", "Connection: Upgrade",
                 "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==", "Sec-WebSocket-Version: 13"]
    else:
        head.append("Connection: close")
    writer.write(("\r\n".join(head) + "\r\n\r\n").encode())
    await writer.drain()
    status = await reader.readline()
    body = b""
    if not upgrade:
        body = (await reader.read()).partition(b"\r\n\r\n")[2]
    writer.close()
    return int(status.split()[1]), body


async def test_loopback_bind_answers_loopback_names_only(tmp_path):
    async with running_hub(tmp_path) as server:
        port = server.port
        for host in (f"127.0.0.1:{port}", "localhost", f"[::1]:{port}"):
            assert await raw_status(port, [host]) == 200, host
            assert await raw_status(port, [host], "/", upgrade=True) == 101, host
        for hosts in ([f"west.example:{port}"], ["evil.example"]):
            assert await raw_status(port, hosts) == 403, hosts
            assert await raw_status(port, hosts, "/", upgrade=True) == 403, hosts
        # No Host, or two, never reaches the guard: aiohttp refuses the request.
        assert await raw_status(port, []) == 400
        assert await raw_status(port, [f"127.0.0.1:{port}", f"127.0.0.1:{port}"]) == 400


async def test_loopback_bind_with_advertised_host(tmp_path):
    advertised = frozenset({parse_advertised("west.example:8443"),
                            parse_advertised("203.0.113.2")})
    async with running_hub(tmp_path, advertised_hosts=advertised) as server:
        port = server.port
        for host in ("west.example:8443", "WEST.example:8443", "203.0.113.2",
                     f"127.0.0.1:{port}", "localhost"):
            assert await raw_status(port, [host]) == 200, host
            assert await raw_status(port, [host], "/readyz") == 200, host
            assert await raw_status(port, [host], "/", upgrade=True) == 101, host
        for host in ("west.example", "west.example:8444", f"203.0.113.2:{port}",
                     "evil.example"):
            assert await raw_status(port, [host]) == 403, host
            assert await raw_status(port, [host], "/metrics") == 403, host
            assert await raw_status(port, [host], "/", upgrade=True) == 403, host
        # A real WebSocket session under the advertised name works end to end.
        async with WsProbe.connect(server.url, headers={"Host": "west.example:8443"}) as probe:
            await probe.recv_type("welcome")
            await probe.register("p/alice")
            await probe.recv_type("presence_update", agent="p/alice")
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{port}/health",
                                headers={"Host": "evil.example"}) as resp:
                assert resp.status == 403
                assert "--advertised-host" in await resp.text()


async def test_the_redsyn_door_is_guarded_as_every_path(tmp_path):
    """/redsyn/v1 answers a request naming another Host, or from a page of
    another Origin, 403 like /health and the WebSocket upgrade, a valid token
    notwithstanding (issue 30 item 6): a page in a browser on the operator's
    machine cannot reach a loopback hub's REDSYN door by DNS rebinding."""
    db = tmp_path / "hubd.db"
    token = login(db, "acme/dev/joel", "laptop")
    proc = hubd_process(tmp_path, db=db).start()
    try:
        port = proc.port
        inbox = "/redsyn/v1/inbox/acme/dev/joel/x"
        bearer = (f"Authorization: Bearer {token}",)
        local = f"127.0.0.1:{port}"
        assert await raw_status(port, [local], inbox, headers=bearer) == 200
        for hosts, extra in (([f"evil.example:{port}"], ()), (["evil.example"], ()),
                             ([local], ("Origin: http://evil.example",)),
                             ([local], (f"Origin: http://{local}",))):
            status, body = await raw_answer(port, hosts, inbox, headers=bearer + extra)
            assert status == 403, (hosts, extra)
            assert json.loads(body)["status"] == 403, body  # the door's own error form
            assert await raw_status(port, hosts, "/health", headers=extra) == 403
            assert await raw_status(port, hosts, "/", upgrade=True, headers=extra) == 403
            for method_path in ("/redsyn/v1/messages", "/redsyn/v1/agents/acme/dev/joel/x"):
                assert await raw_status(port, hosts, method_path, headers=bearer + extra) == 403
    finally:
        proc.stop()

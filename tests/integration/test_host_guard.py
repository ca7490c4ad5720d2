"""The DNS-rebinding guard over real HTTP: which Host headers a loopback hub
answers, with and without --advertised-host (the non-loopback binds are in
tests/multihost/test_advertised_host.py, in network namespaces)."""

import asyncio

import aiohttp

from hubd.http.host_trust import parse_advertised
from tests.support.inproc import running_hub
from tests.support.wsprobe import WsProbe


async def raw_status(port: int, host_lines: list[str], path: str = "/health",
                     upgrade: bool = False) -> int:
    """The HTTP status for a request carrying exactly these Host header lines."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = [f"GET {path} HTTP/1.1"] + [f"Host: {h}" for h in host_lines]
    if upgrade:
        head += ["Upgrade: websocket", "Connection: Upgrade",
                 "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==", "Sec-WebSocket-Version: 13"]
    else:
        head.append("Connection: close")
    writer.write(("\r\n".join(head) + "\r\n\r\n").encode())
    await writer.drain()
    status = await reader.readline()
    writer.close()
    return int(status.split()[1])


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

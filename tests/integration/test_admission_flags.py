"""Admission flags on a real hubd process: --max-clients,
--max-connections-per-host, --allow-origin, --token-file."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import urllib.error

import aiohttp
import pytest

from tests.support.procs import free_port, hubd_process
from tests.support.wsprobe import WsProbe

CLOSE_CAPACITY = 4013
CLOSE_PER_HOST = 4015
CLOSE_AUTH = 4010


async def welcomed(url, **kw) -> WsProbe:
    probe = await WsProbe.open(url, **kw)
    await probe.recv_type("welcome")
    return probe


async def refused(url, code, text, **kw):
    probe = await WsProbe.open(url, **kw)
    error = await probe.recv_type("error")
    assert error["payload"] == text
    closed = await probe.wait_closed()
    assert closed.code == code, closed
    assert not probe.seen("welcome")
    await probe.close()


async def still_talks(probe: WsProbe, name: str) -> None:
    await probe.register(name)
    await probe.recv_type("presence_update", agent=name)
    await probe.send_json({"sender": name, "type": "who_request", "target": "System"})
    assert name in (await probe.recv_type("who_snapshot"))["online_agents"]


def test_max_clients_refuses_the_one_over_and_frees_the_slot(tmp_path):
    hub = hubd_process(tmp_path, "--max-clients", "2").start()
    try:
        async def scenario():
            a = await welcomed(hub.url)
            b = await welcomed(hub.url)
            await refused(hub.url, CLOSE_CAPACITY, "Hub at capacity.")
            await still_talks(a, "p/a")
            await b.close()
            # once the hub has seen b go, its slot is free again
            for _ in range(100):
                if (await asyncio.to_thread(hub.get_json, "/health"))["connections"] == 1:
                    break
                await asyncio.sleep(0.05)
            probe = await welcomed(hub.url)
            await still_talks(probe, "p/c")
            for p in (a, probe):
                await p.close()
        asyncio.run(scenario())
        assert hub.get_json("/health")["connections"] == 0
    finally:
        hub.stop()


def test_max_connections_per_host_counts_each_source_address(tmp_path):
    hub = hubd_process(tmp_path, "--max-connections-per-host", "1").start()
    try:
        async def scenario():
            first = await welcomed(hub.url)
            await refused(hub.url, CLOSE_PER_HOST, "Too many connections from this host.")
            other = await welcomed(hub.url, local_addr=("127.0.0.2", 0))  # another host
            await still_talks(first, "p/a")
            await still_talks(other, "p/b")
            await first.close()
            await other.close()
        asyncio.run(scenario())
    finally:
        hub.stop()


@pytest.mark.parametrize("value", ["-1", "x"])
def test_max_connections_per_host_must_be_a_count(tmp_path, value):
    result = subprocess.run([sys.executable, "-m", "hubd", "--port", str(free_port()), "--db",
                             str(tmp_path / "h.db"), "--max-connections-per-host", value],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "--max-connections-per-host" in result.stderr


def test_allow_origin_admits_exactly_the_listed_origins(tmp_path):
    hub = hubd_process(tmp_path, "--allow-origin", "https://ok.example",
                       "--allow-origin", "http://localhost:3000").start()
    try:
        async def scenario():
            for origin in ("https://ok.example", "http://localhost:3000", None):
                probe = await welcomed(hub.url, headers={"Origin": origin} if origin else None)
                await still_talks(probe, f"p/{abs(hash(origin)) % 1000}")
                await probe.close()
            for origin in ("https://evil.example", "https://ok.example.evil", "null",
                           "https://OK.example"):
                with pytest.raises(aiohttp.WSServerHandshakeError) as refused_:
                    await WsProbe.open(hub.url, headers={"Origin": origin})
                assert refused_.value.status == 403, origin
        asyncio.run(scenario())
        with pytest.raises(urllib.error.HTTPError) as probe_refused:
            hub.get_json("/health", headers={"Origin": "https://evil.example"})
        assert probe_refused.value.code == 403
        assert hub.get_json("/health", headers={"Origin": "https://ok.example"})["status"] == "ok"
    finally:
        hub.stop()


def test_token_file_secures_the_hub(tmp_path):
    secret = tmp_path / "token"
    secret.write_text("s3cret-from-file\n")  # the trailing newline is not part of it
    os.chmod(secret, 0o600)
    hub = hubd_process(tmp_path, "--token-file", str(secret)).start()
    try:
        async def scenario():
            ok = await WsProbe.open(hub.url)
            await ok.register("p/member", token="s3cret-from-file")
            assert (await ok.recv(timeout=5))["type"] == "welcome"
            await ok.recv_type("presence_update", agent="p/member")
            await ok.close()
            for token in ("s3cret-from-file\n", "wrong", None):
                bad = await WsProbe.open(hub.url)
                await bad.register("p/intruder", **({"token": token} if token else {}))
                assert (await bad.recv(timeout=5))["type"] == "auth_denied"
                assert (await bad.wait_closed()).code == CLOSE_AUTH
                await bad.close()
        asyncio.run(scenario())
    finally:
        hub.stop()


@pytest.mark.parametrize("problem", ["missing", "empty"])
def test_token_file_that_cannot_be_used_stops_the_hub(tmp_path, problem):
    path = tmp_path / "token"
    if problem == "empty":
        path.write_text("\n")
    result = subprocess.run([sys.executable, "-m", "hubd", "--port", str(free_port()), "--db",
                             str(tmp_path / "h.db"), "--token-file", str(path)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert str(path) in result.stderr
    assert ("is empty" if problem == "empty" else "cannot read token file") in result.stderr
    assert not (tmp_path / "h.db").exists()

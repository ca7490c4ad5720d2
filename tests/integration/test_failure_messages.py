"""Failures that explain themselves (issue 28 item 3), each with real hub
processes: a wrong pin names the pins presented and how to learn them, in the
log and on /health; /health says degraded, with reasons, while a peer link is
down and ok once it is up; auth denials are logged (rate-limited) with who,
which seat and why, from every door; a chat to a hub with no route is logged
and counted; a bad flag is told first, in one line; the startup log says what
a client must bring; a banner at start and a summary at stop.

Elsewhere: a stalled link (test_forward_stalled.py), a partitioned namespace
and a watch down (test_authority.py), unknown journal rows
(test_journal_files.py, which also shows a journal that cannot be opened
explained) each assert their /health reasons."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request

from hubd.journal import principals as store
from hubd.logs import MAX_LINES, WINDOW_SECONDS
from tests.support.broker_client import BrokerClient, BrokerError
from tests.support.federation import make_pki, site_flags, write_serving_policy
from tests.support.procs import broker_files, free_port, hubd_process
from tests.support.seats import connect, refused
from tests.support.waiting import wait_for
from tests.support.wsprobe import WsProbe, joined


def log_lines(hub, event: str) -> list[str]:
    return [line for line in hub.log().splitlines() if f"] {event} " in line]


def test_a_wrong_pin_names_the_pins_presented_in_the_log_and_on_health(tmp_path):
    pki = make_pki(tmp_path / "pki", ["east", "west", "north"])
    policy = write_serving_policy(tmp_path / "west-policy", pki, {"east": ["PROJ"]})
    west = hubd_process(tmp_path / "west", *site_flags(pki, "west", policy).serve,
                        hub_id="west", scheme="wss").start()
    west_url = f"wss://127.0.0.1:{west.port}/"
    # east pins north's certificate for west: a copy-paste mistake
    east = hubd_process(tmp_path / "east", *site_flags(pki, "east", None).connect,
                        "--message-peer", f"west={west_url}",
                        "--message-peer-pin", f"west={pki.server_pin('north')}",
                        hub_id="east").start()
    try:
        health = wait_for(lambda: (h := east.get_json("/health"))["message_forward"]["west"]
                          ["last_error"] and h, timeout=20)
        error = health["message_forward"]["west"]["last_error"]
        presented = pki.hubs["west"]["server"]["pins"]
        assert error["cause"] == "pin_mismatch"
        assert presented["sha256"] in error["detail"] and presented["spki_sha256"] in error["detail"]
        assert f"hubd certs fetch {west_url}" in error["detail"]
        assert health["status"] == "degraded"
        assert health["reasons"] == [
            f"message peer west: link down (pin_mismatch: {error['detail']}); "
            "0 forward(s) pending"], health["reasons"]
        said = [line for line in log_lines(east, "peer link failed") if "pin_mismatch" in line]
        assert said and presented["sha256"] in said[0]
        # the advice works: `hubd certs fetch` prints the pin west presented
        out = subprocess.run([sys.executable, "-m", "hubd", "certs", "fetch", west_url],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and presented["sha256"] in out.stdout, out.stdout + out.stderr
    finally:
        east.stop()
        west.stop()


def test_health_is_degraded_while_a_peer_link_is_down_and_ok_once_it_is_up(tmp_path):
    pki = make_pki(tmp_path / "pki", ["east", "west"])
    west_port = free_port()
    east = hubd_process(tmp_path / "east", *site_flags(pki, "east", None).connect,
                        "--message-peer", f"west=wss://127.0.0.1:{west_port}/",
                        "--message-peer-pin", f"west={pki.server_pin('west')}",
                        hub_id="east").start()
    policy = write_serving_policy(tmp_path / "west-policy", pki, {"east": ["PROJ"]})
    west = hubd_process(tmp_path / "west", *site_flags(pki, "west", policy).serve,
                        hub_id="west", scheme="wss", port=west_port)
    try:
        async def send():
            alice = await joined(east.url, "PROJ/alice")
            await alice.chat("PROJ/alice", "PROJ/bob@west", "waits for west",
                             receipt_requested=True)
            await alice.recv_type("delivery_receipt", timeout=10)
            await alice.close()
        asyncio.run(send())
        down = wait_for(lambda: (h := east.get_json("/health"))["message_forward"]["west"]
                        ["last_error"] and h["message_forward"]["west"]["pending"] and h)
        assert down["status"] == "degraded"
        [reason] = down["reasons"]
        assert reason.startswith("message peer west: link down (") and \
            reason.endswith("; 1 forward(s) pending"), reason
        west.start()
        up = wait_for(lambda: (h := east.get_json("/health"))["status"] == "ok" and h,
                      timeout=30, what="east's /health ok once west is up")
        assert up["reasons"] == [] and up["message_forward"]["west"]["link"] == "up"
    finally:
        east.stop()
        west.stop()


def test_auth_denials_are_logged_with_who_which_seat_and_why_rate_limited(tmp_path):
    db = tmp_path / "hubd.db"
    store.add(db, "alice", ["PROJ/alice"])
    alice_token = store.new_token(db, "alice", "laptop")
    hub = hubd_process(tmp_path / "hub", db=db).start()
    try:
        started = time.monotonic()  # before the first denial: the log windows' start

        async def deny():
            # the Router's refusal: alice's token does not hold bob's seat
            probe = await connect(hub.url, "PROJ/bob", alice_token)
            await refused(probe)
            await probe.close()
            # the WebSocket door's: a token nobody holds
            wrong = await WsProbe.open(hub.url)
            await wrong.register("PROJ/carol", token="not-a-token")
            await wrong.recv_type("auth_denied")
            await wrong.close()
            # the broker door's: a wrong broker token
            socket_path, _ = broker_files(db)
            client = await BrokerClient.connect(str(socket_path))
            try:
                await client.call("auth", token="wrong")
                raise AssertionError("a wrong broker token was accepted")
            except BrokerError as exc:
                assert exc.code == "bad_token", exc
            await client.close()
        asyncio.run(deny())
        # the REDSYN door's: no bearer token
        request = urllib.request.Request(hub.http_url + "/redsyn/v1/agents", method="GET")
        try:
            urllib.request.urlopen(request, timeout=5)
            raise AssertionError("REDSYN answered without a token")
        except urllib.error.HTTPError as exc:
            assert exc.code == 401
        lines = wait_for(lambda: len(found := log_lines(hub, "auth denied")) == 4 and found)
        seat, door, broker, redsyn = lines
        assert "[info" in seat
        assert re.search(r"door=hub .*peer=127\.0\.0\.1 principal=alice reason=.*PROJ/bob"
                         r".* seat=PROJ/bob", seat), seat
        assert re.search(r"door=hub peer=127\.0\.0\.1 reason='?Invalid authentication token"
                         r".* seat=PROJ/carol", door), door
        assert re.search(r"door=broker peer='?pid \d+'? reason='?wrong broker token", broker), broker
        assert re.search(r"door=redsyn peer=127\.0\.0\.1 reason='?no bearer token.* "
                         r"seat='?GET /redsyn/v1/agents", redsyn), redsyn
        assert alice_token not in hub.log()

        # rate-limited: a client retrying a wrong token in a loop writes at most
        # MAX_LINES lines a window (LimitedLog's unit test shows the rest reported)
        async def flood():
            for _ in range(3 * MAX_LINES):
                probe = await WsProbe.open(hub.url)
                await probe.register("PROJ/x", token="not-a-token")
                await probe.recv_type("auth_denied")
                await probe.close()
        asyncio.run(flood())
        windows = int((time.monotonic() - started) // WINDOW_SECONDS) + 1
        assert hub.metric("hubd_auth_denied_total") == 2 + 3 * MAX_LINES
        written = len(log_lines(hub, "auth denied"))
        assert written <= min(windows * MAX_LINES, 4 + 3 * MAX_LINES - 1), (written, windows)
    finally:
        hub.stop()


def test_a_chat_to_a_hub_with_no_route_is_logged_and_counted(tmp_path):
    hub = hubd_process(tmp_path / "hub", hub_id="west").start()
    try:
        async def send():
            amy = await joined(hub.url, "PROJ/amy")
            await amy.chat("PROJ/amy", "PROJ/alice@east", "a reply", client_msg_id="r1")
            error = await amy.recv_type("error")
            assert error["payload"] == "Hub 'east' is not a configured message peer of this hub."
            assert error["client_msg_id"] == "r1"
            await amy.close()
            socket_path, token_file = broker_files(tmp_path / "hub" / "hubd.db")
            client = await BrokerClient.connect(str(socket_path), token_file.read_text().strip())
            await client.call("register", clientKind="cli", handle="bot")
            try:
                await client.call("send", threadId=None, to="PROJ/alice@east", body="hi")
                raise AssertionError("a send to a hub with no route was accepted")
            except BrokerError as exc:
                assert "not a configured message peer" in exc.message, exc
            await client.close()
        asyncio.run(send())
        assert hub.metric("hubd_chats_no_route_total") == 2
        lines = log_lines(hub, "chat to a hub with no route; refused (add --message-peer for "
                               "it if it should have one)")
        assert len(lines) == 2 and all("hub=east" in line for line in lines), hub.log()
        assert "sender=PROJ/amy" in lines[0] and "sender=bot" in lines[1]
    finally:
        hub.stop()


def test_a_bad_flag_is_told_first_in_one_line(tmp_path):
    out = subprocess.run([sys.executable, "-m", "hubd", "--port", "eighty"],
                         capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert out.returncode == 2
    assert out.stderr.splitlines() == ["hubd: error: argument --port: invalid int value: 'eighty'",
                                       "(`hubd --help` lists every option)"]


def test_the_start_says_what_clients_must_bring_and_the_stop_sums_up(tmp_path):
    hub = hubd_process(tmp_path / "open", hub_id="site").start()
    secured = hubd_process(tmp_path / "secured", "--token", "s3cret", hub_id="site2").start()
    try:
        async def chat():
            a = await joined(hub.url, "PROJ/a")
            await a.chat("PROJ/a", "PROJ/b", "one event")
            await a.close()
        asyncio.run(chat())
    finally:
        assert hub.stop() == 0
        secured.stop()
    [listening] = log_lines(hub, "listening")
    assert "agent_auth=open-loopback" in listening and "tls=False" in listening
    assert "tokenless_agents=loopback" in listening and "secured=" not in listening
    [listening] = log_lines(secured, "listening")
    assert "agent_auth=shared-token" in listening and "tokenless_agents=refused" in listening
    [started] = log_lines(hub, "hubd started")
    version = __import__("hubd").__version__
    db = tmp_path / "open" / "hubd.db"
    assert f"version={version}" in started and "hub_id=site" in started
    assert f"journal={db}" in started
    doors = json.loads(started.split("doors=")[1].split("} ")[0].replace("'", '"') + "}")
    assert doors == {"websocket": hub.url, "redsyn": f"{hub.http_url}/redsyn/v1",
                     "broker": str(broker_files(db)[0])}
    [stopped] = log_lines(hub, "hubd stopped")
    assert "exit_code=0" in stopped and "hub_id=site" in stopped and "uptime_seconds=" in stopped
    events = int(re.search(r"events_written=(\d+)", stopped).group(1))
    assert events >= 1 and f"journal_seq={events}" in stopped  # a fresh journal: all this run's

"""The status page of a running hub in a real headless browser (Debian's
chromium): who is online on every door (a WebSocket seat, a broker handle, a
REDSYN agent), a live claim, a board task, a message peer that is down with
its backlog and last error, the partition state; behind the same Host guard
as /health; `/` keeps its old answers for WebSocket clients and for plain
GETs (docs/operations.md, "Status page")."""

from __future__ import annotations

import asyncio
import html
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from tests.support.broker_client import BrokerClient
from tests.support.prereq import need_tool
from tests.support.procs import broker_files, free_port, hubd_process
from tests.support.redsyn_client import Client, login
from tests.support.wsprobe import joined


RITA = "acme/ops/rita/helper"  # a REDSYN agent


def chromium(*args: str, profile: Path) -> subprocess.CompletedProcess:
    """Headless chromium; --no-sandbox because CI runs as root, its own
    profile folder so runs share nothing."""
    binary = need_tool("chromium")
    return subprocess.run([binary, "--headless", "--no-sandbox", "--disable-gpu",
                           "--no-first-run", "--disable-extensions",
                           f"--user-data-dir={profile}", *args],
                          capture_output=True, text=True, timeout=120)


def visible_text(dom: str) -> str:
    """The DOM's text, one space between cells (what a reader sees)."""
    body = dom.split("<body>", 1)[1]
    return html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", body)))


def section(text: str, heading: str, following: str) -> str:
    return text.split(heading, 1)[1].split(following, 1)[0]


def test_the_status_page_shows_a_running_hub_in_a_browser(tmp_path):
    need_tool("chromium")
    db = tmp_path / "hub" / "hubd.db"
    db.parent.mkdir()
    redsyn_token = login(db, "acme/ops/rita", "laptop")
    down_port = free_port()  # nothing listens there: the peer is down
    hub = hubd_process(tmp_path / "hub", "--message-peer", f"west=ws://127.0.0.1:{down_port}/",
                       "--namespace-owner", "PROJ=status-hub", db=db, hub_id="status-hub").start()
    try:
        async def scenario():
            alice = await joined(hub.url, "PROJ/alice")
            await alice.send_json({"sender": "PROJ/alice", "target": "System", "type": "claim",
                                   "payload": "T-42", "task_id": "T-42",
                                   "paths": ["src/parser.py"], "ttl_seconds": 600,
                                   "timestamp": time.time()})
            assert (await alice.recv_type("claim_granted", timeout=10))["task_id"] == "T-42"
            await alice.send_json({"sender": "PROJ/alice", "target": "System",
                                   "type": "ledger_task", "task_id": "B-7",
                                   "title": "Ship <the> parser", "project": "PROJ",
                                   "payload": "", "timestamp": time.time()})
            await alice.recv_type("ledger_task_posted", timeout=10)
            await alice.chat("PROJ/alice", "PROJ/bob@west", "waits for west",
                             receipt_requested=True)
            await alice.recv_type("delivery_receipt", timeout=10)
            socket_path, token_file = broker_files(db)
            broker = await BrokerClient.connect(str(socket_path), token_file.read_text().strip())
            await broker.call("register", clientKind="cli", handle="bertha")
            redsyn = Client(hub.http_url, redsyn_token)
            assert redsyn.announce(RITA).status in (200, 201)
            await asyncio.to_thread(redsyn.take, RITA)  # heard now
            # the browser reads the page while everyone is still online
            dump = await asyncio.to_thread(chromium, "--dump-dom", hub.http_url + "/",
                                           profile=tmp_path / "profile")
            shot = tmp_path / "status-page.png"
            await asyncio.to_thread(chromium, f"--screenshot={shot}", "--window-size=1100,1400",
                                    "--hide-scrollbars", hub.http_url + "/",
                                    profile=tmp_path / "profile")
            await broker.close()
            await alice.close()
            return dump, shot
        dump, shot = asyncio.run(scenario())
        assert dump.returncode == 0, dump.stderr[-2000:]
        dom = dump.stdout
        assert "<script" not in dom
        text = visible_text(dom)
        assert "hubd status-hub: degraded" in text
        assert "message peer west: link down" in text
        online = section(text, "Online", "Live claims")
        assert "WebSocket (1) name how PROJ/alice connected" in online
        assert re.search(r"Broker \(Unix socket\) \(1\) name how bertha (connected|listening)",
                         online), online
        assert re.search(r"REDSYN \(HTTP\) \(1\) name how acme/ops/rita/helper heard \d+ s ago via ", online)
        claims = section(text, "Live claims", "Board")
        assert re.search(r"T-42 PROJ/alice \S+ src/parser\.py in \d+ s online", claims), claims
        board = section(text, "Board", "Peers")
        assert "B-7 Ship <the> parser open" in board  # escaped in the page, shown as typed
        assert "Ship &lt;the&gt; parser" in dom
        peers = section(text, "Peers", "Partition")
        assert re.search(r"west down 1 [\d.]+ never refused: \S+", peers), peers
        assert "No namespace is partitioned." in text and "PROJ → status-hub" in text
        assert shot.stat().st_size > 10_000 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        keep = __import__("os").environ.get("HUBD_STATUS_SCREENSHOT")
        if keep:  # how docs/status-page.png is made
            shutil.copyfile(shot, keep)

        # the same guard as /health: a Host this hub does not serve is refused
        request = urllib.request.Request(hub.http_url + "/", headers={
            "Accept": "text/html", "Host": "rebound.example"})
        try:
            urllib.request.urlopen(request, timeout=5)
            raise AssertionError("the status page answered a foreign Host")
        except urllib.error.HTTPError as exc:
            assert exc.code == 403
        # a plain GET of / (no text/html) keeps today's answer
        try:
            urllib.request.urlopen(hub.http_url + "/", timeout=5)
            raise AssertionError("a plain GET / was not refused")
        except urllib.error.HTTPError as exc:
            assert exc.code == 426
        # and the page's view is there as JSON too
        view = hub.get_json("/status")
        assert view["claims"]["listed"][0]["task_id"] == "T-42"
        assert view["status"] == "degraded"
    finally:
        hub.stop()


def test_the_status_page_needs_the_metrics_token_when_health_does(tmp_path):
    hub = hubd_process(tmp_path / "hub", "--metrics-token", "peek").start()
    try:
        request = urllib.request.Request(hub.http_url + "/", headers={"Accept": "text/html"})
        try:
            urllib.request.urlopen(request, timeout=5)
            raise AssertionError("the status page answered without the token")
        except urllib.error.HTTPError as exc:
            assert exc.code == 401
        request.add_header("Authorization", "Bearer peek")
        with urllib.request.urlopen(request, timeout=5) as answer:
            assert answer.headers["Content-Type"].startswith("text/html")
            assert "script-src" not in answer.headers["Content-Security-Policy"]
            assert "default-src 'none'" in answer.headers["Content-Security-Policy"]
            assert "<h1>hubd test-hub: " in answer.read().decode()
    finally:
        hub.stop()

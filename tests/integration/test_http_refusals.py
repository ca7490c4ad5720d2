"""Requests the hub's HTTP listener refuses leave one log line each, bounded,
and no traceback (issue 30 item 9): malformed requests on any path, and a
REDSYN client that goes away in the middle of its body. A real hubd process,
raw TCP."""

from __future__ import annotations

import math
import socket
import time

from hubd.logs import MAX_LINES, WINDOW_SECONDS
from tests.support.procs import hubd_process
from tests.support.redsyn_client import Client, login
from tests.support.waiting import wait_for

MALFORMED = [
    b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Bad: a\x01b\r\n\r\n",  # control char
    b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\nG@T / HTTP/1.1\r\n\r\n",  # bad method
    b"GET /redsyn/v1/" + b"a" * 9000 + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",  # too long
    b"POST /redsyn/v1/messages HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: x\r\n\r\n",
]
ROUNDS = 8


def exchange(port: int, data: bytes) -> bytes:
    """Send the bytes, read until the hub closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(data)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
        return out


def gone_mid_body(port: int, token: str) -> None:
    """Headers promising 1000 bytes, ten of them, then the connection closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"POST /redsyn/v1/messages HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                  b"Authorization: Bearer " + token.encode() + b"\r\n"
                  b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
                  b'{"v": 1, "')


def test_refused_requests_log_one_line_each_rate_limited_and_no_traceback(tmp_path):
    db = tmp_path / "hubd.db"
    token = login(db, "acme/dev/joel", "laptop")
    proc = hubd_process(tmp_path, db=db).start()
    try:
        started = time.monotonic()
        for _ in range(ROUNDS):
            for data in MALFORMED:
                assert exchange(proc.port, data).split(b"\r\n")[0].endswith(b"400 Bad Request")
        for _ in range(5):
            gone_mid_body(proc.port, token)
        # every malformed request was answered (exchange read it); the cut
        # bodies are answered 400 to nobody (or, were they not, logged)
        wait_for(lambda: proc.metric('hubd_redsyn_requests_total{code="400"}') >= 5
                 or "Error handling request" in proc.log(), what="the cut bodies' answers")
        elapsed = time.monotonic() - started
        # the listener still serves
        assert Client(proc.http_url, token).call("GET", "/inbox/acme/dev/joel/x").status == 200
        refused = proc.metric('hubd_http_refused_total{reason="malformed"}')
    finally:
        proc.stop()
    log = proc.log()
    assert "Traceback" not in log and "ConnectionResetError" not in log, log[-3000:]
    assert refused == ROUNDS * len(MALFORMED)
    lines = [line for line in log.splitlines() if "http request refused" in line]
    assert all("reason=malformed" in line for line in lines)
    # one line per refusal, MAX_LINES per window at most: the burst was cut short
    windows = math.floor(elapsed / WINDOW_SECONDS) + 1
    assert MAX_LINES <= len(lines) <= MAX_LINES * windows, (len(lines), elapsed)
    assert len(lines) < ROUNDS * len(MALFORMED)

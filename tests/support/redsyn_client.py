"""A small blocking REDSYN client for tests (urllib: real HTTP, no mocks)."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request

VERSION = "2026-09-25"


def login(db, person: str, name: str) -> str:
    out = subprocess.run([sys.executable, "-m", "hubd", "redsyn", "login", "--db", str(db),
                          "--person", person, "--name", name, "--json"],
                         capture_output=True, text=True, timeout=60, check=True)
    return json.loads(out.stdout)["token"]


class Answer:
    def __init__(self, status: int, headers, body: bytes):
        self.status, self.headers, self.body = status, headers, body

    @property
    def json(self):
        return json.loads(self.body)


class Client:
    def __init__(self, base: str, token: str | None, version: str | None = VERSION):
        self.base = base.rstrip("/") + "/redsyn/v1"
        self.token, self.version = token, version

    def call(self, method: str, path: str, body=None, raw: bytes | None = None,
             timeout: float = 70.0, headers: dict | None = None) -> Answer:
        sent = {"Content-Type": "application/json"}
        if self.token is not None:
            sent["Authorization"] = f"Bearer {self.token}"
        if self.version is not None:
            sent["Redsyn-Version"] = self.version
        sent.update(headers or {})
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None
                                            else None)
        request = urllib.request.Request(self.base + path, data=data, method=method,
                                         headers=sent)
        try:
            with urllib.request.urlopen(request, timeout=timeout) as answer:
                return Answer(answer.status, answer.headers, answer.read())
        except urllib.error.HTTPError as err:
            return Answer(err.code, err.headers, err.read())

    def announce(self, agent: str, **doc) -> Answer:
        return self.call("PUT", f"/agents/{agent}", {"listening": True, **doc})

    def send(self, envelope: dict) -> Answer:
        return self.call("POST", "/messages", {"v": 1, **envelope})

    def take(self, agent: str, wait: float = 0, lease: float | None = None) -> list:
        query = f"?wait={wait:g}" + (f"&lease={lease:g}" if lease is not None else "")
        answer = self.call("GET", f"/inbox/{agent}{query}")
        assert answer.status == 200, (answer.status, answer.body)
        return answer.json["items"]

    def take_until(self, agent: str, count: int = 1, lease: float | None = None,
                   rounds: int = 20) -> list:
        got: list = []
        for _ in range(rounds):
            got += self.take(agent, wait=10, lease=lease)
            if len(got) >= count:
                return got
        raise AssertionError(f"{agent} got {len(got)} of {count} messages")

    def ack(self, agent: str, ids: list) -> Answer:
        return self.call("POST", f"/inbox/{agent}/ack", {"ids": ids})

"""A broker client written from seed 004 alone (protocol v2 over a Unix socket).

It knows only what the seed says: newline-delimited JSON, the first line auth
with the token, every line carrying v and a per-connection monotonic id,
answers echoing the id with ok/result or ok/error{code,message}, and server
events (no id) on listening connections. It does not import hubd.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

VERSION = 2
LINE_LIMIT = 1024 * 1024


class BrokerError(Exception):
    def __init__(self, code: str, message: str, error: dict):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.error = error


class BrokerClosed(ConnectionError):
    """The hub closed the connection with no answer left to read."""


class BrokerClient:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader = reader
        self.writer = writer
        self.next_id = 1
        self.answers: asyncio.Queue = asyncio.Queue()
        self.events: asyncio.Queue = asyncio.Queue()
        self.closed = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._read())

    @classmethod
    async def connect(cls, path: str, token: str | None = None) -> "BrokerClient":
        # generous line limit: answers (thread views) may be long
        reader, writer = await asyncio.open_unix_connection(path, limit=8 * LINE_LIMIT)
        client = cls(reader, writer)
        if token is not None:
            await client.call("auth", token=token)
        return client

    async def _read(self) -> None:
        try:
            while True:
                line = await self.reader.readline()
                if not line:
                    break
                obj = json.loads(line)
                assert obj.get("v") == VERSION, obj
                if obj.get("type") == "event":
                    assert "id" not in obj, obj
                    await self.events.put(obj)
                else:
                    await self.answers.put(obj)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self.closed.set()

    async def send_raw(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def send_line(self, obj: dict) -> None:
        await self.send_raw(json.dumps(obj).encode() + b"\n")

    async def answer(self, timeout: float = 10.0) -> dict:
        """The next answer; BrokerClosed at once if the hub closed the
        connection and none is left, TimeoutError after `timeout`."""
        async with asyncio.timeout(timeout):
            while self.answers.empty():
                if self.closed.is_set():
                    raise BrokerClosed("the hub closed the connection")
                getter = asyncio.ensure_future(self.answers.get())
                closed = asyncio.ensure_future(self.closed.wait())
                try:
                    await asyncio.wait({getter, closed}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    closed.cancel()
                    getter.cancel()
                if getter.done() and not getter.cancelled():
                    return getter.result()
            return self.answers.get_nowait()

    def take_id(self) -> int:
        id_ = self.next_id
        self.next_id += 1
        return id_

    async def request(self, type_: str, timeout: float = 10.0, **fields: Any) -> dict:
        """One request; the raw answer object (ok or not), checked for its envelope."""
        id_ = self.take_id()
        await self.send_line({"v": VERSION, "id": id_, "type": type_, **fields})
        obj = await self.answer(timeout)
        assert obj["id"] == id_, (obj, id_)
        assert isinstance(obj["ok"], bool)
        if obj["ok"]:
            assert isinstance(obj["result"], dict), obj
        else:
            assert set(obj["error"]) >= {"code", "message"}, obj
            assert isinstance(obj["error"]["code"], str) and obj["error"]["message"]
        return obj

    async def call(self, type_: str, timeout: float = 10.0, **fields: Any) -> dict:
        """One request; its result, or BrokerError."""
        obj = await self.request(type_, timeout, **fields)
        if not obj["ok"]:
            raise BrokerError(obj["error"]["code"], obj["error"]["message"], obj["error"])
        return obj["result"]

    async def event(self, name: str | None = None, timeout: float = 10.0) -> dict:
        """The next server event (of that name: others before it are dropped)."""
        async with asyncio.timeout(timeout):
            while True:
                obj = await self.events.get()
                if name is None or obj["event"] == name:
                    return obj

    def pending_events(self) -> list[dict]:
        out = []
        while not self.events.empty():
            out.append(self.events.get_nowait())
        return out

    async def close(self) -> None:
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except (ConnectionError, BrokenPipeError):
            pass
        self._task.cancel()

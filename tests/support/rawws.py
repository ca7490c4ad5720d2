"""A raw WebSocket client on a plain asyncio stream, for tests that need to
send exactly the bytes they choose (bad frames, several in one write) and see
exactly what came back: every frame up to the close frame, or that none came.
"""

from __future__ import annotations

import asyncio
import base64
import os
import struct
from dataclasses import dataclass


def client_frame(opcode: int, payload: bytes, *, fin: bool = True, rsv: int = 0,
                 length: int | None = None) -> bytes:
    """A masked client frame; `length` overrides the declared payload length."""
    n = len(payload) if length is None else length
    head = bytes([(0x80 if fin else 0) | rsv | opcode])
    if n < 126:
        head += bytes([0x80 | n])
    elif n < 65536:
        head += bytes([0x80 | 126]) + struct.pack("!H", n)
    else:
        head += bytes([0x80 | 127]) + struct.pack("!Q", n)
    key = os.urandom(4)
    masked = bytes(b ^ key[i % 4] for i, b in enumerate(payload))
    return head + key + masked


def text(payload: bytes | str) -> bytes:
    return client_frame(0x1, payload.encode() if isinstance(payload, str) else payload)


@dataclass
class Received:
    frames: list  # (opcode, payload) in order, the close frame included
    close: tuple[int, str] | None  # (code, reason) of the hub's close frame
    error: str | None  # how reading ended other than EOF (e.g. ConnectionResetError)


def parse_frames(data: bytes) -> tuple[list, tuple[int, str] | None]:
    frames, close, i = [], None, 0
    while i + 2 <= len(data):
        opcode, n, j = data[i] & 0x0F, data[i + 1] & 0x7F, i + 2
        if n == 126:
            n, j = struct.unpack("!H", data[j:j + 2])[0], j + 2
        elif n == 127:
            n, j = struct.unpack("!Q", data[j:j + 8])[0], j + 8
        if j + n > len(data):
            break
        payload = data[j:j + n]
        frames.append((opcode, payload))
        if opcode == 0x8:
            code = struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else 1005
            close = (code, payload[2:].decode("utf-8", "replace"))
            break
        i = j + n
    return frames, close


class RawWs:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer = reader, writer

    @classmethod
    async def connect(cls, port: int, host: str = "127.0.0.1", *, rcvbuf: int | None = None,
                      path: str = "/", tls=None) -> "RawWs":
        """`tls`: an ssl.SSLContext for a hub serving wss."""
        import socket

        sock = socket.socket()
        if rcvbuf is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, (host, port))
        reader, writer = await asyncio.open_connection(
            sock=sock, ssl=tls, server_hostname=host if tls is not None else None)
        key = base64.b64encode(os.urandom(16)).decode()
        writer.write((f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
                      f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                      "Sec-WebSocket-Version: 13\r\n\r\n").encode())
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 101"):
            raise AssertionError(f"handshake refused: {head[:200]!r}")
        return cls(reader, writer)

    async def send(self, data: bytes) -> bool:
        """Write; False once the hub has closed or reset the connection."""
        try:
            self.writer.write(data)
            await self.writer.drain()
        except (ConnectionError, OSError):
            return False
        return True

    async def read_all(self, timeout: float = 10.0) -> Received:
        """Read until EOF, a reset, or the close frame and EOF; bounded by timeout."""
        return await self._read(timeout, until_close=False)

    async def read_until_close(self, timeout: float = 10.0) -> Received:
        """Read until the hub's close frame has arrived (or EOF, a reset, the
        timeout), without waiting for the connection to end."""
        return await self._read(timeout, until_close=True)

    async def _read(self, timeout: float, until_close: bool) -> Received:
        data, error = b"", None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            while not (until_close and parse_frames(data)[1] is not None):
                chunk = await asyncio.wait_for(self.reader.read(1 << 20),
                                               max(0.0, deadline - loop.time()))
                if not chunk:
                    break
                data += chunk
        except (ConnectionError, OSError, asyncio.TimeoutError) as exc:
            error = type(exc).__name__
        frames, close = parse_frames(data)
        return Received(frames, close, error)

    def close(self) -> None:
        self.writer.close()

"""Door-neutral messages and the Router's send entries.

A Message is a frame (a dict) that leaves the hub. Doors encode it for their
wire, and each encoding is made once per message however many endpoints get
it: the first endpoint of a door to deliver it caches its bytes on the message
(`encoded`). A chat's JSON text is made once by its handler and is both the
journal payload and the text every recipient gets.
"""

from __future__ import annotations

from typing import Callable

from hubd.wire import codec


class Message:
    __slots__ = ("frame", "type", "_json", "_wire")

    def __init__(self, frame: dict, json: bytes | None = None):
        self.frame = frame
        self.type: str = frame.get("type") or "chat"
        self._json = json
        self._wire: dict | None = None

    def __repr__(self) -> str:
        return f"<Message {self.type}>"

    @property
    def json(self) -> bytes:
        """Compact JSON (UTF-8), made at most once."""
        text = self._json
        if text is None:
            text = self._json = codec.encode(self.frame)
        return text

    def encoded(self, wire: Callable[["Message"], bytes]) -> bytes:
        """This message as `wire` frames it, made once and kept on the message
        (a door's wire function is its cache key)."""
        cache = self._wire
        if cache is None:
            data = wire(self)
            self._wire = {wire: data}
            return data
        data = cache.get(wire)
        if data is None:
            data = cache[wire] = wire(self)
        return data


class CloseEndpoint:
    """A send entry that closes the endpoint once the messages before it are out."""

    __slots__ = ("code", "reason")

    def __init__(self, code: int, reason: str):
        self.code = code
        self.reason = reason


# Close codes: the reference protocol's vocabulary for why the hub ended a
# session. The WebSocket door sends them as close codes; another door maps
# them onto its own wire.
CLOSE_NAME_CONFLICT = 4009
CLOSE_AUTH = 4010
CLOSE_REGISTRATION_TIMEOUT = 4012
CLOSE_CAPACITY = 4013
CLOSE_PER_HOST = 4015
CLOSE_TRY_AGAIN = 1013
CLOSE_INTERNAL = 1011
CLOSE_GOING_AWAY = 1001

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
    __slots__ = ("frame", "_json", "_wire", "_wired")

    def __init__(self, frame: dict, json: bytes | None = None):
        self.frame = frame
        self._json = json
        # the encoding of the first door that delivered it (nearly every
        # message leaves through one door): its wire function and bytes; with
        # a second door, _MANY and a dict wire -> bytes
        self._wire = None
        self._wired = None

    def __repr__(self) -> str:
        return f"<Message {self.type}>"

    @property
    def type(self) -> str:
        return self.frame.get("type") or "chat"

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
        if self._wire is wire:
            return self._wired
        if self._wire is None:
            self._wire = wire
            data = self._wired = wire(self)
            return data
        if self._wire is not _MANY:
            self._wired = {self._wire: self._wired}
            self._wire = _MANY
        data = self._wired.get(wire)
        if data is None:
            data = self._wired[wire] = wire(self)
        return data


# marks a message encoded for more than one door
_MANY = object()


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
# the reference closes a registration that fails identity binding with the same code
CLOSE_IDENTITY_BINDING = 4013
CLOSE_PER_HOST = 4015
CLOSE_TRY_AGAIN = 1013
CLOSE_INTERNAL = 1011
CLOSE_GOING_AWAY = 1001

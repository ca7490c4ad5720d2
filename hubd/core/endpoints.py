"""The open endpoints of every door, by id.

An endpoint is one place a door delivers messages to (a WebSocket today). The
Router and its outcomes name endpoints by id only; the journal writer, after a
commit, looks each id up here and hands the endpoint its messages
(hubd/actors/journal_writer.py, `release`). An id whose
endpoint has gone is skipped: it closed while its messages were being
committed, exactly as a closed socket drops what it is sent.
"""

from __future__ import annotations

import itertools
from typing import Iterator, Protocol

from .message import Message

_ids = itertools.count(1)


def next_endpoint_id() -> int:
    """Endpoint ids are unique within the process, whichever door asks."""
    return next(_ids)


class Endpoint(Protocol):
    id: int

    def deliver(self, message: Message) -> None:
        """Queue one message; never blocks (a full queue closes the endpoint)."""

    def close(self, code: int, reason: str) -> None:
        """Close after what is already queued."""

    def write_stalled_for(self, now: float) -> float:
        """Seconds the endpoint's current write has waited to drain (0: none)."""

    def abort(self) -> None:
        """Drop an endpoint whose writes cannot drain; the door may first try a
        bounded graceful close (the WebSocket door: 1 s), and reports no stall
        meanwhile (write_stalled_for 0), so the sweeper counts it once."""

    # Optional: when_written(callback). The callback gets True once every
    # message delivered so far has completed its write (left the door's
    # buffers within its drain bound), False if the endpoint closes or its
    # write stalls out first. A door without it counts delivery as written.


class Listener:
    """An endpoint inside the hub's process: a door's own ear for the Router's
    messages (the REDSYN door's wake-ups, the broker's transcript watcher).
    It writes nothing, so nothing stalls, and its owner ends it."""

    def __init__(self) -> None:
        self.id = next_endpoint_id()

    def deliver(self, message: Message) -> None:
        raise NotImplementedError

    def close(self, code: int, reason: str) -> None:
        pass

    def write_stalled_for(self, now: float) -> float:
        return 0.0

    def abort(self) -> None:
        pass


class Endpoints:
    def __init__(self) -> None:
        self._by_id: dict[int, Endpoint] = {}
        self.get = self._by_id.get

    def add(self, endpoint: Endpoint) -> None:
        self._by_id[endpoint.id] = endpoint

    def remove(self, endpoint: Endpoint) -> None:
        if self._by_id.get(endpoint.id) is endpoint:
            del self._by_id[endpoint.id]

    def __len__(self) -> int:
        return len(self._by_id)

    def __iter__(self) -> Iterator[Endpoint]:
        return iter(list(self._by_id.values()))

    def deliver(self, endpoint_id: int, message: Message) -> None:
        endpoint = self._by_id.get(endpoint_id)
        if endpoint is not None:
            endpoint.deliver(message)

    def when_written(self, endpoint_id: int, callback) -> None:
        """callback(True) once what endpoint_id was given so far is written,
        callback(False) if it is gone or fails first (consume-live receipts)."""
        endpoint = self._by_id.get(endpoint_id)
        if endpoint is None:
            callback(False)
            return
        track = getattr(endpoint, "when_written", None)
        if track is None:
            callback(True)  # its door has no write to wait for (it counts delivery)
        else:
            track(callback)

    def close(self, endpoint_id: int, code: int, reason: str) -> None:
        endpoint = self._by_id.get(endpoint_id)
        if endpoint is not None:
            endpoint.close(code, reason)

"""The Router's timers: commands that become due at a time.

A handler that must act later (a broker `wait` that times out) asks the
Router for a timer (`Router.at(when, command)`) and keeps the key it gets, a
plain int, in its state: no loop handle lives in state, so a state rebuilt
from the journal holds nothing that belongs to the event loop. When a timer
is due the Router dispatches its command like any other, through its one
table; a handler that no longer needs it cancels it by key (or ignores it
when it comes, finding nothing to do).

Bounded by the live timers: cancelled entries are dropped from the heap once
they are more than half of it.
"""

from __future__ import annotations

import heapq
import itertools


class TimerHeap:
    def __init__(self) -> None:
        self._heap: list[tuple[float, int]] = []
        self._commands: dict[int, object] = {}
        self._keys = itertools.count(1)

    def __len__(self) -> int:
        return len(self._commands)

    def push(self, when: float, command) -> int:
        key = next(self._keys)
        self._commands[key] = command
        heapq.heappush(self._heap, (when, key))
        return key

    def cancel(self, key: int | None) -> None:
        if key is None or self._commands.pop(key, None) is None:
            return
        if len(self._heap) > 2 * len(self._commands) + 64:
            self._heap = [entry for entry in self._heap if entry[1] in self._commands]
            heapq.heapify(self._heap)

    def due(self, now: float) -> list:
        """The commands due at `now`, in time order (taken off the heap)."""
        out = []
        heap, commands = self._heap, self._commands
        while heap and heap[0][0] <= now:
            _, key = heapq.heappop(heap)
            command = commands.pop(key, None)
            if command is not None:
                out.append(command)
        return out

    def next_at(self) -> float | None:
        """When the earliest live timer is due, or None."""
        heap, commands = self._heap, self._commands
        while heap and heap[0][1] not in commands:
            heapq.heappop(heap)
        return heap[0][0] if heap else None

"""Per-principal ingress quota: chat events and bytes per sliding window.

The principal is server-derived (a token fingerprint, or the peer address on
an open hub), never the sender name, so renaming does not multiply a budget.
The window is approximated by a ring of sub-buckets: exact to one sub-bucket,
O(1) per admission, bounded memory per principal.
"""

from __future__ import annotations

from dataclasses import dataclass, field

SUB_BUCKETS = 12
MAX_PRINCIPALS = 10_000

EVENTS = "events"
BYTES = "bytes"
OVERSIZED = "oversized"
CAPACITY = "principal-capacity"


@dataclass(frozen=True, slots=True)
class QuotaLimits:
    events: int
    bytes: int
    window: float


@dataclass(slots=True)
class _Window:
    starts: list = field(default_factory=lambda: [0.0] * SUB_BUCKETS)
    events: list = field(default_factory=lambda: [0] * SUB_BUCKETS)
    sizes: list = field(default_factory=lambda: [0] * SUB_BUCKETS)
    last_seen: float = 0.0


class IngressQuota:
    def __init__(self, limits: QuotaLimits | None):
        self.limits = limits
        self._windows: dict[str, _Window] = {}

    def admit(self, principal: str, size: int, now: float) -> str | None:
        """Charge one event of size bytes; return the refusal reason or None."""
        limits = self.limits
        if limits is None:
            return None
        if size > limits.bytes:
            return OVERSIZED
        window = self._windows.get(principal)
        if window is None:
            if len(self._windows) >= MAX_PRINCIPALS and not self._evict_idle(now):
                # Fail closed: never reset another principal's live budget.
                return CAPACITY
            window = self._windows[principal] = _Window()
        span = limits.window / SUB_BUCKETS
        slot_start = now - (now % span)
        slot = int(now / span) % SUB_BUCKETS
        if window.starts[slot] != slot_start:
            window.starts[slot] = slot_start
            window.events[slot] = 0
            window.sizes[slot] = 0
        horizon = now - limits.window
        events = sizes = 0
        for i in range(SUB_BUCKETS):
            if window.starts[i] > horizon:
                events += window.events[i]
                sizes += window.sizes[i]
        if events + 1 > limits.events:
            return EVENTS
        if sizes + size > limits.bytes:
            return BYTES
        window.events[slot] += 1
        window.sizes[slot] += size
        window.last_seen = now
        return None

    def _evict_idle(self, now: float) -> bool:
        horizon = now - self.limits.window
        idle = [p for p, w in self._windows.items() if w.last_seen <= horizon]
        for principal in idle:
            del self._windows[principal]
        return bool(idle)

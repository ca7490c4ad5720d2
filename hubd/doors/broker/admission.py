"""Who may hold a connection to the broker socket (docs/broker.md, "Authentication").

Two separate bounds, so the socket cannot be exhausted either way:

- at most AUTHENTICATED connections that passed `auth`: a newcomer arriving
  while they are all taken is refused at once (it could never be served), and
  so is an `auth` that finds them taken;
- at most UNAUTHENTICATED connections that have not (yet) authenticated:
  a newcomer past that bound displaces the longest-waiting connection of
  the process (the peer's pid, SO_PEERCRED) that holds the most of them.
  Connections that never authenticate hold a place only until newer ones
  need it, not for the 10 s auth timeout, and a process that floods the
  socket displaces its own connections first: a client that authenticates
  as soon as it connects is not locked out by them, even while another
  process opens hundreds a second.

Connections that never authenticate therefore never count against the
authenticated bound. Every refusal is counted by reason
(`hubd_broker_refused_connections_total{reason}`) and logged, at most one line
per reason per LOG_EVERY_SECONDS with the number refused since the last line.
Sans-IO: the door closes what this decides.
"""

from __future__ import annotations

from collections import Counter, OrderedDict

AUTHENTICATED = 256
UNAUTHENTICATED = 64
LOG_EVERY_SECONDS = 10.0

# refusal reasons: the label values of hubd_broker_refused_connections_total
AUTHENTICATED_FULL = "authenticated_full"
UNAUTHENTICATED_DISPLACED = "unauthenticated_displaced"
CLOSING = "closing"
REASONS = (AUTHENTICATED_FULL, UNAUTHENTICATED_DISPLACED, CLOSING)

SENTENCES = {
    AUTHENTICATED_FULL: f"The broker serves at most {AUTHENTICATED} authenticated connections; "
                        "try again later.",
    UNAUTHENTICATED_DISPLACED: f"The broker holds at most {UNAUTHENTICATED} connections that have "
                               "not authenticated, and this one had waited longest; send auth as "
                               "soon as you connect.",
    CLOSING: "The broker is shutting down.",
}


class Admission:
    def __init__(self, authenticated: int = AUTHENTICATED,
                 unauthenticated: int = UNAUTHENTICATED):
        self.authenticated_bound = authenticated
        self.unauthenticated_bound = unauthenticated
        self.authenticated: set = set()
        # waiting connection -> the process it came from, oldest first
        self.waiting: OrderedDict = OrderedDict()
        self.per_process: Counter = Counter()

    def arrive(self, conn, process=None) -> tuple[str | None, object | None]:
        """A new connection from `process` (its peer's pid; None when unknown):
        (refusal reason or None, a waiting connection it displaces or None)."""
        if len(self.authenticated) >= self.authenticated_bound:
            return AUTHENTICATED_FULL, None
        self.waiting[conn] = process
        self.per_process[process] += 1
        displaced = None
        if len(self.waiting) > self.unauthenticated_bound:
            displaced = self._longest_waiting_of_the_largest_holder()
            self._forget(displaced)
        return None, displaced

    def _longest_waiting_of_the_largest_holder(self):
        most = max(self.per_process.values())
        return next(conn for conn, process in self.waiting.items()
                    if self.per_process[process] == most)

    def _forget(self, conn) -> None:
        process = self.waiting.pop(conn)
        left = self.per_process[process] - 1
        if left:
            self.per_process[process] = left
        else:
            del self.per_process[process]

    def authenticate(self, conn) -> str | None:
        """A waiting connection sent the right token: the refusal reason, or
        None when it now holds an authenticated place."""
        if conn in self.waiting:
            self._forget(conn)
        if len(self.authenticated) >= self.authenticated_bound:
            return AUTHENTICATED_FULL
        self.authenticated.add(conn)
        return None

    def leave(self, conn) -> None:
        if conn in self.waiting:
            self._forget(conn)
        self.authenticated.discard(conn)

    def counts(self) -> dict[str, int]:
        return {"authenticated": len(self.authenticated), "unauthenticated": len(self.waiting)}


class RefusalLog:
    """At most one log line per reason per `every` seconds, saying how many
    connections were refused for it since the last line."""

    def __init__(self, every: float = LOG_EVERY_SECONDS):
        self.every = every
        self.last: dict[str, float] = {}
        self.unlogged: dict[str, int] = {}

    def refused(self, reason: str, now: float) -> int | None:
        """Count one refusal; the number to log now, or None to stay quiet."""
        count = self.unlogged.get(reason, 0) + 1
        last = self.last.get(reason)
        if last is not None and now - last < self.every:
            self.unlogged[reason] = count
            return None
        self.last[reason] = now
        self.unlogged[reason] = 0
        return count

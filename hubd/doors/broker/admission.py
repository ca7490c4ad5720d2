"""Who may hold a connection to the broker socket (docs/broker.md, "Authentication").

Two separate bounds, so the socket cannot be exhausted either way:

- at most AUTHENTICATED connections that passed `auth`: a newcomer arriving
  while they are all taken is refused at once (it could never be served), and
  so is an `auth` that finds them taken;
- at most UNAUTHENTICATED connections that have not (yet) authenticated:
  a newcomer past that bound displaces the one that has waited longest.
  Connections that never authenticate hold a place only until newer ones
  need it, not for the 10 s auth timeout, so a client that authenticates as
  soon as it connects is not locked out by them.

Connections that never authenticate therefore never count against the
authenticated bound. Every refusal is counted by reason
(`hubd_broker_refused_connections_total{reason}`) and logged, at most one line
per reason per LOG_EVERY_SECONDS with the number refused since the last line.
Sans-IO: the door closes what this decides.
"""

from __future__ import annotations

from collections import OrderedDict

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
        self.waiting: OrderedDict = OrderedDict()  # oldest first

    def arrive(self, conn) -> tuple[str | None, object | None]:
        """A new connection: (refusal reason or None, a waiting connection it
        displaces or None)."""
        if len(self.authenticated) >= self.authenticated_bound:
            return AUTHENTICATED_FULL, None
        displaced = None
        if len(self.waiting) >= self.unauthenticated_bound:
            displaced, _ = self.waiting.popitem(last=False)
        self.waiting[conn] = None
        return None, displaced

    def authenticate(self, conn) -> str | None:
        """A waiting connection sent the right token: the refusal reason, or
        None when it now holds an authenticated place."""
        self.waiting.pop(conn, None)
        if len(self.authenticated) >= self.authenticated_bound:
            return AUTHENTICATED_FULL
        self.authenticated.add(conn)
        return None

    def leave(self, conn) -> None:
        self.waiting.pop(conn, None)
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

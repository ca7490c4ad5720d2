"""Auth denials, from every door, in one log: who was refused (the peer's
address, the principal its token named, if any), which seat or identity it
asked for, on which door, and why.

At info, so an operator sees them without debug logging, and rate-limited
(hubd/logs.py LimitedLog: a client retrying a wrong token in a loop writes
MAX_LINES lines per window, the rest are counted and reported as
`suppressed=N` on the next line written). The doors keep counting their own
refusals on /metrics (hubd_auth_denied_total, hubd_redsyn_requests_total by
status, hubd_broker_bad_tokens_total): this is the log's home only.
"""

from __future__ import annotations

import structlog

from hubd.logs import LimitedLog

log = structlog.get_logger("hubd.auth")


class AuthDenials:
    def __init__(self, clock=None):
        self.line = LimitedLog(log, "info", clock)

    def denied(self, door: str, reason: str, *, peer: str | None = None,
               principal: str | None = None, seat: str | None = None) -> None:
        self.line("auth denied", door=door, peer=peer, principal=principal, seat=seat,
                  reason=reason)

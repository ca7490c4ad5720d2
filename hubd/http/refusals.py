"""What the HTTP listener logs about requests it refuses before any handler
runs, or that a handler could not finish: one line each, rate-limited.

aiohttp logs a request line it cannot parse (a bad method, a header with a
control character, a line too long), and a client that went away while its
handler read the body, as "Error handling request" with the full traceback
(about 20 lines each, on its `aiohttp.server` logger). A client can send
thousands of those a minute. The listener hands aiohttp a `ServerLog`
instead of that logger (AppRunner's `logger=`): a refusal is one structlog
line naming the peer and what was wrong, at most MAX_LINES per
WINDOW_SECONDS, the rest counted and reported on the next line that is
written (`suppressed=N`) and on /metrics (`hubd_http_refused_total`). An
exception that is neither (a handler bug) keeps its traceback, through the
same bound.
"""

from __future__ import annotations

import logging

import structlog
from aiohttp.http_exceptions import HttpProcessingError

from hubd.logs import LineBudget

log = structlog.get_logger("hubd.http")

MAX_DETAIL = 200

MALFORMED = "malformed"
CLIENT_GONE = "client_gone"
HANDLER_FAILED = "handler_failed"


def kind_of(exc: BaseException | None) -> str:
    """Why aiohttp gave up on a request: its parser refused it, the client
    went away, or a handler raised something else."""
    if isinstance(exc, HttpProcessingError):
        return MALFORMED
    if isinstance(exc, ConnectionError):
        return CLIENT_GONE
    return HANDLER_FAILED


class ServerLog(logging.Logger):
    """The logger aiohttp's request handler writes to, as a Logger (it calls
    `exception`, `debug`, `warning`). Everything it says lands here."""

    def __init__(self, metrics, clock):
        super().__init__("hubd.http.server")
        self.metrics = metrics
        self.clock = clock
        self.budget = LineBudget()

    def _log(self, level, msg, args, exc_info=None, extra=None, stack_info=False,
             stacklevel=1):
        exc = exc_info if isinstance(exc_info, BaseException) else None
        if exc is None and level < logging.WARNING:
            return  # aiohttp's debug notes (a premature disconnect it already handled)
        kind = kind_of(exc) if exc is not None else None
        if kind is not None:
            counts = self.metrics.http_refused
            counts[kind] = counts.get(kind, 0) + 1
        write, held = self.budget.take(self.clock())
        if not write:
            return
        fields = {"suppressed": held} if held else {}
        if kind in (MALFORMED, CLIENT_GONE):
            # aiohttp's words ("Error handling request from %s") name only the peer
            log.info("http request refused", reason=kind, detail=_detail(exc),
                     peer=args[0] if args else None, **fields)
        elif exc is not None:
            log.error("http handler failed", what=_text(msg, args), exc_info=exc, **fields)
        else:
            log.warning("http server", what=_text(msg, args), **fields)


def _text(msg, args) -> str:
    try:
        return str(msg) % args if args else str(msg)
    except (TypeError, ValueError):
        return f"{msg} {args!r}"


def _detail(exc: BaseException) -> str:
    if isinstance(exc, HttpProcessingError):
        detail = f"{exc.code} {exc.message}"
    else:
        detail = f"{type(exc).__name__}: {exc}"
    return " ".join(detail.split())[:MAX_DETAIL]

"""Structured logging: key=value text for a terminal, JSON lines in production."""

from __future__ import annotations

import logging
import sys
import time

import structlog

# a rate-limited log line: at most MAX_LINES per WINDOW_SECONDS
WINDOW_SECONDS = 10.0
MAX_LINES = 10


def configure(log_format: str = "text", level: str = "INFO") -> None:
    numeric = getattr(logging, level.upper(), logging.INFO)
    renderer = (structlog.processors.JSONRenderer() if log_format == "json"
                else structlog.dev.ConsoleRenderer(colors=False))
    processors = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.StackInfoRenderer(),
        structlog.processors.format_exc_info if log_format == "json" else (lambda l, m, e: e),
        renderer,
    ]
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    # aiohttp and asyncio log through the standard library; keep them quiet
    # unless something is wrong, and on the same stream.
    logging.basicConfig(level=max(numeric, logging.WARNING), stream=sys.stderr,
                        format="%(levelname)s %(name)s: %(message)s")


class LineBudget:
    """At most `lines` log lines per `window` seconds (pure: the caller
    gives the clock). `take(now)` says whether to write one now, and how
    many were held back since the last one written."""

    def __init__(self, lines: int = MAX_LINES, window: float = WINDOW_SECONDS):
        self.lines, self.window = lines, window
        self._window_start = float("-inf")
        self._written = 0
        self._held = 0

    def take(self, now: float) -> tuple[bool, int]:
        if now - self._window_start >= self.window:
            self._window_start, self._written = now, 0
        if self._written >= self.lines:
            self._held += 1
            return False, 0
        self._written += 1
        held, self._held = self._held, 0
        return True, held


class LimitedLog:
    """One kind of log line, at most MAX_LINES per WINDOW_SECONDS: a client
    repeating the same mistake in a loop cannot flood the log. The lines held
    back are reported on the next one written (`suppressed=N`)."""

    def __init__(self, logger, level: str = "info", clock=None):
        self.write = getattr(logger, level)
        self.clock = clock or time.monotonic
        self.budget = LineBudget()

    def __call__(self, event: str, **fields) -> None:
        write, held = self.budget.take(self.clock())
        if not write:
            return
        if held:
            fields["suppressed"] = held
        self.write(event, **{k: v for k, v in fields.items() if v is not None})

"""Structured logging: key=value text for a terminal, JSON lines in production."""

from __future__ import annotations

import logging
import sys

import structlog


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

"""Polling for a condition a test cannot be told about (a row in another
process's journal, a figure on /health): bounded, and loud when it times out."""

from __future__ import annotations

import time
from typing import Any, Callable


def wait_for(predicate: Callable[[], Any], timeout: float = 20.0, what: str = "condition",
             interval: float = 0.1) -> Any:
    """The first truthy value of predicate(), polled until timeout seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"{what} not met within {timeout:.0f}s")

"""Commands run inside a test site (a network namespace): this repository's
Python with the repository importable, and the chat driver."""

from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def python(*args: str) -> list[str]:
    return [sys.executable, *args]


def driver(*args: str) -> list[str]:
    return python("-m", "tests.support.chat_driver", *args)


def env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), **extra}

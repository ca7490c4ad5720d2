"""The commands the README documents, read from it, so a test runs what a
reader would type rather than its own copy of it."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"


def block_after(heading: str, text: str | None = None) -> list[str]:
    """The lines of the first ``` block after the line starting with `heading`."""
    lines = (README.read_text() if text is None else text).splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(heading))
    opening = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("```"))
    closing = next(i for i in range(opening + 1, len(lines)) if lines[i].startswith("```"))
    return lines[opening + 1:closing]


def first_block() -> list[str]:
    """The README's opening commands (install and run; install and test)."""
    return block_after("# hubd")


def argv(line: str) -> list[str]:
    """A documented `hubd ...` line as argv: its comment dropped, `hubd` run
    as this interpreter's `-m hubd` (the checkout the tests import)."""
    words = shlex.split(line, comments=True)
    assert words and words[0] == "hubd", line
    return [sys.executable, "-m", "hubd", *words[1:]]

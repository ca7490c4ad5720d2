"""docs/migration-from-reference.md says what hubd's command line is: every
flag it lists as carrying over is one hubd takes, none it lists as missing
is, and the version it quotes is the one hubd's welcome says. (It drifted:
the page said version 2 and that hubd lacked four flags it has.) The same
page against the reference hub's own --help: tests/interop/test_migration_flags.py."""

import re
from pathlib import Path

from hubd.cli import build_parser
from hubd.wire.envelope import PROTOCOL_VERSION

DOC = Path(__file__).resolve().parents[2] / "docs" / "migration-from-reference.md"
FLAG = re.compile(r"(--[a-z0-9][a-z0-9-]*)(\*?)")


def hubd_flags() -> set[str]:
    return {opt for action in build_parser()._actions for opt in action.option_strings
            if opt.startswith("--")}


def section(start: str, end: str) -> str:
    text = DOC.read_text()
    return text[text.index(start):text.index(end, text.index(start))]


def carried_over() -> set[str]:
    return {flag for flag, star in FLAG.findall(section("**Flags**", "**Files.**"))
            if not star}


def not_in_hubd() -> list[tuple[str, bool]]:
    """(flag or prefix, is a prefix) of the flags the page says hubd lacks."""
    return [(flag, bool(star)) for flag, star in
            FLAG.findall(section("**Flags hubd does not have.**", "should not move yet"))]


def test_every_flag_said_to_carry_over_is_one_hubd_takes():
    flags = carried_over()
    assert len(flags) > 40
    assert flags - hubd_flags() == set()


def test_no_flag_said_to_be_missing_is_one_hubd_takes():
    ours = hubd_flags()
    listed = not_in_hubd()
    assert len(listed) > 30  # the section was found and read (it shrinks as hubd gains flags)
    for flag, prefix in listed:
        if prefix:
            assert not [f for f in ours if f.startswith(flag)], flag
        else:
            assert flag not in ours, flag


def test_the_version_the_page_quotes_is_the_welcomes():
    row = next(line for line in DOC.read_text().splitlines()
               if line.startswith("| protocol version in `welcome`"))
    assert f"| **{PROTOCOL_VERSION}**:" in row, row


def test_every_other_flag_of_hubds_is_listed_as_its_own():
    added = FLAG.findall(section("hubd adds", "## Order of a move"))
    for flag in hubd_flags() - carried_over() - {"--help"}:
        assert any(flag == name or (star and flag.startswith(name)) for name, star in added), \
            flag

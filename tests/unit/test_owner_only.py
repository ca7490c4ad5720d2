"""hubd/owner_only.py's survey: every unsafe file of a list named in one
refusal with the commands that fix them all; what is not a regular file, or
not there, is left to the check that reads it."""

from __future__ import annotations

import os

from hubd.owner_only import survey
from tests.support.prereq import need_root

NOBODY = 65534


def test_one_refusal_names_every_unsafe_file_and_the_fixes(tmp_path):
    def made(name: str, mode: int) -> str:
        path = tmp_path / name
        path.write_text("x")
        os.chmod(path, mode)
        return str(path)

    fine, wide, group = made("fine", 0o600), made("wide", 0o644), made("group", 0o640)
    found = survey([("journal", fine, False), ("serving policy", wide, True),
                    ("client CA", group, True), ("serving policy", wide, True),
                    ("principals file", tmp_path / "absent", False),
                    ("journal", tmp_path, False)])
    assert found.paths == {wide, group}
    assert found.refusal() == (f"serving policy {wide} (mode 0644), client CA {group} (mode 0640) "
                               "are accessible by other users; hubd reads them only when "
                               f"owner-only; run: chmod 600 {wide} {group}")
    assert survey([("journal", fine, False)]).refusal() is None


def test_files_that_must_be_this_users_are_named_with_the_chown(tmp_path):
    need_root("hand a file to another user")
    theirs = tmp_path / "store.json"
    theirs.write_text("{}")
    os.chmod(theirs, 0o600)
    os.chown(theirs, NOBODY, NOBODY)
    assert survey([("journal", theirs, False)]).refusal() is None  # the owner is not its rule
    said = survey([("federation store", theirs, True)]).refusal()
    assert said == (f"federation store {theirs} (owned by uid {NOBODY}) is not owned by the user "
                    f"hubd runs as (uid {os.geteuid()}); run: chown {os.geteuid()} {theirs}")

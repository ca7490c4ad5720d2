"""docs/migration-from-reference.md against the reference hub's own
`synapse hub --help`: a flag both hubs take is listed as carrying over, and
every flag only the reference takes is listed as one hubd does not have (by
name or by a `--prefix*`). Before this, the page listed four flags as
missing from hubd that hubd takes (--advertised-host and the three
recipient-liveness flags)."""

import re
import subprocess

from tests.support.prereq import missing
from tests.support.procs import reference_env
from tests.unit.test_migration_doc import carried_over, hubd_flags, not_in_hubd


def reference_flags(venv, home) -> set[str]:
    out = subprocess.run([str(venv / "bin" / "synapse"), "hub", "--help"], check=True,
                         capture_output=True, text=True, env=reference_env(home)).stdout
    usage = out[:out.index("options:")]  # `[--flag ARG]` and `[--a | --no-a]`
    return set(re.findall(r"[\[|] ?(--[a-z0-9][a-z0-9-]*)", usage)) - {"--help"}


def test_the_page_sorts_every_reference_flag(reference_venv_status, tmp_path):
    venv, why = reference_venv_status
    if venv is None:
        missing(why)
    theirs, ours = reference_flags(venv, tmp_path / "home"), hubd_flags()
    assert len(theirs) > 100
    assert (theirs & ours) - carried_over() == set()
    listed = not_in_hubd()
    unlisted = {flag for flag in theirs - ours
                if not any(flag == name or (prefix and flag.startswith(name))
                           for name, prefix in listed)}
    assert unlisted == set()

"""Files that hold secrets are owner-only: one rule and one refusal for all.

The journal (message bodies, token digests, webhook secrets), the principals
file, the broker token, and federation's serving policy, store and client CA
are refused when the group or others have any permission on them (the
reference hub's rule; 0600 and 0400 are the usual modes), with the one line
that fixes it.
"""

from __future__ import annotations

import os
import stat

OTHERS = stat.S_IRWXG | stat.S_IRWXO


def open_to_others(label: str, files: list[tuple[str | os.PathLike, int]]) -> str | None:
    """The refusal for `files` ((path, st_mode) pairs; `label` names the
    first) when any of them gives the group or others access, else None."""
    wide = [(os.fspath(path), stat.S_IMODE(mode)) for path, mode in files if mode & OTHERS]
    if not wide:
        return None
    (first, mode), rest = wide[0], wide[1:]
    modes = "; ".join([f"mode {mode:04o}"] + [f"{path} mode {m:04o}" for path, m in rest])
    return (f"{label} {first} is accessible by other users ({modes}); it must be owner-only; "
            f"run: chmod 600 {' '.join(path for path, _ in wide)}")

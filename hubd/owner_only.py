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


def survey(files: list[tuple[str, str | os.PathLike, bool]]) -> str | None:
    """One refusal naming every file of `files` ((label, path, must be this
    user's) triples) that gives the group or others access, or that must
    belong to the user hubd runs as and does not, with the commands that fix
    them all; None when every one that exists is safe. A missing file is
    left to the check that reads it.

    hubd runs it before it starts (and `hubd --check`), so an operator
    learns every unsafe file at once, not one per start."""
    wide: list[tuple[str, str, int]] = []
    foreign: list[tuple[str, str, int]] = []
    seen: set[str] = set()
    for label, path, owned in files:
        path = os.fspath(path)
        if path in seen:
            continue
        seen.add(path)
        try:
            info = os.stat(path)
        except OSError:
            continue
        if not stat.S_ISREG(info.st_mode):
            continue  # a folder or socket where a file should be: its own check explains
        if info.st_mode & OTHERS:
            wide.append((label, path, stat.S_IMODE(info.st_mode)))
        if owned and info.st_uid != os.geteuid():
            foreign.append((label, path, info.st_uid))
    if not wide and not foreign:
        return None
    said = []
    if wide:
        said.append(f"{_listing([(label, path, f'mode {mode:04o}') for label, path, mode in wide])} "
                    f"{'is' if len(wide) == 1 else 'are'} accessible by other users; hubd reads "
                    f"{'it' if len(wide) == 1 else 'them'} only when owner-only; "
                    f"run: chmod 600 {' '.join(path for _, path, _ in wide)}")
    if foreign:
        said.append(f"{_listing([(label, path, f'owned by uid {uid}') for label, path, uid in foreign])} "
                    f"{'is' if len(foreign) == 1 else 'are'} not owned by the user hubd runs as "
                    f"(uid {os.geteuid()}); run: chown {os.geteuid()} "
                    f"{' '.join(path for _, path, _ in foreign)}")
    return "; ".join(said)


def _listing(items: list[tuple[str, str, str]]) -> str:
    return ", ".join(f"{label} {path} ({what})" for label, path, what in items)

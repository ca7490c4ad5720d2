"""Files that hold secrets are owner-only: one rule and one refusal for all.

The journal (message bodies, token digests, webhook secrets), the principals
file, the broker token, and federation's serving policy, store and client CA
are refused when the group or others have any permission on them (the
reference hub's rule; 0600 and 0400 are the usual modes), with the one line
that fixes it. `open_to_others` is the check each reader makes when it opens
its file (at start, on a reload); `survey` looks at all of them before a hub
starts, so one refusal names every unsafe file.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field

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


@dataclass
class Survey:
    """What `survey` found: files open to others (label, path, mode) and
    files that must be this user's and are not (label, path, owner uid)."""

    wide: list[tuple[str, str, int]] = field(default_factory=list)
    foreign: list[tuple[str, str, int]] = field(default_factory=list)

    @property
    def paths(self) -> set[str]:
        return {path for _, path, _ in self.wide + self.foreign}

    def refusal(self) -> str | None:
        """One message naming every unsafe file and the commands that fix them all."""
        said = []
        if self.wide:
            listed = _listing([(label, path, f"mode {mode:04o}")
                               for label, path, mode in self.wide])
            said.append(f"{listed} {_is(self.wide)} accessible by other users; hubd reads "
                        f"{'it' if len(self.wide) == 1 else 'them'} only when owner-only; "
                        f"run: chmod 600 {' '.join(path for _, path, _ in self.wide)}")
        if self.foreign:
            listed = _listing([(label, path, f"owned by uid {uid}")
                               for label, path, uid in self.foreign])
            said.append(f"{listed} {_is(self.foreign)} not owned by the user hubd runs as "
                        f"(uid {os.geteuid()}); run: chown {os.geteuid()} "
                        f"{' '.join(path for _, path, _ in self.foreign)}")
        return "; ".join(said) or None


def survey(files: list[tuple[str, str | os.PathLike, bool]]) -> Survey:
    """Every file of `files` ((label, path, must be this user's) triples)
    that gives the group or others access, or that must belong to the user
    hubd runs as and does not. A missing file, or one that is no regular
    file, is left to the check that reads it.

    hubd runs it before it starts (and `hubd --check`), so an operator
    learns every unsafe file at once, not one per start."""
    found = Survey()
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
            found.wide.append((label, path, stat.S_IMODE(info.st_mode)))
        if owned and info.st_uid != os.geteuid():
            found.foreign.append((label, path, info.st_uid))
    return found


def _is(items: list) -> str:
    return "is" if len(items) == 1 else "are"


def _listing(items: list[tuple[str, str, str]]) -> str:
    return ", ".join(f"{label} {path} ({what})" for label, path, what in items)

"""Files that hold secrets are owner-only: one rule and one refusal for all.

The journal (message bodies, token digests, webhook secrets), the principals
file, the broker token, and federation's serving policy, store and client CA
are refused when the group or others have any permission on them (the
reference hub's rule; 0600 and 0400 are the usual modes), with the one line
that fixes it. `open_to_others` is the check each reader makes when it opens
its file (at start, on a reload); `survey` looks at all of them before a hub
starts, so one refusal names every unsafe file; `read_owner_only_file` reads
trust material (a serving policy, a federation store, a client CA) safely.
"""

from __future__ import annotations

import errno
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


# Trust files are small; a bound keeps a wrong path (a log, a device) from
# being read into memory whole.
MAX_FILE_BYTES = 4 * 1024 * 1024


class OwnerOnlyFileError(ValueError):
    """The file is refused; the message names it and says why."""


def read_owner_only_file(path: str | os.PathLike[str], label: str) -> bytes:
    """The bytes of `path`, read once through one descriptor, if it is safe to trust.

    Safe means: no symbolic link anywhere in the path, a regular file, owned by
    the effective user, no permission bits for group or others (the reference
    hub's rule: 0600 and 0400 are the usual modes), non-empty, and at most
    MAX_FILE_BYTES. Every check is made on the open descriptor, so the file
    cannot be swapped between the check and the read.
    """
    path = os.fspath(path)
    try:
        fd = _open_without_symlinks(path)
    except OSError as exc:
        raise OwnerOnlyFileError(_open_failure(label, path, exc)) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OwnerOnlyFileError(f"{label} {path} is not a regular file")
        if info.st_uid != os.geteuid():
            raise OwnerOnlyFileError(
                f"{label} {path} is owned by uid {info.st_uid}, not by the user hubd runs as "
                f"(uid {os.geteuid()}); run: chown {os.geteuid()} {path}"
            )
        refused = open_to_others(label, [(path, info.st_mode)])
        if refused is not None:
            raise OwnerOnlyFileError(refused)
        if info.st_size > MAX_FILE_BYTES:
            raise OwnerOnlyFileError(f"{label} {path} is larger than {MAX_FILE_BYTES} bytes")
        chunks = []
        remaining = MAX_FILE_BYTES + 1
        while remaining > 0:
            chunk = os.read(fd, min(remaining, 1 << 16))
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
        data = b"".join(chunks)
    except OSError as exc:
        raise OwnerOnlyFileError(f"cannot read {label} {path}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if len(data) > MAX_FILE_BYTES:  # grew after fstat
        raise OwnerOnlyFileError(f"{label} {path} is larger than {MAX_FILE_BYTES} bytes")
    if not data.strip():
        raise OwnerOnlyFileError(f"{label} {path} is empty")
    return data


def _open_without_symlinks(path: str) -> int:
    """Open `path` read-only, refusing a symbolic link in *any* component.

    O_NOFOLLOW alone only guards the last component; walking the directories
    one at a time with O_NOFOLLOW guards the rest, as the reference hub does.
    """
    if not path:
        raise OSError(errno.ENOENT, "empty path")
    components = [part for part in path.split("/") if part not in ("", ".")]
    if not components:
        raise OSError(errno.EISDIR, os.strerror(errno.EISDIR))
    # O_PATH opens a directory without needing read permission on it (Linux);
    # with O_NOFOLLOW|O_DIRECTORY a symlinked directory fails with ENOTDIR.
    dir_flags = getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY | os.O_CLOEXEC
    dir_fd = os.open("/" if path.startswith("/") else ".", dir_flags)
    try:
        for part in components[:-1]:
            next_fd = os.open(part, dir_flags | os.O_NOFOLLOW, dir_fd=dir_fd)
            os.close(dir_fd)
            dir_fd = next_fd
        # O_NONBLOCK: opening a FIFO must not hang; fstat then refuses it.
        return os.open(
            components[-1],
            os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
            dir_fd=dir_fd,
        )
    finally:
        os.close(dir_fd)


def _open_failure(label: str, path: str, exc: OSError) -> str:
    if exc.errno == errno.ELOOP:
        return (f"{label} {path} is a symbolic link; hubd reads only regular files "
                "it can open without following links; point the setting at the real file")
    if exc.errno == errno.ENOTDIR:
        return (f"cannot open {label} {path}: a directory in the path is a symbolic link "
                "or not a directory; hubd follows no symbolic links; use the real path")
    if exc.errno == errno.ENOENT:
        return f"cannot open {label} {path}: no such file"
    return f"cannot open {label} {path}: {exc.strerror or exc}"

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

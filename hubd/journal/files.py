"""The journal's files on disk: made owner-only, refused when others can
read them, and a journal that cannot be opened explained.

The journal holds message bodies, token digests and webhook secrets. SQLite
makes the -wal and -shm files with the database file's mode, so creating
the database 0600 before SQLite first opens it keeps all three owner-only.
SQLite says "unable to open database file" whatever the cause; the checks
here say which it is and what to do, before SQLite is asked.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from hubd.owner_only import open_to_others

SIDE_FILES = ("-wal", "-shm")


class JournalFileError(RuntimeError):
    """The journal's path cannot be used as it is; the message says why and
    what to do."""


def prepare_for_writing(path: str | Path) -> None:
    """Create the journal owner-only if it does not exist; raise
    JournalFileError when it, or the -wal and -shm files beside it, cannot be
    read and written, or when others may read any of them.

    An existing journal is only looked at (stat, access), never opened: this
    process may hold SQLite connections to it, and closing any other
    descriptor of the file would drop their POSIX locks."""
    path = Path(path)
    try:
        info = _stat_or_create(path)
    except OSError as exc:
        raise JournalFileError(_why_not(path, exc)) from None
    if stat.S_ISDIR(info.st_mode):
        raise JournalFileError(_why_not(path, IsADirectoryError(errno.EISDIR, "")))
    if not os.access(path, os.R_OK | os.W_OK):
        raise JournalFileError(_why_not(path, PermissionError(errno.EACCES, "")))
    files = [(path, info.st_mode)]
    for suffix in SIDE_FILES:
        side = Path(f"{path}{suffix}")
        try:
            files.append((side, side.stat().st_mode))
        except FileNotFoundError:
            if not os.access(path.parent, os.W_OK | os.X_OK):
                raise JournalFileError(
                    f"journal {path}: no permission to create {side.name} in its folder "
                    f"{path.parent} (SQLite keeps the -wal and -shm files beside the journal); "
                    f"let uid {os.geteuid()} write there, or choose another --db") from None
    refused = open_to_others("journal", files)
    if refused is not None:
        raise JournalFileError(refused)


def check_without_creating(path: str | Path) -> None:
    """prepare_for_writing's verdict without making the journal (`hubd
    --check`): JournalFileError when an existing journal could not be used,
    or when a new one could not be made where `path` says."""
    path = Path(path)
    if os.path.lexists(path):
        prepare_for_writing(path)  # it exists: only looked at
        return
    folder = path.parent
    if not folder.is_dir():
        missing = errno.ENOTDIR if os.path.lexists(folder) else errno.ENOENT
        raise JournalFileError(_why_not(path, OSError(missing, "")))
    if not os.access(folder, os.W_OK | os.X_OK):
        raise JournalFileError(_why_not(path, PermissionError(errno.EACCES, "")))


def _stat_or_create(path: Path) -> os.stat_result:
    try:
        return os.stat(path)
    except FileNotFoundError:
        pass
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))
    except FileExistsError:  # made meanwhile by another process
        pass
    return os.stat(path)


def _why_not(path: Path, exc: OSError) -> str:
    folder = path.parent
    if exc.errno == errno.EISDIR:
        return (f"journal {path} is a directory, not a file; name a file in it, e.g. "
                f"--db {path / 'hubd.db'}")
    if exc.errno == errno.ENOENT:
        return (f"journal {path}: its folder {folder} does not exist; create it "
                f"(mkdir -p {folder}) or choose another --db")
    if exc.errno == errno.ENOTDIR:
        return f"journal {path}: a part of its folder {folder} is a file, not a folder"
    if exc.errno == errno.EACCES:
        if path.exists():
            return (f"journal {path}: no permission to read and write it as uid "
                    f"{os.geteuid()} (it is owned by uid {_owner(path)}); run hubd as its "
                    "owner, or chown the journal and its -wal and -shm files")
        return (f"journal {path} does not exist and uid {os.geteuid()} may not create files in "
                f"{folder}; let it write there, or choose another --db")
    if exc.errno == errno.EROFS:
        return f"journal {path} is on a read-only file system; choose another --db"
    return f"journal {path} cannot be opened: {exc.strerror or exc}"


def _owner(path: Path) -> str:
    try:
        return str(path.stat().st_uid)
    except OSError:
        return "?"

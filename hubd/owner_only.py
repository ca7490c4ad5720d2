"""Files that hold secrets are owner-only: one rule and one refusal for all.

The journal (message bodies, token digests, webhook secrets), the principals
file, the broker token, and federation's serving policy, store and client CA
are refused when the group or others have any permission on them (the
reference hub's rule; 0600 and 0400 are the usual modes), with the one line
that fixes it. `read_owner_only_file` reads such a file safely (trust
material: a serving policy, a federation store, a client CA).
"""

from __future__ import annotations

import errno
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

"""Snapshot files: the journal's projection at a seq, beside the journal
(docs/journal.md, "Snapshots").

`<db>.snapshots/<seq, 20 digits>.snap`, owner-only in an owner-only folder:

    HUBDSNAP\\n<header: canonical JSON>\\n<body><sha256 of everything before it>

The header says which format, hubd and projection (`fingerprint`) wrote it,
the hub and seq it is of, and a digest of the journal row at that seq (a
snapshot of another journal, or of rows since rewritten, does not match it).
The body is hubd/state/frozen.py's. A snapshot is written to a temporary
file in the same folder, fsynced, renamed into place and the folder fsynced,
so a crash at any point leaves either the new file whole or no new file; the
newest `keep` are kept.

This module knows files only: what a snapshot holds and when one is taken
are hubd/state/frozen.py's and hubd/actors/snapshotter.py's.
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import orjson

MAGIC = b"HUBDSNAP\n"
FORMAT = 1
SUFFIX = ".snap"
DIGEST_BYTES = 32
TEMP_PREFIX = ".tmp-"
# written in pieces so a fault hook can stop a write in the middle
WRITE_CHUNK = 1 << 20


class SnapshotInvalid(ValueError):
    """A snapshot file that must not be used; the message says why."""


@dataclass(frozen=True, slots=True)
class SnapshotFile:
    seq: int
    path: Path


def snapshot_dir(db: str | os.PathLike) -> Path:
    return Path(f"{os.fspath(db)}.snapshots")


def listed(directory: Path) -> list[SnapshotFile]:
    """The snapshot files in `directory`, newest (highest seq) first."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    found = []
    for name in names:
        stem, dot, suffix = name.partition(".")
        if dot and "." + suffix == SUFFIX and stem.isdigit():
            found.append(SnapshotFile(int(stem), directory / name))
    found.sort(key=lambda f: f.seq, reverse=True)
    return found


def row_digest(row: tuple) -> str:
    """The digest of a journal row (seq, ts, kind, payload) a snapshot is of."""
    seq, ts, kind, payload = row
    return hashlib.sha256(orjson.dumps([seq, ts, kind, payload])).hexdigest()


def encode(header: dict, body: bytes) -> bytes:
    head = orjson.dumps(header, option=orjson.OPT_SORT_KEYS)
    content = b"".join((MAGIC, head, b"\n", body))
    return content + hashlib.sha256(content).digest()


def decode(data: bytes) -> tuple[dict, bytes]:
    """(header, body) of a snapshot file's bytes; SnapshotInvalid if it is not
    one, is cut short or fails its checksum."""
    if not data.startswith(MAGIC):
        raise SnapshotInvalid("not a hubd snapshot (no HUBDSNAP header)")
    if len(data) < len(MAGIC) + DIGEST_BYTES:
        raise SnapshotInvalid("cut short")
    content, digest = data[:-DIGEST_BYTES], data[-DIGEST_BYTES:]
    if hashlib.sha256(content).digest() != digest:
        raise SnapshotInvalid("checksum mismatch (the file is damaged or cut short)")
    end = content.find(b"\n", len(MAGIC))
    if end < 0:
        raise SnapshotInvalid("no header line")
    try:
        header = orjson.loads(content[len(MAGIC):end])
    except orjson.JSONDecodeError as exc:
        raise SnapshotInvalid(f"header is not JSON: {exc}") from None
    if not isinstance(header, dict):
        raise SnapshotInvalid("header is not a JSON object")
    if header.get("format") != FORMAT:
        raise SnapshotInvalid(f"snapshot format {header.get('format')!r}; this hubd reads "
                              f"format {FORMAT}")
    return header, content[end + 1:]


def read(file: SnapshotFile, max_bytes: int) -> tuple[dict, bytes]:
    """The header and body of a snapshot file, if it is owner-only, at most
    max_bytes, and whole (SnapshotInvalid otherwise)."""
    try:
        fd = os.open(file.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise SnapshotInvalid(f"cannot be opened: {exc.strerror or exc}") from None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise SnapshotInvalid("not a regular file")
        if info.st_uid != os.geteuid() or info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise SnapshotInvalid("not owner-only (a snapshot is only trusted when no other "
                                  "user could have written it)")
        if info.st_size > max_bytes:
            raise SnapshotInvalid(f"{info.st_size} bytes, over the bound of {max_bytes}")
        data = handle.read()
    header, body = decode(data)
    if header.get("seq") != file.seq:
        raise SnapshotInvalid(f"its header says seq {header.get('seq')!r}, its name {file.seq}")
    return header, body


def prepare_dir(directory: Path) -> None:
    """Make the snapshot folder owner-only (refuse one others may use)."""
    directory.mkdir(mode=0o700, exist_ok=True)
    info = os.stat(directory, follow_symlinks=False)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() \
            or info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise OSError(f"snapshot folder {directory} must be an owner-only folder of uid "
                      f"{os.geteuid()} (chmod 700 it)")


def write(directory: Path, seq: int, data: bytes, keep: int,
          midway: Callable[[], None] | None = None) -> Path:
    """Write one snapshot file durably and keep the newest `keep`. `midway`
    (a test's fault hook) runs once half of the file is written and synced."""
    prepare_dir(directory)
    final = directory / f"{seq:020d}{SUFFIX}"
    temp = directory / f"{TEMP_PREFIX}{seq:020d}.{os.getpid()}"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        view = memoryview(data)
        half = len(data) // 2
        written = 0
        while written < len(data):
            end = min(len(data), written + WRITE_CHUNK)
            if midway is not None and written <= half < end:
                end = half
            written += os.write(fd, view[written:end])
            if midway is not None and written == half:
                os.fsync(fd)
                midway()
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        temp.unlink(missing_ok=True)
        raise
    os.close(fd)
    os.replace(temp, final)
    _fsync_dir(directory)
    prune(directory, keep)
    return final


def prune(directory: Path, keep: int) -> list[Path]:
    """Remove all but the newest `keep` snapshots; the removed paths."""
    removed = [f.path for f in listed(directory)[max(keep, 1):]]
    for path in removed:
        path.unlink(missing_ok=True)
    if removed:
        _fsync_dir(directory)
    return removed


def remove_temporaries(directory: Path) -> list[Path]:
    """Temporary files a writer left when it died (only called when no writer runs)."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    removed = [directory / n for n in names if n.startswith(TEMP_PREFIX)]
    for path in removed:
        path.unlink(missing_ok=True)
    return removed


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

"""Checks before a hub starts, and what `hubd --check` reports.

At every start, hubd/owner_only.py's `survey` looks at every file hubd reads
only when it is owner-only (the journal and its -wal and -shm, the principals
file, the broker's token, the serving policy with its store and client CA, a
config file holding a secret) and names all that are not in one refusal,
with the commands that fix them: an operator fixes them in one go, not one
per start.

`--check` adds `problems`: every file the hub would refuse at start loaded as
the hub loads it (the journal's folder, the principals file, federation's
policy and certificates), each failure named. Nothing is created or changed.
The listener's port is not tried: the hub the file configures may be running.
"""

from __future__ import annotations

import os
from pathlib import Path

from hubd.config import HubConfig
from hubd.config_file import FILE, SECRET_KEYS, Layers


def owner_only_files(config: HubConfig, layers: Layers | None = None
                     ) -> list[tuple[str, str | os.PathLike, bool]]:
    """(label, path, must be this user's) of the core's owner-only files."""
    db = Path(config.db)
    files: list[tuple[str, str | os.PathLike, bool]] = [
        ("journal", db, False), ("journal", f"{db}-wal", False), ("journal", f"{db}-shm", False)]
    if config.principals_file is not None:
        files.append(("principals file", config.principals_file, False))
    if config.broker is not None:
        files.append(("broker token file", config.broker.token_file, False))
    if layers is not None and layers.path is not None:
        secrets = sorted(key for key in SECRET_KEYS
                         if layers.sources[layers.actions[key].dest] == FILE)
        if secrets:
            files.append((f"config file (it holds {', '.join(secrets)})", layers.path, False))
    return files


def problems(config: HubConfig, surveyed: set[str] = frozenset()) -> list[str]:
    """What the core would refuse at start besides the owner-only survey
    (files in `surveyed` it already refused are not read)."""
    from hubd.actors.identity import read_principals_file
    from hubd.actors.signed_identity import load_signed_identity
    from hubd.state.acl import PolicyError
    from hubd.journal.files import JournalFileError, check_without_creating
    from hubd.state.principals import PrincipalError

    found = []
    try:
        check_without_creating(config.db)
    except JournalFileError as exc:
        found.append(str(exc))
    if config.principals_file is not None and os.fspath(config.principals_file) not in surveyed:
        try:
            read_principals_file(config.principals_file, config.token)
        except PrincipalError as exc:
            found.append(str(exc))
    try:
        load_signed_identity(config.security)
    except PolicyError as exc:
        found.append(str(exc))
    return found

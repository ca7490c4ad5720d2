"""Federation's files, checked before a hub starts and by `hubd --check`.

`owner_only_files` lists the files hubd reads only when owner-only and owned
by its user (the serving policy, the federation store and the client CA it
names), so one survey can name every unsafe one at once (hubd/owner_only.py).
`file_problems` loads every file the federation flags name, as the hub would
at start, and names every one that fails rather than the first.
"""

from __future__ import annotations

import json
import os

from .config import FederationConfig, merged_routes
from .policy import PolicyError
from .policy_loading import CLIENT_CA_LABEL, POLICY_LABEL, STORE_LABEL, load_serving_policy


def owner_only_files(config: FederationConfig | None) -> list[tuple[str, str, bool]]:
    """(label, path, must be this user's) of the serving policy and the two
    files it names. The policy is read here only for those two names; its
    trust is decided when it is loaded."""
    if config is None or config.serving_policy_path is None:
        return []
    path = os.fspath(config.serving_policy_path)
    files = [(POLICY_LABEL, path, True)]
    try:
        with open(path, "rb") as handle:
            document = json.loads(handle.read(4 * 1024 * 1024).decode("utf-8-sig"))
    except (OSError, ValueError):
        return files  # loading it says what is wrong
    if isinstance(document, dict):
        for key, label in (("federation_store", STORE_LABEL), ("client_ca_file", CLIENT_CA_LABEL)):
            named = document.get(key)
            if isinstance(named, str) and named:
                files.append((label, os.path.join(os.path.dirname(path), named), True))
    return files


def file_problems(config: FederationConfig | None, surveyed: set[str] = frozenset()) -> list[str]:
    """Every federation file that would refuse the hub's start, each named;
    the serving policy is not loaded when the owner-only survey already
    refused one of its files (in `surveyed`)."""
    from .pki import PkiError  # cryptography's X.509: only `hubd --check` needs it here
    from .tls import server_context

    if config is None:
        return []
    problems = []
    policy = None
    policy_files = {path for _, path, _ in owner_only_files(config)}
    if config.serving_policy_path is not None and not policy_files & surveyed:
        try:
            policy = load_serving_policy(config.serving_policy_path)
        except PolicyError as exc:
            problems.append(str(exc))
    if config.tls_certfile is not None:
        try:
            server_context(config.tls_certfile, config.tls_keyfile,
                           client_ca_pem=policy.client_ca_pem if policy else None)
        except PkiError as exc:
            problems.append(str(exc))
    if any(route.secure for route in merged_routes(config).values()):
        try:
            config.client_context()
        except PkiError as exc:
            problems.append(str(exc))
    return problems

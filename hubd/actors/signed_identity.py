"""The reference's identity files, loaded: the trust bundle, the ACL policy,
the role grants and the per-message keys, as one immutable snapshot the
Router decides with (docs/identity.md, "The reference's identity files").

It sits beside the principal table (hubd/actors/identity.py): the principals
say which token may speak for which seat; this says which key proves a
sender, which frames the ACL lets through and who holds which role. Read at
start (a file that cannot be used refuses the start) and on SIGHUP (one that
cannot be used keeps the running snapshot).
"""

from __future__ import annotations

import json
import stat
from dataclasses import dataclass, field
from pathlib import Path

from hubd.config import SecurityConfig
from hubd.owner_only import open_to_others
from hubd.state.acl import PolicyError, Rule, parse_acl_policy, parse_role_grants
from hubd.state.card_trust import CardKey, parse_card_trust
from hubd.state.identity_binding import TrustedKey, parse_trust_bundle
from hubd.state.message_auth import KeyFormatError, MacKey, keyring, parse_key_file

MAX_FILE_BYTES = 4 * 1024 * 1024
MAX_KEY_FILE_BYTES = 1024 * 1024
# trust material nobody else may change (reading it is harmless: keys are public)
_WRITABLE_BY_OTHERS = stat.S_IWGRP | stat.S_IWOTH


@dataclass(frozen=True)
class SignedIdentity:
    config: SecurityConfig = field(default_factory=SecurityConfig)
    trusted_keys: dict[str, TrustedKey] = field(default_factory=dict)
    acl: tuple[Rule, ...] | None = None  # None: no --acl-policy
    role_grants: dict[str, tuple[str, ...]] = field(default_factory=dict)
    mac_keys: dict[str, MacKey] = field(default_factory=dict)
    card_keys: dict[str, CardKey] = field(default_factory=dict)  # --capability-card-trust

    @property
    def binding_required(self) -> bool:
        return self.config.require_identity_binding

    @property
    def acl_enforced(self) -> bool:
        return self.config.require_acl and self.acl is not None

    @property
    def message_auth_required(self) -> bool:
        return self.config.require_message_auth

    def summary(self) -> dict:
        """For /health and the start's log line: what is enforced, never a key."""
        return {"identity_binding": self.binding_required,
                "trusted_keys": len(self.trusted_keys), "acl": self.acl_enforced,
                "acl_rules": len(self.acl or ()), "roles": len(self.role_grants),
                "message_auth": self.message_auth_required,
                "message_auth_keys": len(self.mac_keys),
                "message_auth_sequence_floor": self.config.message_auth_floor_mode}


def _read_json(path: Path, what: str):
    try:
        info = path.stat()
    except FileNotFoundError:
        raise PolicyError(f"{what} does not exist: {path}") from None
    except OSError as exc:
        raise PolicyError(f"cannot read {what} {path}: {exc.strerror}") from None
    if info.st_mode & _WRITABLE_BY_OTHERS:
        raise PolicyError(f"{what} {path} is writable by other users "
                          f"(mode {stat.S_IMODE(info.st_mode):04o}); run: chmod 600 {path}")
    if info.st_size > MAX_FILE_BYTES:
        raise PolicyError(f"{what} {path} is over {MAX_FILE_BYTES} bytes")
    try:
        return json.loads(path.read_bytes())
    except OSError as exc:
        raise PolicyError(f"cannot read {what} {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise PolicyError(f"{what} {path} is not JSON: {exc}") from None


def read_key_file(path: Path) -> list[MacKey]:
    """--message-auth-key-file: owner-only, one KEY_ID:SECRET:SENDER[,...] a
    line; PolicyError says why not (the reference's sentences)."""
    try:
        info = path.stat()
        loose = open_to_others("--message-auth-key-file", [(str(path), info.st_mode)])
        if loose is not None:
            raise PolicyError(loose)
        if info.st_size > MAX_KEY_FILE_BYTES:
            raise PolicyError(f"--message-auth-key-file {path} is over "
                              f"{MAX_KEY_FILE_BYTES} bytes")
        return parse_key_file(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise PolicyError(f"cannot read --message-auth-key-file {path}: {exc.strerror}") \
            from None
    except UnicodeDecodeError:
        raise PolicyError(f"--message-auth-key-file {path} is not UTF-8") from None
    except KeyFormatError as exc:
        raise PolicyError(str(exc)) from None


def mac_keyring(config: SecurityConfig) -> dict[str, MacKey]:
    """The per-message keys: --message-auth-key's and the key file's, now."""
    keys = list(config.message_auth_keys)
    if config.message_auth_key_file is not None:
        keys += read_key_file(config.message_auth_key_file)
    try:
        return keyring(keys)
    except KeyFormatError as exc:
        raise PolicyError(str(exc)) from None


def load_signed_identity(config: SecurityConfig) -> SignedIdentity:
    """Every file the flags name, read and checked; PolicyError says why not."""

    def load(path: Path | None, what: str, parse):
        if path is None:
            return None
        try:
            return parse(_read_json(path, what))
        except PolicyError as exc:
            text = str(exc)
            raise PolicyError(text if str(path) in text else f"{what} {path}: {text}") from None

    trusted = load(config.identity_trust, "identity trust bundle", parse_trust_bundle) or {}
    acl = load(config.acl_policy, "ACL policy", parse_acl_policy)
    roles = load(config.role_grants, "role grants", parse_role_grants) or {}
    cards = load(config.capability_card_trust, "capability-card trust bundle",
                 parse_card_trust) or {}
    return SignedIdentity(config, trusted, acl, roles, mac_keyring(config), cards)

"""The hub's principals, kept current (docs/identity.md).

One home for "who is this token": the doors authenticate with `table`, the
Router decides with it. The table is an immutable snapshot swapped whole: from
the journal's principal tables, looked at twice a second (so `hubd principal
...` applies within a second), or from `--principals FILE`, re-read on SIGHUP
(a file that cannot be used is refused and the old table kept). When the table
changes, the Router re-checks every session against it: a revoked token or a
seat its principal no longer covers is closed (4010).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import structlog

from hubd.actors.signed_identity import SignedIdentity, load_signed_identity
from hubd.core.commands import PRINCIPALS_CHANGED
from hubd.journal.principals import JournalPrincipals
from hubd.owner_only import open_to_others
from hubd.state.acl import PolicyError
from hubd.state.principals import (PrincipalError, PrincipalTable, build_table,
                                   parse_principals_file)

log = structlog.get_logger("hubd.identity")

MAX_FILE_BYTES = 4 * 1024 * 1024


def read_principals_file(path: Path, shared_token: str | None) -> PrincipalTable:
    """The file's table, or PrincipalError saying why it cannot be used."""
    try:
        info = path.stat()
        data = path.read_bytes() if info.st_size <= MAX_FILE_BYTES else None
    except OSError as exc:
        raise PrincipalError(f"cannot read principals file {path}: {exc.strerror}") from exc
    refused = open_to_others("principals file", [(path, info.st_mode)])
    if refused is not None:
        raise PrincipalError(refused)
    if data is None:
        raise PrincipalError(f"principals file {path} is over {MAX_FILE_BYTES} bytes")
    try:
        doc = json.loads(data)
    except ValueError as exc:
        raise PrincipalError(f"principals file {path} is not JSON: {exc}") from exc
    try:
        return parse_principals_file(doc, shared_token, source=str(path))
    except PrincipalError as exc:
        raise PrincipalError(f"principals file {path}: {exc}") from None


def _signed(config) -> SignedIdentity:
    try:
        return load_signed_identity(config.security)
    except PolicyError as exc:
        raise PrincipalError(str(exc)) from None


def _change_text(table: PrincipalTable) -> str:
    if table.open:
        return "no principals and no tokens left; the hub is open again"
    if not table.tokenless:
        return "every agent needs a token (the shared --token, or a principal's)"
    if table.held_everything:
        return "a principal holds every seat ('*'): every agent needs a token"
    return ("principals hold seats now: a seat a principal holds needs its token; agents "
            "without a token keep every other seat, as before")


class IdentityWatch:
    def __init__(self, config):
        self.config = config
        self.table: PrincipalTable = build_table([], [], config.token, source="none")
        self._journal = JournalPrincipals(config.db) if config.principals_file is None else None
        self.router = None  # set once the Router exists
        # the reference's identity files (trust bundle, ACL, role grants,
        # per-message keys): hubd/actors/signed_identity.py
        self.signed = SignedIdentity(config.security)

    async def open(self) -> None:
        """The first read, before any door admits a connection (a file that
        cannot be used stops the start)."""
        self.signed = _signed(self.config)
        if self.signed.summary() != SignedIdentity().summary():
            log.info("signed identity", **self.signed.summary())
        security = self.config.security
        if security.require_message_auth:
            # the reference says this on stderr; hubd's ledger is its journal
            log.info("durable message-auth replay enabled", ledger="journal",
                     sequence_floor=security.message_auth_floor_mode,
                     **({"replay_db_not_opened": str(security.message_auth_replay_db)}
                        if security.message_auth_replay_db is not None else {}))
        if self._journal is None:
            self._swap(read_principals_file(self.config.principals_file, self.config.token))
        else:
            table = await asyncio.to_thread(self._journal.read, self.config.token)
            if table is not None:
                self._swap(table)
        t = self.table
        if t.open:
            log.warning("open hub: no --token and no principals; agents are admitted from "
                        "loopback only" if not self.config.open_network else
                        "open hub: no --token and no principals, and --open-network admits "
                        "agents from any address under any name")
        else:
            log.info("principals", source=t.source, principals=len(t.principals),
                     shared_token=t.shared is not None,
                     seats_bound=t.enforcing, tokenless=self._tokenless(t))

    async def run(self) -> None:
        if self._journal is None:
            return
        while True:
            await asyncio.sleep(self.config.timing.principals_poll)
            try:
                table = await asyncio.to_thread(self._journal.read, self.config.token)
            except PrincipalError as exc:
                log.error("principal tables refused; the running ones are kept", reason=str(exc))
                continue
            if table is not None:
                self._swap(table)
                log.info("principals reloaded", principals=len(table.principals),
                         tokens=len(table.by_digest))

    def summary(self) -> dict:
        """For /health: where the principals come from, what kind of hub this
        is, and who may connect without a token."""
        t = self.table
        return {"mode": self._mode(t), "tokenless": self._tokenless(t), "source": t.source,
                "principals": len(t.principals), "tokens": len(t.by_digest)}

    def _mode(self, t: PrincipalTable) -> str:
        return ("principals" if t.enforcing else "shared-token" if not t.open
                else "open-network" if self.config.open_network else "open-loopback")

    def _tokenless(self, t: PrincipalTable) -> str:
        """Where agents without a token may connect from (on the seats no
        principal holds): nowhere on a hub with a shared --token."""
        if not t.tokenless:
            return "refused"
        return "any-address" if self.config.open_network else "loopback"

    def reload(self) -> dict:
        """SIGHUP: re-read the files (PrincipalError, a ValueError: keep the old)."""
        signed = _signed(self.config)
        if self.config.principals_file is not None:
            self._swap(read_principals_file(self.config.principals_file, self.config.token))
        self.signed = signed
        changed = {"signed_identity": signed.summary()} if signed.summary() != \
            SignedIdentity().summary() else {}
        if self.config.principals_file is None:
            return changed
        return {**changed, "principals": len(self.table.principals)}

    def _swap(self, table: PrincipalTable) -> None:
        old, self.table = self.table, table
        if self.router is not None and (self._mode(old), old.held_everything) != \
                (self._mode(table), table.held_everything):
            # once per change of kind, not per session it closes (each of
            # those is logged as it is closed)
            log.warning("identity changed: " + _change_text(table),
                        before=self._mode(old), after=self._mode(table),
                        tokenless=self._tokenless(table))
        if self.router is not None:
            self.router.post_control(PRINCIPALS_CHANGED)

    async def close(self) -> None:
        if self._journal is not None:
            await asyncio.to_thread(self._journal.close)

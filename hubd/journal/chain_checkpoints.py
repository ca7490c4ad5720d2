"""Signed checkpoints of the journal's hash chain (docs/journal.md, "The hash
chain and its checkpoints").

A checkpoint says "hub H's journal had link L at seq N", signed with the
hub's Ed25519 checkpoint key. One at every multiple of `--checkpoint-every`
(seqs N, 2N, ...), one at every snapshot's seq, and one at the head when a
hub starts with rows after its last checkpoint. Log pulls serve them beside the rows, so a peer checks what
it is served against what this hub signed, and two signed checkpoints of one
hub for one seq with different links are a proof, to anyone, that its
history was rewritten (equivocation).

The key: hubd had no Ed25519 key of its own (federation's TLS identity is
ECDSA P-256, and only a federated hub has one), so each journal gets one,
made at its first start, kept beside it in `<db>.chain-key` (owner-only,
the raw 32-byte seed, hex) and not in the journal, so whoever can change the
journal's rows cannot also sign a new history unless they can read that
file too. Its public key is recorded in the journal's meta (`chain_key`).

The pure parts (signing, checking, `due`, `conflict`) come first; the
table's reads and writes after.
"""

from __future__ import annotations

import os
import sqlite3
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from hubd.owner_only import OwnerOnlyFileError, read_owner_only_file
from hubd.wire.digests import canonical_json

SIGNED_DOMAIN = b"hubd:journal-checkpoint:v1\x00"
DEFAULT_EVERY = 1000
TABLE = ("CREATE TABLE IF NOT EXISTS checkpoints (seq INTEGER PRIMARY KEY, head TEXT NOT NULL, "
         "hub_id TEXT NOT NULL, key TEXT NOT NULL, signature TEXT NOT NULL, created REAL)")


class CheckpointInvalid(ValueError):
    """A checkpoint that is not well formed or whose signature does not hold."""


@dataclass(frozen=True, slots=True)
class Checkpoint:
    hub_id: str
    seq: int
    head: str  # the chain link at seq, hex
    key: str  # the signer's Ed25519 public key, hex
    signature: str  # hex

    def signed_bytes(self) -> bytes:
        return SIGNED_DOMAIN + canonical_json({"head": self.head, "hub_id": self.hub_id,
                                               "seq": self.seq})

    def to_json(self) -> dict:
        return asdict(self)


def public_hex(private: Ed25519PrivateKey) -> str:
    return private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw).hex()


def sign(private: Ed25519PrivateKey, hub_id: str, seq: int, head: bytes) -> Checkpoint:
    unsigned = Checkpoint(hub_id, seq, head.hex(), public_hex(private), "")
    return Checkpoint(hub_id, seq, head.hex(), unsigned.key,
                      private.sign(unsigned.signed_bytes()).hex())


def from_json(value) -> Checkpoint:
    """A checkpoint as served or stored, checked: well formed and its
    signature holds for the key it names. CheckpointInvalid otherwise."""
    if not isinstance(value, dict):
        raise CheckpointInvalid("a checkpoint is not an object")
    hub_id, seq = value.get("hub_id"), value.get("seq")
    head, key, signature = value.get("head"), value.get("key"), value.get("signature")
    if not isinstance(hub_id, str) or not hub_id:
        raise CheckpointInvalid("checkpoint hub_id must be a non-empty string")
    if isinstance(seq, bool) or not isinstance(seq, int) or seq < 1:
        raise CheckpointInvalid("checkpoint seq must be a positive integer")
    for name, text, size in (("head", head, 32), ("key", key, 32), ("signature", signature, 64)):
        if not isinstance(text, str) or len(text) != 2 * size:
            raise CheckpointInvalid(f"checkpoint {name} must be {size} bytes of hex")
        try:
            bytes.fromhex(text)
        except ValueError:
            raise CheckpointInvalid(f"checkpoint {name} is not hex") from None
    checkpoint = Checkpoint(hub_id, seq, head.lower(), key.lower(), signature.lower())
    check(checkpoint)
    return checkpoint


def check(checkpoint: Checkpoint) -> None:
    try:
        Ed25519PublicKey.from_public_bytes(bytes.fromhex(checkpoint.key)).verify(
            bytes.fromhex(checkpoint.signature), checkpoint.signed_bytes())
    except (InvalidSignature, ValueError):
        raise CheckpointInvalid(f"checkpoint at seq {checkpoint.seq}: the signature does not "
                                "hold for its key") from None


def due(first_seq: int, last_seq: int, every: int) -> range:
    """The seqs a commit of rows first_seq..last_seq signs: the multiples of
    `every` among them (0: none). At fixed seqs, not at a commit's end, so
    two histories of one hub are signed at the same seqs whatever their
    commits grouped: a rewritten one shows a second head for a seq."""
    if every <= 0:
        return range(0)
    return range(-(-first_seq // every) * every, last_seq + 1, every)


def conflict(a: Checkpoint, b: Checkpoint) -> bool:
    """Two checkpoints that cannot both be true: one hub, one key, one seq,
    two heads, both signatures holding (check each before)."""
    return (a.hub_id, a.key, a.seq) == (b.hub_id, b.key, b.seq) and a.head != b.head


# -- the key file

def key_path(db: str | Path) -> Path:
    return Path(f"{db}.chain-key")


def load_or_create_key(db: str | Path) -> Ed25519PrivateKey:
    """The journal's checkpoint key, made (owner-only) when there is none.
    OwnerOnlyFileError when the file is unsafe or not a key."""
    path = key_path(db)
    if not os.path.lexists(path):
        private = Ed25519PrivateKey.generate()
        seed = private.private_bytes_raw().hex().encode() + b"\n"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, seed)
            os.fsync(fd)
        finally:
            os.close(fd)
        return private
    text = read_owner_only_file(path, "journal checkpoint key").strip()
    try:
        return Ed25519PrivateKey.from_private_bytes(bytes.fromhex(text.decode()))
    except ValueError:
        raise OwnerOnlyFileError(f"journal checkpoint key {path} is not 32 bytes of hex "
                                 "(an Ed25519 seed)") from None


# -- the table (on the connection that owns it)

def ensure_table(conn: sqlite3.Connection) -> None:
    conn.execute(TABLE)


def store(conn: sqlite3.Connection, checkpoint: Checkpoint) -> None:
    conn.execute("INSERT OR REPLACE INTO checkpoints (seq, head, hub_id, key, signature, "
                 "created) VALUES (?, ?, ?, ?, ?, ?)",
                 (checkpoint.seq, checkpoint.head, checkpoint.hub_id, checkpoint.key,
                  checkpoint.signature, time.time()))


def _rows(conn: sqlite3.Connection, where: str, params: tuple) -> list[Checkpoint]:
    try:
        rows = conn.execute(f"SELECT hub_id, seq, head, key, signature FROM checkpoints {where}",
                            params).fetchall()
    except sqlite3.OperationalError as exc:
        if "no such table" in str(exc):
            return []
        raise
    return [Checkpoint(*row) for row in rows]


def between(conn: sqlite3.Connection, after: int, through: int) -> list[Checkpoint]:
    return _rows(conn, "WHERE seq > ? AND seq <= ? ORDER BY seq", (after, through))


def newest_at_or_before(conn: sqlite3.Connection, seq: int) -> Checkpoint | None:
    found = _rows(conn, "WHERE seq <= ? ORDER BY seq DESC LIMIT 1", (seq,))
    return found[0] if found else None


def last_seq(conn: sqlite3.Connection) -> int:
    found = _rows(conn, "ORDER BY seq DESC LIMIT 1", ())
    return found[0].seq if found else 0


class Signer:
    """The writer's side: signs the head when a commit makes one due, and at
    a seq asked for (a snapshot's). Runs on the writer's thread."""

    def __init__(self, conn: sqlite3.Connection, hub_id: str, private: Ed25519PrivateKey,
                 every: int):
        self.conn, self.hub_id, self.private, self.every = conn, hub_id, private, every
        self.last_seq = last_seq(conn)
        conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('chain_key', ?)",
                     (public_hex(private),))

    def committed(self, rows: list[tuple]) -> None:
        """Rows just committed, each ending with its link, in seq order."""
        first = rows[0][0]
        for seq in due(first, rows[-1][0], self.every):
            index = seq - first
            row = rows[index] if index < len(rows) and rows[index][0] == seq else next(
                (r for r in rows if r[0] == seq), None)
            if row is not None:
                self.at(seq, row[-1])

    def at(self, seq: int, head: bytes) -> Checkpoint:
        checkpoint = sign(self.private, self.hub_id, seq, head)
        store(self.conn, checkpoint)
        self.last_seq = max(self.last_seq, seq)
        return checkpoint

"""Scoped attachments (wire v4): who may use which verb, and what a request's
fields must be; pure (docs/attachments.md; docs/reference-observed.md §13).

Every refusal is a text of the reference's (`attachment_result.error`), which
clients branch on. Nothing here touches storage: the handler
(hubd/handlers/attachments.py) asks these first and the store second.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass

import pybase64

from hubd.state.acl import ATTACHMENT_VERBS, Rule, allowed, holds_role, project_of

# the reference's limits (§13.4)
MAX_LENGTH = 8 * 1024 * 1024
CHUNK_BYTES = 32 * 1024
MAX_CHUNK_ENCODED = 43692  # base64 of CHUNK_BYTES, with room for padding
SCOPE_QUOTA_BYTES = 256 * 1024 * 1024
# open uploads: the reference allows 4 in the whole hub; hubd allows 4 per
# sender and 64 in the hub (a fifth from one sender is refused either way)
MAX_UPLOADS_PER_SENDER = 4
MAX_UPLOADS_PER_HUB = 64

DISABLED = "attachments disabled"
VERSION_FOUR = "attachment protocol version four required"
DENIED = "attachment access denied"
UNAVAILABLE = "attachment unavailable"
EXISTS = "attachment already exists"
TOO_MANY = "too many active uploads"
BAD_LENGTH = "invalid attachment length"
BAD_DIGEST = "invalid attachment digest"
BAD_MEDIA = "invalid media type"
BAD_PROVENANCE = "invalid provenance"
BAD_EXPIRY = "invalid expiry"
BAD_OFFSET = "invalid chunk offset"
BAD_CHUNK_LENGTH = "invalid chunk length"
BAD_CHUNK = "invalid attachment chunk"
UNKNOWN_UPLOAD = "unknown upload"
INCOMPLETE = "upload incomplete"
MISMATCH = "attachment digest mismatch"
BAD_READ_OFFSET = "invalid read offset"
EXPIRED = "attachment expired"
BAD_REF = "invalid attachment reference"
SCOPE_QUOTA = "attachment scope quota exceeded"
# hubd's: the root holds its byte bound; nothing committed is touched
ROOT_FULL = "attachment store full"

# an attachment scope (a project name) and a content digest (sha256 hex), as
# the reference accepts them; cross-hub grants (attachment_grants) read the same
SCOPE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")
DIGEST = re.compile(r"[0-9a-f]{64}\Z")
_MEDIA = re.compile(r"[a-z0-9][a-z0-9.+-]*/[a-z0-9][a-z0-9.+-]{0,80}\Z")
_PROVENANCE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:/#@-]{0,255}\Z")
_REF = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}\Z")
_UPLOAD_ID = re.compile(r"[0-9a-f]{48}\Z")


def _is_int(value) -> bool:
    return type(value) is int


def _is_number(value) -> bool:
    return type(value) in (int, float)


def access_error(type_: str, frame: dict, sender: str, version: int | None,
                 roles: dict, rules: tuple[Rule, ...] | None) -> str | None:
    """The refusal of a request before anything is looked up: the wire
    version of the registration, the scope (the sender's project), the role
    grant `<scope>/<permission>` and an ACL rule for it."""
    if version is None or version < 4:
        return VERSION_FOUR
    scope = frame.get("scope")
    if not isinstance(scope, str) or not SCOPE.match(scope) or scope != project_of(sender):
        return DENIED
    permission = ATTACHMENT_VERBS[type_]
    if not holds_role(roles, sender, f"{scope}/{permission}"):
        return DENIED
    if rules is None or not allowed(rules, sender, permission, "attachment", scope):
        return DENIED
    return None


@dataclass(frozen=True, slots=True)
class Metadata:
    scope: str
    digest: str
    length: int
    media_type: str
    provenance: str
    expires_at: float

    def as_wire(self) -> dict:
        return {"scope": self.scope, "digest": self.digest, "length": self.length,
                "media_type": self.media_type, "provenance": self.provenance,
                "expires_at": self.expires_at}


def read_begin(frame: dict, now: float) -> Metadata | str:
    """A begin's metadata, or the refusal naming its first bad field."""
    names = ("digest", "length", "media_type", "provenance", "expires_at")
    if any(frame.get(name) is None for name in names):
        return UNAVAILABLE
    length, digest = frame["length"], frame["digest"]
    if not _is_int(length) or not 0 <= length <= MAX_LENGTH:
        return BAD_LENGTH
    if not isinstance(digest, str) or not DIGEST.match(digest):
        return BAD_DIGEST
    media = frame["media_type"]
    if not isinstance(media, str) or not _MEDIA.match(media):
        return BAD_MEDIA
    provenance = frame["provenance"]
    if not isinstance(provenance, str) or not _PROVENANCE.match(provenance):
        return BAD_PROVENANCE
    expires = frame["expires_at"]
    if not _is_number(expires) or not expires > now:
        return BAD_EXPIRY
    return Metadata(frame["scope"], digest, length, media, provenance, float(expires))


def strict_b64decode(text: str) -> bytes | None:
    """`base64.b64decode(text, validate=True)`, or None where it raises.

    pybase64 (SIMD) decodes a chunk's 44 KB in ~2 us against ~120 us; it
    refuses a few texts the standard library accepts (padding after a full
    quantum, "0000="), so a refusal is asked of the standard library again
    and only its verdict counts."""
    try:
        return pybase64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        pass
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return None


def read_chunk(frame: dict, received: int, length: int) -> bytes | str:
    """A chunk's bytes, or its refusal: the offset must be what the upload
    holds, the body standard base64 of 1..32768 bytes not running past the
    declared length."""
    offset, body = frame.get("offset"), frame.get("body")
    if not _is_int(offset) or offset != received:
        return BAD_OFFSET
    if not isinstance(body, str) or len(body) > MAX_CHUNK_ENCODED:
        return BAD_CHUNK
    data = strict_b64decode(body)
    if data is None:
        return BAD_CHUNK
    if not 0 < len(data) <= CHUNK_BYTES or received + len(data) > length:
        return BAD_CHUNK_LENGTH
    return data


def chunk_finished(received: int, expected: int, offset: int, size: int,
                   stored: bool) -> tuple[int, int, bool]:
    """An upload's (received, expected, counted) once its chunk at `offset`
    of `size` bytes finished. Stored (written, its frame committed) and next
    in line, it counts. Otherwise it does not (a failed one, or one sent on
    after a failed one), and the upload expects again at most `offset`: the
    client's retry there is accepted (docs/attachments.md, "Failures")."""
    if stored and offset == received:
        return received + size, max(expected, received + size), True
    return received, max(received, min(expected, offset)), False


def read_offset(frame: dict, length: int) -> int | str:
    offset = frame.get("offset", 0)
    if offset is None:
        offset = 0
    if not _is_int(offset) or not 0 <= offset <= length:
        return BAD_READ_OFFSET
    return offset


def upload_id_of(frame: dict) -> str | None:
    value = frame.get("upload_id")
    return value if isinstance(value, str) and _UPLOAD_ID.match(value) else None


def digest_of(frame: dict) -> str | None:
    value = frame.get("digest")
    return value if isinstance(value, str) and DIGEST.match(value) else None


def ref_of(frame: dict) -> str | None:
    value = frame.get("ref")
    return value if isinstance(value, str) and _REF.match(value) else None


def upload_refusal(sender_open: int, hub_open: int) -> str | None:
    if sender_open >= MAX_UPLOADS_PER_SENDER or hub_open >= MAX_UPLOADS_PER_HUB:
        return TOO_MANY
    return None


def space_refusal(length: int, scope_bytes: int, root_bytes: int, root_limit: int) -> str | None:
    """Room for an upload of `length`: the scope's quota, then the root's bound
    (bytes committed and reserved by open uploads)."""
    if scope_bytes + length > SCOPE_QUOTA_BYTES:
        return SCOPE_QUOTA
    if root_bytes + length > root_limit:
        return ROOT_FULL
    return None

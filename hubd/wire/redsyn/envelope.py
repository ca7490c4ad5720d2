"""REDSYN envelope v1: addresses, validation of what a node sends, and the
typed errors every endpoint answers with ({"error": ..., "status": N}).

Pure: no IO, no clock (callers pass `now`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from dataclasses import dataclass

from .canonical import NotCanonicalizable, canonical_bytes

API_VERSION = "2026-09-25"
# the door name (Opened.door) of the REDSYN door's endpoint: whose dialect
# its commands are (hubd/handlers/redsyn/)
DOOR = "redsyn"
KNOWN_VERSIONS = (API_VERSION,)

KINDS = frozenset({"request", "progress", "reply", "event"})
ENCRYPTED_TYPE = "application/redsyn+encrypted"

NAME = r"[a-z0-9._-]{1,64}"
_NAME = re.compile(NAME)
_SESSION = re.compile(r"s[1-9][0-9]{0,9}|new")
_ID = re.compile(r"[A-Za-z0-9._~-]{1,128}")

# Limits (docs/redsyn.md, "Limits"). The HTTP body limit is checked by the door
# before parsing; these are checked on the parsed envelope.
MAX_REQUEST_BYTES = 8 * 1024 * 1024       # one POST, files included
MAX_ENVELOPE_BYTES = 256 * 1024           # the envelope without files
MAX_FILES_BYTES = 4 * 1024 * 1024         # the decoded zip
MAX_REFS = 32
MAX_TEXT_FIELD = 1024                     # ref url/note, description
MAX_TTL = 7 * 86400
DEFAULT_TTL = 86400


class RedsynError(Exception):
    """An answer other than 2xx: its status and the text a person reads."""

    def __init__(self, status: int, error: str, **extra):
        super().__init__(error)
        self.status = status
        self.error = error
        self.extra = extra

    def document(self) -> dict:
        return {"error": self.error, "status": self.status, **self.extra}


class Forbidden(RedsynError):
    """403 for authority: the caller may not act for this agent or person.
    The door logs it as an auth denial (a 403 for a quota is not one)."""

    def __init__(self, error: str, **extra):
        super().__init__(403, error, **extra)


def bad(error: str) -> RedsynError:
    return RedsynError(400, error)


# -- addresses


@dataclass(frozen=True, slots=True)
class Address:
    """org/team/user/agent, with an optional session (sN, or "new")."""

    org: str
    team: str
    user: str
    agent: str
    session: str | None = None

    @property
    def agent_address(self) -> str:
        return f"{self.org}/{self.team}/{self.user}/{self.agent}"

    @property
    def person(self) -> str:
        return f"{self.org}/{self.team}/{self.user}"

    def __str__(self) -> str:
        return self.agent_address + (f"#{self.session}" if self.session else "")

    def with_session(self, session: str | None) -> "Address":
        return Address(self.org, self.team, self.user, self.agent, session)


@dataclass(frozen=True, slots=True)
class Topic:
    org: str
    team: str
    name: str

    def __str__(self) -> str:
        return f"topic:{self.org}/{self.team}/{self.name}"


def parse_person(text: str) -> str:
    parts = text.split("/")
    if len(parts) != 3 or not all(_NAME.fullmatch(p) for p in parts):
        raise bad(f"a person is org/team/user in lowercase letters, digits, '.', '-', '_' "
                  f"(got {text!r})")
    return text


def check_org(text) -> str:
    """An organization's name: the first segment of its addresses."""
    if not isinstance(text, str) or not _NAME.fullmatch(text):
        raise bad(f"an organization is a name of lowercase letters, digits, '.', '-', '_' "
                  f"(got {text!r})")
    return text


def parse_address(text, sender: Address | None = None, what: str = "address") -> Address:
    """A full address, or a short form resolved from the sender: `agent` (the
    sender's user and team), `user/agent` (its team), `team/user/agent` (its org)."""
    if not isinstance(text, str) or not text:
        raise bad(f"{what} must be a non-empty string")
    base, _, session = text.partition("#")
    if "#" in text and not _SESSION.fullmatch(session):
        raise bad(f"{what} {text!r}: a session is #s<number> or #new")
    parts = base.split("/")
    if not 1 <= len(parts) <= 4 or not all(_NAME.fullmatch(p) for p in parts):
        raise bad(f"{what} {text!r} is not org/team/user/agent (lowercase letters, digits, "
                  "'.', '-', '_')")
    if len(parts) < 4:
        if sender is None:
            raise bad(f"{what} {text!r} must be a full address org/team/user/agent")
        parts = [sender.org, sender.team, sender.user][: 4 - len(parts)] + parts
    return Address(*parts, session or None)


def parse_topic(text: str) -> Topic:
    if not isinstance(text, str) or not text.startswith("topic:"):
        raise bad(f"a topic is topic:org/team/name (got {text!r})")
    parts = text[len("topic:"):].split("/")
    if len(parts) != 3 or not all(_NAME.fullmatch(p) for p in parts):
        raise bad(f"a topic is topic:org/team/name in lowercase letters, digits, '.', '-', '_' "
                  f"(got {text!r})")
    return Topic(*parts)


def check_id(value, what: str = "id") -> str:
    if not isinstance(value, str) or not _ID.fullmatch(value):
        raise bad(f"{what} must be 1-128 characters of letters, digits, '.', '_', '~', '-'")
    return value


# -- base64url


def b64url_decode(text, what: str) -> bytes:
    if not isinstance(text, str):
        raise bad(f"{what} must be a base64url string")
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        raise bad(f"{what} is not valid base64url") from None


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def b64_decode_any(text, what: str) -> bytes:
    """Standard or url-safe base64, with or without padding (files.zip)."""
    if not isinstance(text, str):
        raise bad(f"{what} must be a base64 string")
    try:
        return base64.b64decode(text.replace("-", "+").replace("_", "/")
                                + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise bad(f"{what} is not valid base64") from None


# -- the envelope a node sends


@dataclass(frozen=True, slots=True)
class Incoming:
    """A validated envelope as it arrived, before the hub resolves it.

    `fields` keeps the envelope's known fields as sent (what a signature
    covers); `to` is None only for a reply or progress that names no
    recipient (it goes back to its request's sender and session)."""

    fields: dict
    kind: str
    sender: Address
    to: Address | Topic | None
    files: bytes | None
    files_sha256: str
    encrypted: bool
    size: int
    digest: str  # sha256 of the RFC 8785 form of `fields` and files_sha256


def _text(value, what: str, limit: int = MAX_TEXT_FIELD, required: bool = False) -> str:
    if value is None and not required:
        return ""
    if not isinstance(value, str):
        raise bad(f"{what} must be a string")
    if len(value) > limit:
        raise bad(f"{what} is longer than {limit} characters")
    return value


def _body(value) -> bool:
    """Checks the body; True when it is an encrypted one."""
    if not isinstance(value, dict):
        raise bad("body must be an object with a \"type\"")
    type_ = value.get("type")
    if not isinstance(type_, str) or not type_ or len(type_) > 128:
        raise bad("body.type must be a non-empty media type")
    if type_ == "text/plain" and not isinstance(value.get("text"), str):
        raise bad("a text/plain body needs \"text\", a string")
    if type_ == ENCRYPTED_TYPE:
        enc = value.get("enc")
        if not isinstance(enc, dict) or enc.get("v") != 1 or \
                enc.get("alg") != "P256-HKDF-SHA256-A256GCM":
            raise bad("an encrypted body needs enc {v: 1, alg: P256-HKDF-SHA256-A256GCM, ...}")
        for name in ("epk", "nonce", "ct"):
            if not isinstance(enc.get(name), str) or not enc[name]:
                raise bad(f"body.enc.{name} must be a base64url string")
            b64url_decode(enc[name], f"body.enc.{name}")
        if len(b64url_decode(enc["epk"], "body.enc.epk")) != 65:
            raise bad("body.enc.epk must be an uncompressed P-256 point (65 bytes)")
        if len(b64url_decode(enc["nonce"], "body.enc.nonce")) != 12:
            raise bad("body.enc.nonce must be 12 bytes")
        files_nonce = enc.get("files_nonce", "")
        if not isinstance(files_nonce, str):
            raise bad("body.enc.files_nonce must be a string")
        return True
    return False


def _refs(value) -> list:
    if value is None:
        return []
    if not isinstance(value, list) or len(value) > MAX_REFS:
        raise bad(f"refs must be a list of at most {MAX_REFS} objects")
    for ref in value:
        if not isinstance(ref, dict) or not isinstance(ref.get("url"), str):
            raise bad("each ref is an object with a \"url\" string (and an optional \"note\")")
        _text(ref["url"], "ref url")
        _text(ref.get("note"), "ref note")
    return value


SIGNED_TEXT_FIELDS = ("id", "kind", "from", "to", "thread", "reply_to")


def validate(document, sender_person: str, encoded_size: int) -> Incoming:
    """Check one envelope a node POSTed (already JSON-decoded).

    `sender_person` is the node's person: `from` must be one of its agents
    (a bare agent name is resolved against it)."""
    if not isinstance(document, dict):
        raise bad("the request body must be one JSON envelope (an object)")
    if document.get("v") != 1 or isinstance(document.get("v"), bool):
        raise bad("envelope \"v\" must be 1")
    kind = document.get("kind")
    if not isinstance(kind, str) or kind not in KINDS:
        raise bad(f"kind must be one of {', '.join(sorted(KINDS))}")
    org, team, user = sender_person.split("/")
    person = Address(org, team, user, "_")
    sender = parse_address(document.get("from"), person, "from")
    if sender.person != sender_person:
        raise Forbidden(f"this node speaks for {sender_person}/..., not for {sender}")
    if sender.session == "new" and kind != "request":
        raise bad("#new opens a session for a request; a reply goes back in its own session")

    raw_to = document.get("to")
    to: Address | Topic | None
    if raw_to in (None, ""):
        if kind not in ("reply", "progress"):
            raise bad("\"to\" is required (only a reply or progress may omit it)")
        to = None
    elif kind == "event":
        to = parse_topic(raw_to)
    elif isinstance(raw_to, str) and raw_to.startswith("topic:"):
        raise bad("only an envelope of kind \"event\" goes to a topic")
    else:
        to = parse_address(raw_to, sender, "to")
        if to.session == "new":
            raise bad("#new is for the sender's own address")

    if document.get("id") is not None:
        check_id(document["id"])
    for name in ("thread", "reply_to"):
        if document.get(name) not in (None, ""):
            check_id(document[name], name)
    if kind in ("reply", "progress") and document.get("reply_to") in (None, ""):
        raise bad(f"a {kind} needs reply_to, the id of its request")
    ts = document.get("ts")
    if ts is not None and (not isinstance(ts, int) or isinstance(ts, bool) or ts < 0):
        raise bad("ts must be the Unix time in whole seconds")
    ttl = document.get("ttl")
    if ttl is not None and (not isinstance(ttl, int) or isinstance(ttl, bool)
                            or not 1 <= ttl <= MAX_TTL):
        raise bad(f"ttl must be whole seconds from 1 to {MAX_TTL}")
    if "body" not in document:
        raise bad("body is required")
    encrypted = _body(document["body"])
    if encrypted and kind == "event":
        raise bad("events to topics are not encrypted in this version")
    refs = _refs(document.get("refs"))
    if encrypted and refs:
        raise bad("an encrypted envelope sends refs: [] (the refs are sealed inside)")
    error = document.get("error", False)
    if not isinstance(error, bool):
        raise bad("error must be true or false")

    files = None
    files_sha256 = ""
    raw_files = document.get("files")
    if raw_files not in (None, {}):
        if not isinstance(raw_files, dict) or set(raw_files) != {"zip"} or \
                not isinstance(raw_files["zip"], str):
            raise bad("files must be {\"zip\": \"<base64 of a zip>\"}")
        if len(raw_files["zip"]) > MAX_FILES_BYTES * 4 // 3 + 4:
            raise RedsynError(413, f"files are larger than {MAX_FILES_BYTES} bytes")
        files = b64_decode_any(raw_files["zip"], "files.zip")
        if len(files) > MAX_FILES_BYTES:
            raise RedsynError(413, f"files are larger than {MAX_FILES_BYTES} bytes")
        files_sha256 = hashlib.sha256(files).hexdigest()
    files_encoded = len(raw_files["zip"]) if files is not None else 0
    if encoded_size - files_encoded > MAX_ENVELOPE_BYTES:
        raise RedsynError(413, f"the envelope without files is larger than "
                               f"{MAX_ENVELOPE_BYTES} bytes")

    sig = document.get("sig")
    if sig is not None:
        if not isinstance(sig, dict) or sig.get("alg") != "ed25519" or \
                not isinstance(sig.get("key"), str) or not isinstance(sig.get("value"), str):
            raise bad("sig must be {\"alg\": \"ed25519\", \"key\": ..., \"value\": ...}")

    # "sig": null is an unsigned envelope, as the seed's signed_by reads it
    fields = {name: document.get(name) for name in (
        "v", "id", "kind", "from", "to", "thread", "reply_to", "ts", "ttl", "body", "refs",
        "error", "sig") if name in document and not (name == "sig" and sig is None)}
    fields["refs"] = refs
    fields["error"] = error
    try:
        digest = hashlib.sha256(canonical_bytes({**fields, "files_sha256": files_sha256}))
    except NotCanonicalizable as exc:
        # what is signed and what identifies a message is its RFC 8785 form:
        # an envelope without one (an integer beyond 2**53, 1e400, nesting
        # deeper than 64) can be neither
        raise bad(f"the envelope has no RFC 8785 canonical form: {exc}") from None
    return Incoming(fields, kind, sender, to, files, files_sha256, encrypted, encoded_size,
                    digest.hexdigest())

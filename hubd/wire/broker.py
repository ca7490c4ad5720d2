"""The local broker's wire (seed 004, protocol version 2): sans-IO.

Newline-delimited JSON. Every client line is `{"v": 2, "id": N, "type": ...}`
plus the verb's fields; every answer echoes the id:

    {"v":2,"id":N,"ok":true,"result":{...}}
    {"v":2,"id":N,"ok":false,"error":{"code":"...","message":"..."}}

Server events (push, notification) carry no id. A line is at most 1 MiB.

`LineSplitter` cuts a byte stream into lines without ever holding more than one
line's bound; `parse_line` turns one line into a `Request` or a `WireError`
naming the error code and the sentence the client gets. Nothing here raises on
bad input.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

import orjson

from hubd.wire.codec import nests_deeper
from hubd.wire.utf8 import utf8_problem

PROTOCOL_VERSION = 2
# the door names (Opened.door) of the broker's connections and of its
# transcript watcher: whose dialect their commands are (hubd/handlers/broker/)
DOOR = "broker"
PROOFS_DOOR = "broker-proofs"
# the broker's verbs that are verbs of the shared vocabulary (each line
# becomes that command; the others are Requests named broker.<verb>)
SHARED_VERBS = {"register": "register", "session": "register", "send": "send",
                "reply": "send", "fetch-push": "take", "delivered": "ack", "ack": "ack"}
MAX_LINE_BYTES = 1024 * 1024
MAX_DEPTH = 32

# error codes (seed 004), every one the broker answers with
AUTH_REQUIRED = "auth_required"
BAD_TOKEN = "bad_token"
BROKER_CLOSED = "broker_closed"
BROKER_DOWN = "broker_down"
UNKNOWN_HANDLE = "unknown_handle"
UNKNOWN_GROUP = "unknown_group"
UNKNOWN_THREAD = "unknown_thread"
UNKNOWN_MESSAGE = "unknown_message"
DUPLICATE = "duplicate"
RATE_LIMITED = "rate_limited"
CAP_THREAD = "cap_thread"
CAP_INBOX = "cap_inbox"
BAD_REQUEST = "bad_request"
TIMEOUT = "timeout"
NATIVE_FAILED = "native_failed"
INTERNAL = "internal"
ERROR_CODES = (AUTH_REQUIRED, BAD_TOKEN, BROKER_CLOSED, BROKER_DOWN, UNKNOWN_HANDLE,
               UNKNOWN_GROUP, UNKNOWN_THREAD, UNKNOWN_MESSAGE, DUPLICATE, RATE_LIMITED,
               CAP_THREAD, CAP_INBOX, BAD_REQUEST, TIMEOUT, NATIVE_FAILED, INTERNAL)
# hubd's own (docs/broker.md): a handle the broker's principal may not speak for
FORBIDDEN = "forbidden"
HUBD_ERROR_CODES = (FORBIDDEN,)

# types (seed 004)
DELIVERY_STATES = ("queued", "sent", "delivered", "acknowledged", "replied")
VERDICTS = ("agree", "disagree", "info")
MODES = ("push", "notify", "silent")
PRESENCE_STATES = ("online", "busy", "idle", "offline", "presumed-offline")
CLI_NAMES = ("claude", "codex", "gemini", "zcode", "opencode", "hummin", "other")
CLIENT_KINDS = ("mcp", "cli", "hook", "adapter")
SESSION_EVENTS = ("session-start", "prompt", "stop", "session-end")
WAIT_UNTIL = ("all_replied", "any_replied")
GROUP_ACTIONS = ("create", "list", "add", "remove", "delete")
NOTIFICATION_KINDS = ("reply_arrived", "queued_delivered", "peer_offline")

HANDLE_RE = re.compile(r"^[a-z0-9][a-z0-9-]{1,47}$")
# a client id is a positive integer that fits the JSON number every client has
MAX_ID = 2 ** 53 - 1


@dataclass(frozen=True, slots=True)
class WireError:
    """A line the broker refuses: its code, the sentence, and the id to echo
    (None when the line had no usable id)."""

    code: str
    message: str
    id: int | None = None


@dataclass(frozen=True, slots=True)
class Request:
    id: int
    type: str
    fields: dict


class LineTooLong:
    """Stands in for a line longer than the bound; its bytes were discarded."""

    __slots__ = ("size",)

    def __init__(self, size: int):
        self.size = size


class LineSplitter:
    """Cuts bytes into lines. Holds at most MAX_LINE_BYTES of an unfinished line:
    past that, the rest of the line is skipped up to its newline and the line is
    reported once as LineTooLong."""

    def __init__(self, limit: int = MAX_LINE_BYTES):
        self.limit = limit
        self._parts: list[bytes] = []
        self._held = 0
        self._skipping = 0  # bytes of an over-long line skipped so far (0: not skipping)

    def feed(self, data: bytes) -> list:
        out: list = []
        start = 0
        while start < len(data):
            end = data.find(b"\n", start)
            if end < 0:
                self._hold(data[start:], out)
                break
            self._hold(data[start:end], out)
            if self._skipping:
                out.append(LineTooLong(self._skipping))
                self._skipping = 0
            else:
                line = b"".join(self._parts)
                if line.strip():
                    out.append(line)
            self._parts, self._held = [], 0
            start = end + 1
        return out

    def _hold(self, chunk: bytes, out: list) -> None:
        if self._skipping:
            self._skipping += len(chunk)
            return
        if self._held + len(chunk) > self.limit:
            self._skipping = self._held + len(chunk)
            self._parts, self._held = [], 0
            return
        if chunk:
            self._parts.append(chunk)
            self._held += len(chunk)

    @property
    def pending_bytes(self) -> int:
        return self._held


def too_long_error(size: int) -> WireError:
    return WireError(BAD_REQUEST, f"Line of {size} bytes exceeds the {MAX_LINE_BYTES}-byte "
                                  "bound; it was discarded.")


# -- field checks: each returns an error sentence or None

Check = Callable[[object], "str | None"]


def _string(value) -> str | None:
    return None if isinstance(value, str) else "must be a string"


def _text(value) -> str | None:
    return None if isinstance(value, str) and value.strip() else "must be a non-empty string"


def _boolean(value) -> str | None:
    return None if isinstance(value, bool) else "must be true or false"


def _integer(value) -> bool:
    return type(value) is int


def _positive(value) -> str | None:
    return None if _integer(value) and 0 < value <= MAX_ID else "must be a positive integer"


def _nullable_positive(value) -> str | None:
    return None if value is None else _positive(value)


def _nullable_count(value) -> str | None:
    if value is None:
        return None
    return None if _integer(value) and 0 <= value <= MAX_ID else \
        "must be null or a non-negative integer"


def _ids(value) -> str | None:
    if not isinstance(value, list) or not value or len(value) > 1000:
        return "must be a list of 1 to 1000 message ids"
    return None if all(_integer(v) and 0 < v <= MAX_ID for v in value) else \
        "must hold positive integers only"


def _references(value) -> str | None:
    if not isinstance(value, list) or len(value) > 100:
        return "must be a list of at most 100 message ids"
    return None if all(_integer(v) and 0 < v <= MAX_ID for v in value) else \
        "must hold positive integers only"


def _handle(value) -> str | None:
    return None if isinstance(value, str) and HANDLE_RE.match(value) else \
        "must be a handle (^[a-z0-9][a-z0-9-]{1,47}$)"


def _target_item(value) -> bool:
    return isinstance(value, str) and 0 < len(value) <= 256 and value.strip() == value


def _to(value) -> str | None:
    if _target_item(value):
        return None
    if isinstance(value, list) and 0 < len(value) <= 100 and all(_target_item(v) for v in value):
        return None
    return "must be a handle, a group, a hub target, or a list of 1 to 100 of them"


def _members(value) -> str | None:
    if not isinstance(value, list) or len(value) > 200:
        return "must be a list of at most 200 handles"
    return None if all(isinstance(v, str) and HANDLE_RE.match(v) for v in value) else \
        "must hold handles only"


def _one_of(values) -> Check:
    def check(value) -> str | None:
        return None if value in values else "must be one of " + ", ".join(values)
    return check


def _host(value) -> str | None:
    if not isinstance(value, dict):
        return "must be an object {hostPid, hostStart}"
    pid, start = value.get("hostPid"), value.get("hostStart")
    if not (_integer(pid) and 0 < pid <= MAX_ID):
        return "hostPid must be a positive integer"
    if not (_integer(start) or isinstance(start, (float, str))) or isinstance(start, bool):
        return "hostStart must be a number or a string"
    return None


def _ancestors(value) -> str | None:
    if not isinstance(value, list) or len(value) > 64:
        return "must be a list of at most 64 pids"
    return None if all(_integer(v) and 0 < v <= MAX_ID for v in value) else \
        "must hold positive integers only"


def _native(value) -> str | None:
    if not isinstance(value, dict):
        return "must be an object {socketPath, token}"
    if _text(value.get("socketPath")) or _string(value.get("token")):
        return "needs socketPath (a path) and token (a string)"
    return None


def _timeout_ms(value) -> str | None:
    return None if _integer(value) and 0 <= value <= WAIT_MAX_MS else \
        f"must be an integer from 0 to {WAIT_MAX_MS}"


def _limit(value) -> str | None:
    return None if _integer(value) and 0 < value <= FETCH_MAX else \
        f"must be an integer from 1 to {FETCH_MAX}"


def _short(check: Check, bound: int) -> Check:
    def bounded(value) -> str | None:
        problem = check(value)
        if problem is None and isinstance(value, str) and len(value) > bound:
            return f"must be at most {bound} characters"
        return problem
    return bounded


WAIT_MAX_MS = 300_000
FETCH_MAX = 100

REQUIRED, OPTIONAL = True, False

# verb -> field -> (required, check). Fields not listed are ignored, so a newer
# client's extra fields do not break an older broker.
VERBS: dict[str, dict[str, tuple[bool, Check]]] = {
    "auth": {"token": (REQUIRED, _string)},
    "register": {
        "handle": (OPTIONAL, _handle),
        "display": (OPTIONAL, _short(_string, 200)),
        "role": (OPTIONAL, _short(_string, 200)),
        "clientKind": (REQUIRED, _one_of(CLIENT_KINDS)),
        "host": (OPTIONAL, _host),
        "ancestors": (OPTIONAL, _ancestors),
        "client": (OPTIONAL, _one_of(CLI_NAMES)),
        "cwd": (OPTIONAL, _short(_string, 4096)),
        "owner": (OPTIONAL, _boolean),
    },
    "session": {
        "event": (REQUIRED, _one_of(SESSION_EVENTS)),
        "client": (REQUIRED, _one_of(CLI_NAMES)),
        "cliSessionId": (REQUIRED, _short(_text, 256)),
        "host": (REQUIRED, _host),
        "transcriptPath": (OPTIONAL, _short(_string, 4096)),
        "title": (OPTIONAL, _short(_string, 200)),
        "cwd": (OPTIONAL, _short(_string, 4096)),
        "handle": (OPTIONAL, _handle),
        "native": (OPTIONAL, _native),
        "listen": (OPTIONAL, _boolean),
    },
    "delivered": {"ids": (REQUIRED, _ids)},
    "send": {
        "threadId": (REQUIRED, _nullable_positive),
        "to": (REQUIRED, _to),
        "body": (REQUIRED, _text),
        "references": (OPTIONAL, _references),
        "mode": (OPTIONAL, _one_of(MODES)),
    },
    "reply": {
        "messageId": (REQUIRED, _positive),
        "body": (REQUIRED, _text),
        "verdict": (OPTIONAL, _one_of(VERDICTS)),
        "references": (OPTIONAL, _references),
    },
    "ack": {"ids": (REQUIRED, _ids)},
    "read": {"ids": (REQUIRED, _ids)},
    "inbox": {"unreadOnly": (REQUIRED, _boolean)},
    "thread": {
        "threadId": (REQUIRED, _positive),
        "sinceSeq": (REQUIRED, _nullable_count),
        "full": (REQUIRED, _boolean),
        "messageId": (OPTIONAL, _positive),
    },
    "collect": {"threadId": (REQUIRED, _positive)},
    "wait": {
        "threadId": (REQUIRED, _positive),
        "until": (REQUIRED, _one_of(WAIT_UNTIL)),
        "timeoutMs": (OPTIONAL, _timeout_ms),
    },
    "groups": {
        "action": (REQUIRED, _one_of(GROUP_ACTIONS)),
        "name": (OPTIONAL, _handle),
        "members": (OPTIONAL, _members),
    },
    "status": {},
    "prune": {},
    "hook": {
        "event": (REQUIRED, _one_of(SESSION_EVENTS)),
        "handle": (OPTIONAL, _handle),
        "sessionHint": (OPTIONAL, _short(_text, 256)),
    },
    "native-register": {
        "handle": (REQUIRED, _handle),
        "socketPath": (REQUIRED, _short(_text, 4096)),
        "token": (REQUIRED, _short(_string, 4096)),
    },
    "fetch-push": {"handle": (REQUIRED, _handle), "limit": (REQUIRED, _limit)},
}


def parse_line(line: bytes | str) -> Request | WireError:
    """One client line -> a Request with its fields checked, or why not."""
    try:
        value = orjson.loads(line)
    except orjson.JSONDecodeError:
        return _not_json(line)
    if not isinstance(value, dict):
        return WireError(BAD_REQUEST, "A line must be a JSON object.")
    raw_id = value.get("id")
    id_ = raw_id if _integer(raw_id) and 0 < raw_id <= MAX_ID else None
    if nests_deeper(line, value, MAX_DEPTH):
        return WireError(BAD_REQUEST, f"JSON nests deeper than {MAX_DEPTH} levels.", id_)
    if id_ is None:
        return WireError(BAD_REQUEST, "Every line carries id, a positive integer.")
    if value.get("v") != PROTOCOL_VERSION or type(value.get("v")) is not int:
        return WireError(BAD_REQUEST, f"Protocol version {PROTOCOL_VERSION} only: every line "
                                      f"carries \"v\": {PROTOCOL_VERSION}.", id_)
    type_ = value.get("type")
    spec = VERBS.get(type_) if isinstance(type_, str) else None
    if spec is None:
        shown = type_ if isinstance(type_, str) else repr(type_)
        return WireError(BAD_REQUEST, f"Unknown message type {shown[:64]!r}.", id_)
    fields: dict = {}
    for name, (required, check) in spec.items():
        if name not in value or (value[name] is None and not _accepts_null(check)):
            if required:
                return WireError(BAD_REQUEST, f"{type_}: field {name!r} is required.", id_)
            continue
        problem = check(value[name])
        if problem is not None:
            return WireError(BAD_REQUEST, f"{type_}: {name} {problem}.", id_)
        fields[name] = value[name]
    return Request(id_, type_, fields)


def _not_json(line: bytes | str) -> WireError:
    """Why orjson refused the line. Text that is not valid UTF-8 (raw bytes, or
    escapes of lone surrogates) is refused here, before any of it could be
    stored or forwarded; the answer names the fault and carries the line's id
    when the line is otherwise sound JSON."""
    problem = utf8_problem(line)
    if problem is None:
        return WireError(BAD_REQUEST, "Malformed JSON line.")
    try:
        value = orjson.loads(problem.repaired)
    except orjson.JSONDecodeError:
        value = None
    raw_id = value.get("id") if isinstance(value, dict) else None
    id_ = raw_id if _integer(raw_id) and 0 < raw_id <= MAX_ID else None
    return WireError(BAD_REQUEST, f"The line is not valid UTF-8 text: {problem.what}; "
                                  "nothing of it was used.", id_)


def _accepts_null(check: Check) -> bool:
    return check(None) is None


# -- encoding

def encode_ok(id_: int | None, result: dict) -> bytes:
    return orjson.dumps({"v": PROTOCOL_VERSION, "id": id_, "ok": True, "result": result}) + b"\n"


def encode_error(id_: int | None, code: str, message: str, **extra) -> bytes:
    error = {"code": code, "message": message}
    error.update(extra)
    return orjson.dumps({"v": PROTOCOL_VERSION, "id": id_, "ok": False, "error": error}) + b"\n"


def encode_event(event: str, payload) -> bytes:
    return orjson.dumps({"v": PROTOCOL_VERSION, "type": "event", "event": event,
                         "payload": payload}) + b"\n"

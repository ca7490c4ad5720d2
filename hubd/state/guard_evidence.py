"""Authenticated guard-denial evidence (seed 000, "Guard evidence" and
"Authenticated guard-denial evidence"): the pure decisions behind the
`guard_denial` verb (hubd/handlers/evidence.py).

* `read_denial(frame)` keeps only the closed, content-minimised fields the
  seed lists (provider, reason_code, path_count and three lowercase SHA-256
  digests) or says, in the reference's words, why the frame is refused
  (`error_code: guard_evidence`). Anything else the frame carries (a path,
  a payload, an unknown field) never reaches the journal row.
* `record(denial, credential, recorder)` is the audit row: the client's
  digests plus the server-derived provenance, stored only as digests
  (`credential_principal_sha256`, `recorder_sha256`).
* `EvidenceWindow` is the per-credential sliding window (100 events and
  256 KiB per 60 seconds by default, configurable for tests): evidence over
  it is refused before the journal grows. It is live bookkeeping, like the
  reference's (a restart forgets it), and bounded in the credentials it
  tracks.

The row is audit-only: `appliers.records` names it, so a replay keeps its
seq and changes no projection (it cannot create or change a claim).
"""

from __future__ import annotations

import hashlib
import re
from collections import OrderedDict, deque
from dataclasses import dataclass

from .hub import Appliers

GUARD_DENIAL = "guard_denial"
RECORDED = "guard_denial_recorded"
RECORDED_TEXT = "Guard denial evidence recorded."

CODE_INVALID = "guard_evidence"
CODE_UNAVAILABLE = "guard_evidence_unavailable"
CODE_RATE_LIMITED = "guard_evidence_rate_limited"
UNAVAILABLE_TEXT = "guard denial evidence requires an authenticated durable hub"
RATE_LIMITED_TEXT = "guard denial evidence ingress limit exceeded"

# the ACL access a guard_denial needs under --require-acl (seed 000)
ACL_PERMISSION = ("evidence", "evidence", "guard-denial")

REASON_CODES = frozenset((
    "GUARD_NO_CLAIM", "GUARD_NOT_EDITABLE", "GUARD_OWNERSHIP_AMBIGUOUS",
    "GUARD_STATE_UNREACHABLE", "GUARD_TARGET_INVALID"))
PROVIDERS = frozenset(("claude", "codex", "gemini", "grok", "kimi", "opencode", "shell"))
MAX_PATH_COUNT = 512
DIGEST_FIELDS = ("actor_sha256", "call_sha256", "scope_sha256")
_SHA256 = re.compile(r"[0-9a-f]{64}")

# the window (seed 000: "100 events and 256 KiB per 60 seconds")
WINDOW_EVENTS = 100
WINDOW_BYTES = 256 * 1024
WINDOW_SECONDS = 60.0
# credentials the window tracks at once; the least recently seen goes first
MAX_CREDENTIALS = 4096


@dataclass(frozen=True, slots=True)
class Denial:
    provider: str
    reason_code: str
    path_count: int
    actor_sha256: str
    call_sha256: str
    scope_sha256: str


def read_denial(frame: dict) -> Denial | str:
    """The denial a frame carries, or the refusal text (the reference's order:
    reason_code, provider, path_count, then the digests)."""
    reason_code = frame.get("reason_code")
    if not isinstance(reason_code, str) or reason_code not in REASON_CODES:
        return "guard denial reason_code is not recognised"
    provider = frame.get("provider")
    if not isinstance(provider, str) or provider not in PROVIDERS:
        return "guard denial provider is not recognised"
    path_count = frame.get("path_count")
    if isinstance(path_count, bool) or not isinstance(path_count, int):
        return "guard denial path_count must be an integer"
    if not 0 <= path_count <= MAX_PATH_COUNT:
        return "guard denial path_count is outside the supported bound"
    digests = {}
    for name in DIGEST_FIELDS:
        value = frame.get(name)
        if not isinstance(value, str) or _SHA256.fullmatch(value) is None:
            return f"guard denial {name} must be lowercase SHA-256"
        digests[name] = value
    return Denial(provider, reason_code, path_count, **digests)


def sha256_text(value: str) -> str:
    return hashlib.sha256(value.encode("utf-8")).hexdigest()


def record(denial: Denial, credential: str, recorder: str) -> dict:
    """The journal row's payload: digests only. `credential` is the door's
    digest of the connect token (Session.credential); it is hashed again
    under a domain label so the row never holds the value the door compares."""
    return {
        "actor_sha256": denial.actor_sha256,
        "call_sha256": denial.call_sha256,
        "credential_principal_sha256": sha256_text("hubd-guard-credential\x00" + credential),
        "decision": "deny",
        "path_count": denial.path_count,
        "provider": denial.provider,
        "reason_code": denial.reason_code,
        "recorder_sha256": sha256_text(recorder),
        "scope_sha256": denial.scope_sha256,
    }


class EvidenceWindow:
    """Per-credential sliding window over accepted evidence: (time, bytes)
    entries younger than `seconds`. `admit` answers None (and counts the
    evidence) or the limit it would cross: "events" or "bytes"."""

    def __init__(self, events: int = WINDOW_EVENTS, max_bytes: int = WINDOW_BYTES,
                 seconds: float = WINDOW_SECONDS, max_credentials: int = MAX_CREDENTIALS):
        self.events, self.max_bytes, self.seconds = events, max_bytes, seconds
        self.max_credentials = max_credentials
        self._buckets: OrderedDict[str, tuple[deque, list]] = OrderedDict()

    def _bucket(self, credential: str, now: float) -> tuple[deque, list]:
        bucket = self._buckets.get(credential)
        if bucket is None:
            if len(self._buckets) >= self.max_credentials:
                self._buckets.popitem(last=False)
            bucket = self._buckets[credential] = (deque(), [0])
        else:
            self._buckets.move_to_end(credential)
        entries, total = bucket
        while entries and entries[0][0] <= now - self.seconds:
            total[0] -= entries.popleft()[1]
        return bucket

    def check(self, credential: str, size: int, now: float) -> str | None:
        """The limit this evidence would cross, or None; counts nothing."""
        entries, total = self._bucket(credential, now)
        if len(entries) >= self.events:
            return "events"
        if total[0] + size > self.max_bytes:
            return "bytes"
        return None

    def count(self, credential: str, size: int, now: float) -> None:
        entries, total = self._bucket(credential, now)
        entries.append((now, size))
        total[0] += size

    def tracked(self) -> int:
        return len(self._buckets)


appliers = Appliers()
appliers.records(GUARD_DENIAL)

"""Claims and leases: the projection, the appliers, and every decision about
them as pure functions of (state, request, now).

A lease is one dict, the *lease record*, exactly as journaled in `claim`,
`handoff`, `task_update` and `checkpoint` events (the reference hub's payload
shape): task_id, owner, note, claimed_at, lease_expires_at, status, data_ref,
worktree, paths, epoch, version, checkpoint, git, quota_principal and, when
the claim carried one, path_identity. `release` and `lease_expired` events
carry task_id, owner and epoch. `claim_denial` rows are audit-only.

Every value the hub decides (epoch, times, the normalised request) is in the
event, so applying it live and replaying it at start give the same state.

What a holder may do with its lease (release receipts, status transitions,
a wait's deadlock) is hubd/state/lease_rules.py.

A lease ends by release (owner, matching epoch), by expiry (its
lease_expires_at passed, or its holder was offline longer than
--lease-offline-ttl), or is replaced by a handoff or a renewal (the owner
claiming its own task again: new epoch, fresh lease, version 0).
"""

from __future__ import annotations

import hashlib
import heapq
import json
import math
from dataclasses import dataclass, field

from hubd.wire.digests import canonical_sha256

from . import scope as sc
from .events import Event
from .hub import Appliers, HubState

# event kinds (the reference hub's names where it has one)
CLAIM = "claim"
CLAIM_DENIAL = "claim_denial"
RELEASE = "release"
TASK_UPDATE = "task_update"
CHECKPOINT = "checkpoint"
HANDOFF = "handoff"
LEASE_EXPIRED = "lease_expired"
LEASE_KINDS = (CLAIM, TASK_UPDATE, CHECKPOINT, HANDOFF)

EXTENSION = "claims"

# claim_denied reason codes (seed, "Durable claim-denial evidence")
TASK_ID_REQUIRED = "TASK_ID_REQUIRED"
PATH_IDENTITY_INVALID = "PATH_IDENTITY_INVALID"
LEASE_LIVE = "LEASE_LIVE"
SCOPE_CONFLICT = "SCOPE_CONFLICT"
QUOTA_EXCEEDED = "QUOTA_EXCEEDED"
CLAIM_DENIED = "CLAIM_DENIED"

MAX_TASK_ID_CHARS = 512
CLAIMANT_CHARS = 128  # the bounded claimant name kept in a denial row



@dataclass(frozen=True)
class LeaseLimits:
    """Operator bounds on claims (see HubConfig / the hubd CLI)."""

    default_ttl: float = 3600.0
    min_ttl: float = 30.0
    max_ttl: float = 30 * 86400.0
    max_claims_per_agent: int = 128
    max_paths_per_claim: int = 512
    # seconds a lease outlives its holder's disconnect; None: until its TTL
    offline_ttl: float | None = None


# -- the projection

@dataclass
class ClaimState:
    leases: dict = field(default_factory=dict)  # task_id -> lease record
    epoch: int = 0  # the last fencing epoch issued (hub-wide, monotonic)
    by_owner: dict = field(default_factory=dict)  # owner -> set of task_ids
    index: sc.ScopeIndex = field(default_factory=sc.ScopeIndex)
    # (lease_expires_at, task_id, epoch); stale entries are skipped when popped
    expiry: list = field(default_factory=list, compare=False)

    def live(self, task_id: str, now: float) -> dict | None:
        lease = self.leases.get(task_id)
        if lease is None or lease["lease_expires_at"] <= now:
            return None
        return lease

    def held_by(self, owner: str, now: float) -> list[str]:
        return sorted(t for t in self.by_owner.get(owner, ()) if self.live(t, now) is not None)

    def due(self, now: float) -> list[dict]:
        """Leases whose time is up, soonest first. Their expiry is decided by
        the hub and journaled; this only finds them (and drops heap entries of
        leases that already ended or changed)."""
        heap = self.expiry
        found, keep = [], []
        while heap and heap[0][0] <= now:
            entry = heapq.heappop(heap)
            expires, task_id, epoch = entry
            lease = self.leases.get(task_id)
            if lease is not None and lease["epoch"] == epoch and lease[
                    "lease_expires_at"] == expires:
                found.append(lease)
                keep.append(entry)
        for entry in keep:
            heapq.heappush(heap, entry)
        return found

    def put(self, lease: dict) -> None:
        task_id = lease["task_id"]
        old = self.leases.get(task_id)
        if old is not None:
            self._drop(old)
        self.leases[task_id] = lease
        self.by_owner.setdefault(lease["owner"], set()).add(task_id)
        self.index.add(task_id, spec_of(lease))
        if lease["epoch"] > self.epoch:
            self.epoch = lease["epoch"]
        heap = self.expiry
        heapq.heappush(heap, (lease["lease_expires_at"], task_id, lease["epoch"]))
        if len(heap) > 2 * len(self.leases) + 1024:
            # entries of ended or renewed leases: rebuild from the live ones
            self.expiry = [(x["lease_expires_at"], t, x["epoch"]) for t, x in self.leases.items()]
            heapq.heapify(self.expiry)

    def remove(self, task_id: str) -> dict | None:
        lease = self.leases.pop(task_id, None)
        if lease is not None:
            self._drop(lease)
        return lease

    def _drop(self, lease: dict) -> None:
        owned = self.by_owner.get(lease["owner"])
        if owned is not None:
            owned.discard(lease["task_id"])
            if not owned:
                del self.by_owner[lease["owner"]]
        self.index.remove(lease["task_id"])


# the projections this module keeps in HubState.extensions, by name
PROJECTIONS = {EXTENSION: ClaimState}
appliers = Appliers()
appliers.records(CLAIM_DENIAL)


def claims_of(state: HubState) -> ClaimState:
    return state.extensions[EXTENSION]


def spec_of(lease: dict) -> sc.ScopeSpec:
    """The scope of a stored lease (recomputed from the record, so replay
    and live agree)."""
    return scope_spec(str(lease.get("worktree", "")), list(lease.get("paths") or ()),
                      lease.get("path_identity"))


def scope_spec(worktree: str, paths: list[str], raw_identity) -> sc.ScopeSpec:
    """The scope of a claim from what its record holds: the literal worktree,
    the normalised, de-duplicated paths ([] or a "" path: the whole worktree)
    and the path_identity as sent (already validated when it was granted)."""
    whole = not paths or "" in paths
    identity = None
    if isinstance(raw_identity, dict):
        rows = raw_identity.get("paths")
        display = [sc.normalize_path(r.get("git_path")) if isinstance(r, dict) else None
                   for r in rows] if isinstance(rows, list) else []
        parsed = sc.parse_identity(raw_identity, display) if None not in display else sc.INVALID
        if isinstance(parsed, sc.Identity):
            identity = _aligned(parsed, paths)
        else:
            identity = _worktree_identity(raw_identity)
    return sc.spec_for(worktree, [] if whole else paths, identity, widened=whole)


def _aligned(identity: sc.Identity, paths: list[str]) -> sc.Identity:
    """The identity's rows, one per (de-duplicated) display path."""
    rows = []
    for path in paths:
        for row in identity.rows:
            git_path = row.strings[0]
            if git_path == path or (not identity.case_sensitive
                                    and git_path.casefold() == path.casefold()):
                rows.append(row)
                break
        else:
            return sc.Identity(identity.worktree_path, identity.worktree_object_id,
                               identity.namespace, identity.case_sensitive, ())
    return sc.Identity(identity.worktree_path, identity.worktree_object_id, identity.namespace,
                       identity.case_sensitive, tuple(rows))


def _worktree_identity(raw: dict) -> sc.Identity | None:
    wt = raw.get("worktree_path")
    if not isinstance(wt, str) or not wt:
        return None
    ns = raw.get("filesystem_namespace", "")
    obj = raw.get("worktree_object_id", "")
    sensitive = raw.get("case_sensitive", True)
    return sc.Identity(wt, obj if isinstance(obj, str) else "", ns if isinstance(ns, str) else "",
                       sensitive if isinstance(sensitive, bool) else True, ())


def _lease_from(payload: dict) -> dict | None:
    task_id = payload.get("task_id")
    owner = payload.get("owner")
    epoch = payload.get("epoch")
    expires = payload.get("lease_expires_at")
    if not (isinstance(task_id, str) and task_id and isinstance(owner, str)
            and isinstance(epoch, int) and isinstance(expires, (int, float))):
        return None  # a foreign or damaged row changes nothing
    return dict(payload)


def _apply_lease(state: HubState, event: Event) -> None:
    lease = _lease_from(event.payload)
    if lease is not None:
        claims_of(state).put(lease)


for _kind in LEASE_KINDS:
    appliers.applies(_kind)(_apply_lease)


@appliers.applies(RELEASE)
@appliers.applies(LEASE_EXPIRED)
def _apply_end(state: HubState, event: Event) -> None:
    payload = event.payload
    claims = claims_of(state)
    task_id = payload.get("task_id")
    lease = claims.leases.get(task_id) if isinstance(task_id, str) else None
    if lease is None:
        return
    epoch = payload.get("epoch")
    if isinstance(epoch, int) and not isinstance(epoch, bool) and epoch != lease["epoch"]:
        return  # about an older lease of the task
    claims.remove(task_id)
    if isinstance(epoch, int) and epoch > claims.epoch:
        claims.epoch = epoch


# -- reading requests

def text_field(value) -> str:
    """Free text fields (note, data_ref, checkpoint): strings as sent, other
    values as their text, nothing as ""."""
    if value is None:
        return ""
    return value if isinstance(value, str) else str(value)


def task_id_of(frame: dict, *fallbacks: str) -> str:
    value = frame.get("task_id")
    for name in fallbacks:
        if value is None or value == "":
            value = frame.get(name)
    if value is None or isinstance(value, (dict, list)):
        return ""
    return (value if isinstance(value, str) else str(value)).strip()


def strict_int(value) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value


def ttl_of(value, limits: LeaseLimits) -> float:
    """Seconds the lease lasts: absent or not a number -> the default; then
    clamped to [min_ttl, max_ttl]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return limits.default_ttl
    return min(max(float(value), limits.min_ttl), limits.max_ttl)


@dataclass
class ClaimRequest:
    claimant: str
    task_id: str
    note: str = ""
    worktree: str = ""
    paths: list = field(default_factory=list)  # normalised, de-duplicated; [""] if widened
    widened: bool = False
    ttl: float = 3600.0
    data_ref: str = ""
    git: dict | None = None
    path_identity: dict | None = None  # as sent (echoed byte for byte)
    quota_principal: str = ""
    refusal: tuple[str, str] | None = None  # (reason_code, text) found while reading

    @property
    def spec(self) -> sc.ScopeSpec:
        return scope_spec(self.worktree, self.paths, self.path_identity)


def read_claim(frame: dict, claimant: str, limits: LeaseLimits,
               quota_principal: str = "") -> ClaimRequest:
    """Everything a claim frame asks for, normalised; `refusal` is set when the
    frame cannot be granted whatever the state."""
    task_id = task_id_of(frame, "payload")
    req = ClaimRequest(claimant, task_id, quota_principal=quota_principal)
    if not task_id:
        req.refusal = (TASK_ID_REQUIRED, "Task ID is required.")
        return req
    if len(task_id) > MAX_TASK_ID_CHARS or "\x00" in task_id:
        req.task_id = task_id[:MAX_TASK_ID_CHARS].replace("\x00", "")
        req.refusal = (CLAIM_DENIED, f"Task ID is longer than {MAX_TASK_ID_CHARS} characters "
                                     "or holds a NUL character.")
        return req
    req.note = text_field(frame.get("note"))
    req.data_ref = text_field(frame.get("data_ref"))
    worktree = frame.get("worktree")
    req.worktree = "" if worktree is None else (worktree if isinstance(worktree, str)
                                                else str(worktree))
    git = frame.get("git")
    if isinstance(git, dict):
        git = dict(git)
        git.setdefault("auto_release_on", "merge")
        req.git = git
    req.ttl = ttl_of(frame.get("ttl_seconds"), limits)

    raw_paths = frame.get("paths")
    if raw_paths is None:
        raw_paths = []
    if not isinstance(raw_paths, list):
        req.refusal = (PATH_IDENTITY_INVALID,
                       f"Task '{task_id}' paths must be a list of repository-relative paths.")
        return req
    display: list[str] = []
    for raw in raw_paths:
        path = sc.normalize_path(raw)
        if path is None:
            shown = raw if isinstance(raw, str) else json.dumps(raw)[:80]
            req.refusal = (PATH_IDENTITY_INVALID,
                           f"Task '{task_id}' path '{shown[:200]}' is not a repository-relative "
                           "path (absolute, '..', control characters or too long).")
            return req
        display.append(path)

    raw_identity = frame.get("path_identity")
    if raw_identity is not None:
        parsed = sc.parse_identity(raw_identity, display)
        if parsed == sc.INVALID:
            req.refusal = (PATH_IDENTITY_INVALID,
                           f"Task '{task_id}' carries an invalid path identity.")
            return req
        if parsed == sc.MISMATCH:
            req.refusal = (PATH_IDENTITY_INVALID,
                           f"Task '{task_id}' path identity does not match its declared scope.")
            return req
        req.path_identity = raw_identity

    paths = list(dict.fromkeys(display))  # de-duplicated, first occurrence kept
    if len(paths) > limits.max_paths_per_claim:
        # too many paths to track one by one: the claim covers its worktree
        paths, req.widened = [""], True
    req.paths = paths
    return req


# -- decisions

@dataclass(frozen=True)
class Deny:
    reason_code: str
    text: str
    conflict_task_id: str | None = None
    holder: str | None = None


def denial_fields(deny: Deny) -> dict:
    """What a claim_denied says beside its text: the stable reason code and,
    for a conflict, the task and holder it conflicts with. The same fields
    whether the claimant is on this hub or a peer forwarded its claim."""
    fields = {"reason_code": deny.reason_code}
    if deny.conflict_task_id is not None:
        fields["conflict_task_id"] = deny.conflict_task_id
        fields["holder"] = deny.holder
    return fields


@dataclass(frozen=True)
class Grant:
    lease: dict
    renewal: bool


def decide_claim(claims: ClaimState, req: ClaimRequest, now: float,
                 limits: LeaseLimits) -> Grant | Deny:
    """The grant decision. Order: the request itself, the task's lease, the
    claimant's quota, then scope overlap with every other live lease."""
    if req.refusal is not None:
        return Deny(*req.refusal)
    task_id = req.task_id
    current = claims.live(task_id, now)
    renewal = current is not None and current["owner"] == req.claimant
    if current is not None and not renewal:
        return Deny(LEASE_LIVE, f"Task '{task_id}' is already claimed by {current['owner']}.",
                    task_id, current["owner"])
    if not renewal:
        owned = claims.by_owner.get(req.claimant, ())
        if len(owned) >= limits.max_claims_per_agent:
            held = len(claims.held_by(req.claimant, now))
            if held >= limits.max_claims_per_agent:
                return Deny(QUOTA_EXCEEDED, f"Agent {req.claimant} holds the maximum "
                                            f"{limits.max_claims_per_agent} claims.")
    conflicts = claims.index.conflicts(req.spec, task_id,
                                       lambda t: claims.live(t, now) is not None)
    if conflicts:
        other = claims.leases[conflicts[0]]
        return Deny(SCOPE_CONFLICT, f"Task '{task_id}' file scope conflicts with "
                                    f"'{other['task_id']}' held by {other['owner']}.",
                    other["task_id"], other["owner"])
    lease = {
        "task_id": task_id, "owner": req.claimant, "note": req.note, "claimed_at": now,
        "lease_expires_at": now + req.ttl, "status": "claimed",
        "data_ref": req.data_ref or (current["data_ref"] if renewal else ""),
        "worktree": req.worktree, "paths": list(req.paths), "epoch": claims.epoch + 1,
        "version": 0, "checkpoint": current["checkpoint"] if renewal else "",
        "git": req.git, "quota_principal": req.quota_principal,
    }
    if req.path_identity is not None:
        lease["path_identity"] = req.path_identity
    return Grant(lease, renewal)


def denial_evidence(claimant: str, req: ClaimRequest, reason_code: str) -> dict:
    """The content-minimised audit row for a refused claim: the bounded
    claimant name with its full digest, the decision and reason, the path
    count, and SHA-256 correlations of the task id and of the declared scope.
    No note, raw task id, worktree, paths, git metadata or identity."""
    scope = {"paths": req.paths, "worktree": req.worktree}
    return {
        "claimant": claimant[:CLAIMANT_CHARS],
        "claimant_sha256": _sha256(claimant),
        "claimant_truncated": len(claimant) > CLAIMANT_CHARS,
        "decision": "deny",
        "durable": True,
        "path_count": len(req.paths),
        "reason_code": reason_code,
        "scope_sha256": canonical_sha256(scope),
        "task_id_sha256": _sha256(req.task_id),
    }


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def grant_fields(lease: dict) -> dict:
    """The lease as claim_granted carries it."""
    fields = {name: lease[name] for name in (
        "task_id", "owner", "note", "lease_expires_at", "status", "worktree", "paths", "epoch",
        "version", "checkpoint", "git")}
    if "path_identity" in lease:
        fields["path_identity"] = lease["path_identity"]
    return fields


def snapshot_entry(lease: dict) -> dict:
    """The lease as state_snapshot.active_claims lists it (presence is added
    by the caller)."""
    entry = {name: lease.get(name) for name in (
        "task_id", "owner", "note", "claimed_at", "lease_expires_at", "status", "data_ref",
        "worktree", "paths", "epoch", "version", "checkpoint", "git")}
    if "path_identity" in lease:
        entry["path_identity"] = lease["path_identity"]
    return entry

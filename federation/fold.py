"""Fold a merged multi-hub log into the observed (advisory) view.

Input: ``MergedLog.ordered()`` -- hub-tagged events in (ts, hub_id, seq) order.
Output: an ``ObservedState`` that an operator reads and that partition detection
consumes. Nothing here grants, revokes or routes anything.

What merges, and how:

- Board (``ledger_task``: the complete task record, with an optional
  ``_causal_parent`` {hub_id, seq, event_fingerprint} beside it). Two kinds of
  edge say "this write saw that one": a hub's own later write of a task follows
  its earlier writes (one hub's board is linear), and a verified causal parent.
  A parent is accepted only when the named event is in the union, is a task
  write, its fingerprint matches, and it concerns the same task; anything else
  suppresses nothing. Proven ancestors are removed; among the remaining heads
  the display winner is the largest (ts, hub_id, seq) -- a presentation choice,
  never authority, with the winner's provenance visible. Remaining heads whose
  task records differ are reported as an unresolved, payload-free conflict: it
  proves disagreement, not concurrency (a missing edge proves nothing).
- Progress notes (``ledger_progress``): grow-only, every note in merged order.
- Observed claims: claims are mutual exclusion and are never merged. Each
  hub's lease records (``claim``, ``task_update``, ``checkpoint``, ``handoff``:
  all carry the whole lease) are folded per (hub_id, task_id) in that hub's own
  seq order; ``release`` and ``lease_expired`` clear it (when they carry an
  epoch, only the lease of that epoch). A handoff replaces the record with the
  new owner's, so the old owner's claim is gone. The display view shows, per
  task, the live per-hub claim whose latest event is last in merged order -- a
  release on one hub cannot hide another hub's claim on an equal task id, and
  the per-(hub, task) fold itself is what ``asserting_hubs`` reads.

hubd and the reference hub journal these kinds alike except: hubd's
``release`` carries {task_id, owner, epoch} and hubd journals ``lease_expired``
(the reference's ``release`` is {task_id} and it journals no expiry, so an
expired reference lease is recognised by ``lease_expires_at`` alone).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping

from hubd.state.board import CAUSAL_KEY, Malformed, causal_parent
from federation.log_model import LogEvent, event_fingerprint

LEDGER_TASK = "ledger_task"
LEDGER_PROGRESS = "ledger_progress"
LEASE_KINDS = frozenset({"claim", "task_update", "checkpoint", "handoff"})
LEASE_END_KINDS = frozenset({"release", "lease_expired"})
# What fold() reads; a follower may retain only these (MergedLog(retain=...)).
FOLDED_KINDS = frozenset({LEDGER_TASK, LEDGER_PROGRESS}) | LEASE_KINDS | LEASE_END_KINDS

BOARD_POLICY = {
    "mode": "causal-head-then-display-lww",
    "causal_parent": "content-bound-single-parent",
    "order": ["timestamp", "hub_id", "seq"],
    "authoritative": False,
    "causal": False,
    "warning": ("Display only. A verified content-bound parent removes only the ancestor it "
                "proves; the remaining heads are ordered by wall-clock timestamp, which is "
                "neither task authority nor evidence that writes were concurrent. "
                "Synchronised clocks (NTP included) do not establish causality."),
}

# Fingerprint of a bare task record (conflict evidence): the event fingerprint
# of a fixed pseudo-event carrying the record, as the reference computes it,
# so record fingerprints compare across hubd and reference observers.
_RECORD_HUB, _RECORD_SEQ, _RECORD_TS = "synapse-board-record", 1, 0.0

# causal_parent_status values
PARENT_NONE = "none"
PARENT_INVALID = "invalid"  # malformed reference
PARENT_MISSING = "missing"  # no task write with that identity in the union
PARENT_WRONG_TASK = "wrong-task"
PARENT_MISMATCH = "fingerprint-mismatch"
PARENT_SELF = "self-parent"
PARENT_VERIFIED = "verified"
PARENT_CYCLE = "cycle-rejected"  # verified edges that would form a cycle: all dropped


def task_record(payload: Mapping) -> dict:
    """The task as clients see it: the event payload without the causal parent."""
    return {k: v for k, v in payload.items() if k != CAUSAL_KEY}


def record_fingerprint(payload: Mapping) -> str:
    return event_fingerprint(_RECORD_HUB, _RECORD_SEQ, _RECORD_TS, LEDGER_TASK,
                             task_record(payload))


def _task_id(payload: Mapping) -> str:
    value = payload.get("task_id")
    return value.strip() if isinstance(value, str) else ""


def namespace_of(identity) -> str | None:
    """`PROJECT/seat` -> `PROJECT` (the prefix before the first slash, as the
    reference derives it); None for a bare name or a non-string."""
    if not isinstance(identity, str) or "/" not in identity:
        return None
    project = identity.split("/", 1)[0]
    return project or None


# -- the view

@dataclass(frozen=True)
class Provenance:
    task_id: str
    hub_id: str
    seq: int
    timestamp: float
    event_fingerprint: str
    causal: bool  # a verified cross-hub parent chain selected this unique head
    causal_parent: dict | None = None
    causal_parent_status: str = PARENT_NONE

    def to_json(self) -> dict:
        out = {
            "task_id": self.task_id, "hub_id": self.hub_id, "seq": self.seq,
            "timestamp": self.timestamp, "order_key": [self.timestamp, self.hub_id, self.seq],
            "event_fingerprint": self.event_fingerprint,
            "selection": "causal-head" if self.causal else "display-order",
            "display_winner": True, "authoritative": False, "causal": self.causal,
        }
        if self.causal_parent is not None:
            out["causal_parent"] = dict(self.causal_parent)
        if self.causal_parent_status != PARENT_NONE:
            out["causal_parent_status"] = self.causal_parent_status
        return out


@dataclass(frozen=True)
class Contender:
    """One remaining head of a conflicted task, without its payload."""

    hub_id: str
    seq: int
    timestamp: float
    record_fingerprint: str
    event_fingerprint: str
    causal_parent: dict | None = None
    causal_parent_status: str = PARENT_NONE

    def to_json(self) -> dict:
        out = {"hub_id": self.hub_id, "seq": self.seq, "timestamp": self.timestamp,
               "record_fingerprint": self.record_fingerprint,
               "event_fingerprint": self.event_fingerprint}
        if self.causal_parent is not None:
            out["causal_parent"] = dict(self.causal_parent)
        if self.causal_parent_status != PARENT_NONE:
            out["causal_parent_status"] = self.causal_parent_status
        return out


@dataclass(frozen=True)
class Conflict:
    task_id: str
    contenders: tuple[Contender, ...]  # sorted by (hub_id, seq)

    def to_json(self) -> dict:
        return {"task_id": self.task_id, "status": "unresolved",
                "kind": "cross-hub-snapshot-divergence", "causal": False,
                "causal_parent_aware": True, "resolution": "operator-required",
                "contenders": [c.to_json() for c in self.contenders]}


@dataclass(frozen=True)
class ObservedClaim:
    task_id: str
    hub_id: str  # the hub whose log reports it
    claim: dict  # the lease record as that hub journaled it
    seq: int  # the event that last set it
    ts: float

    @property
    def owner(self) -> str:
        owner = self.claim.get("owner")
        return owner if isinstance(owner, str) else ""

    def live(self, now: float) -> bool:
        expires = self.claim.get("lease_expires_at")
        return (not isinstance(expires, bool) and isinstance(expires, (int, float))
                and expires > now)

    def to_json(self) -> dict:
        return {"task_id": self.task_id, "hub_id": self.hub_id, "observed": True,
                "claim": dict(self.claim)}


@dataclass(frozen=True)
class ObservedState:
    board: dict = field(default_factory=dict)  # task_id -> displayed record
    board_provenance: dict = field(default_factory=dict)  # task_id -> Provenance
    board_conflicts: dict = field(default_factory=dict)  # task_id -> Conflict
    progress: tuple = ()
    observed_claims: dict = field(default_factory=dict)  # task_id -> ObservedClaim (display)
    hub_claims: dict = field(default_factory=dict)  # (hub_id, task_id) -> ObservedClaim

    def to_json(self) -> dict:
        """The reference's ObservedState JSON (key names and shapes), sorted by
        task id. `board_conflicts` is the conflicts map."""
        return {
            "board": {t: dict(self.board[t]) for t in sorted(self.board)},
            "board_policy": {k: (list(v) if isinstance(v, list) else v)
                             for k, v in BOARD_POLICY.items()},
            "board_provenance": {t: self.board_provenance[t].to_json()
                                 for t in sorted(self.board_provenance)},
            "board_conflicts": {t: self.board_conflicts[t].to_json()
                                for t in sorted(self.board_conflicts)},
            "progress": [dict(n) for n in self.progress],
            "observed_claims": {t: self.observed_claims[t].to_json()
                                for t in sorted(self.observed_claims)},
        }

    def render(self, peer_id: str, now: float | None = None) -> str:
        """The operator text of `hubd multihub observe` (the seed's walkthrough)."""
        lines = [f"observing peer '{peer_id}' — {len(self.board)} tasks, "
                 f"{len(self.progress)} progress notes, {len(self.observed_claims)} "
                 "observed claims"]
        if self.board:
            lines.append("board (verified causal heads; display LWW among unresolved heads "
                         "— non-authoritative):")
            for task_id in sorted(self.board):
                record, prov = self.board[task_id], self.board_provenance[task_id]
                source = f"display source {prov.hub_id}#{prov.seq} @ {prov.timestamp:g}"
                if prov.causal:
                    source += "; causal head"
                if prov.causal_parent_status != PARENT_NONE:
                    source += f"; parent {prov.causal_parent_status}"
                lines.append(f"  [{record.get('status', '')}] {task_id} — "
                             f"{record.get('title', '')} [{source}]")
        if self.board_conflicts:
            lines.append("unresolved board conflicts (heads differ; not proof of concurrency — "
                         "operator review):")
            for task_id in sorted(self.board_conflicts):
                heads = ", ".join(f"{c.hub_id}#{c.seq}"
                                  for c in self.board_conflicts[task_id].contenders)
                lines.append(f"  {task_id}: {heads}")
        if self.observed_claims:
            lines.append("observed claims (advisory — not granted):")
            for task_id in sorted(self.observed_claims):
                claim = self.observed_claims[task_id]
                suffix = " (lease expired)" if now is not None and not claim.live(now) else ""
                lines.append(f"  {task_id} -> {claim.owner} @ {claim.hub_id}{suffix}")
        return "\n".join(lines)


# -- folding

def _parent_of(payload: Mapping) -> tuple[dict | None, str]:
    if CAUSAL_KEY not in payload or payload[CAUSAL_KEY] in (None, ""):
        return None, PARENT_NONE
    try:
        return causal_parent({"causal_parent": payload[CAUSAL_KEY]}), PARENT_MISSING
    except Malformed:
        return None, PARENT_INVALID
    except Exception:  # a strange foreign value: no edge, never a crash
        return None, PARENT_INVALID


def _has_cycle(parents: dict) -> bool:
    """Kahn's algorithm over the parent edges (no recursion)."""
    indegree = {node: 0 for node in parents}
    for node, ps in parents.items():
        for p in ps:
            if p in indegree:
                indegree[p] += 1
    ready = [n for n, d in indegree.items() if d == 0]
    seen = 0
    while ready:
        node = ready.pop()
        seen += 1
        for p in parents[node]:
            if p in indegree:
                indegree[p] -= 1
                if indegree[p] == 0:
                    ready.append(p)
    return seen != len(indegree)


def _fold_task(task_id: str, writes: list[LogEvent], task_writes: dict) -> tuple:
    """(winner, provenance, conflict or None) for one task's writes (merged order)."""
    same_hub: dict = {w.identity: set() for w in writes}
    by_hub: dict[str, list[LogEvent]] = {}
    for w in writes:
        by_hub.setdefault(w.hub_id, []).append(w)
    for chain in by_hub.values():
        chain.sort(key=lambda e: e.seq)
        for earlier, later in zip(chain, chain[1:]):
            same_hub[later.identity].add(earlier.identity)

    parents = {k: set(v) for k, v in same_hub.items()}
    refs: dict = {}
    for w in writes:
        parent, status = _parent_of(w.payload)
        if parent is not None:
            target = task_writes.get((parent["hub_id"], parent["seq"]))
            if target is None:
                status = PARENT_MISSING
            elif _task_id(target.payload) != task_id:
                status = PARENT_WRONG_TASK
            elif target.fingerprint != parent["event_fingerprint"]:
                status = PARENT_MISMATCH
            elif target.identity == w.identity:
                status = PARENT_SELF
            else:
                status = PARENT_VERIFIED
                parents[w.identity].add(target.identity)
        refs[w.identity] = (parent, status)

    if _has_cycle(parents):
        # Honest content-bound parents cannot form a cycle (each names a
        # fingerprint that already existed); one that does proves nothing.
        parents = same_hub
        refs = {k: (p, PARENT_CYCLE if s == PARENT_VERIFIED else s) for k, (p, s) in refs.items()}

    ancestors = set().union(*parents.values()) if parents else set()
    heads = [w for w in writes if w.identity not in ancestors] or list(writes)
    winner = max(heads, key=lambda e: e.order_key)
    head_ids = {h.identity for h in heads}
    # causal: a unique head that won because verified ancestry removed another
    # hub's write, not merely because its own hub wrote later.
    causal = len(heads) == 1 and any(
        w.hub_id != winner.hub_id and w.identity not in head_ids for w in writes)
    parent, status = refs[winner.identity]
    provenance = Provenance(task_id, winner.hub_id, winner.seq, winner.ts, winner.fingerprint,
                            causal, parent, status)
    conflict = None
    if len(heads) > 1:
        contenders = tuple(sorted(
            (Contender(h.hub_id, h.seq, h.ts, record_fingerprint(h.payload), h.fingerprint,
                       *refs[h.identity]) for h in heads),
            key=lambda c: (c.hub_id, c.seq)))
        if len({c.record_fingerprint for c in contenders}) > 1:
            conflict = Conflict(task_id, contenders)
    return winner, provenance, conflict


def _fold_claims(events: list[LogEvent]) -> dict:
    """(hub_id, task_id) -> ObservedClaim, each hub folded in its own seq order
    (a hub's sequence is its authoritative local order; wall clocks are not)."""
    held: dict = {}
    for e in sorted(events, key=lambda e: (e.hub_id, e.seq)):
        task_id = _task_id(e.payload)
        if not task_id:
            continue
        key = (e.hub_id, task_id)
        if e.kind in LEASE_KINDS:
            held[key] = ObservedClaim(task_id, e.hub_id, dict(e.payload), e.seq, e.ts)
        else:  # release / lease_expired
            current = held.get(key)
            if current is None:
                continue
            epoch = e.payload.get("epoch")
            if (isinstance(epoch, int) and not isinstance(epoch, bool)
                    and epoch != current.claim.get("epoch")):
                continue  # ends an older lease of the task
            del held[key]
    return held


def fold(events: Iterable[LogEvent]) -> ObservedState:
    """Fold events in MergedLog.ordered() order into the observed view. Pure
    and deterministic: the same union folds to the same view."""
    events = list(events)
    task_writes: dict = {}  # (hub_id, seq) -> every ledger_task event
    by_task: dict[str, list[LogEvent]] = {}
    progress: list = []
    lease_events: list[LogEvent] = []
    for e in events:
        if e.kind == LEDGER_TASK:
            task_writes[e.identity] = e
            task_id = _task_id(e.payload)
            if task_id:
                by_task.setdefault(task_id, []).append(e)
        elif e.kind == LEDGER_PROGRESS:
            progress.append(dict(e.payload))
        elif e.kind in LEASE_KINDS or e.kind in LEASE_END_KINDS:
            lease_events.append(e)

    board, provenance, conflicts = {}, {}, {}
    for task_id, writes in by_task.items():
        winner, prov, conflict = _fold_task(task_id, writes, task_writes)
        board[task_id] = task_record(winner.payload)
        provenance[task_id] = prov
        if conflict is not None:
            conflicts[task_id] = conflict

    hub_claims = _fold_claims(lease_events)
    display: dict = {}
    for claim in hub_claims.values():
        current = display.get(claim.task_id)
        if current is None or (claim.ts, claim.hub_id, claim.seq) > (
                current.ts, current.hub_id, current.seq):
            display[claim.task_id] = claim
    return ObservedState(board, provenance, conflicts, tuple(progress), display, hub_claims)


def asserting_hubs(observed: ObservedState, now: float,
                   hub: str | None = None) -> dict[str, set[str]]:
    """{namespace: {hub_id, ...}}: the hubs observed holding a live claim
    (lease_expires_at > now) in each namespace, from the per-(hub, task) fold.
    The namespace is the claim owner's `PROJECT/` prefix; a bare owner
    contributes nothing. `hub` limits it to what that hub's own log shows (a
    watch feeding PartitionDetector.observe(peer, ...) passes hub=peer)."""
    out: dict[str, set[str]] = {}
    for (hub_id, _task), claim in observed.hub_claims.items():
        if hub is not None and hub_id != hub:
            continue
        if not claim.live(now):
            continue
        namespace = namespace_of(claim.owner)
        if namespace:
            out.setdefault(namespace, set()).add(hub_id)
    return out

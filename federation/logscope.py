"""What of this hub's journal a log pull shows a peer (docs/federation.md).

A peer's grant names the namespaces it may address; a log pull shows it the
events of those namespaces only. Every other event is served in its place as a
*withheld* placeholder (same seq and ts, kind `withheld`, a payload naming
why), so the log stays contiguous: a follower checks that no seq is missing
(federation/merge.py, and the reference hub's follower alike) and a
placeholder is the same bytes on every pull as long as the grant is the same.

An event is shown when every namespace it concerns is granted; an event that
concerns none (the hub's own bookkeeping: forward outbox and settlement rows,
partitions, remote lease records, broker and REDSYN state, principals...) is
withheld from every peer. Pure functions of the event and the grant.
"""

from __future__ import annotations

from typing import Mapping

WITHHELD = "withheld"
NOT_GRANTED = "namespace_not_granted"  # it concerns a namespace the grant does not name
NO_NAMESPACE = "no_namespace"  # it concerns no namespace: never shown to a peer

# kinds that carry a whole lease, or the end of one, under `owner`
_OWNER_KINDS = frozenset({"claim", "task_update", "checkpoint", "handoff", "release",
                          "lease_expired"})


def _seat_namespace(seat) -> str | None:
    """PROJ of `PROJ/alice` or of a forwarded `PROJ/alice@east`."""
    if not isinstance(seat, str):
        return None
    head, sep, _ = seat.partition("@")[0].partition("/")
    return head if sep and head else None


def _target_namespaces(target) -> set[str] | None:
    """The namespaces a chat's target names (an empty set for a broadcast);
    None when a part cannot be placed."""
    if target is None or target == "" or target == "all":
        return set()
    if not isinstance(target, str):
        return None
    found = set()
    for item in target.split(","):
        item = item.strip().partition("@")[0]
        if not item:
            return None
        head = item.partition("/")[0]  # a seat, a glob under a namespace, or a bare
        if not head or any(c in head for c in "*?["):  # namespace or role name
            return None
        found.add(head)
    return found


def event_namespaces(kind: str, payload) -> frozenset[str] | None:
    """The namespaces an event concerns, or None when it concerns none this
    module can place (withheld from every peer)."""
    if not isinstance(payload, Mapping):
        return None
    found: set[str] = set()
    if kind == "chat":
        sender = _seat_namespace(payload.get("sender"))
        targets = _target_namespaces(payload.get("target"))
        if sender is None or targets is None:
            return None
        found = {sender} | targets
    elif kind in _OWNER_KINDS:
        owner = _seat_namespace(payload.get("owner"))
        if owner is None:
            return None
        found = {owner}
    elif kind == "claim_denial":
        claimant = _seat_namespace(payload.get("claimant"))
        if claimant is None:
            return None
        found = {claimant}
    elif kind == "ledger_task":
        creator = _seat_namespace(payload.get("created_by"))
        if creator is None:
            return None
        found = {creator}
        project = payload.get("project")
        if isinstance(project, str) and project:
            found.add(project)
    elif kind == "ledger_progress":
        author = _seat_namespace(payload.get("author"))
        if author is None:
            return None
        found = {author}
    else:
        return None
    return frozenset(found)


def withheld_reason(kind: str, payload, granted: frozenset[str]) -> str | None:
    """Why this event is not shown to a peer granted `granted`, or None."""
    namespaces = event_namespaces(kind, payload)
    if not namespaces:
        return NO_NAMESPACE
    if namespaces <= granted:
        return None
    return NOT_GRANTED


def placeholder(seq: int, ts: float, reason: str) -> dict:
    return {"seq": seq, "ts": ts, "kind": WITHHELD, "payload": {"reason_code": reason}}

"""Partition detection: when another hub is seen acting as owner of a namespace.

The standing watch polls each operator-named peer and folds what its log
shows; a peer holding a live claim in a namespace is *asserting* it. Any
asserting hub other than the namespace's configured owner (and this hub)
contests ownership, and a contested namespace refuses every grant until
ownership is re-established -- claim safety fails closed, never open.

This object is the pure decision: it is fed each peer's poll outcome and
returns the transitions to journal (the caller appends them, durably, in one
commit, before it publishes the new refusing set). Rules:

- Evidence only ever narrows authority. A failed or refused poll changes
  nothing (the peer's last successful observation stands). A successful poll
  of an empty log may add assertions but never removes any.
- A contestant is dropped only after a successful, non-empty refresh from that
  contestant itself shows it no longer asserts, and no other observation still
  shows it. A namespace heals when its last contestant is dropped.
- Entering a contest, or any change of the contesting set, is one
  ``multihub_partition`` row (transition "entered" / "updated"); nothing is
  written while the set is unchanged. Healing is one ``multihub_heal`` row.
- restore() rebuilds the refusing set from those rows after a restart. A
  restored contestant must again be proven absent by its own successful
  non-empty refresh. A partition row without a usable ``contesting_hubs`` list
  restores as contested by an unknown hub, which clears only once every watched
  peer (``watched``) has refreshed successfully with history; with no
  ``watched`` list it never clears by itself.

Every governed namespace (owned here or by a peer) is tracked, as by the
reference hub: a contest over a remote-owned namespace stops claim forwarding
too. Without an ownership map nothing is ever partitioned.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, NamedTuple

from federation.ownership import NamespaceOwnership

MULTIHUB_PARTITION = "multihub_partition"
MULTIHUB_HEAL = "multihub_heal"
# The contestant a malformed journaled partition row restores with (the
# reference hub's marker, so rows written by either hub restore alike).
UNKNOWN_CONTESTANT = "<unverified-persisted-contester>"


class Transition(NamedTuple):
    kind: str  # MULTIHUB_PARTITION or MULTIHUB_HEAL
    payload: dict


def _hubs(value) -> frozenset[str]:
    if isinstance(value, str):
        value = (value,)
    try:
        return frozenset(h for h in value if isinstance(h, str) and h)
    except TypeError:
        return frozenset()


def _row(row) -> tuple[Any, Any]:
    """(kind, payload) of a journal row given as an object with .kind/.payload,
    a mapping with "kind"/"payload", or a (kind, payload) pair."""
    if isinstance(row, Mapping):
        return row.get("kind"), row.get("payload")
    if hasattr(row, "kind") and hasattr(row, "payload"):
        return row.kind, row.payload
    kind, payload = row
    return kind, payload


class PartitionDetector:
    def __init__(self, local_hub_id: str, ownership: NamespaceOwnership, *,
                 watched: Iterable[str] | None = None):
        self.local_hub_id = local_hub_id
        self.ownership = ownership
        self.watched = frozenset(watched) if watched is not None else None
        self._observations: dict[str, dict[str, frozenset[str]]] = {}  # peer -> ns -> hubs
        self._contesting: dict[str, frozenset[str]] = {}  # ns -> contesting hubs (journaled)
        self._unproven: dict[str, set[str]] = {}  # ns -> contestants not yet proven absent
        self._unknown_pending: dict[str, set[str] | None] = {}  # ns -> watched peers to refresh

    # -- reads

    def is_partitioned(self, namespace: str | None) -> bool:
        return namespace in self._contesting

    def partitioned(self) -> frozenset[str]:
        return frozenset(self._contesting)

    def contesting(self, namespace: str) -> tuple[str, ...]:
        return tuple(sorted(self._contesting.get(namespace, ())))

    def observation(self, peer: str) -> dict[str, frozenset[str]]:
        """The last observation of `peer` the detector relies on."""
        return dict(self._observations.get(peer, {}))

    # -- feeding

    def observe(self, peer: str, asserting: Mapping[str, Iterable[str]] | None,
                refreshed_ok: bool, non_empty: bool) -> list[Transition]:
        """One poll of `peer`. `asserting` is what the peer's log shows
        ({namespace: {hub_id, ...}}, normally fold.asserting_hubs of the
        peer's events: {ns: {peer}}), or None when the poll produced no view.
        `refreshed_ok`: the pull succeeded and was not refused (a refusal is a
        snapshot with log_end_seq null; AcceptResult.refused). `non_empty`: the
        observer holds some of the peer's history after this poll *and* is
        caught up to the log_end_seq the peer reported -- AcceptResult.complete
        -- so neither an empty journal nor a page in the middle of the log is
        taken as proof of what the peer shows now.
        Returns the transitions to journal, in namespace order."""
        if not refreshed_ok or asserting is None:
            return []  # a failed poll: the last successful observation stands
        seen = {ns: _hubs(hubs) for ns, hubs in asserting.items()
                if isinstance(ns, str) and _hubs(hubs)}
        if non_empty:
            self._observations[peer] = seen
            for pending in self._unproven.values():
                pending.discard(peer)
            for pending in self._unknown_pending.values():
                if pending is not None:
                    pending.discard(peer)
        else:
            # success, but no history behind it: it may add, never remove
            merged = dict(self._observations.get(peer, {}))
            for ns, hubs in seen.items():
                merged[ns] = merged.get(ns, frozenset()) | hubs
            self._observations[peer] = merged
        return self._recompute()

    def _evidence(self) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {}
        for observed in self._observations.values():
            for ns, hubs in observed.items():
                out.setdefault(ns, set()).update(hubs)
        return out

    def _recompute(self) -> list[Transition]:
        ownership = self.ownership
        evidence = self._evidence()
        transitions: list[Transition] = []
        for ns in sorted(set(ownership.owners) | set(self._contesting)):
            owner = ownership.owner_of(ns)
            old = self._contesting.get(ns, frozenset())
            new = set(ownership.contesting(ns, evidence.get(ns, ())))
            unproven = self._unproven.get(ns, set())
            # still contesting until proven absent; never the owner or this hub
            keep = {h for h in old & unproven if h != owner and h != self.local_hub_id}
            if UNKNOWN_CONTESTANT in keep and self._unknown_pending.get(ns) == set():
                keep.discard(UNKNOWN_CONTESTANT)
            new |= keep
            new = frozenset(new)
            if new == old:
                continue
            if new:
                transitions.append(Transition(MULTIHUB_PARTITION, {
                    "namespace": ns, "local_hub_id": self.local_hub_id,
                    "owner_hub_id": owner or "", "contesting_hubs": sorted(new),
                    "outcome": "partitioned", "transition": "updated" if old else "entered"}))
                self._contesting[ns] = new
                self._unproven[ns] = (unproven & new) | (new - old)
                if UNKNOWN_CONTESTANT not in new:
                    self._unknown_pending.pop(ns, None)
            else:
                resolution = ownership.resolve(ns)
                transitions.append(Transition(MULTIHUB_HEAL, {
                    "namespace": ns, "local_hub_id": self.local_hub_id,
                    "owner_hub_id": owner or "", "previous_contesting_hubs": sorted(old),
                    "outcome": resolution.kind, "observation_refreshed": True}))
                del self._contesting[ns]
                self._unproven.pop(ns, None)
                self._unknown_pending.pop(ns, None)
        return transitions

    # -- restart

    def restore(self, rows: Iterable) -> frozenset[str]:
        """Rebuild the refusing set from journaled multihub_partition /
        multihub_heal rows (in journal order; other kinds are skipped). The
        latest row per namespace wins; only a heal with observation_refreshed
        true clears. Replaces the detector's state; returns partitioned()."""
        active: dict[str, frozenset[str]] = {}
        for row in rows:
            kind, payload = _row(row)
            if kind not in (MULTIHUB_PARTITION, MULTIHUB_HEAL) or not isinstance(payload, Mapping):
                continue
            ns = payload.get("namespace")
            ns = ns.strip() if isinstance(ns, str) else ""
            if not ns:
                continue
            if kind == MULTIHUB_HEAL:
                if payload.get("observation_refreshed") is True:
                    active.pop(ns, None)
                continue
            raw = payload.get("contesting_hubs")
            hubs = None
            if isinstance(raw, list) and raw and all(isinstance(h, str) and h.strip()
                                                     for h in raw):
                hubs = frozenset(h.strip() for h in raw)
            active[ns] = hubs if hubs else frozenset({UNKNOWN_CONTESTANT})
        self._observations = {}
        self._contesting = dict(active)
        self._unproven = {ns: set(hubs) for ns, hubs in active.items()}
        self._unknown_pending = {
            ns: (set(self.watched) if self.watched is not None else None)
            for ns, hubs in active.items() if UNKNOWN_CONTESTANT in hubs}
        return self.partitioned()

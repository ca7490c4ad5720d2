"""Peer quarantine after equivocation, and its explicit recovery (journal rows).

When a peer presents a second fingerprint for an event identity the observer
already accepted, the follower refuses the batch, keeps its prior view, stops
polling that peer and journals ``multihub_equivocation`` -- digests only, never
the event payload. The quarantine survives restart and is cleared only by an
operator ceremony (``hubd multihub recover``, hub stopped) that journals
``multihub_equivocation_recovery`` naming who accepted it, a digest of why,
and the new log generation or checkpoint accepted; the follower then discards
that peer's old history and cursor and starts again from zero.

These are the pure parts: the two row payloads and the fold that tells which
peers are quarantined. Payload fields are the brief's plus the reference
hub's (``observer_id``, ``recovered_by``, ``explicit_recovery``, ``status``,
bounded identity digests), so either hub's rows restore alike.
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass
from typing import Iterable, Mapping

from federation.log_model import Equivocation
from federation.partition import _row

MULTIHUB_EQUIVOCATION = "multihub_equivocation"
MULTIHUB_EQUIVOCATION_RECOVERY = "multihub_equivocation_recovery"
LABEL_BYTES = 256  # operator labels are kept up to this many UTF-8 bytes, plus a full digest
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class RecoveryRefused(ValueError):
    """A recovery the journal does not allow (unknown or already recovered peer,
    or an empty label)."""


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _bounded(name: str, text: str) -> dict:
    """The label cut to LABEL_BYTES (on a character boundary), its digest, and
    whether it was cut."""
    encoded = text.encode("utf-8")
    kept = encoded[:LABEL_BYTES].decode("utf-8", errors="ignore")
    return {name: kept, f"{name}_sha256": hashlib.sha256(encoded).hexdigest(),
            f"{name}_truncated": kept != text}


def _label(name: str, value) -> str:
    if not isinstance(value, str) or not value.strip():
        raise RecoveryRefused(f"{name} must be a non-empty string")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise RecoveryRefused(f"{name} is not valid UTF-8") from exc
    return value


def equivocation_payload(error: Equivocation, observer_id: str, detected_at: float) -> dict:
    """The multihub_equivocation row for a refused batch: the peer, the seq,
    both fingerprints, when and by whom it was detected. No payload."""
    if not math.isfinite(detected_at):
        raise ValueError("detection time must be finite")
    return {**_bounded("peer_id", _label("peer_id", error.hub_id)),
            **_bounded("observer_id", observer_id or ""),
            "seq": error.seq,
            "accepted_fingerprint": error.accepted_fingerprint,
            "conflicting_fingerprint": error.offered_fingerprint,
            "detected_at": float(detected_at),
            "status": "quarantined",
            # what was caught (federation/log_chain.py): conflicting_offer,
            # chain_broken, checkpoint_equivocation; and for the last the two
            # signed checkpoints, the proof a third party can check
            "reason": error.reason,
            **({"proof": error.proof} if error.proof else {})}


def recovery_payload(peer_id: str, operator: str, reason: str, new_log_generation: str,
                     recovered_at: float) -> dict:
    """The multihub_equivocation_recovery row. The free-text reason is kept
    only as its SHA-256."""
    peer_id = _label("peer_id", peer_id)
    operator = _label("operator", operator)
    reason = _label("reason", reason)
    generation = _label("new_log_generation", new_log_generation)
    if isinstance(recovered_at, bool) or not isinstance(recovered_at, (int, float)) or (
            not math.isfinite(recovered_at)):
        raise RecoveryRefused("recovery time must be finite")
    return {**_bounded("peer_id", peer_id),
            "operator": operator,
            **_bounded("recovered_by", operator),
            **_bounded("new_log_generation", generation),
            "reason_sha256": _sha256(reason),
            "recovered_at": float(recovered_at),
            "explicit_recovery": True,
            "status": "recovered"}


@dataclass(frozen=True)
class Quarantine:
    peer_id: str
    seq: int
    accepted_fingerprint: str
    conflicting_fingerprint: str
    detected_at: float
    observer_id: str
    reason: str = "conflicting_offer"
    proof: tuple = ()  # two signed checkpoints (checkpoint_equivocation)

    def to_json(self) -> dict:
        out = {"peer_id": self.peer_id, "seq": self.seq,
               "accepted_fingerprint": self.accepted_fingerprint,
               "conflicting_fingerprint": self.conflicting_fingerprint,
               "detected_at": self.detected_at, "observer_id": self.observer_id,
               "reason": self.reason}
        if self.proof:
            out["proof"] = list(self.proof)
        return out


def active_quarantines(rows: Iterable) -> dict[str, Quarantine]:
    """Peers quarantined by the journal: a multihub_equivocation row with no
    later multihub_equivocation_recovery (explicit, naming a generation) for
    the same peer. Rows are (kind, payload) pairs, mappings or events with a
    .ts, in journal order; other kinds are skipped."""
    active: dict[str, Quarantine] = {}
    for row in rows:
        kind, payload = _row(row)
        if kind not in (MULTIHUB_EQUIVOCATION, MULTIHUB_EQUIVOCATION_RECOVERY) or not (
                isinstance(payload, Mapping)):
            continue
        peer = payload.get("peer_id")
        peer = peer.strip() if isinstance(peer, str) else ""
        if not peer:
            continue
        if kind == MULTIHUB_EQUIVOCATION_RECOVERY:
            generation = payload.get("new_log_generation")
            if payload.get("explicit_recovery") is True and isinstance(generation, str) and (
                    generation.strip()):
                active.pop(peer, None)
            continue
        seq = payload.get("seq")
        seq = seq if isinstance(seq, int) and not isinstance(seq, bool) else 0
        fingerprints = [payload.get(k) for k in ("accepted_fingerprint",
                                                 "conflicting_fingerprint")]
        fingerprints = [f if isinstance(f, str) and _SHA256.match(f) else "0" * 64
                        for f in fingerprints]
        detected = payload.get("detected_at")
        if isinstance(detected, bool) or not isinstance(detected, (int, float)):
            detected = getattr(row, "ts", 0.0) if not isinstance(row, Mapping) else row.get(
                "ts", 0.0)
        observer = payload.get("observer_id")
        reason = payload.get("reason")
        proof = payload.get("proof")
        proof = tuple(proof) if isinstance(proof, list) and len(proof) == 2 and all(
            isinstance(item, Mapping) for item in proof) else ()
        active[peer] = Quarantine(peer, seq, fingerprints[0], fingerprints[1],
                                  float(detected or 0.0),
                                  observer if isinstance(observer, str) else "",
                                  reason if isinstance(reason, str) else "conflicting_offer",
                                  proof)
    return active


def recovery_decision(rows: Iterable, peer_id: str, operator: str, reason: str,
                      new_log_generation: str, recovered_at: float) -> dict:
    """The recovery payload if the journal rows (equivocation and recovery
    kinds, in journal order) allow it; RecoveryRefused otherwise. Used by the
    offline command below and reusable by a running hub's own ceremony."""
    rows = list(rows)
    payload = recovery_payload(peer_id, operator, reason, new_log_generation, recovered_at)
    active = active_quarantines(rows)
    if peer_id not in active:
        ever = any(_row(r)[0] == MULTIHUB_EQUIVOCATION and isinstance(_row(r)[1], Mapping)
                   and _row(r)[1].get("peer_id") == peer_id for r in rows)
        raise RecoveryRefused(
            f"peer {peer_id!r} is not quarantined: " +
            ("it was already recovered" if ever else "this journal holds no equivocation "
             "record for it"))
    return payload


def record_recovery(journal_path, peer_id: str, operator: str, reason: str,
                    new_log_generation: str, now: float | None = None):
    """Append multihub_equivocation_recovery to a STOPPED hubd journal at the
    next seq, if the journal shows `peer_id` quarantined. Returns the Event
    written. Raises RecoveryRefused (unknown or already recovered peer, empty
    label), journal_access.HubRunning (the journal is open elsewhere: stop the
    hub first) or journal_access.JournalError."""
    import time

    from federation.journal_access import append_operator_row

    at = time.time() if now is None else now
    return append_operator_row(
        journal_path, MULTIHUB_EQUIVOCATION_RECOVERY,
        lambda rows: recovery_decision(rows, peer_id, operator, reason, new_log_generation, at),
        reads=(MULTIHUB_EQUIVOCATION, MULTIHUB_EQUIVOCATION_RECOVERY), now=at)

"""What a lease's holder may do with it: release, task_update, checkpoint,
handoff and wait_request decided as pure functions (the projection and the
claim decision are hubd/state/claims.py).

State transitions of a lease (`status`), as table:

    claimed         -> claimed | working | done | failed
    working         -> working | input_required | done | failed
    input_required  -> input_required | working | done | failed
    done            -> done
    failed          -> failed
"""

from __future__ import annotations

import math

from .claims import ClaimState, strict_int, text_field

TRANSITIONS = {
    "claimed": {"claimed", "working", "done", "failed"},
    "working": {"working", "input_required", "done", "failed"},
    "input_required": {"input_required", "working", "done", "failed"},
    "done": {"done"},
    "failed": {"failed"},
}

EVIDENCE_LISTS = ("evidence", "artifacts", "known_failures", "changed_files",
                  "generated_artifacts", "approvals")
FRESH_SECONDS = 3600.0


def check_holder(lease: dict | None, task_id: str, who: str, epoch, *,
                 not_claimed: str, owned: str) -> str | None:
    """Why `who` may not act on this lease (None if it may). `epoch` is checked
    only when it is an integer."""
    if lease is None:
        return not_claimed.format(task_id=task_id)
    if lease["owner"] != who:
        return owned.format(task_id=task_id, owner=lease["owner"], who=who)
    epoch = strict_int(epoch)
    if epoch is not None and epoch != lease["epoch"]:
        return f"Task '{task_id}' epoch is stale (current {lease['epoch']})."
    return None


def string_list(value) -> list[str]:
    """Evidence lists: a string is one item; items become trimmed text; empty
    items are dropped; anything else is an empty list."""
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        return []
    out = []
    for item in value:
        if isinstance(item, (dict, list)):
            continue
        text = (item if isinstance(item, str) else str(item)).strip()
        if text:
            out.append(text)
    return out


def build_receipt(frame: dict, task_id: str, owner: str) -> tuple[dict, bool]:
    """The release receipt and whether the request carried any evidence.

    epistemic_status is the hub's plain reading of what was submitted, never
    a policy verdict: degraded (known failures declared), unsupported (no
    positive evidence), needs_freshness (evidence without its age), stale
    (evidence older than an hour) or unverified (fresh, as submitted)."""
    receipt: dict = {"task_id": task_id, "owner": owner, "released": True}
    for name in EVIDENCE_LISTS:
        receipt[name] = string_list(frame.get(name))
    confidence = frame.get("confidence")
    has_confidence = confidence is not None and not isinstance(confidence, (dict, list)) and (
        text_field(confidence) != "")
    freshness = frame.get("freshness_seconds")
    has_freshness = (not isinstance(freshness, bool) and isinstance(freshness, (int, float))
                     and math.isfinite(freshness))
    positive = any(receipt[name] for name in EVIDENCE_LISTS if name != "known_failures")
    reasons = []
    if receipt["known_failures"]:
        reasons.append("known failures declared")
    if positive:
        reasons.append("positive evidence present")
        if not receipt["known_failures"]:
            if not has_freshness:
                reasons.append("freshness_seconds missing")
            elif float(freshness) > FRESH_SECONDS:
                reasons.append(f"evidence age exceeds {int(FRESH_SECONDS)} seconds")
            else:
                reasons.append("fresh evidence present but unverified")
    else:
        reasons.append("no positive evidence, artifact, changed file, generated artifact, "
                       "or approval")
    if receipt["known_failures"]:
        status = "degraded"
    elif not positive:
        status = "unsupported"
    elif not has_freshness:
        status = "needs_freshness"
    elif float(freshness) > FRESH_SECONDS:
        status = "stale"
    else:
        status = "unverified"
    receipt["epistemic_status"] = status
    receipt["epistemic_reasons"] = reasons
    if has_confidence:
        receipt["confidence"] = text_field(confidence)
    if has_freshness:
        receipt["freshness_seconds"] = max(0.0, float(freshness))
    has_evidence = any(receipt[name] for name in EVIDENCE_LISTS) or has_confidence or (
        has_freshness)
    return receipt, has_evidence


def receipt_note_text(receipt: dict) -> str:
    parts = [f"{name}={', '.join(receipt[name])}" for name in EVIDENCE_LISTS if receipt[name]]
    for name in ("confidence", "freshness_seconds"):
        if name in receipt:
            parts.append(f"{name}={receipt[name]}")
    parts.append(f"epistemic_status={receipt['epistemic_status']}")
    parts.append(f"epistemic_reasons={', '.join(receipt['epistemic_reasons'])}")
    return "release receipt: " + "; ".join(parts)


def transition_refusal(task_id: str, current: str, wanted: str) -> str | None:
    if wanted in TRANSITIONS.get(current, ()):
        return None
    return f"Task '{task_id}' cannot transition {current} -> {wanted}."


def deadlock(claims: ClaimState, waits: dict, waiter: str, holder: str, now: float,
             depth: int = 64) -> bool:
    """Would `waiter` waiting on `holder` close a cycle in the wait-for graph?
    `waits` maps an agent to (task, epoch) it waits for; a wait counts only
    while that very lease is still live."""
    current = holder
    for _ in range(depth):
        if current == waiter:
            return True
        waiting = waits.get(current)
        if waiting is None:
            return False
        task, epoch = waiting
        lease = claims.live(task, now)
        if lease is None or lease["epoch"] != epoch:
            return False
        current = lease["owner"]
    return False

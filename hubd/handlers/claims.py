"""Claim-family verbs: claim, release, task_update, checkpoint, handoff,
wait_request; the lease expiry sweep; state_snapshot's active_claims and the
read-only release_confirmation.

Decisions are made by hubd.state.claims (pure); this module turns them into
events and frames. Every grant goes through `grant_or_deny`, the one place a
lease is granted or refused on this hub's authority.

The principal's claim grant (docs/identity.md, "Grants") gates the verbs that
take or give a lease: `claim` (a new lease or a renewal) in the claimant
seat's namespace, `handoff` in the holder's and the recipient's. `release`,
`task_update`, `checkpoint` act only on a lease the seat already holds and
`wait_request` writes nothing, so they need no grant.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

from hubd.actors.router import Router
from hubd.core.plugin import Verbs
from hubd.state import board as bd
from hubd.state import capabilities as cap
from hubd.state import claims as cl
from hubd.state import lease_rules as lr
from hubd.state import idem
from hubd.state.presence import Session

from hubd.wire.targets import project_of

from . import grants, idempotency

# this module's verbs (its plugin installs them)
verbs = Verbs()

MAX_WAITS = 10_000


class ClaimsLive:
    """Live (not journaled) bookkeeping of the claim verbs, bounded (MAX_WAITS each)."""

    def __init__(self, router: Router):
        # owner -> when its last socket went away
        self.offline_since: OrderedDict = OrderedDict()
        # waiter -> (task, epoch) it waits for (deadlock detection)
        self.waits: OrderedDict = OrderedDict()


def limits(router: Router) -> cl.LeaseLimits:
    return router.config.claims


def offline_since(router: Router) -> OrderedDict:
    """Owners whose last socket went away, and since when."""
    return router.live_of(ClaimsLive).offline_since


# -- claim

def _gated(router: Router, session: Session, frame: dict, verb: str) -> bool:
    """A plugin's claim gate (federation's namespace ownership) sees claim-family
    verbs first; True when it handled the frame (forwarded it to the owning
    hub, or refused it naming the owner)."""
    gate = router.installed.claim_gate
    return gate is not None and gate(router, session, frame, verb)


@verbs.handles("claim")
def claim(router: Router, session: Session, frame: dict, size: int) -> None:
    # the principal's claim grant first, before the namespace owner's gate:
    # a claim this session may not make is refused here whoever owns it
    refusal = grants.claim_refusal(router, session, (project_of(session.name),))
    if refusal is not None:
        grants.refuse_claim(router, session, cl.read_claim(
            frame, session.name, limits(router), session.principal), refusal)
        return
    if _gated(router, session, frame, "claim"):
        return
    keyed = idempotency.begin(router, session, "claim", frame)
    if keyed is idempotency.HANDLED:
        return
    request = cl.read_claim(frame, session.name, limits(router), session.principal)
    grant_or_deny(router, session, request, keyed)


def grant_or_deny(router: Router, session: Session, request: cl.ClaimRequest,
                  keyed: idempotency.Keyed | None = None) -> cl.Grant | cl.Deny:
    """Grant or refuse one claim on this hub's authority.

    This is the single grant decision point. Federation puts its namespace
    ownership gate in front of this call: a claim in a namespace this hub does
    not own must be forwarded to its owner or refused before reaching here.
    """
    decision, granted, first = decide_and_record(router, request)
    task_id = request.task_id
    if isinstance(decision, cl.Deny):
        router.reply(session, "claim_denied", decision.text, task_id=task_id,
                     **cl.denial_fields(decision))
        router.fail_privately(session, f"Claim of '{task_id}' could not be decided now (the "
                                       "hub could not journal it); nothing changed. Retry.",
                              task_id=task_id)
        return decision
    idempotency.remember(router, session, keyed, granted, first)
    router.fail_privately(session, f"Claim of '{task_id}' was not journalled; nothing was "
                                   "granted. Retry (with the same idem_key).", task_id=task_id)
    return decision


def decide_and_record(router: Router, request: cl.ClaimRequest):
    """The decision and its events: durable denial evidence, or the lease and
    its claim_granted broadcast. Returns (decision, claim_granted frame or
    None, the first seq it journaled). Used for local claimants and for claims
    a peer hub forwards to this owner."""
    expire_due(router)
    claims = cl.claims_of(router.state)
    decision = cl.decide_claim(claims, request, router.now, limits(router))
    if isinstance(decision, cl.Deny):
        # durable, content-minimised evidence first; the reply leaves only
        # once it is committed
        router.event(cl.CLAIM_DENIAL,
                     cl.denial_evidence(request.claimant, request, decision.reason_code))
        return decision, None, None
    lease = decision.lease
    first = router.next_seq()
    router.event(cl.CLAIM, lease)
    granted = router.frame("claim_granted", "all",
                           f"Task '{request.task_id}' claimed by {lease['owner']}.",
                           **cl.grant_fields(lease))
    router.broadcast(granted)
    return decision, granted, first


# -- release

@verbs.handles("release")
def release(router: Router, session: Session, frame: dict, size: int) -> None:
    if _gated(router, session, frame, "release"):
        return
    keyed = idempotency.begin(router, session, "release", frame)
    if keyed is idempotency.HANDLED:
        return
    name = session.name
    bound = {"release_operation_id": keyed.key, "request_digest": keyed.digest} if keyed else {}
    task_id, refusal, lease = release_refusal(router, name, frame)
    if refusal is not None:
        router.reply(session, "release_denied", refusal, task_id=task_id, **bound)
        return
    first = router.next_seq()
    granted = record_release(router, name, lease, frame, bound)
    idempotency.remember(router, session, keyed, granted, first)
    router.fail_privately(session, f"Release of '{task_id}' was not journalled; the lease is "
                                   "still held. Retry (with the same idem_key).", task_id=task_id,
                          **bound)


def release_refusal(router: Router, who: str, frame: dict) -> tuple[str, str | None, dict | None]:
    """(task_id, refusal text or None, the live lease) for `who` releasing."""
    expire_due(router)
    task_id = cl.task_id_of(frame, "payload")
    if not task_id:
        return task_id, "Task ID is required.", None
    lease = cl.claims_of(router.state).live(task_id, router.now)
    return task_id, lr.check_holder(lease, task_id, who, frame.get("epoch"),
                                    not_claimed="Task '{task_id}' is not currently claimed.",
                                    owned="Task '{task_id}' is owned by {owner}, not {who}."), lease


def record_release(router: Router, name: str, lease: dict, frame: dict, bound: dict) -> dict:
    """Journal and announce one release; returns the release_granted frame."""
    task_id = lease["task_id"]
    now = router.now
    receipt, has_evidence = lr.build_receipt(frame, task_id, name)
    router.event(cl.RELEASE, {"task_id": task_id, "owner": name, "epoch": lease["epoch"],
                              "released_at": now})
    granted = router.frame("release_granted", "all", f"Task '{task_id}' released by {name}.",
                           task_id=task_id, owner=name, receipt=receipt, **bound)
    router.broadcast(granted)
    if has_evidence:
        note = {"task_id": task_id, "author": name, "kind": "assessment",
                "text": lr.receipt_note_text(receipt), "posted_at": now}
        router.event(bd.LEDGER_PROGRESS, note)
        router.broadcast(router.frame("ledger_progress_posted", "all",
                                      f"Release receipt from {name}", note=note))
    return granted


# -- task_update, checkpoint, handoff, wait_request
#
# Each verb is decided by a function of (router, who, frame) that makes its
# events and broadcasts and returns an Answer; the handler sends the Answer to
# its local claimant, and federation's owner side relays it to a claimant on
# another hub (federation/handlers/claims.py), so both are decided alike.


@dataclass(slots=True)
class Answer:
    """What a claim-family verb answers whoever asked."""

    ok: bool
    type: str  # the reply's frame type ("error" for task_update's refusals)
    text: str
    fields: dict
    frame: dict | None = None  # the reply frame made, when ok (for idempotency)
    lease: dict | None = None  # the lease after the verb, when it changed one
    first: int | None = None  # the first seq the verb journaled (for idempotency)


def answer_locally(router: Router, session: Session, answer: Answer) -> None:
    if answer.type == "error":
        router.error(session, answer.text, **answer.fields)
    else:
        router.reply(session, answer.type, answer.text, **answer.fields)


def _answer_keyed(router: Router, session: Session, keyed, answer: Answer, failed: str) -> None:
    idempotency.remember(router, session, keyed, answer.frame, answer.first)
    router.fail_privately(session, failed, task_id=answer.fields["task_id"])


def _keyed_verb(router: Router, session: Session, frame: dict, verb: str,
                decide: Callable[[Router, str, dict], Answer],
                not_journalled: Callable[[str, str], str], *, to_sender: bool = False) -> None:
    """A lease verb decided on this hub: the ownership gate, the idempotency
    key, the decision; a refusal is answered at once, a change is remembered
    under its key (and sent to the sender too when `to_sender`)."""
    if _gated(router, session, frame, verb):
        return
    keyed = idempotency.begin(router, session, verb, frame)
    if keyed is idempotency.HANDLED:
        return
    answer = decide(router, session.name, frame)
    if not answer.ok:
        answer_locally(router, session, answer)
        return
    if to_sender:
        router.send(session.endpoint, answer.frame)
    _answer_keyed(router, session, keyed, answer,
                  not_journalled(answer.fields["task_id"], session.name))


def _reply_fields(frame: dict) -> dict:
    return {k: v for k, v in frame.items()
            if k not in ("type", "payload", "sender", "target", "timestamp", "hub_id")}


@verbs.handles("task_update")
def task_update(router: Router, session: Session, frame: dict, size: int) -> None:
    _keyed_verb(router, session, frame, "task_update", update_task,
                lambda task_id, who: f"Update of '{task_id}' was not journalled; nothing "
                                     "changed. Retry.")


def update_task(router: Router, who: str, frame: dict) -> Answer:
    expire_due(router)
    task_id = cl.task_id_of(frame, "id")
    if not task_id:
        return Answer(False, "error", "Task ID is required.", {})
    lease = cl.claims_of(router.state).live(task_id, router.now)
    refusal = lr.check_holder(lease, task_id, who, frame.get("epoch"),
                              not_claimed="Task '{task_id}' not found.",
                              owned="Task '{task_id}' owned by {owner}, not {who}.")
    if refusal is None:
        wanted = cl.strict_int(frame.get("expected_version"))
        if wanted is not None and wanted != lease["version"]:
            refusal = f"Task '{task_id}' version conflict (current {lease['version']})."
    status = cl.text_field(frame.get("status")).strip() if refusal is None else ""
    if refusal is None and status:
        refusal = lr.transition_refusal(task_id, lease["status"], status)
    if refusal is not None:
        return Answer(False, "error", refusal, {"task_id": task_id})
    updated = dict(lease)
    updated["status"] = status or lease["status"]
    if frame.get("note") is not None:
        updated["note"] = cl.text_field(frame["note"])
    if frame.get("data_ref") is not None:
        updated["data_ref"] = cl.text_field(frame["data_ref"])
    updated["version"] = lease["version"] + 1
    first = router.next_seq()
    router.event(cl.TASK_UPDATE, updated)
    reply = router.frame("task_updated", "all", f"Task '{task_id}' updated by {who}.",
                         task_id=task_id, owner=who, status=updated["status"],
                         data_ref=updated["data_ref"], version=updated["version"])
    router.broadcast(reply)
    return Answer(True, "task_updated", reply["payload"], _reply_fields(reply), reply, updated,
                  first)


@verbs.handles("checkpoint")
def checkpoint(router: Router, session: Session, frame: dict, size: int) -> None:
    _keyed_verb(router, session, frame, "checkpoint", save_checkpoint,
                lambda task_id, who: f"Checkpoint of '{task_id}' was not journalled; nothing "
                                     "changed. Retry.", to_sender=True)


def save_checkpoint(router: Router, who: str, frame: dict) -> Answer:
    expire_due(router)
    task_id = cl.task_id_of(frame, "id")
    lease = cl.claims_of(router.state).live(task_id, router.now) if task_id else None
    refusal = "Task ID is required." if not task_id else lr.check_holder(
        lease, task_id, who, frame.get("epoch"), not_claimed="Task '{task_id}' not found.",
        owned="Task '{task_id}' owned by {owner}, not {who}.")
    if refusal is not None:
        return Answer(False, "checkpoint_denied", refusal, {"task_id": task_id})
    text = frame.get("checkpoint")
    if text is None:
        text = frame.get("payload")
    updated = dict(lease)
    updated["checkpoint"] = cl.text_field(text)
    updated["version"] = lease["version"] + 1
    first = router.next_seq()
    router.event(cl.CHECKPOINT, updated)
    reply = router.frame("checkpoint_saved", who, f"Checkpoint saved for '{task_id}' by {who}.",
                         task_id=task_id, version=updated["version"])
    return Answer(True, "checkpoint_saved", reply["payload"], _reply_fields(reply), reply,
                  updated, first)


# -- handoff

@verbs.handles("handoff")
def handoff(router: Router, session: Session, frame: dict, size: int) -> None:
    # giving a lease is claiming on the recipient's behalf: the claim grant must
    # cover the holder's namespace and the recipient's
    to = handoff_target(frame)
    wanted = (project_of(session.name),)
    if to != "all" and project_of(to) != wanted[0]:
        wanted += (project_of(to),)
    refusal = grants.claim_refusal(router, session, wanted)
    if refusal is not None:
        grants.refuse(router, session, refusal, "handoff", reply="handoff_denied",
                      task_id=cl.task_id_of(frame, "id", "payload"))
        return
    _keyed_verb(router, session, frame, "handoff", hand_off,
                lambda task_id, who: f"Handoff of '{task_id}' was not journalled; "
                                     f"{who} still holds it. Retry.")


def handoff_target(frame: dict) -> str:
    to = frame.get("to_agent")
    if not isinstance(to, str) or not to:
        to = frame.get("target") or "all"
    return to


def hand_off(router: Router, who: str, frame: dict, target_online: bool = False) -> Answer:
    """`target_online`: the hub the claimant is on saw the target online (a
    forwarded handoff to an agent on that hub); otherwise it must be online here."""
    expire_due(router)
    name = who
    now = router.now
    claims = cl.claims_of(router.state)
    task_id = cl.task_id_of(frame, "id", "payload")
    to = handoff_target(frame)
    lease = claims.live(task_id, now) if task_id else None
    if not task_id:
        refusal = "Task ID is required."
    elif to not in router.presence.by_name and not target_online:
        refusal = f"Handoff target '{to}' is not online."
    else:
        refusal = lr.check_holder(lease, task_id, name, frame.get("epoch"),
                                  not_claimed="Task '{task_id}' is not currently claimed.",
                                  owned="Task '{task_id}' is owned by {owner}, not {who}.")
    if refusal is None and to == lease["owner"]:
        refusal = f"Task '{task_id}' is already owned by {to}."
    if refusal is None:
        cap = limits(router).max_claims_per_agent
        if len(claims.by_owner.get(to, ())) >= cap and len(claims.held_by(to, now)) >= cap:
            refusal = f"Agent {to} holds the maximum {cap} claims."
    if refusal is not None:
        return Answer(False, "handoff_denied", refusal, {"task_id": task_id})
    note = cl.text_field(frame.get("note"))
    moved = dict(lease)
    moved.update(owner=to, note=note, claimed_at=now,
                 lease_expires_at=now + cl.ttl_of(frame.get("ttl_seconds"), limits(router)),
                 epoch=claims.epoch + 1, version=0)
    progress = {"task_id": task_id, "author": name, "kind": "note",
                "text": f"handed off to {to}: {note}" if note else f"handed off to {to}",
                "posted_at": now}
    first = router.next_seq()
    router.event(cl.HANDOFF, moved)
    router.event(bd.LEDGER_PROGRESS, progress)
    router.broadcast(router.frame("ledger_progress_posted", "all", f"Progress from {name}",
                                  note=progress))
    fields = {key: moved[key] for key in ("task_id", "owner")}
    fields["previous_owner"] = name
    fields.update({key: moved[key] for key in ("note", "status", "worktree", "paths", "epoch",
                                               "version", "lease_expires_at", "checkpoint")})
    if "path_identity" in moved:
        fields["path_identity"] = moved["path_identity"]
    granted = router.frame("handoff_granted", "all",
                           f"Task '{task_id}' handed from {name} to {to}.", **fields)
    router.broadcast(granted)
    return Answer(True, "handoff_granted", granted["payload"], _reply_fields(granted), granted,
                  moved, first)


# -- wait_request

@verbs.handles("wait_request")
def wait_request(router: Router, session: Session, frame: dict, size: int) -> None:
    if _gated(router, session, frame, "wait_request"):
        return
    answer_locally(router, session, wait_for_task(router, session.name, frame))


def wait_for_task(router: Router, who: str, frame: dict) -> Answer:
    name = who
    now = router.now
    claims = cl.claims_of(router.state)
    task_id = cl.task_id_of(frame, "id", "payload")
    lease = claims.live(task_id, now) if task_id else None
    if lease is None:
        return Answer(False, "wait_denied", f"Task '{task_id}' is not claimed; nothing to "
                                            "wait for.", {"task_id": task_id})
    holder = lease["owner"]
    if holder == name:
        return Answer(False, "wait_denied", f"You already hold '{task_id}'.",
                      {"task_id": task_id})
    waits = router.live_of(ClaimsLive).waits
    if lr.deadlock(claims, waits, name, holder, now):
        return Answer(False, "wait_denied", f"Waiting for '{task_id}' held by {holder} would "
                                            "deadlock.", {"task_id": task_id, "holder": holder})
    waits.pop(name, None)
    waits[name] = (task_id, lease["epoch"])
    while len(waits) > MAX_WAITS:
        waits.popitem(last=False)
    return Answer(True, "wait_granted", f"Waiting for '{task_id}' held by {holder}.",
                  {"task_id": task_id, "holder": holder})


# -- expiry

def end_lease(router: Router, lease: dict, reason: str) -> None:
    task_id, owner = lease["task_id"], lease["owner"]
    router.event(cl.LEASE_EXPIRED, {"task_id": task_id, "owner": owner, "epoch": lease["epoch"],
                                    "lease_expires_at": lease["lease_expires_at"],
                                    "reason": reason, "expired_at": router.now})
    router.broadcast(router.frame(
        "lease_expired", "all", f"Lease on '{task_id}' held by {owner} expired ({reason}).",
        task_id=task_id, owner=owner, epoch=lease["epoch"],
        lease_expires_at=lease["lease_expires_at"], reason=reason))


def expire_due(router: Router) -> None:
    """Journal and announce every lease whose time is up, before any decision
    that depends on it."""
    claims = cl.claims_of(router.state)
    heap = claims.expiry
    if heap and heap[0][0] <= router.now:
        for lease in claims.due(router.now):
            end_lease(router, lease, "ttl")


def sweep(router: Router) -> None:
    """Once a second: expired leases end themselves; with --lease-offline-ttl,
    so do the leases of a holder offline for longer than that."""
    if "hubd_active_claims" not in router.metrics.gauges:
        register_gauges(router)
    if router.mutations_refused():
        return
    expire_due(router)
    ttl = limits(router).offline_ttl
    if ttl is None:
        return
    claims = cl.claims_of(router.state)
    offline = offline_since(router)
    by_name = router.presence.by_name
    started = router.hub.started
    now = router.now
    for owner in sorted(claims.by_owner):
        if owner in by_name:
            continue
        if now - offline.get(owner, started) >= ttl:
            for task_id in sorted(claims.by_owner.get(owner, ())):
                lease = claims.live(task_id, now)
                if lease is not None:
                    end_lease(router, lease, "holder_offline")
            offline.pop(owner, None)



def register_gauges(router: Router) -> None:
    """The sizes of the claim, board, idempotency and card stores, so their
    bounds are visible on /metrics."""
    def gauge(name, text, read):
        router.metrics.gauge(name, text, read)
    gauge("hubd_active_claims", "Leases held (live or awaiting the expiry sweep).",
          lambda: len(cl.claims_of(router.state).leases))
    gauge("hubd_lease_epoch", "The last fencing epoch issued.",
          lambda: cl.claims_of(router.state).epoch)
    gauge("hubd_idempotency_keys", f"Keyed verdicts remembered (bound {idem.TOTAL}, "
          f"{idem.PER_SENDER} per sender).", lambda: len(idem.store_of(router.state).entries))
    gauge("hubd_board_tasks", f"Board tasks (bound {bd.MAX_TASKS}).",
          lambda: len(bd.board_of(router.state).tasks))
    gauge("hubd_board_progress_notes", f"Board progress notes (bound {bd.MAX_PROGRESS}).",
          lambda: len(bd.board_of(router.state).progress))
    gauge("hubd_capability_registrations",
          f"Persistent capability registrations (bound {cap.MAX_REGISTRATIONS}).",
          lambda: len(cap.capabilities_of(router.state).registrations))


def health_active_claims(hub) -> int:
    router = hub.router
    if router is None:
        return 0
    claims = cl.claims_of(router.state)
    now = time.time()
    return sum(1 for lease in claims.leases.values() if lease["lease_expires_at"] > now)



def on_register(router: Router, session: Session, frame: dict) -> None:
    offline = offline_since(router)
    if offline:
        offline.pop(session.name, None)


def on_unregister(router: Router, session: Session) -> None:
    name = session.name
    if name in router.presence.by_name:
        return  # another socket still holds the name
    if name in cl.claims_of(router.state).by_owner:
        offline = offline_since(router)
        offline[name] = router.now
        while len(offline) > MAX_WAITS:
            offline.popitem(last=False)
    waits = router.live_of(ClaimsLive).waits
    if waits:
        waits.pop(name, None)



# -- state_snapshot sections

def active_claims(router: Router) -> list[dict]:
    now = router.now
    claims = cl.claims_of(router.state)
    by_name = router.presence.by_name
    offline = offline_since(router)
    started = router.hub.started
    out = []
    for task_id in sorted(claims.leases):
        lease = claims.live(task_id, now)
        if lease is None:
            continue
        entry = cl.snapshot_entry(lease)
        online = lease["owner"] in by_name
        entry["holder_online"] = online
        entry["holder_offline_seconds"] = None if online else round(
            max(0.0, now - offline.get(lease["owner"], started)), 3)
        out.append(entry)
    return out


def _hex64(value) -> bool:
    return isinstance(value, str) and len(value) == 64 and all(
        c in "0123456789abcdef" for c in value)


def release_confirmation(router: Router, session: Session, query) -> dict:
    """The read-only answer to state_request.release_confirmation: confirmed
    only for this sender's own accepted release with that key, task and
    digest; unknown otherwise. Nothing is written."""
    if not isinstance(query, dict):
        return {"status": "unknown"}
    task_id = query.get("task_id")
    operation_id = query.get("operation_id")
    digest = query.get("request_digest")
    if not (isinstance(task_id, str) and task_id and isinstance(operation_id, str)
            and 1 <= len(operation_id) <= 128 and "\x00" not in operation_id
            and _hex64(digest)):
        return {"status": "unknown"}
    echo = {"task_id": task_id, "operation_id": operation_id, "request_digest": digest}
    remembered = idem.store_of(router.state).lookup(session.name, "release", operation_id)
    response = remembered.response if remembered is not None else None
    receipt = response.get("receipt") if response is not None else None
    if (response is None or remembered.digest != digest
            or response.get("type") != "release_granted"
            or response.get("task_id") != task_id or response.get("owner") != session.name
            or not isinstance(receipt, dict) or receipt.get("released") is not True):
        return {"status": "unknown", **echo}
    return {**echo, "status": "confirmed", "owner": response["owner"],
            "release_operation_id": operation_id, "receipt": receipt,
            "first_event_seq": remembered.first_event_seq, "commit_seq": remembered.commit_seq}


STATE_SECTIONS = {"active_claims": active_claims, "release_confirmation": release_confirmation}

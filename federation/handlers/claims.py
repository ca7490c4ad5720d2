"""Claims across hubs: routed to the namespace's owner, never merged.

Claimant side (the ownership gate, in front of every claim-family verb:
claim, release, task_update, checkpoint, handoff, wait_request):
- namespace owned here and uncontested: the verb proceeds locally;
- owned by a peer with a `--claim-peer` route: handed to the ClaimForwarder
  actor (federation/actors/claim_forwarder.py), which sends it to the owner as
  `multihub_claim_request`; the owner's verdict comes back as a ClaimVerdict
  message, relayed privately to the claimant (a claim_granted built from the
  owner's lease, its epoch and expiry, or a refusal in the owner's words), and
  the lease as the owner now has it is journaled here (federation/
  remote_leases.py) so the claimant's state_snapshot lists it; an owner that
  does not answer gives the refusal that names it (fail closed);
- owned by a peer without a route, ungoverned, or contested: refused, naming
  the owner when there is one.

Owner side: `multihub_claim_request` from a peer that passes the serving
policy with its pinned certificate, for a namespace this hub owns, is decided
by the same functions as the local verb, on this hub's own authority.
"""

from __future__ import annotations

import structlog

from federation import remote_leases as rl
from federation.actors.claim_forwarder import (LEASE_HELD, REPLIES, ClaimForwarderFull,
                                               ClaimVerdict, ForwardClaim, refusal_text)
from federation.ownership import namespace_of
from federation.policy import NAMESPACE_NOT_GRANTED
from federation.handlers.receiver import PEER_NOT_AUTHORISED, authorise_peer, seat_problem
from hubd.actors.router import Router
from hubd.core.plugin import Verbs
from hubd.handlers import claims as claim_handlers
from hubd.state import claims as cl
from hubd.state.presence import Session

log = structlog.get_logger("hubd.federation.claims")

# this module's verbs (its plugin installs them)
verbs = Verbs()

# typed reasons a multihub_claim_result carries when the request itself is
# refused (beside namespace_not_granted and peer_not_authorised, the forward
# codes): a claimant that is not one seat of the namespace, and a lease held
# by a seat of that name that is not the peer's (docs/federation.md)
INVALID_CLAIMANT = "invalid_claimant"
HOLDER_NOT_AT_ORIGIN = "holder_not_at_origin"

# where each verb names its task (as the local handlers read it)
TASK_FIELDS = {"claim": ("payload",), "release": ("payload",), "task_update": ("id",),
               "checkpoint": ("id",), "handoff": ("id", "payload"),
               "wait_request": ("id", "payload")}


def gate(router: Router, session: Session, frame: dict, verb: str) -> bool:
    authority = router.hub.federation.authority
    if authority is None or not authority.configured:
        return False
    resolution = authority.resolve(session.name)
    if resolution.kind == "local":
        return False
    task_id = cl.task_id_of(frame, *TASK_FIELDS[verb])
    namespace, owner = resolution.namespace, resolution.owner_hub_id
    denied = REPLIES[verb][1]
    if resolution.kind == "remote" and owner in authority.claim_links:
        claim = {k: v for k, v in frame.items() if k != "token"}
        claim["type"] = verb
        request_id = authority.new_request_id()
        request = {"sender": router.hub_id, "target": "all", "type": "multihub_claim_request",
                   "payload": "", "namespace": namespace, "claimant": session.name,
                   "task_id": task_id, "claim": claim, "request_id": request_id}
        if verb == "handoff":
            # the owner cannot see who is online here; this hub vouches for it
            request["target_online"] = claim_handlers.handoff_target(frame) in \
                router.presence.by_name
        try:
            authority.claim_forwarder.submit(ForwardClaim(
                request_id, owner, verb, namespace, task_id, session.name, request,
                session.endpoint))
        except ClaimForwarderFull as exc:
            log.warning("claim forwarder full; claim refused", owner=owner, verb=verb)
            _reply(router, session, denied, f"{verb} refused: {exc}; retry shortly",
                   task_id=task_id, namespace=namespace, ownership="remote",
                   owner_hub_id=owner, forward_error="forwarder_full",
                   reason_code=cl.CLAIM_DENIED)
        return True
    _reply(router, session, denied, refusal_text(namespace, resolution.kind), task_id=task_id,
           namespace=namespace, ownership=resolution.kind,
           owner_hub_id=owner if resolution.kind == "remote" else None,
           reason_code=cl.CLAIM_DENIED)
    return True


def _reply(router: Router, session: Session, type_: str, text: str, **fields) -> None:
    if type_ == "error":
        router.error(session, text, **fields)
    else:
        router.reply(session, type_, text, **fields)


def relay_verdict(router: Router, verdict: ClaimVerdict) -> None:
    """A Router command: record the owner's lease, then tell the claimant."""
    claim = verdict.claim
    if claim.verb == "task_update" and not verdict.ok:
        reply = router.frame("error", claim.claimant, verdict.text, **verdict.fields)
    else:
        reply = router.frame(verdict.type, claim.claimant, verdict.text, **verdict.fields)
    if verdict.lease_effect is not None:
        lease = verdict.lease if verdict.lease_effect == LEASE_HELD else None
        if lease is not None and lease.get("owner") != claim.claimant and \
                lease.get("owner") not in router.presence.by_name:
            lease = None  # handed to an agent that is not on this hub
        if router.mutations_refused():
            log.warning("remote lease not recorded: the journal refuses writes",
                        task_id=claim.task_id, owner_hub_id=claim.owner)
        else:
            router.event(rl.REMOTE_LEASE, rl.payload(claim.task_id, claim.owner, claim.verb,
                                                      lease))
            # the owner decided: the claimant hears it even if the record fails
            router.send_on_failure(claim.reply_to, reply["type"], lambda: reply)
    router.send(claim.reply_to, reply)


def active_claims_with_remote(router: Router) -> list[dict]:
    """state_snapshot.active_claims: this hub's leases and, with `owner_hub_id`,
    its agents' leases on their namespaces' owners, as the owners granted them."""
    local = claim_handlers.active_claims(router)
    remote = rl.remote_leases_of(router.state).live(router.now)
    if not remote:
        return local
    by_name = router.presence.by_name
    offline = claim_handlers.offline_since(router)
    started = router.hub.started
    for lease in remote:
        entry = cl.snapshot_entry(lease)
        entry["owner_hub_id"] = lease["owner_hub_id"]
        online = lease["owner"] in by_name
        entry["holder_online"] = online
        entry["holder_offline_seconds"] = None if online else round(
            max(0.0, router.now - offline.get(lease["owner"], started)), 3)
        local.append(entry)
    local.sort(key=lambda entry: entry["task_id"])
    return local


def claimant_problem(claimant: str, namespace: str) -> str | None:
    """A peer speaks only for seats on its own hub (seat@ORIGIN), as for a
    forwarded chat's sender: the claimant is exactly one PROJECT/seat of the
    request's namespace, without a hub, list or glob."""
    problem = seat_problem(claimant, "claimant")
    if problem is None and namespace_of(claimant) != namespace:
        problem = f"claimant {claimant!r} is not in namespace {namespace!r}"
    return problem


def peer_principal(origin: str) -> str:
    """What a lease taken through a peer records as its principal (no local
    principal's name holds a ':', so it cannot be posed)."""
    return f"federation-peer:{origin}"


def holder_refusal(router: Router, origin: str, claimant: str, claim: dict,
                   verb: str) -> str | None:
    """The claimant a peer names is `claimant@ORIGIN`: the live lease it would
    renew, release, update, checkpoint or hand off must be one taken through
    that same peer, not a lease of a seat of the same name on this hub or on
    another hub."""
    task = cl.task_id_of(claim, *TASK_FIELDS[verb])
    lease = cl.claims_of(router.state).live(task, router.now) if task else None
    if lease is None or lease.get("owner") != claimant:
        return None  # decided by the verb itself (not claimed, held by another name)
    if lease.get("quota_principal") == peer_principal(origin):
        return None
    return (f"Task '{task}' is held by {claimant} on another hub than '{origin}'; "
            f"{origin} may act only for its own seats ({claimant}@{origin}).")


@verbs.handles("multihub_claim_request", peers=True)
def claim_request(router: Router, session: Session, frame: dict, size: int) -> None:
    """Owner side: decide a claim a peer forwarded, on this hub's authority."""
    namespace, claimant = frame.get("namespace"), frame.get("claimant")
    task_id, claim = frame.get("task_id"), frame.get("claim")
    if not all(isinstance(v, str) and v.strip() for v in (namespace, claimant, task_id)) or \
            not isinstance(claim, dict):
        router.error(session, "Malformed multi-hub claim request")
        return
    sender = frame.get("sender")
    target = session.peer_hub or session.name or "all"
    request_id = frame.get("request_id") if isinstance(frame.get("request_id"), str) else None

    def result(granted: bool, detail: str, grant: dict | None = None,
               lease: dict | None = None, reason_code: str | None = None) -> dict:
        fields = {"granted": granted, "task_id": task_id, "namespace": namespace,
                  "owner_hub_id": router.hub_id, "detail": detail, "grant": grant}
        if lease is not None:
            fields["lease"] = cl.snapshot_entry(lease)
        if request_id is not None:
            fields["request_id"] = request_id
        if reason_code is not None:
            # hubd's typed refusal of the request itself (the reference's
            # claimant reads `detail` and ignores it)
            fields["reason_code"] = reason_code
        return router.frame("multihub_claim_result", target, "Multi-hub claim result", **fields)

    decision = authorise_peer(router, session, sender, namespace)
    if decision is None or not decision.allowed:
        code = NAMESPACE_NOT_GRANTED if decision is not None and \
            decision.reason == NAMESPACE_NOT_GRANTED else PEER_NOT_AUTHORISED
        log.info("forwarded claim refused", sender=sender, namespace=namespace, reason=code,
                 detail=decision.detail if decision else "no serving policy")
        router.send(session.endpoint, result(False, "peer not authorised to forward claims",
                                             reason_code=code))
        return
    problem = claimant_problem(claimant, namespace)
    if problem is not None:
        log.info("forwarded claim refused", sender=sender, reason=INVALID_CLAIMANT,
                 detail=problem)
        router.send(session.endpoint, result(False, problem, reason_code=INVALID_CLAIMANT))
        return
    authority = router.hub.federation.authority
    resolution = authority.resolve(claimant) if authority is not None and authority.configured \
        else None
    if resolution is None or resolution.kind != "local" or namespace_of(claimant) != namespace:
        router.send(session.endpoint, result(False, f"this hub does not own namespace '{namespace}'"))
        return
    verb = claim.get("type") or "claim"
    if verb not in REPLIES:
        router.send(session.endpoint, result(False, f"verb {verb!r} is not forwarded"))
        return
    if verb != "wait_request" and router.mutations_refused():
        router.send(session.endpoint, result(False, "durable journal recovery is required"))
        return
    if verb != "wait_request":
        refused = holder_refusal(router, sender, claimant, claim, verb)
        if refused is not None:
            log.info("forwarded claim refused", sender=sender, verb=verb,
                     reason=HOLDER_NOT_AT_ORIGIN, detail=refused)
            router.send(session.endpoint, result(False, refused,
                                                 reason_code=HOLDER_NOT_AT_ORIGIN))
            return
    if verb == "release":
        task, refusal, lease = claim_handlers.release_refusal(router, claimant, claim)
        if refusal is not None:
            router.send(session.endpoint, result(False, refusal))
            return
        claim_handlers.record_release(router, claimant, lease, claim, {})
        router.send(session.endpoint, result(True, f"Task '{task}' released by {claimant}."))
    elif verb == "claim":
        # Decided exactly as a local claim: a re-claim of a held task renews it
        # (new scope, epoch and expiry). The reference answers "already claimed"
        # with the old lease instead, which leaves a renewing claimant believing
        # it holds a scope and an expiry it does not.
        request = cl.read_claim(claim, claimant, claim_handlers.limits(router),
                                peer_principal(sender))
        outcome, granted, _ = claim_handlers.decide_and_record(router, request)
        if isinstance(outcome, cl.Deny):
            # the decision's stable code and conflict, as a local claimant
            # gets them (the reference relays only the text)
            router.send(session.endpoint, result(False, outcome.text, cl.denial_fields(outcome)))
        else:
            router.send(session.endpoint, result(True, granted["payload"],
                                             cl.grant_fields(outcome.lease), outcome.lease))
    else:
        if verb == "task_update":
            answer = claim_handlers.update_task(router, claimant, claim)
        elif verb == "checkpoint":
            answer = claim_handlers.save_checkpoint(router, claimant, claim)
        elif verb == "handoff":
            answer = claim_handlers.hand_off(router, claimant, claim,
                                             target_online=frame.get("target_online") is True)
        else:
            answer = claim_handlers.wait_for_task(router, claimant, claim)
        router.send(session.endpoint, result(answer.ok, answer.text, answer.fields, answer.lease))
        if not answer.ok or verb == "wait_request":
            return
    failed = result(False, "the owning hub could not journal the decision; nothing changed")
    router.send_on_failure(session.endpoint, "multihub_claim_result", lambda: failed)

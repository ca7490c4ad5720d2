"""Claims across hubs: routed to the namespace's owner, never merged.

Claimant side (the ownership gate, in front of the claim path):
- namespace owned here and uncontested: the claim proceeds locally;
- owned by a peer with a `--claim-peer` route: sent to it as
  `multihub_claim_request`; the owner's verdict comes back as a private
  claim_granted built from the owner's lease (its epoch and expiry) or a
  claim_denied with the owner's words; an owner that does not answer gives the
  refusal that names it (fail closed);
- owned by a peer without a route, ungoverned, or contested: refused, naming
  the owner when there is one.
Releases follow the same route (a lease lives only on its owner).

Owner side: `multihub_claim_request` from a peer that passes the serving
policy with its pinned certificate, for a namespace this hub owns, is decided
by the same grant path as a local claim, on this hub's own authority.
"""

from __future__ import annotations

import asyncio

import structlog

from federation.link import TIMEOUT, LinkError
from federation.ownership import namespace_of
from federation.receiver import authorise_peer
from hubd.actors.router import Router
from hubd.core.plugin import Verbs
from hubd.handlers import claims as claim_handlers
from hubd.state import claims as cl
from hubd.state.presence import Session

log = structlog.get_logger("hubd.federation.claims")

# this module's verbs (its plugin installs them)
verbs = Verbs()

FORWARD_TIMEOUT = 10.0
VERBS = {"claim": ("claim_granted", "claim_denied"),
         "release": ("release_granted", "release_denied")}


def _refusal_text(namespace, kind: str) -> str:
    return f"claim refused: this hub does not own namespace '{namespace}' ({kind})"


def gate(router: Router, session: Session, frame: dict, verb: str) -> bool:
    authority = router.hub.federation.authority
    if authority is None or not authority.configured:
        return False
    resolution = authority.resolve(session.name)
    if resolution.kind == "local":
        return False
    task_id = cl.task_id_of(frame, "payload")
    namespace, owner = resolution.namespace, resolution.owner_hub_id
    if resolution.kind == "remote" and owner in authority.claim_links:
        _forward(router, session, frame, verb, namespace, owner, task_id)
        return True
    denied = VERBS[verb][1]
    router.reply(session, denied, _refusal_text(namespace, resolution.kind), task_id=task_id,
                 namespace=namespace, ownership=resolution.kind,
                 owner_hub_id=owner if resolution.kind == "remote" else None,
                 reason_code=cl.CLAIM_DENIED)
    return True


def _forward(router: Router, session: Session, frame: dict, verb: str, namespace: str,
             owner: str, task_id: str) -> None:
    authority = router.hub.federation.authority
    link = authority.claim_links[owner]
    endpoint, claimant = session.endpoint, session.name
    claim = {k: v for k, v in frame.items() if k != "token"}
    request_id = authority.new_request_id()
    request = {"sender": router.hub_id, "target": "all", "type": "multihub_claim_request",
               "payload": "", "namespace": namespace, "claimant": claimant, "task_id": task_id,
               "claim": claim, "request_id": request_id}
    granted_type, denied_type = VERBS[verb]
    common = {"task_id": task_id, "namespace": namespace, "owner_hub_id": owner}

    async def ask() -> None:
        try:
            answer = await link.request(request, FORWARD_TIMEOUT, key=request_id)
            verdict = _verdict(answer)
        except LinkError as exc:
            if exc.cause == TIMEOUT:
                text = (f"claim refused: owning hub '{owner}' did not answer forwarded claim "
                        f"'{task_id}' before timeout")
            else:
                text = _refusal_text(namespace, "remote")
            reply = (denied_type, text, {"ownership": "remote", "forward_error": exc.cause,
                                         "reason_code": cl.CLAIM_DENIED})
        except ValueError as exc:
            reply = (denied_type, f"claim refused: owning hub '{owner}' answered badly ({exc})",
                     {"ownership": "remote", "forward_error": "invalid_answer",
                      "reason_code": cl.CLAIM_DENIED})
        else:
            granted, detail, grant = verdict
            if granted:
                fields = dict(grant) if isinstance(grant, dict) else {}
                fields.pop("type", None)
                reply = (granted_type, detail or f"{verb} granted by {owner}", fields)
            else:
                reply = (denied_type, detail or "claim refused by the owning hub", {})
        type_, text, fields = reply
        fields = {**common, **fields}
        router.hub.router.post_control(
            lambda r: r.send(endpoint, r.frame(type_, claimant, text, **fields)))

    router.hub.track(asyncio.get_running_loop().create_task(ask()))


def _verdict(answer: dict) -> tuple[bool, str, dict | None]:
    granted = answer.get("granted")
    if not isinstance(granted, bool):
        raise ValueError("granted is not a boolean")
    for name in ("task_id", "namespace", "owner_hub_id"):
        if not isinstance(answer.get(name), str) or not answer[name]:
            raise ValueError(f"{name} is missing")
    detail = answer.get("detail") if isinstance(answer.get("detail"), str) else ""
    grant = answer.get("grant") if isinstance(answer.get("grant"), dict) else None
    return granted, detail, grant


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

    def result(granted: bool, detail: str, grant: dict | None = None) -> dict:
        fields = {"granted": granted, "task_id": task_id, "namespace": namespace,
                  "owner_hub_id": router.hub_id, "detail": detail, "grant": grant}
        if request_id is not None:
            fields["request_id"] = request_id
        return router.frame("multihub_claim_result", target, "Multi-hub claim result", **fields)

    decision = authorise_peer(router, session, sender, namespace)
    if decision is None or not decision.allowed:
        log.info("forwarded claim refused", sender=sender,
                 reason=decision.detail if decision else "no serving policy")
        router.send(session.endpoint, result(False, "peer not authorised to forward claims"))
        return
    authority = router.hub.federation.authority
    resolution = authority.resolve(claimant) if authority is not None and authority.configured \
        else None
    if resolution is None or resolution.kind != "local" or namespace_of(claimant) != namespace:
        router.send(session.endpoint, result(False, f"this hub does not own namespace '{namespace}'"))
        return
    if router.mutations_refused():
        router.send(session.endpoint, result(False, "durable journal recovery is required"))
        return
    verb = claim.get("type") or "claim"
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
                                f"federation-peer:{sender}")
        outcome, granted, _ = claim_handlers.decide_and_record(router, request)
        if isinstance(outcome, cl.Deny):
            router.send(session.endpoint, result(False, outcome.text))
        else:
            router.send(session.endpoint, result(True, granted["payload"],
                                             cl.grant_fields(outcome.lease)))
    else:
        router.send(session.endpoint, result(False, f"verb {verb!r} is not forwarded"))
        return
    failed = result(False, "the owning hub could not journal the decision; nothing changed")
    router.send_on_failure(session.endpoint, "multihub_claim_result", lambda: failed)

"""The seat-level ACL as the verb handlers apply it (docs/identity.md, "Grants").

The decisions are pure (hubd.state.principals: claim_refusal, board_refusal,
mailbox_choice); this module asks them with the session's credential and the
hub's current principal table, and turns a refusal into its durable evidence
and its private answer. The evidence is an event of this command, so the
answer leaves only once it is committed, and nothing else is written: a
refused request changes no lease, task, note or watermark.
"""

from __future__ import annotations

from hubd.actors.router import Router
from hubd.state import claims as cl
from hubd.state import principals as pr
from hubd.state.presence import Session


def _ask(router: Router, session: Session, decide, *args):
    return decide(router.hub.identity.table, session.credential, session.principal, *args)


def claim_refusal(router: Router, session: Session, namespaces) -> pr.GrantRefusal | None:
    return _ask(router, session, pr.claim_refusal, namespaces)


def board_refusal(router: Router, session: Session, namespaces) -> pr.GrantRefusal | None:
    return _ask(router, session, pr.board_refusal, namespaces)


def mailbox_choice(router: Router, session: Session, mailbox_for):
    return _ask(router, session, pr.mailbox_choice, session.name, mailbox_for)


def refuse_claim(router: Router, session: Session, request: cl.ClaimRequest,
                 refusal: pr.GrantRefusal) -> None:
    """A claim the principal may not make: the durable claim_denial row (as
    every claim refusal has, reason_code NOT_GRANTED, plus the grant and the
    namespace), then claim_denied."""
    evidence = cl.denial_evidence(request.claimant, request, refusal.reason_code)
    evidence["grant"] = refusal.grant
    evidence["namespace"] = refusal.namespace
    router.event(cl.CLAIM_DENIAL, evidence)
    router.reply(session, "claim_denied", refusal.text, task_id=request.task_id,
                 reason_code=refusal.reason_code, grant=refusal.grant,
                 namespace=refusal.namespace)
    router.fail_privately(session, f"Claim of '{request.task_id}' could not be decided now (the "
                                   "hub could not journal it); nothing changed. Retry.",
                          task_id=request.task_id)


def refuse(router: Router, session: Session, refusal: pr.GrantRefusal, verb: str, *,
           reply: str = "error", task_id: str | None = None) -> None:
    """Any other refusal: an acl_denial row, then the private answer (an
    `error` with error_code not_granted, or the verb's own denial frame)."""
    router.event(pr.ACL_DENIAL, pr.refusal_evidence(refusal, verb, session.name, task_id))
    fields = {"reason_code": refusal.reason_code, "grant": refusal.grant}
    if task_id is not None:
        fields["task_id"] = task_id
    if refusal.grant == "mailbox":
        fields["mailbox_for"] = refusal.mailbox
    else:
        fields["namespace"] = refusal.namespace
    if reply == "error":
        router.error(session, refusal.text, error_code=pr.ERROR_CODE, **fields)
    else:
        router.reply(session, reply, refusal.text, **fields)
    router.fail_privately(session, f"The {verb} was not granted, and the hub could not journal "
                                   "the refusal; nothing changed.", **fields)

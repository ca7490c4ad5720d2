"""ClaimForwarder: the actor that carries claim-family verbs to the namespace's owner.

The Router's ownership gate (federation/handlers/claims.py) turns a claim,
release, task_update, checkpoint, handoff or wait_request for a namespace a
peer owns into a ForwardClaim message on this actor's one bounded inbox; a
full inbox is refused at once, visibly (the claimant is told, the refusal is
counted). The actor keeps at most IN_FLIGHT requests open on the owners'
links, each answered within its timeout (timing.claim_answer) on its clock,
and hands every outcome back to the Router as a ClaimVerdict message; it reads no one's state and no
one reads its own.

Supervision: the requests run in the actor's own TaskGroup, so an exception
nobody expected ends the actor (and with it the hub, non-zero) instead of
vanishing in a detached task; before it ends, every request it still holds is
answered "unknown" to its claimant, loudly, in the log too.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass, field
from typing import Callable, Mapping

import structlog

from federation.clock import SYSTEM, wait_for
from federation.actors.link_socket import TIMEOUT as LINK_TIMEOUT
from federation.actors.link_socket import LinkError
from hubd.state.claims import CLAIM_DENIED

log = structlog.get_logger("hubd.federation.claims")

INBOX = 1024
IN_FLIGHT = 64

# verb -> (the reply type when the owner agrees, the reply type when it does not)
REPLIES = {
    "claim": ("claim_granted", "claim_denied"),
    "release": ("release_granted", "release_denied"),
    "task_update": ("task_updated", "error"),
    "checkpoint": ("checkpoint_saved", "checkpoint_denied"),
    "handoff": ("handoff_granted", "handoff_denied"),
    "wait_request": ("wait_granted", "wait_denied"),
}
# A claim_denied always carries a stable reason_code (docs/claims.md). The
# owner's is relayed when it is one: upper-case letters, digits and
# underscores, as hubd's own (LEASE_LIVE, SCOPE_CONFLICT, ...); an owner that
# gives none (the reference hub, a hubd before it sent them) or something else
# is answered with the generic CLAIM_DENIED, never a code guessed from its text.
_REASON_CODE = re.compile(r"[A-Z][A-Z0-9_]{0,63}")
# What a granted verb does to the claimant's record of its remote leases.
LEASE_HELD = "held"  # the answer carries the lease as it now is
LEASE_ENDED = "ended"
LEASE_EFFECT = {"claim": LEASE_HELD, "release": LEASE_ENDED, "task_update": LEASE_HELD,
                "checkpoint": LEASE_HELD, "handoff": LEASE_HELD, "wait_request": None}


@dataclass(frozen=True, slots=True)
class ForwardClaim:
    """One claim-family request for the owner `owner`, and whom to answer."""

    request_id: str
    owner: str
    verb: str
    namespace: str
    task_id: str
    claimant: str
    request: dict  # the multihub_claim_request frame
    reply_to: object  # the claimant's endpoint, opaque to this actor


@dataclass(frozen=True, slots=True)
class ClaimVerdict:
    """What the claimant is told, and the lease as the owner now has it."""

    claim: ForwardClaim
    ok: bool
    type: str
    text: str
    fields: dict = field(default_factory=dict)
    lease_effect: str | None = None  # LEASE_HELD, LEASE_ENDED or None
    lease: dict | None = None


class ClaimForwarderFull(Exception):
    """The inbox is at its bound: the claim is refused now rather than queued."""


class ClaimForwarder:
    def __init__(self, links: Mapping[str, object], deliver: Callable[[ClaimVerdict], None], *,
                 timeout: float, clock=SYSTEM, inbox: int = INBOX,
                 in_flight: int = IN_FLIGHT):
        self.links = links
        self.deliver = deliver
        self.clock = clock
        self.timeout = timeout
        self.inbox: asyncio.Queue = asyncio.Queue(inbox)
        self.max_in_flight = in_flight
        self.in_flight: dict[str, ForwardClaim] = {}
        self.refused_full = 0
        self.answered = 0

    def submit(self, claim: ForwardClaim) -> None:
        """From the Router (never blocks): ClaimForwarderFull at the bound."""
        try:
            self.inbox.put_nowait(claim)
        except asyncio.QueueFull:
            self.refused_full += 1
            raise ClaimForwarderFull(
                f"{self.inbox.maxsize} claims are already waiting for their owners") from None

    async def run(self) -> None:
        slots = asyncio.Semaphore(self.max_in_flight)
        try:
            async with asyncio.TaskGroup() as group:
                while True:
                    # a slot first: a claim leaves the inbox only to be sent
                    await slots.acquire()
                    claim = await self.inbox.get()
                    self.in_flight[claim.request_id] = claim
                    group.create_task(self._ask(claim, slots),
                                      name=f"claim-{claim.verb}-{claim.request_id}")
        except BaseException as exc:
            self._fail_pending(exc)
            raise

    async def _ask(self, claim: ForwardClaim, slots: asyncio.Semaphore) -> None:
        try:
            verdict = await self._verdict(claim)
            self.in_flight.pop(claim.request_id, None)
            self.answered += 1
            self.deliver(verdict)
        finally:
            slots.release()

    async def _verdict(self, claim: ForwardClaim) -> ClaimVerdict:
        owner, verb = claim.owner, claim.verb
        granted_type, denied_type = REPLIES[verb]
        common = {"task_id": claim.task_id, "namespace": claim.namespace, "owner_hub_id": owner}
        link = self.links.get(owner)
        if link is None:
            return ClaimVerdict(claim, False, denied_type, refusal_text(claim.namespace, "remote"),
                                {**common, "ownership": "remote", "forward_error": "no_route",
                                 "reason_code": CLAIM_DENIED})
        try:
            # matched by the request_id hubd echoes, or in order from an
            # owner that echoes none (the reference hub)
            answer = await wait_for(self.clock, link.request(
                claim.request, None, key=claim.request_id, reply_type="multihub_claim_result"),
                self.timeout)
            granted, detail, grant, lease = read_answer(answer)
            if answer["task_id"] != claim.task_id:
                # an owner that echoes no request id is matched in order: an
                # answer about another task is not this request's
                raise ValueError(f"answered for task {answer['task_id']!r}")
        except (LinkError, TimeoutError) as exc:
            cause = exc.cause if isinstance(exc, LinkError) else LINK_TIMEOUT
            if cause == LINK_TIMEOUT:
                text = (f"{verb} refused: owning hub '{owner}' did not answer forwarded {verb} "
                        f"'{claim.task_id}' before timeout")
            else:
                text = refusal_text(claim.namespace, "remote")
            return ClaimVerdict(claim, False, denied_type, text,
                                {**common, "ownership": "remote", "forward_error": cause,
                                 "reason_code": CLAIM_DENIED})
        except ValueError as exc:
            return ClaimVerdict(claim, False, denied_type,
                                f"{verb} refused: owning hub '{owner}' answered badly ({exc})",
                                {**common, "ownership": "remote",
                                 "forward_error": "invalid_answer", "reason_code": CLAIM_DENIED})
        fields = dict(grant) if grant is not None else {}
        for envelope in ("type", "sender", "target", "timestamp", "hub_id", "payload"):
            fields.pop(envelope, None)
        if not granted:
            reason = answer.get("reason_code")
            if isinstance(reason, str) and reason and len(reason) <= 64:
                # the owner refused the request itself (its grant for this hub,
                # the claimant, the holder), typed: relayed as federation_reason
                fields["federation_reason"] = reason
            if verb == "claim":
                fields["reason_code"] = claim_reason_code(fields.get("reason_code"))
            return ClaimVerdict(claim, False, denied_type,
                                detail or f"{verb} refused by the owning hub", {**common, **fields})
        effect = LEASE_EFFECT[verb]
        if effect == LEASE_HELD and lease is None and verb == "claim" and grant is not None:
            lease = grant  # an owner that sends only the grant (the reference hub)
        return ClaimVerdict(claim, True, granted_type, detail or f"{verb} granted by {owner}",
                            {**common, **fields}, effect if lease is not None or
                            effect == LEASE_ENDED else None, lease)

    def _fail_pending(self, exc: BaseException) -> None:
        stopping = isinstance(exc, asyncio.CancelledError)
        pending = list(self.in_flight.values())
        self.in_flight.clear()
        while not self.inbox.empty():
            pending.append(self.inbox.get_nowait())
        if not pending and stopping:
            return
        (log.warning if stopping else log.error)(
            "claim forwarder stopped; answering its pending requests", pending=len(pending),
            error=None if stopping else repr(exc))
        for claim in pending:
            denied = REPLIES[claim.verb][1]
            self.deliver(ClaimVerdict(
                claim, False, denied,
                f"{claim.verb} of '{claim.task_id}': this hub stopped forwarding it "
                f"({'shutting down' if stopping else 'internal error'}); whether owning hub "
                f"'{claim.owner}' decided it is unknown. Check state, then retry.",
                {"task_id": claim.task_id, "namespace": claim.namespace,
                 "owner_hub_id": claim.owner, "ownership": "remote",
                 "forward_error": "forwarder_stopped", "reason_code": CLAIM_DENIED}))

    def health(self) -> dict:
        return {"queued": self.inbox.qsize(), "queue_bound": self.inbox.maxsize,
                "in_flight": len(self.in_flight), "in_flight_bound": self.max_in_flight,
                "refused_full": self.refused_full, "answered": self.answered}


def claim_reason_code(owner_code) -> str:
    """The reason_code a claimant's claim_denied carries for an owner's
    refusal: the owner's own stable code, or CLAIM_DENIED without one."""
    if isinstance(owner_code, str) and _REASON_CODE.fullmatch(owner_code):
        return owner_code
    return CLAIM_DENIED


def refusal_text(namespace, kind: str) -> str:
    return f"claim refused: this hub does not own namespace '{namespace}' ({kind})"


def read_answer(answer: dict) -> tuple[bool, str, dict | None, dict | None]:
    """(granted, detail, the reply fields, the lease) of a multihub_claim_result;
    ValueError when it is not one."""
    granted = answer.get("granted")
    if not isinstance(granted, bool):
        raise ValueError("granted is not a boolean")
    for name in ("task_id", "namespace", "owner_hub_id"):
        if not isinstance(answer.get(name), str) or not answer[name]:
            raise ValueError(f"{name} is missing")
    detail = answer.get("detail") if isinstance(answer.get("detail"), str) else ""
    grant = answer.get("grant") if isinstance(answer.get("grant"), dict) else None
    lease = answer.get("lease") if isinstance(answer.get("lease"), dict) else None
    if lease is not None and not (isinstance(lease.get("task_id"), str)
                                  and isinstance(lease.get("owner"), str)
                                  and isinstance(lease.get("lease_expires_at"), (int, float))):
        raise ValueError("lease is malformed")
    return granted, detail, grant, lease

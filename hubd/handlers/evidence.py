"""Guard-denial evidence, fleet planning input and shared-pool reservations
(seed 000; docs/guard-evidence-and-spend.md): the verbs `guard_denial`,
`entitlement_advert` and `spend_request`. Decisions live in
hubd/state/guard_evidence.py, entitlements.py and spend_ledger.py; this
module translates and answers, always to the requester only.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections import deque
from typing import NamedTuple

import structlog

from hubd.actors.router import Router
from hubd.core.plugin import Plugin, Verbs
from hubd.owner_only import OwnerOnlyFileError, read_owner_only_file
from hubd.state import entitlements as ent
from hubd.state import guard_evidence as guard
from hubd.state import spend_ledger as spend
from hubd.state.acl import allowed
from hubd.state.presence import Session

from . import idempotency

log = structlog.get_logger("hubd.evidence")

verbs = Verbs()

# authorised spend requests waiting while the ledger file is being written
MAX_WAITING = 256


class EvidenceLive:
    """Live bookkeeping: the guard-evidence window (per connect credential)
    and the spend ledger as last read or written (None: not read yet)."""

    def __init__(self, router: Router):
        config = router.config.evidence
        self.window = guard.EvidenceWindow(config.window_events, config.window_bytes,
                                           router.config.timing.guard_evidence_window)
        self.ledger: dict | None = None
        # a ledger write in flight, and the authorised requests waiting for it
        self.writing = False
        self.waiting: deque = deque()


# -- guard_denial

@verbs.handles("guard_denial")
def guard_denial(router: Router, session: Session, frame: dict, size: int) -> None:
    if session.credential is None:
        # an open hub has no credential principal to attest (seed 000)
        router.error(session, guard.UNAVAILABLE_TEXT, error_code=guard.CODE_UNAVAILABLE)
        return
    keyed = idempotency.begin(router, session, guard.GUARD_DENIAL, frame)
    if keyed is idempotency.HANDLED:
        return
    denial = guard.read_denial(frame)
    if isinstance(denial, str):
        router.error(session, denial, error_code=guard.CODE_INVALID)
        return
    window = router.live_of(EvidenceLive).window
    limit = window.check(session.credential, size, router.now)
    if limit is not None:
        router.metrics.count_evidence_refusal(guard.CODE_RATE_LIMITED)
        log.warning("guard evidence refused: the credential's window is full",
                    limit_reason=limit, sender=session.name)
        router.error(session, guard.RATE_LIMITED_TEXT, error_code=guard.CODE_RATE_LIMITED,
                     limit_reason=limit)
        return
    event = router.event(guard.GUARD_DENIAL,
                         guard.record(denial, session.credential, session.name or ""))
    window.count(session.credential, size, router.now)
    reply = router.frame(guard.RECORDED, session.name, guard.RECORDED_TEXT,
                         audit_seq=event.seq, call_sha256=denial.call_sha256,
                         reason_code=denial.reason_code)
    router.send(session.endpoint, reply)
    router.fail_privately(session, guard.UNAVAILABLE_TEXT, error_code=guard.CODE_UNAVAILABLE)
    idempotency.remember(router, session, keyed, reply, event.seq)


# -- entitlement_advert

def _advert_refused(router: Router, session: Session, alias: str, text: str) -> None:
    router.reply(session, ent.RESULT, text, pool_alias=alias, applied=False, audit_seq=None)


@verbs.handles("entitlement_advert")
def entitlement_advert(router: Router, session: Session, frame: dict, size: int) -> None:
    signed = router.hub.identity.signed
    alias = ent.alias_of(frame)
    if not signed.binding_required:
        # only a hub that binds every registration to a trusted key proves senders
        _advert_refused(router, session, alias, ent.NOT_PROVEN)
        return
    advert = ent.read_advert(frame)
    if isinstance(advert, str):
        _advert_refused(router, session, alias, advert)
        return
    alias = advert["pool_alias"]
    if signed.acl is None or not allowed(signed.acl, session.name or "", ent.ACL_PERMISSION,
                                         ent.ACL_TARGET_KIND, alias):
        _advert_refused(router, session, alias, ent.NOT_AUTHORISED)
        return
    event = router.event(ent.ENTITLEMENT_ADVERT, {
        "advertiser": session.name, "hub_id": router.hub_id, "advert": advert})
    router.reply(session, ent.RESULT, f"advertisement recorded for {alias!r}",
                 pool_alias=alias, applied=True, audit_seq=event.seq)
    # not committed: the same private verdict shape, refused
    router.send_on_failure(session.endpoint, ent.RESULT, lambda: router.frame(
        ent.RESULT, session.name, ent.NOT_DURABLE, pool_alias=alias, applied=False,
        audit_seq=None))


# -- spend_request

def _serves(router: Router, session: Session) -> bool:
    """A peer hub's link the serving policy authorises, on a hub with a ledger."""
    if router.config.evidence.spend_ledger is None or session.peer_hub is None:
        return False
    policy = getattr(getattr(router.hub, "federation", None), "serving_policy", None)
    if policy is None:
        return False
    return policy.authorise(session.peer_hub, session.peer_cert, None, router.now).allowed


def _ledger(router: Router) -> dict | None:
    live = router.live_of(EvidenceLive)
    if live.ledger is None:
        path = router.config.evidence.spend_ledger
        try:
            live.ledger = spend.parse(read_owner_only_file(path, "spend ledger"), router.hub_id)
        except (OwnerOnlyFileError, spend.LedgerError) as exc:
            log.error("spend ledger unavailable", path=str(path), error=str(exc))
            return None
    return live.ledger


def _write_ledger(path, data: bytes) -> bool:
    """Replace the ledger file atomically (0600, fsynced): all or nothing.
    Runs on a worker thread."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, temp = tempfile.mkstemp(prefix=".spend-ledger-", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, path)
        dir_fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError as exc:
        log.error("spend ledger not written", path=str(path), error=str(exc))
        try:
            os.unlink(temp)
        except OSError:
            pass
        return False
    return True


class LedgerWritten(NamedTuple):
    """A ledger write finished (on its worker thread): answer its request."""
    ask: "SpendAsk"
    answer: dict
    after: dict
    ok: bool


class SpendAsk(NamedTuple):
    endpoint: int
    target: str
    caller: str
    action: str
    document: dict


def _send_result(router: Router, ask: SpendAsk, answer: dict) -> None:
    router.send(ask.endpoint, router.frame(spend.RESULT, ask.target, spend.RESULT_TEXT,
                                           spend_action=ask.action, spend_result=dict(answer)))


def _decide(router: Router, ask: SpendAsk) -> None:
    """Decide one authorised request; a change is written (off the Router's
    task) before it is answered or applied, and requests that arrive
    meanwhile wait their turn (in order, bounded)."""
    live = router.live_of(EvidenceLive)
    ledger = _ledger(router)
    if ledger is None:
        _send_result(router, ask, spend.REFUSALS[ask.action])
        return
    answer, after, refused = spend.decide(ledger, ask.caller, ask.action, ask.document,
                                          spend.utc(router.now))
    if refused is not None:
        log.info("spend request refused", peer=ask.caller, action=ask.action, reason=refused)
    if after is ledger:
        _send_result(router, ask, answer)
        return
    path, data = router.config.evidence.spend_ledger, spend.dump(after)
    if len(data) > spend.MAX_FILE_BYTES:
        log.warning("spend request refused: the ledger file would be over its bound",
                    bytes=len(data), limit=spend.MAX_FILE_BYTES)
        router.metrics.count_evidence_refusal("spend_ledger_full")
        _send_result(router, ask, spend.REFUSALS[ask.action])
        return
    live.writing = True
    future = asyncio.get_running_loop().run_in_executor(None, _write_ledger, path, data)

    def written(done: asyncio.Future) -> None:
        ok = not done.cancelled() and done.exception() is None and done.result()
        router.post_control(LedgerWritten(ask, answer, after, bool(ok)))

    future.add_done_callback(written)


def ledger_written(router: Router, command: LedgerWritten) -> None:
    live = router.live_of(EvidenceLive)
    live.writing = False
    if command.ok:
        live.ledger = command.after
        _send_result(router, command.ask, command.answer)
    else:  # the file keeps the old ledger, and so does the hub
        _send_result(router, command.ask, spend.REFUSALS[command.ask.action])
    while live.waiting and not live.writing:
        _decide(router, live.waiting.popleft())


@verbs.handles("spend_request", peers=True)
def spend_request(router: Router, session: Session, frame: dict, size: int) -> None:
    if not spend.is_request(frame):
        router.error(session, spend.MALFORMED)
        return
    action, document = frame["spend_action"], frame["spend"]
    owner = frame.get("owner_hub")
    if session.peer_hub is None and owner is not None:
        # an agent of this hub asks a pool owner hub over the peer link
        if not isinstance(owner, str) or owner == router.hub_id:
            router.error(session, spend.MALFORMED)
            return
        relay = getattr(getattr(router.hub, "federation", None), "relay_spend", None)
        signed = router.hub.identity.signed
        # a hubd extension (the seed's spend_request is a peer hub's): an agent
        # spends its hub's reservations only where the ACL policy lets it
        if relay is None or signed.acl is None or not allowed(
                signed.acl, session.name or "", spend.RELAY_PERMISSION, "hub", owner):
            if relay is not None:
                router.metrics.count_evidence_refusal("spend_relay_denied")
            router.reply(session, spend.RESULT, spend.RESULT_TEXT, spend_action=action,
                         spend_result=dict(spend.REFUSALS[action]))
        else:
            relay(router, session, owner, action, document)
        return
    ask = SpendAsk(session.endpoint, session.name or session.peer_hub or "", session.peer_hub or "",
                   action, document)
    if not _serves(router, session):
        log.warning("spend request refused: peer not served", sender=session.name,
                    action=action)
        _send_result(router, ask, spend.REFUSALS[action])
        return
    live = router.live_of(EvidenceLive)
    if live.writing:
        if len(live.waiting) >= MAX_WAITING:
            log.warning("spend request refused: too many waiting", waiting=len(live.waiting))
            router.metrics.count_evidence_refusal("spend_ledger_busy")
            _send_result(router, ask, spend.REFUSALS[action])
        else:
            live.waiting.append(ask)
        return
    _decide(router, ask)


def evidence_plugin() -> Plugin:
    appliers: dict[str, list] = {}
    for module in (guard, ent):
        for kind, fns in module.appliers.items():
            appliers.setdefault(kind, []).extend(fns)
    return Plugin("evidence", verbs=verbs, appliers=appliers, live=(EvidenceLive,),
                  commands={LedgerWritten: ledger_written})

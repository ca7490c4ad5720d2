"""Shared blackboard verbs: ledger_task, ledger_task_update, ledger_progress,
board_request. Decisions in hubd.state.board; refusals are private `error`
frames; accepted writes are broadcast after they are committed.

If the journal cannot take a write, only the requesting connection hears of
it, with the seed's exact sentence ("Task '<id>' was not journalled; mutation
rolled back." / "Progress note was not journalled; mutation rolled back.");
nothing is broadcast and the projection is restored from the journal.

The three writes need the principal's board grant in the namespaces they touch
(hubd.state.board.namespaces_touched; docs/identity.md, "Grants"); a refusal
is journaled as `acl_denial` and answered with a private `error`
(`error_code: not_granted`) before anything else is looked at.
"""

from __future__ import annotations

import structlog

from hubd.actors.router import Router
from hubd.core.plugin import Verbs
from hubd.state import board as bd
from hubd.state.presence import Session

from . import grants, idempotency

log = structlog.get_logger("hubd.board")

# this module's verbs (its plugin installs them)
verbs = Verbs()

PARENT_FAULT = "Causal parent validation failed; task was not changed."


def _parent(router: Router, session: Session, frame: dict):
    """(ok, causal_parent). A refusal has already been sent when not ok."""
    try:
        return True, bd.causal_parent(frame)
    except bd.Malformed as exc:
        router.error(session, f"Malformed frame: {exc}")
    except Exception:  # an unexpected parser fault: say so plainly, log the rest
        log.exception("causal parent validation failed")
        router.error(session, PARENT_FAULT)
    return False, None


def _not_granted(router: Router, session: Session, frame: dict, verb: str) -> bool:
    """True when the principal may not post this write (refused and journaled)."""
    board = bd.board_of(router.state)
    refusal = grants.board_refusal(router, session,
                                   bd.namespaces_touched(board, frame, session.name, verb))
    if refusal is None:
        return False
    task_id = bd.task_id_text(frame)
    grants.refuse(router, session, refusal, verb, task_id=task_id or None)
    return True


def _write_task(router: Router, session: Session, frame: dict, verb: str) -> None:
    if _not_granted(router, session, frame, verb):
        return
    keyed = idempotency.begin(router, session, verb, frame)
    if keyed is idempotency.HANDLED:
        return
    ok, parent = _parent(router, session, frame)
    if not ok:
        return
    board = bd.board_of(router.state)
    try:
        if verb == "ledger_task":
            decision = bd.decide_declare(board, frame, session.name, router.now)
        else:
            decision = bd.decide_update(board, frame, router.now)
    except bd.Malformed as exc:
        router.error(session, f"Malformed frame: {exc}")
        return
    if isinstance(decision, str):
        router.error(session, decision)
        return
    task = decision.task
    task_id = task["task_id"]
    record = dict(task)
    if parent is not None:
        record[bd.CAUSAL_KEY] = parent  # journaled beside the task, never shown
    first = router.next_seq()
    router.event(bd.LEDGER_TASK, record)
    if verb == "ledger_task":
        reply = router.frame("ledger_task_posted", "all",
                             f"Task '{task_id}' {'declared' if decision.created else 're-declared'}"
                             f" by {session.name}.", task=task)
    else:
        reply = router.frame("ledger_task_updated", "all", f"Task '{task_id}' plan updated.",
                             task=task)
    router.broadcast(reply)
    idempotency.remember(router, session, keyed, reply, first)
    router.fail_privately(session, f"Task '{task_id}' was not journalled; mutation rolled back.")


@verbs.handles("ledger_task")
def ledger_task(router: Router, session: Session, frame: dict, size: int) -> None:
    _write_task(router, session, frame, "ledger_task")


@verbs.handles("ledger_task_update")
def ledger_task_update(router: Router, session: Session, frame: dict, size: int) -> None:
    _write_task(router, session, frame, "ledger_task_update")


@verbs.handles("ledger_progress")
def ledger_progress(router: Router, session: Session, frame: dict, size: int) -> None:
    if _not_granted(router, session, frame, "ledger_progress"):
        return
    keyed = idempotency.begin(router, session, "ledger_progress", frame)
    if keyed is idempotency.HANDLED:
        return
    note = bd.read_progress(frame, session.name, router.now)
    if isinstance(note, str):
        router.error(session, note)
        return
    first = router.next_seq()
    router.event(bd.LEDGER_PROGRESS, note)
    reply = router.frame("ledger_progress_posted", "all", f"Progress from {session.name}",
                         note=note)
    router.broadcast(reply)
    idempotency.remember(router, session, keyed, reply, first)
    router.fail_privately(session, "Progress note was not journalled; mutation rolled back.")


@verbs.handles("board_request")
def board_request(router: Router, session: Session, frame: dict, size: int) -> None:
    router.reply(session, "board_snapshot", "Board snapshot",
                 board=bd.board_of(router.state).snapshot())

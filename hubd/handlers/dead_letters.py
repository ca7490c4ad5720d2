"""Dead-letter escalation: a directed chat that reached nobody, made an active signal.

A directed chat is a dead letter when it matched no live connection (the
seed's words): no recipient at all, or only stale ones (the routing service,
hubd/handlers/routing.py, says so in the chat's journaled route), or live
ones whose every write failed (known only where the hub awaits the writes: a
chat with a receipt requested, and every forwarded chat; journaled as
`dead_letter_unwritten` once they reported). Either way the ledger
(hubd/state/chat.py) counts it. When the target's count crosses the escalation threshold
(`--dead-letter-escalation-threshold N`, the reference's option; 0, the
default, is off), at most once per target per
`--dead-letter-escalation-window SECONDS`, this module:

1. journals `dead_letter_escalation` {target, count, last_sender, threshold}
   in the same command as the chat (the audit row the reference writes, and
   the state "once per window" reads back after a restart);
2. tells every agent connected to this hub a `dead_letter_escalation` frame
   (the reference's fields and text), after the commit: the target is not
   connected, that is why it is dead-lettering; the sender and the operators
   who can act are;
3. returns, and the routing service (`dead_lettered`) hands the target to the
   federation plugin when it is installed (`RemoteHubs.dead_letter_escalated`):
   if a peer hub owns the target's namespace and a relay route leads there,
   it forwards the content-free pointer (federation/handlers/dead_letter_pointer.py).

It never re-delivers anything: the ledger holds counts and names, not bodies.
The decision is hubd/state/dead_letter_escalation.py `escalation_due`.
"""

from __future__ import annotations

import structlog

from hubd.actors.router import Router
from hubd.state import dead_letter_escalation as rules

log = structlog.get_logger("hubd.dead_letters")


def journal_unwritten(router: Router, target: str, sender: str, chat_seq: int) -> None:
    """The dead letter of a chat whose every write failed: its own row."""
    router.event(rules.DEAD_LETTER_UNWRITTEN, {"target": target, "sender": sender,
                                               "chat_seq": chat_seq})
    log.info("directed chat reached no recipient: every write failed", target=target,
             sender=sender, seq=chat_seq)


def after_dead_letter(router: Router, target: str) -> int | None:
    """A dead letter to `target` was just journaled (its ledger entry is
    counted): escalate if due. Inside the command that journaled it.
    Returns the count escalated at (the routing service then tells the
    federation plugin, the one module that asks it), or None."""
    config = router.config
    threshold = config.dead_letter_escalation_threshold
    if threshold < 1:
        return None
    ledger = router.state.chat.dead_letters
    entry = ledger.by_target.get(target)
    if entry is None:
        return None
    count = entry["count"]
    now = router.now
    window = config.dead_letter_escalation_window
    last = ledger.escalated.get(target)
    if not rules.escalation_due(count, threshold, last, now, window):
        if last is not None and count > last[0] and (count - last[0]) % threshold == 0:
            # a threshold crossing the window holds back (counted once per crossing)
            router.metrics.dead_letter_escalations_suppressed += 1
        return None
    sender = entry["last_sender"]
    router.event(rules.DEAD_LETTER_ESCALATION, {
        "target": target, "count": count, "last_sender": sender, "threshold": threshold,
        "window": window})
    router.metrics.dead_letter_escalations += 1
    log.warning("dead-letter escalation: directed messages reach nobody", target=target,
                count=count, last_sender=sender, threshold=threshold)
    router.broadcast(router.frame(
        "dead_letter_escalation", "all", rules.escalation_notice(target, count, sender),
        escalation_target=target, escalation_count=count, last_sender=sender))
    return count

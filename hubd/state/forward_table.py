"""A forward's life as a table: every state a chat forwarded to a peer hub can
be in and every move it can make, in one place (as h11 keeps every HTTP/1.1
transition in one table), so "what can happen to my forwarded chat" is
answered by reading this table and the receipts a sender can be told
(hubd/state/receipt_table.py), not by following callbacks through the
outbox, the link and the Router.

Nothing here does IO or keeps state: the ForwardOutbox asks `forward_step`
for the next state of a forward and raises on a transition the table does not
have. (A forward is not session-bound delivery: that is
hubd/state/delivery_rules.py.)
"""

from __future__ import annotations

# -- a forward's life (federation.actors.outbox owns the instances, one per row)
#
#   QUEUED ──send──▶ IN_FLIGHT ──answer accepted───▶ ACCEPTED    (settled)
#     ▲                 │  │ ───answer duplicate──▶ DUPLICATE   (settled)
#     │                 │  │ ───answer refused────▶ REFUSED     (settled)
#     │   link down ────┘  │ ───invalid answer────▶ REFUSED     (settled)
#     │   (front of queue) │
#     │                    ├──no answer in time──▶ WAITING ─due / link up / peer alive─▶ QUEUED
#     │                    └──transient refusal──▶ HELD ────due / link up──────────────▶ QUEUED
#     └─ send failed (the link refused the post: down, or its inbox full)
#
#   QUEUED ──restored no answer──▶ WAITING;  QUEUED ──restored refusal──▶ HELD
#   (a restarted hub's backlog for a peer whose journaled retry is not due yet)
#
#   any unsettled state ──ttl──▶ EXPIRED; ──peer older than wire v5──▶ REFUSED
#
# A forward in flight when its link drops goes back to the front of the queue:
# the peer may or may not have it, and a resend is answered `duplicate` if it
# did. The back-off is for a peer that answered "not now" or not at all; a
# peer that was away gets everything at once when it returns (link up).
#
# WAITING and HELD differ only in what a sign of life from the peer (its
# inbound link, a forward from it, a log pull) does: a forward that got no
# answer (WAITING) goes again at once, since the peer is evidently there; a
# forward the peer itself refused for now (its quota, its journal: HELD)
# keeps its backoff, so two-way traffic cannot turn a "not now" into a retry
# storm. HELD takes PEER_ALIVE and stays HELD.
#
# After a restart, the backlog the outbox reads from the journal for a peer
# whose journaled retry schedule (federation/clock.py PeerRetry) is not due
# yet starts in the state that schedule names: WAITING after no answer, HELD
# after a "not now", due when the schedule says. The outbox's first link-up
# after the restart does not release them (this hub was away, not the peer).

QUEUED = "queued"
IN_FLIGHT = "in_flight"
WAITING = "waiting"  # no answer came: retried at once on a sign of life
HELD = "held"  # the peer said "not now": a sign of life does not cut its backoff short
ACCEPTED = "accepted"
DUPLICATE = "duplicate"
REFUSED = "refused"
EXPIRED = "expired"
SETTLED = frozenset({ACCEPTED, DUPLICATE, REFUSED, EXPIRED})

# events
SEND = "send"
SEND_FAILED = "send_failed"
LINK_DOWN = "link_down"
LINK_UP = "link_up"
PEER_ALIVE = "peer_alive"  # a sign of life from the peer other than an answer
ANSWER_ACCEPTED = "answer_accepted"
ANSWER_DUPLICATE = "answer_duplicate"
ANSWER_REFUSED = "answer_refused"
ANSWER_TRANSIENT = "answer_transient"
ANSWER_INVALID = "answer_invalid"
ANSWER_TIMEOUT = "answer_timeout"
RETRY_DUE = "retry_due"
TTL = "ttl"
PEER_REJECTED = "peer_rejected"
RESTORED_NO_ANSWER = "restored_no_answer"
RESTORED_REFUSED = "restored_refused"

_UNSETTLED = (QUEUED, IN_FLIGHT, WAITING, HELD)
BACKING_OFF = frozenset({WAITING, HELD})  # in the delayed heap, waiting for a retry

FORWARD_TRANSITIONS: dict[tuple[str, str], str] = {
    (QUEUED, SEND): IN_FLIGHT,
    (QUEUED, RESTORED_NO_ANSWER): WAITING,
    (QUEUED, RESTORED_REFUSED): HELD,
    (IN_FLIGHT, SEND_FAILED): QUEUED,
    (IN_FLIGHT, LINK_DOWN): QUEUED,
    (IN_FLIGHT, ANSWER_ACCEPTED): ACCEPTED,
    (IN_FLIGHT, ANSWER_DUPLICATE): DUPLICATE,
    (IN_FLIGHT, ANSWER_REFUSED): REFUSED,
    (IN_FLIGHT, ANSWER_INVALID): REFUSED,
    (IN_FLIGHT, ANSWER_TRANSIENT): HELD,
    (IN_FLIGHT, ANSWER_TIMEOUT): WAITING,
    (WAITING, RETRY_DUE): QUEUED,
    (WAITING, LINK_UP): QUEUED,
    (WAITING, PEER_ALIVE): QUEUED,
    (HELD, RETRY_DUE): QUEUED,
    (HELD, LINK_UP): QUEUED,
    (HELD, PEER_ALIVE): HELD,
    **{(state, TTL): EXPIRED for state in _UNSETTLED},
    **{(state, PEER_REJECTED): REFUSED for state in _UNSETTLED},
}

# Refusals a later attempt may overcome (the seed: "succeeds on a later retry").
TRANSIENT_REFUSALS = frozenset({"chat_refused", "journal_recovery_required", "quota_exceeded"})


class InvalidTransition(RuntimeError):
    """A forward was asked to make a move the table does not have: a bug."""


def forward_step(state: str, event: str) -> str:
    try:
        return FORWARD_TRANSITIONS[(state, event)]
    except KeyError:
        raise InvalidTransition(f"forward in state {state!r} cannot take {event!r}") from None


def answer_event(disposition, reason_code: str) -> str:
    """What a peer's multihub_message_result means for the forward."""
    if disposition == ACCEPTED:
        return ANSWER_ACCEPTED
    if disposition == DUPLICATE:
        return ANSWER_DUPLICATE
    if disposition == REFUSED:
        return ANSWER_TRANSIENT if reason_code in TRANSIENT_REFUSALS else ANSWER_REFUSED
    return ANSWER_INVALID

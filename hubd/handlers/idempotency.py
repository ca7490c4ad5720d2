"""The idem_key contract for keyed mutations, shared by the claim and board verbs.

    keyed = begin(router, session, "claim", frame)
    if keyed is HANDLED:
        return                      # a retry was answered (or refused)
    ... decide; on success, inside the same command:
    first = router.next_seq(); router.event(...); ...
    remember(router, session, keyed, reply_frame, first)

A retry of an accepted request gets the original reply privately and changes
nothing (also after a restart, or after the lease it granted has ended); the
same key with a different request gets an `idempotency_conflict` error.
"""

from __future__ import annotations

from dataclasses import dataclass

from hubd.actors.router import Router
from hubd.state import idem
from hubd.state.presence import Session
from hubd.core.message import Message
from hubd.wire import codec
from hubd.wire.digests import canonical_sha256
from hubd.wire.envelope import error_frame


@dataclass(frozen=True, slots=True)
class Keyed:
    verb: str
    key: str
    digest: str


class _Handled:
    __slots__ = ()


HANDLED = _Handled()


def begin(router: Router, session: Session, verb: str, frame: dict) -> Keyed | None | _Handled:
    key = idem.idem_key_of(frame)
    if key is None:
        return None
    if len(key) > idem.MAX_KEY_CHARS:
        router.error(session, f"Malformed frame: 'idem_key' must be at most "
                              f"{idem.MAX_KEY_CHARS} characters.")
        return HANDLED
    digest = idem.request_digest(frame)
    remembered = idem.store_of(router.state).lookup(session.name, verb, key)
    if remembered is None:
        return Keyed(verb, key, digest)
    if remembered.digest != digest:
        router.send(session.endpoint, error_frame(
            router.hub_id, session.name, idem.CONFLICT_TEXT,
            remembered.response.get("timestamp", router.now), error_code=idem.CONFLICT_CODE))
        return HANDLED
    # the original verdict, as it was sent (target and timestamp included), to
    # the requester only
    response = remembered.response
    router.send(session.endpoint, Message(response, codec.encode(response)),
                response.get("type", "replay"))
    return HANDLED


def remember(router: Router, session: Session, keyed: Keyed | None, response: dict,
             first_event_seq: int) -> None:
    """Journal the accepted outcome of a keyed request (the last event of the
    operation, committed with it)."""
    if keyed is None:
        return
    commit_seq = router.next_seq()
    router.event(idem.IDEMPOTENCY, {
        "commit_seq": commit_seq,
        "first_event_seq": first_event_seq,
        "key": idem.operation_key(session.name, keyed.verb, keyed.key),
        "request_digest": keyed.digest,
        "response": response,
        "response_sha256": canonical_sha256(response),
    })

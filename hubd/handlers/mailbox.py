"""Mailbox verbs: replay on a mailbox heartbeat, ack watermarks, deferred
receipts and the sender-notification outbox."""

from __future__ import annotations

import asyncio

from hubd.actors.router import Router
from hubd.core.plugin import Verbs
from hubd.core.message import Message
from hubd.state import receipt_table
from hubd.state import events as ev
from hubd.state.presence import Session
from hubd.wire import codec
from hubd.wire.envelope import strict_int
from hubd.wire.targets import parse_target

from . import grants, receipts

# this module's verbs (its plugin installs them)
verbs = Verbs()

# where federation's forwarding sends settled forward receipts from (its home
# is hubd/handlers/receipts.py now)
deliver_notifications = receipts.deliver_notifications


def mailbox_identity(router: Router, session: Session, frame: dict, verb: str) -> str | None:
    """Whose mailbox a connection reads (or acks): its own, its seat's when it
    is that seat's -rx wake sidecar, or, on a hub with principals, another seat
    its principal's mailbox grant covers (docs/identity.md, "Grants"). Without
    principals anything else falls back to its own. None when the grant
    refuses it: the refusal is journaled (acl_denial) and answered with a
    private error, and nothing else may happen for this frame."""
    identity, refusal = grants.mailbox_choice(router, session, frame.get("mailbox_for"))
    if refusal is None:
        return identity
    grants.refuse(router, session, refusal, verb)
    return None


def _roles(router: Router, session: Session, identity: str) -> tuple[str, ...]:
    return session.roles if identity == session.name else router.presence.roles_of(identity)


def serve_mailbox(router: Router, session: Session, frame: dict) -> None:
    state = router.state
    identity = mailbox_identity(router, session, frame, "heartbeat")
    if identity is None:
        return
    since = strict_int(frame.get("since_seq"))
    if since is None or since < 0:
        since = 0
    since = min(since, state.last_seq)
    if since > state.mailbox.watermark(identity) and not router.mutations_refused():
        router.event(ev.MAILBOX_WATERMARK, {"identity": identity, "seq": since})
    seqs = state.mailbox.replay_seqs(identity, _roles(router, session, identity), since)
    if seqs:
        endpoint, hub = session.endpoint, router.hub
        # After release, every seq in the list is committed: safe to read back.
        router.after_release(lambda: hub.track(asyncio.get_running_loop().create_task(
            replay(hub, endpoint, seqs))))


async def replay(hub, endpoint: int, seqs: list[int]) -> None:
    """Send the stored directed chats with these (committed) seqs, marked
    replayed. Runs as its own task so the journal read blocks nobody."""
    rows = await hub.read_journal("payloads", seqs)
    for seq, payload in rows:
        frame = codec.loads_stored(payload)
        frame.pop("receipt_requested", None)
        frame["replayed"] = True
        frame["seq"] = seq
        hub.endpoints.deliver(endpoint, Message(frame))
    frames_out = hub.metrics.frames_out
    frames_out["chat"] = frames_out.get("chat", 0) + len(rows)


@verbs.handles("heartbeat")
def heartbeat(router: Router, session: Session, frame: dict, size: int) -> None:
    # Keepalives are never answered; a heartbeat that asks for the mailbox
    # gets its replay.
    if frame.get("mailbox") is True:
        serve_mailbox(router, session, frame)


@verbs.handles("ack")
def ack(router: Router, session: Session, frame: dict, size: int) -> None:
    seq = strict_int(frame.get("seq"))
    if seq is None or seq <= 0:
        return  # the reference ignores a malformed ack silently; so does hubd
    state = router.state
    identity = mailbox_identity(router, session, frame, "ack")
    if identity is None:
        return
    roles = _roles(router, session, identity)
    if not state.mailbox.directed_to(seq, identity, roles):
        return  # not this identity's mail: neither advances nor fabricates a receipt
    if seq > state.mailbox.watermark(identity):
        router.event(ev.MAILBOX_WATERMARK, {"identity": identity, "seq": seq})
    pending = state.receipts.pending.get(seq)
    if pending is None or not parse_target(pending.target).matches(identity, roles):
        return
    chat_ref = receipt_table.ChatRef(pending.sender, seq, pending.msg_id, pending.target,
                                     pending.client_msg_id)
    text, fields = receipt_table.receipt(receipt_table.DEFERRED, chat_ref, [identity])
    receipt = router.frame("delivery_receipt", pending.sender, text, **fields)
    router.event(ev.DELIVERY_RECEIPT_DEFERRED, {"chat_seq": seq, "recipient": identity,
                                                "receipt": receipt})
    router.metrics.count_receipt(receipt_table.DEFERRED)
    sender = router.presence.session_of(pending.sender)
    if sender is not None:
        receipts.deliver_notifications(router, sender)


def on_register(router: Router, session: Session, frame: dict) -> None:
    if router.mutations_refused():
        return  # housekeeping waits for a writable journal; registration must not
    name = session.name
    if name in router.state.chat.dead_letters.by_target:
        router.event(ev.DEAD_LETTERS_CLEARED, {"target": name})
    receipts.deliver_notifications(router, session)


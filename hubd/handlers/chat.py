"""The chat verb: quota, the retry identity, receipts.

The hot path. A chat frame is stamped in place (it was freshly decoded for
this command and nothing else holds it) and routed by the routing service
(hubd/handlers/routing.py): encoded once, that one string is both the
journal payload and the text every recipient gets (each door frames it once
for all its endpoints).
"""

from __future__ import annotations

from hubd.actors.router import Router
from hubd.core.plugin import Verbs
from hubd.state.channels import channels_of, chat_channel, not_a_member
from hubd.state.chat import same_content
from hubd.state.presence import Session
from hubd.wire.envelope import valid_client_msg_id
from hubd.wire.targets import RemoteTargetError, parse_remote

from . import receipts, routing

# this module's verbs (its plugin installs them)
verbs = Verbs()


@verbs.handles("chat")
def chat(router: Router, session: Session, frame: dict, size: int) -> None:
    name = session.name
    channel = chat_channel(frame)
    if channel and not channels_of(router.state).is_member(channel, name):
        # refused before the quota is charged: a refusal changes nothing
        router.metrics.channel_refusals += 1
        router.error(session, not_a_member(channel), channel=channel)
        return
    refused = router.quota.admit(session.principal, size, router.now)
    if refused is not None:
        router.metrics.refuse_quota(refused)
        router.error(session, f"Durable ingress quota exceeded ({refused}).")
        return
    # `redsyn` is the hub's own word on a chat the REDSYN door made (its kind,
    # signature, client address, a link change); it crosses to peer hubs,
    # which act on it, so no client's chat carries one
    frame.pop("redsyn", None)
    target_raw = frame.get("target") or "all"
    remote = None
    if not channel:
        # a blank `channel` is none (the reference's reading); a channel chat
        # follows the channel's rules and is never forwarded
        frame.pop("channel", None)
        if "@" in target_raw:
            remote = parse_remote(target_raw)
            if isinstance(remote, RemoteTargetError):
                router.error(session, remote.text)
                return

    client_msg_id = valid_client_msg_id(frame.get("client_msg_id"))
    if client_msg_id is not None and _is_retry(router, session, client_msg_id, frame):
        return
    retry = client_msg_id is not None
    if remote is not None:  # refused there if the hub is not a message peer
        routing.forward_chat(router, session, frame, remote, retry)
        return
    wants_receipt = frame.get("receipt_requested") is True
    route_extra = RETRY_ROUTE if retry else None
    if wants_receipt:
        # the chat commits with its receipt aggregate (hubd/handlers/receipts.py)
        route_extra = RECEIPT_RETRY_ROUTE if retry else RECEIPT_ROUTE
    event, recipients, directed = routing.route_chat(router, frame, name, route_extra)
    router.fail_privately(session, "Chat was not journalled; it was not routed. Retry with the "
                                   "same client_msg_id.", client_msg_id=frame.get("client_msg_id"))
    if wants_receipt:
        if channel:
            receipts.request_channel(router, session, frame, event.seq, recipients)
        else:
            receipts.request(router, session, frame, event.seq, recipients, directed)


# route facts of a chat whose (sender, client_msg_id) is remembered once routed
RETRY_ROUTE = {"retry": 1}
# route facts of a receipt-requested chat: its verdicts are separate events
RECEIPT_ROUTE = {"receipt": 1}
RECEIPT_RETRY_ROUTE = {"retry": 1, "receipt": 1}


def _is_retry(router: Router, session: Session, client_msg_id: str, frame: dict) -> bool:
    """Answer a retried client_msg_id; True when the chat must not be routed again."""
    first = router.state.chat.retry.lookup(session.name, client_msg_id, router.now)
    if first is None:
        return False
    if not same_content(first.frame, frame):
        router.error(session, f"client_msg_id '{client_msg_id}' was already used for "
                              "a different message.", client_msg_id=client_msg_id)
        return True
    duplicate = {"duplicate": True, "client_msg_id": client_msg_id,
                 "msg_id": first.msg_id, "seq": first.seq}
    if first.forward_id:
        duplicate["forward_id"] = first.forward_id
    if chat_channel(first.frame):
        duplicate["channel"] = chat_channel(first.frame)  # the seed's: when the first had one
    router.reply(session, "system",
                 f"Chat '{client_msg_id}' was already accepted as message "
                 f"{first.msg_id}; it was not routed again.", **duplicate)
    return True

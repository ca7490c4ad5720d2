"""Chat: stamp, deduplicate, route, journal, receipt.

The hot path. A chat frame is stamped in place (it was freshly decoded for
this command and nothing else holds it), encoded once, and that one string is
both the journal payload and the text every recipient gets (each door frames
it once for all its endpoints).
"""

from __future__ import annotations

from fnmatch import fnmatchcase

from hubd.actors.router import Router
from hubd.core.plugin import Verbs
from hubd.core.message import Message
from hubd.state import events as ev
from hubd.state.chat import same_content
from hubd.state.presence import RX_SUFFIX, Presence, Session
from hubd.wire.envelope import finite_number, valid_client_msg_id
from hubd.wire.targets import RemoteTargetError, Target, parse_remote, parse_target

from . import receipts

# this module's verbs (its plugin installs them)
verbs = Verbs()


def resolve_recipients(presence: Presence, target: Target, sender: str) -> list[str]:
    """Online names a directed target reaches (a -rx sidecar stands in for its
    seat), excluding the sender."""
    by_name = presence.by_name
    items = target.items
    if len(items) == 1 and not target.globs[0] and "/" in items[0] and not presence.by_role:
        # the common case: one exact seat
        item = items[0]
        if item != sender and (item in by_name or (item + RX_SUFFIX) in by_name):
            return [item]
        return []
    found: set[str] = set()
    for item, glob in zip(items, target.globs):
        if glob:
            found.update(n for n in by_name if fnmatchcase(n, item))
            continue
        if item in by_name or (item + RX_SUFFIX) in by_name:
            found.add(item)
        holders = presence.by_role.get(item)
        if holders:
            found.update(holders)
        if "/" not in item:
            prefix = item + "/"
            found.update(n for n in by_name if n.startswith(prefix))
    found.discard(sender)
    return sorted(found)


def recipient_endpoints(presence: Presence, recipients: list[str]) -> tuple:
    """Private routing: each recipient's endpoint and its -rx sidecar's."""
    by_name = presence.by_name
    endpoints = []
    for name in recipients:
        session = by_name.get(name)
        if session is not None:
            endpoints.append(session.endpoint)
        sidecar = by_name.get(name + RX_SUFFIX)
        if sidecar is not None:
            endpoints.append(sidecar.endpoint)
    return tuple(endpoints)


@verbs.handles("chat")
def chat(router: Router, session: Session, frame: dict, size: int) -> None:
    name = session.name
    refused = router.quota.admit(session.principal, size, router.now)
    if refused is not None:
        router.metrics.refuse_quota(refused)
        router.error(session, f"Durable ingress quota exceeded ({refused}).")
        return
    target_raw = frame.get("target") or "all"
    remote = None
    if "@" in target_raw:
        remote = parse_remote(target_raw)
        if isinstance(remote, RemoteTargetError):
            router.error(session, remote.text)
            return
        remote_hubs = router.installed.remote_hubs
        if remote_hubs is None:
            router.error(session, f"Hub '{remote.hub}' is not a configured message peer of "
                                  "this hub.")
            return

    client_msg_id = valid_client_msg_id(frame.get("client_msg_id"))
    if client_msg_id is not None and _is_retry(router, session, client_msg_id, frame):
        return
    retry = client_msg_id is not None
    if remote is not None:  # refused there if the hub is not a message peer
        remote_hubs.forward_chat(router, session, frame, remote, retry)
        return
    wants_receipt = frame.get("receipt_requested") is True
    route_extra = RETRY_ROUTE if retry else None
    if wants_receipt:
        # the chat commits with its receipt aggregate (hubd/handlers/receipts.py)
        route_extra = RECEIPT_RETRY_ROUTE if retry else RECEIPT_ROUTE
    event, recipients, directed = route_chat(router, frame, name, route_extra)
    router.fail_privately(session, "Chat was not journalled; it was not routed. Retry with the "
                                   "same client_msg_id.", client_msg_id=frame.get("client_msg_id"))
    if wants_receipt:
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
    router.reply(session, "system",
                 f"Chat '{client_msg_id}' was already accepted as message "
                 f"{first.msg_id}; it was not routed again.", **duplicate)
    return True


def route_chat(router: Router, frame: dict, sender: str, route_extra: dict | None = None):
    """Stamp, journal and fan out one chat from `sender` (a local seat, or
    seat@HUB for a forwarded one). Returns (event, recipients, directed)."""
    stamp_chat(router, frame, sender)
    target = parse_target(frame.get("target") or "all")
    # a seat on a peer hub (local names never hold '@'): its recipients are there
    outgoing = "@" in target.raw
    directed = not target.is_broadcast and not frame.get("channel") and not outgoing
    presence = router.presence
    plans = ()
    if directed:
        recipients = resolve_recipients(presence, target, sender)
        hooks = router.installed.directed_chat
        if hooks:  # seats a plugin serves outside presence (the broker's <ns>/<handle>)
            plans = [plan for hook in hooks if (plan := hook(router, frame, sender, target))]
            if plans:
                recipients = sorted(set(recipients).union(*(plan.seats for plan in plans)))
    elif outgoing:
        recipients = []  # its recipients are on the peer hub
    else:
        recipients = [n for n in presence.by_name if n != sender]
    text = ev.encode_payload(ev.CHAT, frame)
    route = {"recipients": recipients if directed else []}
    if route_extra:
        route.update(route_extra)  # copied: RETRY_ROUTE is shared
    event = router.event(ev.CHAT, frame, route, payload_text=text)
    for plan in plans:
        plan.journal(router)
    message = Message(frame, text)
    metrics = router.metrics
    metrics.chats_routed += 1
    if (directed or outgoing) and router.private_directed:
        dests = recipient_endpoints(presence, recipients)
        if dests:
            router.send(dests, message, "chat")
    elif presence.endpoints:
        router.send(presence.endpoints, message, "chat")
    if directed and not recipients:
        metrics.dead_letters += 1
    return event, recipients, directed


def stamp_chat(router: Router, frame: dict, sender: str) -> None:
    """Hub time is the only order; a finite client time is kept as metadata."""
    frame.pop("token", None)
    client_ts = finite_number(frame.get("timestamp"))
    if client_ts is not None:
        frame["client_timestamp"] = client_ts
    else:
        frame.pop("client_timestamp", None)
    frame["sender"] = sender
    frame["timestamp"] = router.now
    frame["hub_id"] = router.hub_id
    frame["msg_id"] = router.state.chat.last_msg_id + 1
    frame["seq"] = router.next_seq()

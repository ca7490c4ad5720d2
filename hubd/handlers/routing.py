"""The routing service: where a message goes, decided once, for every door.

Every message to a target comes through here, whichever door it came from:
a WebSocket chat, a REDSYN post to a seat, a broker send to a hub target, a
chat forwarded from a peer hub, a door that speaks only the shared
vocabulary. Its target resolves to:
- seats in presence: a directed chat's recipients (a `-rx` sidecar stands in
  for its seat), everyone online for a broadcast;
- boxes of the installed mailboxes (a REDSYN agent's inbox, a broker
  handle's), each asked once; the chat's route records their entries
  (`route["boxes"][kind]`), so each mailbox's applier reads its own
  recipients from the journaled chat and a replay lands every chat in the
  same boxes. (A chat journaled before this service has no `boxes`: its
  mailboxes read it as the hubd that wrote it did.)
- a seat on a peer hub (`PROJECT/seat@HUB`, or an address whose namespace a
  peer owns), through the federation plugin (`remote_hubs`): this is the
  only module that asks it where a target lives.

Then the chat is journaled once, with its recipients, and the one message
made of its journal payload goes to the recipients' endpoints after commit.
"Delivery" in this code base means session-bound delivery (the delivery_*
verbs); this is routing.
"""

from __future__ import annotations

from fnmatch import fnmatchcase

import structlog

from hubd.actors.router import Router
from hubd.core.message import Message
from hubd.logs import LimitedLog
from hubd.handlers.dead_letters import after_dead_letter, journal_unwritten
from hubd.state import events as ev
from hubd.state import receipt_rules
from hubd.state.acl import allowed
from hubd.state.channels import channels_of, chat_channel
from hubd.state.chat import is_directed
from hubd.state.presence import RX_SUFFIX, Presence, Session
from hubd.wire.envelope import finite_number
from hubd.wire.targets import RemoteSeat, RemoteTargetError, Target, parse_remote, parse_target

log = structlog.get_logger("hubd.routing")


# -- a chat to this hub's seats and boxes

def route_chat(router: Router, frame: dict, sender: str, route_extra: dict | None = None):
    """Stamp, resolve, journal and fan out one chat from `sender` (a local
    seat, a REDSYN agent, local/<handle>, or seat@HUB for a forwarded one).
    Returns (event, recipients, directed)."""
    stamp_chat(router, frame, sender)
    target = parse_target(frame.get("target") or "all")
    directed = is_directed(frame, target)
    presence = router.presence
    boxes: dict = {}
    mailboxes = router.installed.mailboxes
    channel = chat_channel(frame)
    if channel:
        # a private channel: its online members, never a broadcast, never a
        # mailbox, never forwarded (the chat verb refused a non-member's)
        recipients = channel_recipients(router, channel, sender)
    elif directed:
        recipients = resolve_recipients(presence, target, sender)
        reached: tuple = ()
        extensions = router.state.extensions
        for mailbox in mailboxes:
            namespace = mailbox.namespace
            if namespace is not None and namespace not in target.projects:
                continue
            planned = mailbox.plan(router, extensions[mailbox.projection], frame, sender, target,
                                   route_extra)
            if planned is not None:
                boxes[mailbox.kind] = planned.entries
                reached += planned.seats
        if reached:  # seats a mailbox serves outside presence (the broker's <ns>/<handle>)
            recipients = sorted(set(recipients).union(reached))
    elif "@" in target.raw:
        recipients = []  # a seat on a peer hub: its recipients are there
    else:
        recipients = [n for n in presence.by_name if n != sender]
    text = ev.encode_payload(ev.CHAT, frame)
    route = {"recipients": recipients if directed or channel else [], "boxes": boxes}
    # the seed's dead letter is a directed chat that matched no live
    # connection: none at all, or only stale ones (journaled, so the ledger
    # a replay builds counts it the same)
    stale_only = directed and not channel and recipients and receipt_rules.only_stale(
        recipients, presence.by_name, router.now, router.config.liveness, presence.live)
    if stale_only:
        route["stale_only"] = True
    if route_extra:
        route.update(route_extra)  # copied: the callers' route constants are shared
    event = router.event(ev.CHAT, frame, route, payload_text=text)
    if boxes:
        for mailbox in mailboxes:
            entries = boxes.get(mailbox.kind)
            if entries:
                mailbox.delivered(router, event, entries)
    message = Message(frame, text)
    metrics = router.metrics
    metrics.chats_routed += 1
    if channel:
        metrics.channel_chats += 1
        dests = member_endpoints(presence, recipients)
        if dests:
            router.send(dests, message, "chat")
    elif (directed or "@" in target.raw) and router.private_directed:
        dests = recipient_endpoints(presence, recipients)
        if directed:  # a local directed chat: its observers, and the sender's echo
            observers = observer_endpoints(router, target.raw, sender, recipients)
            if observers:
                metrics.observer_copies += len(observers)
                dests += observers
            sender_session = presence.by_name.get(sender)
            if sender_session is not None:
                dests += (sender_session.endpoint,)
        if dests:
            router.send(tuple(dict.fromkeys(dests)), message, "chat")
    elif presence.endpoints:
        router.send(presence.endpoints, message, "chat")
    if directed and (stale_only or not recipients):
        dead_lettered(router, target.raw)
    return event, recipients, directed


def dead_lettered(router: Router, target: str) -> None:
    """A dead letter to `target` was just journaled (the ledger counts it):
    count it, escalate if due, and hand an escalation to the federation
    plugin (a peer hub may own the target's namespace: its pointer goes
    there). Inside the command that journaled it."""
    router.metrics.dead_letters += 1
    escalated = after_dead_letter(router, target)
    remote_hubs = router.installed.remote_hubs
    if escalated is not None and remote_hubs is not None:
        remote_hubs.dead_letter_escalated(router, target, escalated)


def dead_letter_unwritten(router: Router, target: str, sender: str, chat_seq: int) -> None:
    """Every write of the directed chat `chat_seq` to its live matches
    failed (its receipt or its forward's answer says so): a dead letter."""
    journal_unwritten(router, target, sender, chat_seq)
    dead_lettered(router, target)


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


def channel_recipients(router: Router, channel: str, sender: str) -> list[str]:
    """A channel chat's audience: the channel's members online now, not the
    sender; nobody when the sender is not a member (the chat verb refuses
    that; another door's frame carrying a `channel` reaches no one)."""
    book = channels_of(router.state)
    if not book.is_member(channel, sender):
        return []
    by_name = router.presence.by_name
    return sorted(m for m in book.members(channel) if m != sender and m in by_name)


def member_endpoints(presence: Presence, members: list[str]) -> tuple:
    """Channel routing: each member's own socket (the audience is exact
    membership: no -rx sidecar, no observer)."""
    by_name = presence.by_name
    return tuple(by_name[name].endpoint for name in members if name in by_name)


def observer_endpoints(router: Router, target: str, sender: str, recipients: list[str]) -> tuple:
    """Private directed routing: the sockets of online identities the ACL
    policy grants `observe` on agent:<target> (a rule's namespace scopes
    it to observers of that project), the sender and recipients aside.
    Without an ACL policy there are no observers."""
    rules = observe_rules(router.hub.identity.signed.acl)
    if not rules:
        return ()
    skip = set(recipients)
    skip.add(sender)
    return tuple(session.endpoint for name, session in router.presence.by_name.items()
                 if name not in skip and name.removesuffix(RX_SUFFIX) not in skip
                 and allowed(rules, name, "observe", "agent", target))


_observe_cache: list = [None, ()]  # [the policy's rules, its observe rules]


def observe_rules(rules) -> tuple:
    """The policy's `observe` rules, found once per loaded policy (a reload
    replaces the rules object), not once per chat."""
    if rules is not _observe_cache[0]:
        _observe_cache[:] = [rules, tuple(r for r in rules or () if r.permission == "observe")]
    return _observe_cache[1]


# -- any target, from a door's own sender (REDSYN, the broker)

def send_chat(router: Router, frame: dict, sender: str,
              route_extra: dict | None = None) -> None:
    """A chat from `sender` to the frame's target, wherever that lives: this
    hub's seats and boxes, or a seat on a peer hub (forwarded; the caller
    checked `hub_refusal` before it journaled anything)."""
    remote = parse_remote(frame["target"])
    if remote is None:
        route_chat(router, frame, sender, route_extra)
    else:
        router.installed.remote_hubs.forward_from(router, sender, frame, remote, False)


# -- seats on peer hubs (the federation plugin, when installed)

def remote_target(target: str) -> RemoteSeat | RemoteTargetError | None:
    """`PROJECT/seat@HUB` as a seat on a peer hub (or why it cannot be one);
    None for a target on this hub."""
    return parse_remote(target) if "@" in target else None


def knows_hub(router: Router, hub_id: str) -> bool:
    """May this hub address seats on `hub_id` (a configured message peer)?"""
    remote_hubs = router.installed.remote_hubs
    return remote_hubs is not None and remote_hubs.knows(hub_id)


class Unroutable:
    """Chats to a hub this hub has no route to: the log's line budget (a
    client sending to a wrong hub in a loop writes MAX_LINES lines a window)."""

    def __init__(self, router: Router):
        self.line = LimitedLog(log, "warning")


def no_route(router: Router, hub_id: str, sender: str | None) -> str:
    """A chat from `sender` to a seat on `hub_id`, a hub this hub has no route
    to (not a configured message peer): counted (hubd_chats_no_route_total),
    logged, and the refusal's text. A reply refused here is often a one-way
    setup (the peer forwards here, this hub has no --message-peer for it):
    the log line names both. Whoever finds the hub unknown calls this (the
    federation plugin when installed, this module when not)."""
    router.metrics.chats_no_route += 1
    router.live_of(Unroutable).line(
        "chat to a hub with no route; refused (add --message-peer for it if it should have "
        "one)", hub=hub_id, sender=sender)
    return f"Hub '{hub_id}' is not a configured message peer of this hub."


def hub_refusal(router: Router, hub_id: str, sender: str | None) -> str | None:
    """Why a chat from `sender` to a seat on `hub_id` cannot be accepted now
    (no route, a full forward backlog), or None."""
    remote_hubs = router.installed.remote_hubs
    if remote_hubs is None:
        return no_route(router, hub_id, sender)
    return remote_hubs.refusal(router, hub_id, sender)


def owner_seat(router: Router, address: str) -> str | None:
    """`address@HUB` when a peer hub owns the address's namespace, else None."""
    remote_hubs = router.installed.remote_hubs
    return remote_hubs.seat_on_owner(address) if remote_hubs is not None else None


def forward_chat(router: Router, session: Session, frame: dict, remote: RemoteSeat,
                 retry: bool) -> None:
    """A chat verb to a seat on a peer hub: forwarded, or refused to the sender."""
    remote_hubs = router.installed.remote_hubs
    if remote_hubs is None:
        router.error(session, no_route(router, remote.hub, session.name),
                     client_msg_id=frame.get("client_msg_id"))
        return
    remote_hubs.forward_chat(router, session, frame, remote, retry)


def remote_who(router: Router, session: Session, frame: dict, hub_id: str) -> None:
    """who_request naming a peer hub: asked there."""
    remote_hubs = router.installed.remote_hubs
    if remote_hubs is None:
        router.error(session, f"Hub '{hub_id}' is not a configured message peer of this hub.")
    else:
        remote_hubs.remote_who(router, session, frame, hub_id)


def forward_delivery(router: Router, session: Session, frame: dict) -> bool:
    """A delivery_request to `PROJECT/seat@HUB` from a local requester: asked
    there or refused (True); False when it is for this hub."""
    target = frame.get("target")
    remote_hubs = router.installed.remote_hubs
    if remote_hubs is None or session.peer_hub is not None or not isinstance(target, str) \
            or "@" not in target:
        return False  # a forwarded requester is served here, never forwarded on
    remote_hubs.forward_delivery(router, session, frame)
    return True


def routed_delivery(router: Router, session: Session, frame: dict, key: str) -> bool:
    """A delivery status request or cancel for an operation routed to a peer:
    asked there or refused (True); False when it is this hub's."""
    remote_hubs = router.installed.remote_hubs
    if remote_hubs is None or session.peer_hub is not None:
        return False
    return remote_hubs.routed_delivery(router, session, frame, key)


def takes_notices(router: Router, peer: str) -> bool:
    """Whether the peer hub that forwarded a delivery request takes its stage
    changes back (the admission journals the answer with the operation)."""
    remote_hubs = router.installed.remote_hubs
    return remote_hubs is not None and remote_hubs.takes_notices(router, peer)


def notice_peer(router: Router, audience: str, origin_hub: str,
                taker_at_admission: bool) -> str | None:
    """The peer hub a forwarded requester's (`seat@ORIGIN`) delivery
    notification goes back to, or None (no federation, or its origin does not
    take them: then it is journaled only)."""
    remote_hubs = router.installed.remote_hubs
    if remote_hubs is None or "@" not in audience:
        return None
    return remote_hubs.notice_peer(router, audience, origin_hub, taker_at_admission)


def push_notices(router: Router, peer: str, notes: list) -> None:
    """Send journaled delivery notifications back to `peer` (after the commit)."""
    router.installed.remote_hubs.push_notices(router, peer, notes)

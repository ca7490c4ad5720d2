"""What the shared verbs mean on the REDSYN door, and its own verbs.

The door (hubd/doors/redsyn/) turns each HTTP call into a command: PUT an
agent is Register (an announce), POST a message is Send, GET the inbox is
Take (one look of a long poll), POST an ack is Ack; the rest are Requests
(`redsyn.key`, `redsyn.cancel`, `redsyn.subscribe`, `redsyn.agent`,
`redsyn.agent_key`, `redsyn.files`, and the webhook pusher's
`redsyn.webhooks`, `redsyn.webhook_failed`). Each carries the calling node
(`fields["node"]`, who the door authenticated).

Here each is decided by the pure REDSYN rules (hubd/state/redsyn/) on the
Router's state, its events are journaled, and the answer goes back in the
command's future after the commit (an accepted message is durable before its
2xx), or a RedsynError the door turns into its HTTP status. A message to a
hub seat goes through the routing service as a chat from the sender's
address (hubd/handlers/routing.py).
"""

from __future__ import annotations

import time

from hubd.actors.router import Router
from hubd.core.refusals import REFUSALS
from hubd.core.plugin import Dialect
from hubd.state import redsyn as mb
from hubd.state.redsyn import links
from hubd.state.events import UnstorableEvent
from hubd.wire.redsyn.envelope import DOOR, RedsynError, parse_address

from .. import routing
from .mailbox import REDSYN_ROUTE, RedsynLive, journal, owner_of, state_of


def _fail(reply, error: RedsynError) -> None:
    if reply is not None and not reply.done():
        reply.set_exception(error)


def _decide(router: Router, command, decide) -> mb.Decision | None:
    """One call that may change the mailbox: decide on the state and the hub's
    time, journal the decision (events, chats to seats), answer once committed."""
    reply = command.reply
    if router.mutations_refused():
        _fail(reply, RedsynError(503, f"the hub cannot write its journal now "
                                      f"({router.refusing_mutations})"))
        return None
    try:
        decision = decide(state_of(router), router.now)
    except RedsynError as exc:
        _fail(reply, exc)
        return None
    if decision.events and not _journal(router, reply, decision):
        return None
    router.answer(reply, decision.answer)
    return decision


def _journal(router: Router, reply, decision: mb.Decision) -> bool:
    for chat in decision.chats:
        remote = routing.remote_target(chat["frame"]["target"])
        if remote is not None:
            refused = routing.hub_refusal(router, remote.hub, chat["sender"])
            if refused is not None:
                _fail(reply, RedsynError(503, refused))
                return False
    try:
        journal(router, decision.events)
        for chat in decision.chats:
            # the WebSocket side: journaled and sent like any chat from this seat,
            # or forwarded to the peer hub that owns the address's namespace
            routing.send_chat(router, chat["frame"], chat["sender"], REDSYN_ROUTE)
    except REFUSALS as refused:  # nothing of this call is kept
        text = router.refuse_command(refused)
        _fail(reply, RedsynError(400 if isinstance(refused, UnstorableEvent) else 503, text))
        return False
    return True


def _read(router: Router, command, read) -> None:
    """A call that only reads: served while the journal refuses writes too."""
    try:
        router.answer(command.reply, read(state_of(router)))
    except RedsynError as exc:
        _fail(command.reply, exc)


def seat_of(router: Router):
    """The hub seat a REDSYN message to `address` goes to, or None (then the
    address is a REDSYN agent's box): its namespace's owner on a peer hub; a
    WebSocket agent online under that name; else one seen on this hub before,
    unless the address is a REDSYN agent."""
    def seat(address: str, state: mb.RedsynState) -> str | None:
        owned = routing.owner_seat(router, address)
        if owned is not None:
            return owned
        if address in router.presence.by_name:
            return address
        if address in router.state.agents.last_seen and not mb.known_here(state, address):
            return address
        return None
    return seat


# -- the shared verbs

def opened(router: Router, session, command) -> None:
    router.live_of(RedsynLive).door = session.endpoint


def register(router: Router, session, command) -> None:
    """PUT /agents/{address}: an announce."""
    node, doc = command.fields["node"], command.fields["doc"]
    config = router.config
    decision = _decide(router, command, lambda state, now: mb.decide_announce(
        state, node, command.identity, doc, config.redsyn_allow_loopback_webhooks))
    if decision is not None and decision.answer["listening"]:
        router.presence.hear(DOOR, decision.answer["agent"], node.id, time.time())


def send(router: Router, session, command) -> None:
    """POST /messages: the door validated the envelope (fields["incoming"])."""
    fields = command.fields
    new_id = fields["new_id"]
    _decide(router, command, lambda state, now: mb.decide_post(
        state, fields["node"], fields["incoming"], now, router.config.redsyn_limits,
        new_id=lambda: new_id, seat_of=seat_of(router), client=fields.get("client")))


def take(router: Router, session, command) -> None:
    """GET /inbox/{agent}: one look; answers (items, when the next one is ready)."""
    node = command.fields["node"]
    agent = command.identity
    if not command.fields.get("webhook"):
        router.presence.hear(DOOR, agent, node.id, time.time())  # each take is a heartbeat
    _decide(router, command, lambda state, now: mb.decide_poll(
        state, node, agent, command.lease, command.limit, now))


def ack(router: Router, session, command) -> None:
    """POST /inbox/{agent}/ack (or the webhook pusher, after a 2xx)."""
    if command.fields.get("webhook"):
        router.live_of(RedsynLive).webhook_took(command.identity, time.time())
    _decide(router, command, lambda state, now: mb.decide_ack(
        state, command.fields["node"], command.identity, {"ids": command.ids}))


# -- its own verbs

def key(router: Router, session, command) -> None:
    node, doc = command.fields["node"], command.fields["doc"]
    _decide(router, command, lambda state, now: mb.decide_key(state, node, doc))


def cancel(router: Router, session, command) -> None:
    node, id_ = command.fields["node"], command.fields["id"]
    _decide(router, command, lambda state, now: mb.decide_cancel(state, node, id_))


def subscribe(router: Router, session, command) -> None:
    fields = command.fields
    _decide(router, command, lambda state, now: mb.decide_subscribe(
        state, fields["node"], fields["topic"], fields["doc"]))


def agent(router: Router, session, command) -> None:
    """GET /agents/{address}: what the hub knows of an agent of the caller's org."""
    node, address = command.fields["node"], command.fields["address"]

    def read(state: mb.RedsynState) -> dict:
        key_ = parse_address(address, what="agent address").agent_address
        if not links.visible_across(state, node.person.split("/")[0], key_):
            raise RedsynError(403, f"{key_} is not visible outside {key_.split('/')[0]} "
                                   "(an active link that exposes it is)")
        record = state.agents.get(key_)
        heard = router.presence.last_heard(DOOR, key_)
        seen = max(heard[0] if heard else 0.0,
                   router.live_of(RedsynLive).webhook_seen.get(key_, 0.0))
        if record is None and not seen:
            raise RedsynError(404, f"no agent {key_}")
        record = record or mb.Agent()
        return {"agent": key_, "online": time.time() - seen < mb.PRESENCE_SECONDS,
                "last_seen": int(seen) if seen else None, "listening": record.listening,
                "description": record.description, "policy": record.policy,
                "webhook": record.webhook is not None, "node": record.node,
                "waiting": len(state.boxes.get(key_, ()))}
    _read(router, command, read)


def agent_key(router: Router, session, command) -> None:
    fields = command.fields
    _read(router, command, lambda state: mb.key_of(state, fields["node"], fields["address"]))


def files(router: Router, session, command) -> None:
    fields = command.fields
    _read(router, command, lambda state: mb.files_of(state, fields["node"], fields["id"]))


def webhooks(router: Router, session, command) -> None:
    """The webhook pusher's round: agents with a webhook and mail, not busy."""
    busy = command.fields["busy"]
    _read(router, command, lambda state: [
        (agent_, record.webhook) for agent_, record in state.agents.items()
        if record.webhook is not None and agent_ not in busy and agent_ in state.boxes])


def webhook_failed(router: Router, session, command) -> None:
    fields = command.fields
    agent_, id_ = fields["agent"], fields["id"]
    first_retry = router.config.timing.redsyn_webhook_first_retry
    _decide(router, command, lambda state, now: mb.Decision(
        mb.webhook_failed(state, agent_, id_, now, first_retry)
        if id_ in state.boxes.get(agent_, {}) else []))


# -- links between organizations (docs/redsyn.md, "Organizations and links")

def _orgs(router: Router) -> dict:
    """The organizations the hub knows (kept beside the principals)."""
    return router.hub.identity.table.orgs


def _to_peer(router: Router, decision: mb.Decision, link: dict) -> mb.Decision:
    """A change of a link whose other organization a peer hub owns goes there
    too, through the forward outbox (docs/redsyn.md, "Across sites")."""
    [(_, payload)] = decision.events[:1]
    org = payload["org"]
    other = next(o for o in link["orgs"] if o != org)
    seat = routing.owner_seat(router, f"{other}/{links.LINKS_SEAT}")
    if seat is not None:
        decision.chats.append(links.link_chat(org, seat, payload))
    return decision


def link_propose(router: Router, session, command) -> None:
    fields = command.fields

    def decide(state: mb.RedsynState, now: float) -> mb.Decision:
        decision = links.decide_propose(state, fields["node"], fields["doc"], _orgs(router),
                                        now, new_id=lambda: fields["new_id"],
                                        owner_of=owner_of(router))
        return _to_peer(router, decision, decision.answer)
    _decide(router, command, decide)


def link_change(router: Router, session, command) -> None:
    """accept, suspend, resume, end, terms; what waits over the link that it
    no longer admits is given up in the same commit, each sender told."""
    fields = command.fields

    def decide(state: mb.RedsynState, now: float) -> mb.Decision:
        decision, after = links.decide_change(state, fields["node"], fields["id"],
                                              fields["action"], fields["doc"], now)
        if fields["action"] in ("suspend", "end", "terms"):
            decision.events.extend(mb.give_up_refused(state, after, now, decision.chats))
        return _to_peer(router, decision, after)
    _decide(router, command, decide)


def link_read(router: Router, session, command) -> None:
    fields = command.fields
    _read(router, command, lambda state: links.read_link(state, fields["node"], fields["id"]))


def links_list(router: Router, session, command) -> None:
    _read(router, command, lambda state: links.list_links(state, command.fields["node"]))


def org(router: Router, session, command) -> None:
    """GET /orgs/{org}: its record and admins, for its people and admins."""
    node, name = command.fields["node"], command.fields["org"]

    def read(state: mb.RedsynState) -> dict:
        table = router.hub.identity.table
        record = table.orgs.get(name)
        member = node.person.split("/")[0] == name or (
            node.principal is not None and node.principal.admins_org(name))
        if record is None or not member:
            raise RedsynError(404, f"no organization {name} here")
        return {"org": name, "redsyn_version": record["redsyn_version"],
                "admins": table.org_admins(name)}
    _read(router, command, read)


DIALECT = Dialect(opened=opened, register=register, send=send, take=take, ack=ack, requests={
    "redsyn.key": key, "redsyn.cancel": cancel, "redsyn.subscribe": subscribe,
    "redsyn.agent": agent, "redsyn.agent_key": agent_key, "redsyn.files": files,
    "redsyn.webhooks": webhooks, "redsyn.webhook_failed": webhook_failed,
    "redsyn.link_propose": link_propose, "redsyn.link_change": link_change,
    "redsyn.link": link_read, "redsyn.links": links_list, "redsyn.org": org})

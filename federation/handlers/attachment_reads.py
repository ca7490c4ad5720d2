"""Cross-hub attachment reads (wire v6). The source side: a peer hub, admitted
by its pinned client certificate and registered with protocol_version 6 or
more, asks `attachment_peer_request` {action info|read, scope, digest,
offset}; it is answered `attachment_peer_result` (docs/attachments.md,
"Cross-hub reads"; docs/reference-observed.md §14).

Before any object is read: the live peer identity (this link's certificate,
under the serving policy), the namespace trust (its federation record's
`scope_grants` hold read on the scope), then, on the store's worker, its exact
grant in `--attachment-recipient-policy` (re-read per request). Every refusal
is `{ok: false, error: "attachment unavailable"}`. Every request that gets
this far leaves one `peer_read_audit` row in the ledger; nothing is journaled.

The reader side (hubd's own: the reference has no agent-facing reader): an
agent sends the same verb to its own hub with `source_hub`; the hub checks
the agent as for a local attachment_read (its role and ACL rule on the
scope), asks the source over its pinned message-peer link, and relays the
answer as `attachment_peer_result` with `source_hub`. At most 64 such asks
wait at once; each gives up after 15 s.
"""

from __future__ import annotations

from typing import NamedTuple

import pybase64

from hubd.actors.router import Router
from hubd.core.plugin import Verbs
from hubd.handlers.attachments import AttachmentsLive
from hubd.journal.attachment_store import AttachmentStore, read_small_owner_only
from hubd.state.acl import PolicyError
from hubd.state.attachment_grants import (MAX_POLICY_BYTES, PEER_VERSION, PeerRequest,
                                          granted, parse_recipient_policy, read_peer_request)
from hubd.state.attachment_rules import CHUNK_BYTES, DENIED, UNAVAILABLE, access_error
from hubd.state.presence import Session

from federation.actors.peer_ask import ask_peer

RESULT = "attachment_peer_result"
REFUSED = {"ok": False, "error": UNAVAILABLE}

verbs = Verbs()


MAX_ASKS = 64
ASK_SECONDS = 15.0


@verbs.handles("attachment_peer_request", peers=True)
def peer_request(router: Router, session: Session, frame: dict, size: int) -> None:
    if session.peer_hub is None:
        ask_source(router, session, frame)
    else:
        serve_peer(router, session, frame)


def serve_peer(router: Router, session: Session, frame: dict) -> None:
    live = router.live_of(AttachmentsLive)
    peer = session.peer_hub
    request = read_peer_request(frame)
    policy = router.hub.federation.serving_policy
    recipients = router.config.security.attachment_recipient_policy
    if live.store is None or recipients is None:
        router.send(session.endpoint, router.frame(RESULT, peer, "", **REFUSED))
        return
    trusted = (request is not None and policy is not None
               and (session.protocol_version or 0) >= PEER_VERSION
               and policy.may_read_scope(peer, session.peer_cert, request.scope, router.now))
    stored = live.objects.get((request.scope, request.digest)) if trusted else None
    live.run(session.endpoint, peer, RESULT, {}, _serve, live.store, recipients, peer,
             request, frame, trusted, stored, router.now, effect=("peer",))


def _serve(store: AttachmentStore, recipients, peer: str, request: PeerRequest | None,
           frame: dict, trusted: bool, stored, now: float) -> dict:
    """On the store's worker: the grant, then the object; one audit row."""
    answer = REFUSED
    if trusted and stored is not None and stored.meta.expires_at > now \
            and _granted(recipients, peer, request, now):
        meta = stored.meta
        if request.action == "info":
            answer = {"ok": True, "metadata": meta.as_wire()}
        elif request.offset <= meta.length:
            data = store.read(stored.filename, request.offset,
                              min(CHUNK_BYTES, meta.length - request.offset))
            answer = {"ok": True, "scope": meta.scope, "digest": meta.digest,
                      "offset": request.offset, "body": pybase64.b64encode_as_string(data),
                      "eof": request.offset + len(data) >= meta.length}
    scope, digest, action = ((request.scope, request.digest, request.action) if request
                             else tuple(str(frame.get(k, ""))[:256]
                                        for k in ("scope", "digest", "action")))
    store.audit(now, peer, scope, digest, action, answer["ok"])
    return answer


def _granted(recipients, peer: str, request: PeerRequest, now: float) -> bool:
    data = read_small_owner_only(recipients, MAX_POLICY_BYTES)
    if data is None:
        return False
    try:
        grants = parse_recipient_policy(data)
    except PolicyError:
        return False  # a file that cannot be used grants nothing (the reference's)
    return granted(grants, peer, request.scope, request.digest, now)


# -- the reader side

class PeerAsks:
    """The Router's live count of asks waiting for a source hub."""

    def __init__(self, router: Router):
        self.waiting = 0


class PeerReadAnswered(NamedTuple):
    """A source hub answered (or did not): relay `answer` to the agent."""

    endpoint: int
    target: str
    answer: dict


def ask_source(router: Router, session: Session, frame: dict) -> None:
    source = frame.get("source_hub")
    request = read_peer_request(frame)
    signed = router.hub.identity.signed

    def answer(fields: dict) -> None:
        router.send(session.endpoint, router.frame(RESULT, session.name, "",
                                                   source_hub=source, **fields))

    if request is None or not isinstance(source, str):
        return answer(REFUSED)
    if access_error("attachment_read", {"scope": request.scope}, session.name,
                    session.protocol_version, signed.role_grants, signed.acl) is not None:
        return answer({"ok": False, "error": DENIED})
    links = router.hub.federation.peer_links
    asks = router.live_of(PeerAsks)
    if links is None or source not in links.routes or asks.waiting >= MAX_ASKS:
        return answer(REFUSED)
    too_old = links.link(source).versions.refusal("attachment_peer_read")
    if too_old is not None:  # below wire v6 on the negotiated link: nothing is sent
        return answer({**REFUSED, "reason_code": too_old.reason_code, "detail": too_old.text})
    out = {"sender": router.hub_id, "target": "SynapseHub", "type": "attachment_peer_request",
           "payload": "", "timestamp": router.now, "action": request.action,
           "scope": request.scope, "digest": request.digest}
    if request.action == "read":
        out["offset"] = request.offset
    endpoint, name = session.endpoint, session.name
    asks.waiting += 1

    def answered(got: dict | None) -> None:
        router.post_control(PeerReadAnswered(endpoint, name, _relayed(got, request, source)))

    ask_peer(links.link(source), out, RESULT, ASK_SECONDS, answered)


def _relayed(got: dict | None, request: PeerRequest, source: str) -> dict:
    """The source's answer as the agent gets it; one that is not the answer
    to this request (a late answer matched in order after a timeout) is a
    refusal, never another request's bytes."""
    fields = {"source_hub": source}
    if not isinstance(got, dict) or got.get("ok") is not True:
        return {**fields, **REFUSED}
    if request.action == "info":
        meta = got.get("metadata")
        if not isinstance(meta, dict) or meta.get("digest") != request.digest:
            return {**fields, **REFUSED}
        return {**fields, "ok": True, "metadata": meta}
    if (got.get("digest"), got.get("offset")) != (request.digest, request.offset) \
            or not isinstance(got.get("body"), str) or type(got.get("eof")) is not bool:
        return {**fields, **REFUSED}
    return {**fields, "ok": True, "scope": request.scope, "digest": request.digest,
            "offset": request.offset, "body": got["body"], "eof": got["eof"]}


def answered(router: Router, command: PeerReadAnswered) -> None:
    router.live_of(PeerAsks).waiting -= 1
    router.send(command.endpoint, router.frame(RESULT, command.target, "", **command.answer))


COMMANDS = {PeerReadAnswered: answered}

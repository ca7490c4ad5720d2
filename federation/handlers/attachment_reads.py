"""Cross-hub attachment reads (wire v6), the source side: a peer hub, admitted
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
"""

from __future__ import annotations

import base64

from hubd.actors.router import Router
from hubd.core.plugin import Verbs
from hubd.handlers.attachments import AttachmentsLive
from hubd.journal.attachment_store import AttachmentStore, read_small_owner_only
from hubd.state.acl import PolicyError
from hubd.state.attachment_grants import (MAX_POLICY_BYTES, PEER_VERSION, PeerRequest,
                                          granted, parse_recipient_policy, read_peer_request)
from hubd.state.attachment_rules import CHUNK_BYTES, UNAVAILABLE
from hubd.state.presence import Session

RESULT = "attachment_peer_result"
REFUSED = {"ok": False, "error": UNAVAILABLE}

verbs = Verbs()


@verbs.handles("attachment_peer_request", peers=True)
def peer_request(router: Router, session: Session, frame: dict, size: int) -> None:
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
                      "offset": request.offset, "body": base64.b64encode(data).decode("ascii"),
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

"""Cross-hub attachment reads (wire v6), the source hub's decisions: the
recipient policy (`--attachment-recipient-policy`: grants of one digest in
one scope to one recipient hub, until an expiry) and the request's fields;
pure (docs/attachments.md, "Cross-hub reads"; docs/reference-observed.md §14).

Every refusal is the same `attachment unavailable`: a recipient learns
nothing about what exists, what it may not read, or why.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from hubd.state.acl import PolicyError
from hubd.state.attachment_rules import DIGEST, SCOPE

MAX_POLICY_BYTES = 64 * 1024
MAX_GRANTS = 256
GRANT_KEYS = frozenset({"recipient_hub", "scope", "digest", "expires_at"})
PEER_VERSION = 6



@dataclass(frozen=True, slots=True)
class RecipientGrant:
    recipient_hub: str
    scope: str
    digest: str
    expires_at: float


def _no_duplicate_keys(pairs):
    keys = [k for k, _ in pairs]
    if len(keys) != len(set(keys)):
        raise PolicyError("a key appears twice in one object")
    return dict(pairs)


def parse_recipient_policy(data: bytes) -> tuple[RecipientGrant, ...]:
    """`{"version": 1, "grants": [{recipient_hub, scope, digest, expires_at}]}`,
    exactly those keys, at most 256 grants and 64 KiB, no duplicate key or
    grant; PolicyError otherwise."""
    if len(data) > MAX_POLICY_BYTES:
        raise PolicyError(f"recipient policy is over {MAX_POLICY_BYTES} bytes")
    try:
        doc = json.loads(data, object_pairs_hook=_no_duplicate_keys)
    except ValueError as exc:
        raise PolicyError(f"recipient policy is not JSON: {exc}") from None
    if not isinstance(doc, dict) or set(doc) != {"version", "grants"} or doc["version"] != 1 \
            or not isinstance(doc["grants"], list):
        raise PolicyError('recipient policy must be {"version": 1, "grants": [...]}')
    if len(doc["grants"]) > MAX_GRANTS:
        raise PolicyError(f"recipient policy holds more than {MAX_GRANTS} grants")
    grants, seen = [], set()
    for index, entry in enumerate(doc["grants"]):
        if not isinstance(entry, dict) or set(entry) != GRANT_KEYS:
            raise PolicyError(f"grant {index} must have exactly {sorted(GRANT_KEYS)}")
        hub, scope, digest, expires = (entry["recipient_hub"], entry["scope"], entry["digest"],
                                       entry["expires_at"])
        if not (isinstance(hub, str) and hub and isinstance(scope, str) and SCOPE.match(scope)
                and isinstance(digest, str) and DIGEST.match(digest)
                and type(expires) in (int, float)):
            raise PolicyError(f"grant {index} has a bad field")
        if (hub, scope, digest) in seen:
            raise PolicyError(f"grant {index} repeats a grant")
        seen.add((hub, scope, digest))
        grants.append(RecipientGrant(hub, scope, digest, float(expires)))
    return tuple(grants)


def granted(grants: tuple[RecipientGrant, ...], recipient: str, scope: str, digest: str,
            now: float) -> bool:
    return any(g.recipient_hub == recipient and g.scope == scope and g.digest == digest
               and g.expires_at > now for g in grants)


@dataclass(frozen=True, slots=True)
class PeerRequest:
    action: str  # "info" or "read"
    scope: str
    digest: str
    offset: int


def read_peer_request(frame: dict) -> PeerRequest | None:
    """The request's fields, or None (refused, like every other refusal)."""
    action, scope, digest = frame.get("action"), frame.get("scope"), frame.get("digest")
    offset = frame.get("offset", 0) if action == "read" else 0
    if action not in ("info", "read") or not isinstance(scope, str) \
            or not SCOPE.match(scope) or not isinstance(digest, str) \
            or not DIGEST.match(digest) or type(offset) is not int or offset < 0:
        return None
    return PeerRequest(action, scope, digest, offset)

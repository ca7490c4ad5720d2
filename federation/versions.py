"""Wire-version negotiation with a peer hub (seed 000 "Operational warnings"
and the welcome's protocol_version; seed 002 "Network fetchers ... record the
negotiated lowest-common wire version").

Pure decisions, no IO (unit tests: tests/unit/test_version_negotiation.py):

- `negotiate(ours, advertised)`: what the peer's welcome said, read as the
  seed reads it (an integer >= 1; anything else, or nothing, is "silent" and
  counts as legacy wire version 1), the effective (lowest common) version,
  and how the peer relates to this hub: same, older, newer or silent.
- `feature_refusal(feature, negotiation)`: an optional feature a link uses
  needs a minimum wire version; below it the feature is refused with a typed
  code (`peer_version_too_old`) before anything is sent.
- `WarnOnce`: remembers which (peer, relation, advertised) the operator was
  already told of, so a peer that reconnects every few seconds is reported
  once, not once per connect; bounded.

The link (federation/actors/link.py) negotiates on every welcome; /health
(`peer_versions`) and /metrics (`hubd_peer_negotiated_version`,
`hubd_peer_version_warnings_total`) show the result (federation/plugin.py).
Decisions: docs/federation.md, "Wire versions between hubs".
"""

from __future__ import annotations

from typing import NamedTuple

import structlog

log = structlog.get_logger("hubd.federation.link")

LEGACY = 1  # a peer that advertises no usable version (seed 002)

SAME, OLDER, NEWER, SILENT = "same", "older", "newer", "silent"
RELATIONS = (SAME, OLDER, NEWER, SILENT)

TOO_OLD = "peer_version_too_old"

# The optional features a link uses, and the wire version each needs. Chats
# forwarded to a peer are not gated here: a pre-v5 peer answers the forward
# with an error, which settles it refused (docs/federation.md).
FEATURES = {
    "roster": 5,  # who_request naming the peer
    "delivery_forward": 5,  # forwarded delivery intents (a hubd peer: its hubd_features)
    "attachment_peer_read": 6,  # attachment_peer_request to a source hub
}

MAX_REMEMBERED = 256  # (peer, relation, advertised) warnings remembered


class Negotiation(NamedTuple):
    ours: int
    advertised: int | None  # what the peer's welcome said, when usable
    effective: int  # the lowest common version: what the link may use
    relation: str  # SAME, OLDER, NEWER or SILENT

    @property
    def warns(self) -> bool:
        return self.relation != SAME

    def to_json(self) -> dict:
        return {"ours": self.ours, "advertised": self.advertised,
                "negotiated": self.effective, "relation": self.relation}


class Refusal(NamedTuple):
    reason_code: str
    text: str


def read_advertised(value) -> int | None:
    """An integer >= 1 (not a bool); anything else is not a usable version."""
    if type(value) is int and value >= LEGACY:
        return value
    return None


def negotiate(ours: int, advertised) -> Negotiation:
    version = read_advertised(advertised)
    if version is None:
        return Negotiation(ours, None, min(ours, LEGACY), SILENT)
    if version < ours:
        return Negotiation(ours, version, version, OLDER)
    if version > ours:
        return Negotiation(ours, version, ours, NEWER)
    return Negotiation(ours, version, ours, SAME)


def feature_refusal(feature: str, peer: str, negotiation: Negotiation | None) -> Refusal | None:
    """None when the link may use `feature`; else the typed refusal. A link
    that never came up has negotiated nothing: that is the caller's
    `peer_unreachable`, not this."""
    needed = FEATURES[feature]
    if negotiation is None or negotiation.effective >= needed:
        return None
    said = "no version" if negotiation.advertised is None \
        else f"wire version {negotiation.advertised}"
    return Refusal(TOO_OLD, f"hub '{peer}' advertised {said}; the negotiated wire version "
                            f"{negotiation.effective} is below {needed}, which {feature} needs")


def warning_text(peer: str, n: Negotiation) -> str:
    if n.relation == SILENT:
        return (f"peer hub '{peer}' advertised no usable wire version; treating it as "
                f"version {n.effective} and gating optional features to it")
    if n.relation == OLDER:
        return (f"peer hub '{peer}' speaks wire version {n.advertised}, older than this "
                f"hub's {n.ours}; features above {n.effective} are refused on this link")
    return (f"peer hub '{peer}' speaks wire version {n.advertised}, newer than this hub's "
            f"{n.ours}; the link uses {n.effective}")


class WarnOnce:
    """Which version observations the operator was told of (bounded: past
    MAX_REMEMBERED the oldest is forgotten, so at worst told again)."""

    def __init__(self, bound: int = MAX_REMEMBERED):
        self.bound = bound
        self._told: dict[tuple, None] = {}

    def first_time(self, peer: str, n: Negotiation) -> bool:
        if not n.warns:
            return False
        key = (peer, n.relation, n.advertised)
        if key in self._told:
            return False
        self._told[key] = None
        while len(self._told) > self.bound:
            del self._told[next(iter(self._told))]
        return True


class LinkVersions:
    """One link's negotiation: the last welcome's, the operator warned once
    per (relation, advertised version), the warnings counted by relation."""

    def __init__(self, peer: str, ours: int, inbound: bool = False):
        self.peer, self.ours, self.inbound = peer, ours, inbound
        self.negotiation: Negotiation | None = None
        self.warnings: dict[str, int] = {}  # relation -> operator warnings given
        self._told = WarnOnce(16)

    def welcomed(self, advertised) -> Negotiation:
        n = self.negotiation = negotiate(self.ours, advertised)
        if self._told.first_time(self.peer, n):
            self.warnings[n.relation] = self.warnings.get(n.relation, 0) + 1
            log.warning("peer wire version differs", peer=self.peer, relation=n.relation,
                        side="registered with this hub" if self.inbound else "this hub's link",
                        peer_protocol_version=n.advertised, ours=n.ours,
                        negotiated=n.effective, detail=warning_text(self.peer, n))
        return n

    @property
    def effective(self) -> int | None:
        return self.negotiation.effective if self.negotiation is not None else None

    def refusal(self, feature: str) -> Refusal | None:
        """The typed refusal when the negotiated version is below what `feature` needs."""
        return feature_refusal(feature, self.peer, self.negotiation)

    def health(self) -> dict:
        out = self.negotiation.to_json() if self.negotiation is not None else {
            "ours": self.ours, "advertised": None, "negotiated": None, "relation": None}
        out["warnings"] = dict(self.warnings)
        return out

"""Resource offers: what an agent says it can lend (a GPU, a build slot),
keyed (agent, kind, name), as the reference keeps them (docs/resources.md;
docs/reference-observed.md §16).

An offer is journaled (`resource_offered`, the whole record) and applied to
the `resources` projection: a second offer with the same key replaces the
record; records outlive the agent's connection and a restart, as on the
reference, which has no withdrawal verb.

Bounds: `max_offers_per_agent` distinct keys per agent (the reference's
--max-offers-per-agent, default 64: a new key past it is refused, a
replacement is not), MAX_OFFERS over the hub, MAX_META_BYTES of `meta`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import orjson

from .events import Event
from .hub import Appliers, HubState

RESOURCE_OFFERED = "resource_offered"
EXTENSION = "resources"
VERBS = ("resource", "resource_offer")  # the second: the reference's alias

MAX_OFFERS_PER_AGENT = 64
MAX_OFFERS = 10_000
MAX_TEXT_BYTES = 256
MAX_META_BYTES = 4096

# the reference's refusals, word for word; hubd's own for what it does not take
NEEDS_KIND_AND_NAME = "resource offer requires kind+name"
QUOTA_EXCEEDED = "resource offer quota exceeded"
HUB_FULL = f"resource offer refused: this hub holds {MAX_OFFERS} offers"
BAD_TEXT = f"resource offer kind and name must be text of at most {MAX_TEXT_BYTES} bytes"
BAD_CAPACITY = "resource offer capacity must be a whole number of at least 1"
BAD_META = f"resource offer meta must be an object of at most {MAX_META_BYTES} bytes"


@dataclass
class ResourceState:
    offers: dict = field(default_factory=dict)  # (agent, kind, name) -> record
    per_agent: dict = field(default_factory=dict)  # agent -> distinct keys held

    def put(self, record: dict) -> None:
        key = (record["agent"], record["kind"], record["name"])
        if key not in self.offers:
            self.per_agent[key[0]] = self.per_agent.get(key[0], 0) + 1
        self.offers[key] = record

    def listing(self) -> list[dict]:
        """state_snapshot's `resources`: {agent, kind, name, capacity, meta}, by key."""
        return [dict(self.offers[key]) for key in sorted(self.offers)]


PROJECTIONS = {EXTENSION: ResourceState}
appliers = Appliers()


def resources_of(state: HubState) -> ResourceState:
    return state.extensions[EXTENSION]


@appliers.applies(RESOURCE_OFFERED)
def _apply_offer(state: HubState, event: Event) -> None:
    record = event.payload
    if all(isinstance(record.get(k), str) for k in ("agent", "kind", "name")):
        resources_of(state).put({"agent": record["agent"], "kind": record["kind"],
                                 "name": record["name"], "capacity": record.get("capacity", 1),
                                 "meta": record.get("meta") or {}})


def offer_key(record: dict) -> str:
    """The broadcast's `key`: <agent>:<kind>:<name>."""
    return f"{record['agent']}:{record['kind']}:{record['name']}"


def _text_ok(value) -> bool:
    return isinstance(value, str) and len(value.encode("utf-8", "surrogatepass")) \
        <= MAX_TEXT_BYTES


def read_offer(frame: dict, agent: str, resources: ResourceState,
               max_per_agent: int = MAX_OFFERS_PER_AGENT) -> dict | str:
    """The record an offer stores, or the text of its refusal (nothing stored).

    In the reference's order: kind and name present, then the agent's quota.
    hubd refuses what the reference would coerce (a number as kind, a negative
    or textual capacity read as 1, an unbounded kind): a typed refusal says
    what is wrong instead of storing something the sender did not send."""
    kind, name = frame.get("kind"), frame.get("name")
    if kind in (None, "") or name in (None, ""):
        return NEEDS_KIND_AND_NAME
    if not _text_ok(kind) or not _text_ok(name):
        return BAD_TEXT
    capacity = frame.get("capacity", 1)
    if type(capacity) is not int or capacity < 1:
        return BAD_CAPACITY
    meta = frame.get("meta")
    if meta is None:
        meta = {}
    if not isinstance(meta, dict) or len(orjson.dumps(meta)) > MAX_META_BYTES:
        return BAD_META
    key = (agent, kind, name)
    if key not in resources.offers:
        if resources.per_agent.get(agent, 0) >= max_per_agent:
            return QUOTA_EXCEEDED
        if len(resources.offers) >= MAX_OFFERS:
            return HUB_FULL
    return {"agent": agent, "kind": kind, "name": name, "capacity": capacity, "meta": meta}

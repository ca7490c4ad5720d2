"""Capability cards: what agents advertise for discovery (never authorization).

Two kinds of card:
- a live card: the latest `advertise` of a connection. It is presence-like
  state (not journaled) and goes away with its socket.
- a persistent registration (`persist: true`): a dispatch registration for a
  project seat that outlives the sender's disconnect. It is journaled
  (`capability_registered`, the complete card), survives a restart, and
  expires when not refreshed within REGISTRATION_TTL seconds.

manifest_snapshot and capability_advertised show one entry per agent: its
live card with the registration's persistent/dispatchable merged in, or the
registered card when the agent has no live card.

Bounds: MAX_REGISTRATIONS persistent registrations (oldest refresh dropped
first); MAX_CONTRACTS contracts per card; live cards are one per connection.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from .events import Event
from .hub import Appliers, HubState

CAPABILITY_REGISTERED = "capability_registered"
EXTENSION = "capabilities"

REGISTRATION_TTL = 24 * 3600.0
MAX_REGISTRATIONS = 4096
MAX_CONTRACTS = 64
MAX_LIST_ITEMS = 256
RX_SUFFIX = "-rx"



@dataclass
class CapabilityState:
    registrations: OrderedDict = field(default_factory=OrderedDict)  # agent -> registration

    def register(self, agent: str, registration: dict) -> None:
        self.registrations.pop(agent, None)
        self.registrations[agent] = registration
        while len(self.registrations) > MAX_REGISTRATIONS:
            self.registrations.popitem(last=False)

    def current(self, now: float) -> dict:
        return {agent: reg for agent, reg in self.registrations.items()
                if reg["registered_at"] + REGISTRATION_TTL > now}


# the projections this module keeps in HubState.extensions, by name
PROJECTIONS = {EXTENSION: CapabilityState}
appliers = Appliers()


def capabilities_of(state: HubState) -> CapabilityState:
    return state.extensions[EXTENSION]


@appliers.applies(CAPABILITY_REGISTERED)
def _apply_registration(state: HubState, event: Event) -> None:
    payload = event.payload
    agent = payload.get("agent")
    card = payload.get("card")
    if not isinstance(agent, str) or not isinstance(card, dict):
        return
    capabilities_of(state).register(agent, {
        "card": card, "dispatchable": payload.get("dispatchable") is not False,
        "registered_at": payload.get("registered_at", event.ts),
        "registered_by": payload.get("registered_by", agent)})


def _strings(value) -> list[str]:
    if not isinstance(value, list):
        return []
    out: list[str] = []
    for item in value[:MAX_LIST_ITEMS]:
        if isinstance(item, (dict, list)) or item is None:
            continue
        text = (item if isinstance(item, str) else str(item)).strip()
        if text and text not in out:
            out.append(text)
    return out


def _checks(value) -> list:
    """preconditions / postconditions: a list of declarative checks (a single
    string is one check)."""
    if isinstance(value, str):
        return [value] if value else []
    if not isinstance(value, list):
        return []
    return [item for item in value[:MAX_LIST_ITEMS] if item is not None and item != ""]


def _contract(task_class, spec) -> dict | None:
    if not isinstance(task_class, str) or not task_class.strip() or not isinstance(spec, dict):
        return None
    def schema(value):
        return value if isinstance(value, dict) else {}
    return {"task_class": task_class.strip(), "input_schema": schema(spec.get("input_schema")),
            "output_schema": schema(spec.get("output_schema")),
            "preconditions": _checks(spec.get("preconditions")),
            "postconditions": _checks(spec.get("postconditions"))}


def contracts(value) -> list[dict]:
    """Normalise `contracts` (a list of contract objects, or a mapping keyed
    by task class) into the manifest shape; malformed entries are dropped."""
    out: list[dict] = []
    if isinstance(value, list):
        for entry in value:
            if isinstance(entry, dict):
                contract = _contract(entry.get("task_class"), entry)
                if contract is not None:
                    out.append(contract)
    elif isinstance(value, dict):
        for task_class, spec in value.items():
            contract = _contract(task_class, spec)
            if contract is not None:
                out.append(contract)
    return out[:MAX_CONTRACTS]


def _text(value) -> str:
    if value is None or isinstance(value, (dict, list)):
        return ""
    return value if isinstance(value, str) else str(value)


def card(frame: dict, agent: str, now: float) -> dict:
    """The projected card for an advertise frame. `project` is the agent's
    namespace (its name before '/'), whatever the frame says."""
    signature = frame.get("signature") if isinstance(frame.get("signature"), dict) else {}
    meta = frame.get("meta") if isinstance(frame.get("meta"), dict) else {}
    return {
        "agent": agent,
        "description": _text(frame.get("description")),
        "skills": _strings(frame.get("skills")),
        "task_classes": _strings(frame.get("task_classes")),
        "model": _text(frame.get("model")),
        "project": agent.split("/", 1)[0] if "/" in agent else "",
        "manifest_digest": _text(frame.get("manifest_digest")),
        "contracts": contracts(frame.get("contracts")),
        "meta": meta,
        "signature": signature,
        "verification": {},  # hubd/state/card_trust.py verify_card fills it
        "advertised_at": now,
    }


@dataclass(frozen=True)
class Advert:
    agent: str
    persist: bool
    dispatchable: bool


def read_advert(frame: dict, sender: str) -> Advert | str:
    """Who the card is for and whether it persists, or the refusal text."""
    persist = frame.get("persist", False)
    if persist is None:
        persist = False
    if not isinstance(persist, bool):
        return "Malformed frame: 'persist' must be a boolean."
    dispatchable = frame.get("dispatchable", True)
    if dispatchable is None:
        dispatchable = True
    if not isinstance(dispatchable, bool):
        return "Malformed frame: 'dispatchable' must be a boolean."
    agent = frame.get("agent")
    if agent is None or agent == "":
        agent = sender
    if not isinstance(agent, str) or (agent != sender and sender != agent + RX_SUFFIX):
        return ("Capability registration for another identity requires the connection to be "
                "that identity or a recognised receiver sidecar.")
    if persist:
        project, _, seat = agent.partition("/")
        if not project or not seat:
            return ("Persistent capability registration requires a project-scoped seat "
                    "identity (<project>/<seat>).")
    return Advert(agent, persist, dispatchable)


def projected(live: dict | None, registration: dict | None) -> dict | None:
    """One agent's manifest entry."""
    if live is not None:
        entry = dict(live)
        if registration is not None:
            entry["persistent"] = True
            entry["dispatchable"] = registration["dispatchable"]
        return entry
    if registration is not None:
        entry = dict(registration["card"])
        entry["persistent"] = True
        entry["dispatchable"] = registration["dispatchable"]
        return entry
    return None

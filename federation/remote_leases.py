"""The claimant hub's record of its agents' leases held on other hubs.

A lease in a namespace a peer owns lives only on its owner; the claimant's hub
never decides on it. But its agents ask their own hub for state_snapshot, so
every verdict the owner sends back (a grant, an update, a checkpoint, a
handoff, a release) is journaled here as `multihub_remote_lease`, and the
snapshot lists those leases exactly as the owner granted them, with
`owner_hub_id`. Expiry needs no event: a lease past its lease_expires_at is
simply not listed (the owner expires it on its own clock).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from hubd.state.events import Event
from hubd.state.hub import Appliers, HubState

REMOTE_LEASE = "multihub_remote_lease"
EXTENSION = "remote_leases"
# Well above any claimant's cap (--max-claims-per-agent) times its agents; the
# oldest record goes first (it is the likeliest to have expired on its owner).
MAX_REMOTE_LEASES = 10_000


@dataclass
class RemoteLeases:
    leases: OrderedDict = field(default_factory=OrderedDict)  # task_id -> entry

    def live(self, now: float) -> list[dict]:
        return [entry for _, entry in sorted(self.leases.items())
                if entry.get("lease_expires_at", 0) > now]


# the projection this module keeps in HubState.extensions, by name
PROJECTIONS = {EXTENSION: RemoteLeases}
appliers = Appliers()


def remote_leases_of(state: HubState) -> RemoteLeases:
    return state.extensions[EXTENSION]


def payload(task_id: str, owner_hub_id: str, verb: str, lease: dict | None) -> dict:
    """`lease` None: the lease ended (released, or handed to an agent not here)."""
    return {"task_id": task_id, "owner_hub_id": owner_hub_id, "verb": verb, "lease": lease}


@appliers.applies(REMOTE_LEASE)
def _apply_remote_lease(state: HubState, event: Event) -> None:
    leases = remote_leases_of(state).leases
    task_id = event.payload["task_id"]
    lease = event.payload.get("lease")
    leases.pop(task_id, None)
    if lease is not None:
        leases[task_id] = {**lease, "owner_hub_id": event.payload["owner_hub_id"]}
        while len(leases) > MAX_REMOTE_LEASES:
            leases.popitem(last=False)

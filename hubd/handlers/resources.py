"""`resource` (and its alias `resource_offer`) -> `resource_offered`:
an offer journaled, then broadcast to every socket (decisions and bounds in
hubd/state/resources.py; docs/resources.md)."""

from __future__ import annotations

from hubd.actors.router import Router
from hubd.core.plugin import Verbs
from hubd.state import resources as res
from hubd.state.presence import Session

verbs = Verbs()


@verbs.handles(*res.VERBS)
def offer(router: Router, session: Session, frame: dict, size: int) -> None:
    record = res.read_offer(frame, session.name, res.resources_of(router.state),
                            router.config.max_offers_per_agent)
    if isinstance(record, str):
        router.metrics.resource_refusals += 1
        router.error(session, record)
        return
    router.event(res.RESOURCE_OFFERED, record)
    router.fail_privately(session, "Resource offer was not journalled; it was not stored. "
                                   "Retry.")
    # to every socket, the sender's too; without capacity or meta (as the reference)
    router.broadcast(router.frame("resource_offered", "all",
                                  f"Resource offered by {record['agent']}",
                                  agent=record["agent"], kind=record["kind"],
                                  name=record["name"], key=res.offer_key(record)))


def snapshot_resources(router: Router) -> list[dict]:
    return res.resources_of(router.state).listing()

"""What the hub says about itself, answered inside the Router: the /health
document, the status page's view (/health's document and who is online on
every door, the live claims, the board) and the /metrics exposition (the
probes ask with a Request, `hub.health`, `hub.status` and `hub.metrics`, and
serve the answer).

So the probes never read the Router's state from their own task: presence,
the plugins' health sections and the gauges that read the coordination state
are read here, in the Router's turn, between two commands. Nothing is
published on the hot path; a scrape costs its own reading, once.
"""

from __future__ import annotations

from prometheus_client import generate_latest

from hubd.actors.router import Router
from hubd.health import journal_problems, judge
from hubd.state import board as bd


def health_document(router: Router) -> dict:
    hub = router.hub
    presence = router.presence
    document = hub.health_base()
    document["connections"] = len(presence.endpoints)
    document["online_agents"] = len(presence.by_name)
    # the plugins' sections (federation's message_forward and multihub, the
    # core's active_claims); a section with nothing to say is left out
    for name, section in hub.installed.health_sections.items():
        value = section(hub)
        if value is not None:
            document[name] = value
    return judge(document, (journal_problems, *hub.installed.health_problems))


# the status page lists at most this many of each (the counts say how many)
LISTED = 200


def status_view(router: Router) -> dict:
    """The status page's facts: the /health document (peers, backlog, last
    errors, partitions, reasons), who is online on every door, the live
    claims (as a state_request lists them: federation adds its agents'
    leases on other hubs), and the board's tasks, latest updated first."""
    document = health_document(router)
    document["online"] = router.presence.online_by_door(LISTED)
    claims = router.installed.state_sections["active_claims"](router)
    document["claims"] = {"count": len(claims), "listed": claims[:LISTED]}
    tasks = bd.board_of(router.state).tasks
    latest = [task for task, _ in zip(reversed(tasks.values()), range(LISTED))]
    document["board"] = {"count": len(tasks), "listed": latest}
    document["generated_at"] = router.now
    return document


def health(router: Router, session, command) -> None:
    router.answer(command.reply, health_document(router))


def status(router: Router, session, command) -> None:
    router.answer(command.reply, status_view(router))


def metrics(router: Router, session, command) -> None:
    router.answer(command.reply, generate_latest(router.metrics.registry))


REQUESTS = {"hub.health": health, "hub.status": status, "hub.metrics": metrics}

"""What the hub says about itself, answered inside the Router: the /health
document and the /metrics exposition (the probes ask with a Request,
`hub.health` and `hub.metrics`, and serve the answer).

So the probes never read the Router's state from their own task: presence,
the plugins' health sections and the gauges that read the coordination state
are read here, in the Router's turn, between two commands. Nothing is
published on the hot path; a scrape costs its own reading, once.
"""

from __future__ import annotations

from prometheus_client import generate_latest

from hubd.actors.router import Router
from hubd.health import journal_problems, judge


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


def health(router: Router, session, command) -> None:
    router.answer(command.reply, health_document(router))


def metrics(router: Router, session, command) -> None:
    router.answer(command.reply, generate_latest(router.metrics.registry))


REQUESTS = {"hub.health": health, "hub.metrics": metrics}

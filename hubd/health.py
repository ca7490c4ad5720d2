"""Whether the hub is healthy, and if not why: a pure judgement over the
/health document.

Each check reads the document (the hub's own facts and the plugins'
sections) and returns the reasons it finds, one short sentence each; a hub
with any reason is `degraded` and lists them all under `reasons`, so an
operator reading /health learns what is wrong without reading the sections
(the sections keep the detail). The journal's check is the hub's own; the
plugins add theirs (Plugin.health_problems: federation's says which peer
links are down or stalled, which namespaces are partitioned).

`degraded` is not `unhealthy`: a hub whose peer is down still serves its
own agents. A container's liveness check should read the journal fields
(compose/Dockerfile does), not restart a hub because its peer is away.
"""

from __future__ import annotations

from typing import Callable, Iterable

OK = "ok"
DEGRADED = "degraded"

Check = Callable[[dict], list[str]]


def journal_problems(document: dict) -> list[str]:
    reasons = []
    corrupt = document.get("journal_corrupt_rows") or 0
    if corrupt:
        reasons.append(f"journal: {corrupt} undecodable row(s) quarantined; mutations are "
                       "refused until the journal is recovered")
    unknown = document.get("journal_unknown_events") or 0
    if unknown:
        kinds = ", ".join(document.get("journal_unknown_kinds") or ())
        reasons.append(f"journal: {unknown} event(s) of kinds this hubd does not know "
                       f"({kinds}); mutations are refused: run the hubd that wrote them")
    return reasons


def judge(document: dict, checks: Iterable[Check]) -> dict:
    """`document` with its `status` and `reasons` set from every check."""
    reasons = [reason for check in checks for reason in check(document)]
    document["status"] = DEGRADED if reasons else OK
    document["reasons"] = reasons
    return document

"""Federation's reasons for a degraded /health (hubd/health.py), read from
its own sections of the document: message peers whose link is down or whose
forwards are stalled, claim routes and watches that are down, partitioned
namespaces and quarantined peers. Pure: the sections are the facts."""

from __future__ import annotations


def _why(error) -> str:
    if isinstance(error, dict) and error.get("cause"):
        return f" ({error['cause']}: {error.get('detail', '')})"
    return ""


def federation_problems(document: dict) -> list[str]:
    reasons = []
    for peer, entry in sorted((document.get("message_forward") or {}).items()):
        if entry.get("link") == "down":
            reasons.append(f"message peer {peer}: link down{_why(entry.get('last_error'))}; "
                           f"{entry.get('pending', 0)} forward(s) pending")
        if entry.get("stalled"):
            reasons.append(f"message peer {peer}: forwards stalled (the link is up, nothing "
                           f"settles) since {entry.get('stalled_since')}")
    multihub = document.get("multihub") or {}
    for namespace in multihub.get("partitioned") or ():
        reasons.append(f"namespace {namespace}: partitioned (two hubs claim to own it); "
                       "claims in it are refused until it heals")
    for peer in multihub.get("quarantined") or ():
        reasons.append(f"peer {peer}: quarantined for equivocation; its log is not followed "
                       "until an operator recovers it (hubd multihub recover)")
    for peer, route in sorted((multihub.get("claim_routes") or {}).items()):
        if route.get("link") == "down":
            reasons.append(f"claim route {peer}: link down{_why(route.get('last_error'))}")
    for peer, watch in sorted((multihub.get("watches") or {}).items()):
        if watch.get("link") == "down":
            reasons.append(f"watch of {peer}: link down{_why(watch.get('link_error'))}")
    return reasons

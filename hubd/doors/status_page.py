"""The status page: the Router's status view (hubd/handlers/status.py
`status_view`, asked by the probes as `hub.status`) rendered as one HTML
page, read-only, refreshed by the browser every REFRESH_SECONDS.

Server-rendered on purpose: no script, no build step, no CDN, nothing to
keep in step between a page and a JSON schema; a browser with scripts off
shows the same. Every value is escaped (agent names, task titles and error
texts are other people's input), and the answer forbids scripts, frames and
every other fetch outright (Content-Security-Policy), so even an escaping
mistake could not run anything. The same view is served as JSON on /status.
"""

from __future__ import annotations

import time
from html import escape

from hubd.wire.envelope import HUB_WIRE

REFRESH_SECONDS = 5

# what an operator calls each door (the view keys them by their wire names)
DOOR_NAMES = {HUB_WIRE: "WebSocket", "redsyn": "REDSYN (HTTP)", "broker": "Broker (Unix socket)",
              "peer-hubs": "Peer hubs (inbound links)"}

HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; "
                               "frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-store",
    "Referrer-Policy": "no-referrer",
}

_STYLE = """
body{font-family:system-ui,sans-serif;margin:1.5rem;color:#222;background:#fafafa}
h1{font-size:1.4rem;margin:0 0 .3rem} h2{font-size:1.1rem;margin:1.4rem 0 .4rem}
table{border-collapse:collapse;background:#fff;margin-bottom:.4rem}
th,td{border:1px solid #ccc;padding:.25rem .6rem;text-align:left;font-size:.9rem;
vertical-align:top}
th{background:#eee} .ok{color:#176f2c;font-weight:bold} .bad{color:#b00020;font-weight:bold}
.muted{color:#777} .reasons li{color:#b00020} code{font-size:.85rem}
"""


def _text(value) -> str:
    return "" if value is None else escape(str(value))


def _ago(moment, now: float) -> str:
    if not isinstance(moment, (int, float)):
        return ""
    seconds = now - moment
    return f"{seconds:.0f} s ago" if seconds >= 0 else f"in {-seconds:.0f} s"


def _table(headers: list[str], rows: list[list[str]], empty: str) -> str:
    """`rows` hold HTML already escaped."""
    if not rows:
        return f'<p class="muted">{escape(empty)}</p>'
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>"
                   for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _more(section: dict) -> str:
    hidden = section.get("count", 0) - len(section.get("listed", ()))
    return f'<p class="muted">and {hidden} more</p>' if hidden > 0 else ""


def _summary(view: dict, now: float) -> str:
    status = view.get("status", "unknown")
    css = "ok" if status == "ok" else "bad"
    reasons = "".join(f"<li>{_text(r)}</li>" for r in view.get("reasons") or ())
    return (f"<h1>hubd {_text(view.get('hub_id'))}: <span class=\"{css}\" id=\"status\">"
            f"{_text(status)}</span></h1>"
            f"<p class=\"muted\">{_text(view.get('version'))} · up "
            f"{_text(round(view.get('uptime_seconds') or 0))} s · journal seq "
            f"{_text(view.get('journal_seq'))} · {_text(view.get('connections'))} connections · "
            f"refreshed {_text(time.strftime('%H:%M:%S', time.gmtime(now)))} UTC, every "
            f"{REFRESH_SECONDS} s</p>"
            + (f'<ul class="reasons" id="reasons">{reasons}</ul>' if reasons else ""))


def _online(view: dict, now: float) -> str:
    doors = view.get("online") or {}
    if not doors:
        return '<h2>Online</h2><p class="muted">Nobody is online.</p>'
    out = ["<h2>Online</h2>"]
    known = [door for door in DOOR_NAMES if door in doors]
    for door, section in ((d, doors[d]) for d in known + sorted(doors.keys() - set(known))):
        rows = []
        for entry in section.get("listed", ()):
            if "last_heard" in entry:
                how = f"heard {_ago(entry['last_heard'], now)} via {_text(entry.get('through'))}"
            elif "since" in entry:
                how = f"connected {_ago(entry['since'], now)} from {_text(entry.get('peer_host'))}"
            elif "listening" in entry:
                how = "listening" if entry["listening"] else "connected"
            else:
                how = f"from {_text(entry.get('peer_host'))}"
            rows.append([f"<code>{_text(entry.get('name'))}</code>", how])
        out.append(f"<h3>{_text(DOOR_NAMES.get(door, door))} ({section.get('count', 0)})</h3>")
        out.append(_table(["name", "how"], rows, "nobody"))
        out.append(_more(section))
    return "".join(out)


def _claims(view: dict, now: float) -> str:
    section = view.get("claims") or {}
    rows = [[f"<code>{_text(c.get('task_id'))}</code>", f"<code>{_text(c.get('owner'))}</code>",
             _text(c.get("status")), _text(", ".join(map(str, c.get("paths") or ()))),
             _text(_ago(c.get("lease_expires_at"), now)),
             "online" if c.get("holder_online") else '<span class="bad">offline</span>']
            for c in section.get("listed", ())]
    return ("<h2>Live claims</h2>"
            + _table(["task", "holder", "status", "paths", "lease expires", "holder"], rows,
                     "No live claims.")
            + _more(section))


def _board(view: dict, now: float) -> str:
    section = view.get("board") or {}
    rows = [[f"<code>{_text(t.get('task_id'))}</code>", _text(t.get("title")),
             _text(t.get("status")), _text(t.get("suggested_owner")),
             _text(_ago(t.get("updated_at"), now))]
            for t in section.get("listed", ())]
    return ("<h2>Board</h2>"
            + _table(["task", "title", "status", "suggested owner", "updated"], rows,
                     "The board is empty.")
            + _more(section))


def _peers(view: dict, now: float) -> str:
    peers = view.get("message_forward") or {}
    rows = []
    for peer, entry in sorted(peers.items()):
        link = entry.get("link", "?")
        if entry.get("stalled"):
            link += " (stalled)"
        error = entry.get("last_error") or {}
        rows.append([f"<code>{_text(peer)}</code>",
                     f"<span class=\"{'ok' if link == 'up' else 'bad'}\">{_text(link)}</span>",
                     _text(entry.get("pending")),
                     _text(entry.get("oldest_pending_seconds")),
                     _text(_ago(entry.get("last_success"), now)) or "never",
                     (f"{_text(error.get('cause'))}: {_text(error.get('detail'))} "
                      f"({_text(_ago(error.get('at'), now))})") if error else ""])
    return ("<h2>Peers</h2>"
            + _table(["peer", "link", "backlog", "oldest pending (s)", "last success",
                      "last error"], rows, "No message peers configured."))


def _partition(view: dict) -> str:
    multihub = view.get("multihub")
    if multihub is None:
        return ('<h2>Partition</h2><p class="muted">No namespace owner map: this hub '
                "decides its own claims.</p>")
    partitioned = multihub.get("partitioned") or []
    owners = ", ".join(f"{_text(ns)} → {_text(owner)}" for ns, owner in
                       sorted((multihub.get("namespace_owners") or {}).items()))
    state = (f'<p class="bad" id="partition">Partitioned: {_text(", ".join(partitioned))}</p>'
             if partitioned else '<p class="ok" id="partition">No namespace is partitioned.</p>')
    quarantined = multihub.get("quarantined") or []
    if quarantined:
        state += f'<p class="bad">Quarantined peers: {_text(", ".join(quarantined))}</p>'
    return f"<h2>Partition</h2>{state}<p class=\"muted\">Owners: {owners or 'none'}</p>"


def render(view: dict, now: float | None = None) -> str:
    """The page for one status view (a dict from `status_view`)."""
    if now is None:
        now = view.get("generated_at") or time.time()
    body = "".join((_summary(view, now), _online(view, now), _claims(view, now),
                    _board(view, now), _peers(view, now), _partition(view)))
    return ("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta http-equiv=\"refresh\" content=\"{REFRESH_SECONDS}\">"
            f"<title>hubd {_text(view.get('hub_id'))}: {_text(view.get('status'))}</title>"
            f"<style>{_STYLE}</style></head><body>{body}</body></html>")


def wants_page(headers) -> bool:
    """A browser asking for `/` (Accept names text/html, no WebSocket upgrade):
    the status page. Anything else on `/` keeps today's answer."""
    if "websocket" in headers.get("Upgrade", "").lower():
        return False
    return any(part.split(";")[0].strip() == "text/html"
               for part in headers.get("Accept", "").split(","))

"""REDSYN links between organizations (docs/redsyn.md, "Organizations and
links"): their states, who may change them, and whether a message may cross.

Pure: `decide_propose` and `decide_change` read the mailbox state, the
organizations the hub knows and the caller, and return a `Decision` (or
raise RedsynError, having changed nothing); `peer_change_refusal` says
whether a change a peer hub forwarded is taken; `apply_link` is the
projection's part (the one `apply`); `crossing_refusal` says why a message
may not cross between two organizations now, the one rule used when a
message is posted, when it lands from a peer hub, when it is handed out, and
when a link changes under what waits.
"""

from __future__ import annotations

import ipaddress
from collections import OrderedDict

from hubd.state.redsyn_nodes import Node, forbidden
from hubd.wire.redsyn.envelope import RedsynError, check_org, parse_address

from .model import LINK, Decision, RedsynState

ACTIONS = ("propose", "accept", "suspend", "resume", "end", "terms")
MAX_TERM_ENTRIES = 64
MAX_REASON = 1024
MAX_LOG = 1000          # entries kept per link (log_dropped counts the rest)
MAX_OPEN_LINKS = 1000   # links that have not ended, per organization
MAX_ENDED_LINKS = 10_000  # ended links remembered (the oldest forgotten first)

TERMS = ("expose", "signed_only", "allow_ips")


def default_terms() -> dict:
    """Nothing exposed, signed only, from any address."""
    return {"expose": [], "signed_only": True, "allow_ips": []}

# the seat a link change is forwarded from and to (ORG/redsyn-links): a hub
# seat name, so the peer's namespace grant for ORG covers it
LINKS_SEAT = "redsyn-links"


def org_of(address: str) -> str:
    return address.split("/", 1)[0]


def seat_address(name: str) -> str:
    """An address without its session or hub (`a/b/c/d#s1`, `a/b/c/d@west`)."""
    return name.partition("#")[0].partition("@")[0]


# -- terms


def check_terms(org: str, doc) -> dict:
    """One side's terms (400 unless well formed): what comes into `org`."""
    if doc is None:
        return default_terms()
    if not isinstance(doc, dict) or set(doc) - set(TERMS):
        raise RedsynError(400, "terms are {\"expose\"?: [prefix, ...], \"signed_only\"?: bool, "
                               "\"allow_ips\"?: [address or network, ...]}")
    expose = doc.get("expose", [])
    allow = doc.get("allow_ips", [])
    signed_only = doc.get("signed_only", True)
    for name, value in (("expose", expose), ("allow_ips", allow)):
        if not isinstance(value, list) or len(value) > MAX_TERM_ENTRIES or \
                not all(isinstance(v, str) for v in value):
            raise RedsynError(400, f"{name} is a list of at most {MAX_TERM_ENTRIES} strings")
    if not isinstance(signed_only, bool):
        raise RedsynError(400, "signed_only is true or false")
    for prefix in expose:
        parts = prefix.split("/")
        if parts[0] != org or len(parts) > 4:
            raise RedsynError(400, f"{org} exposes only its own addresses ({org}, {org}/team, "
                                   f"...): {prefix!r}")
        if len(parts) > 1:
            parse_address("/".join(parts + ["x"] * (4 - len(parts))), what="expose prefix")
    networks = []
    for entry in allow:
        try:
            networks.append(str(ipaddress.ip_network(entry, strict=False)))
        except ValueError:
            raise RedsynError(400, f"allow_ips: {entry!r} is not an IP address or network") \
                from None
    return {"expose": list(dict.fromkeys(expose)), "signed_only": signed_only,
            "allow_ips": list(dict.fromkeys(networks))}


def _exposes(terms: dict, address: str) -> bool:
    return any(address == p or address.startswith(p + "/") for p in terms["expose"])


def _ip_allowed(terms: dict, client: str | None) -> bool:
    if not terms["allow_ips"]:
        return True
    if client is None:
        return False
    try:
        ip = ipaddress.ip_address(client)
    except ValueError:
        return False
    if ip.version == 6 and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return any(ip in ipaddress.ip_network(n) for n in terms["allow_ips"])


# -- the one crossing rule


def link_between(state: RedsynState, a: str, b: str) -> dict | None:
    """The link between two organizations that has not ended, or None."""
    id_ = state.link_pairs.get(frozenset((a, b)))
    return state.links[id_] if id_ is not None else None


def crossing_refusal(state: RedsynState, sender: str, recipient: str, *, answering: bool,
                     signed: bool, client: str | None) -> str | None:
    """Why a message from `sender` may not reach `recipient` (agent addresses)
    now, or None: same organization, or an active link whose receiving side's
    terms admit it (an answer to a request needs no `expose`)."""
    origin, target = org_of(sender), org_of(recipient)
    if origin == target:
        return None
    return link_refusal(link_between(state, origin, target), origin, recipient,
                        answering=answering, signed=signed, client=client)


def link_refusal(link: dict | None, origin: str, recipient: str, *, answering: bool,
                 signed: bool, client: str | None) -> str | None:
    """The crossing rule for one link (None or ended: no link)."""
    target = org_of(recipient)
    if link is None or link["state"] == "ended":
        return (f"{origin} and {target} have no active link (nothing crosses organizations "
                "without one)")
    name = f"link {link['id']} between {link['orgs'][0]} and {link['orgs'][1]}"
    if link["state"] == "proposed":
        return f"{name} is proposed, not active"
    if link["state"] == "suspended":
        return f"{name} is suspended by {', '.join(link['suspended_by'])}"
    terms = link["terms"][target]
    if not answering and not _exposes(terms, recipient):
        return f"{target} does not expose {recipient} to {origin} over link {link['id']}"
    if terms["signed_only"] and not signed:
        return f"link {link['id']} takes only signed messages into {target}"
    if not _ip_allowed(terms, client):
        return (f"link {link['id']} takes messages into {target} only from its allow-list; "
                f"{client} is not on it")
    return None


def visible_across(state: RedsynState, viewer_org: str, address: str) -> bool:
    """Whether another organization sees this agent (GET /agents, its key):
    over an active link that exposes it."""
    target = org_of(address)
    if viewer_org == target:
        return True
    link = link_between(state, viewer_org, target)
    return link is not None and link["state"] == "active" and \
        _exposes(link["terms"][target], address)


def check_crossing(state: RedsynState, sender: str, recipient: str, **how) -> None:
    refusal = crossing_refusal(state, sender, recipient, **how)
    if refusal is not None:
        raise forbidden(refusal)


def message_refusal(message, recipient: str, link: dict | None) -> str | None:
    """A stored message checked again for one recipient against the link
    between their organizations (hand-out, link change), or None. A chat from
    a WebSocket seat is not a link's (its sender came in under the hub's
    principals); one a REDSYN agent on a peer hub sent (`remote`) is."""
    envelope = message.envelope
    remote = envelope.get("remote")
    sender = seat_address(envelope["from"])
    if envelope.get("error") or (envelope.get("via") == "websocket" and remote is None) or \
            org_of(sender) == org_of(recipient):
        return None
    signed, client = (remote["signed"], remote["client"]) if remote is not None else \
        (bool(envelope.get("signed")), message.client)
    return link_refusal(link, org_of(sender), recipient,
                        answering=envelope["kind"] in ("reply", "progress"),
                        signed=signed, client=client)


def error_chat(agent: str, asker: str, request_id, reason: str) -> dict:
    """The seed's error reply to a REDSYN agent on a peer hub (`asker`,
    address@HUB), as a chat the routing service forwards: it lands in the
    asker's box as the reply to its request `request_id`."""
    return {"sender": agent, "frame": {
        "type": "chat", "target": asker, "payload": f"not delivered: {reason}",
        "redsyn": {"kind": "reply", "error": True, "reply_to": request_id}}}


def link_chat(org: str, other_seat: str, payload: dict) -> dict:
    """A link change for the hub that owns the other organization
    (`other_seat`, ORG/redsyn-links@HUB), forwarded as a chat."""
    return {"sender": f"{org}/{LINKS_SEAT}", "frame": {
        "type": "chat", "target": other_seat, "payload": f"redsyn link {payload['action']}",
        "redsyn": {"link": payload}}}


# -- the projection's part


def apply_link(state: RedsynState, p: dict, ts: float) -> None:
    action = p["action"]
    if action == "propose":
        org, peer = p["orgs"]
        link = {"id": p["id"], "orgs": [org, peer], "state": "proposed", "suspended_by": [],
                "terms": {org: p["terms"], peer: default_terms()}, "created": ts,
                "changed": ts, "log": [], "log_dropped": 0, "n": 0}
        state.links[p["id"]] = link
        state.link_pairs[frozenset((org, peer))] = p["id"]
    else:
        link = state.links[p["id"]]
        _change(link, action, p["org"], p.get("terms"))
        link["changed"] = ts
        if action == "end":
            state.link_pairs.pop(frozenset(link["orgs"]), None)
            state.links.move_to_end(p["id"])
            _forget_ended(state)
    link["n"] += 1
    entry = {"n": link["n"], "ts": ts, "action": action, "org": p["org"], "by": p["by"]}
    for extra in ("terms", "reason"):
        if p.get(extra) is not None:
            entry[extra] = p[extra]
    link["log"].append(entry)
    if len(link["log"]) > MAX_LOG:
        del link["log"][0]
        link["log_dropped"] += 1


def _change(link: dict, action: str, org: str, terms: dict | None) -> None:
    """A link after an action (in place), the same for the decision's preview
    and the projection."""
    if action == "accept":
        link["state"] = "active"
        link["terms"][org] = terms
    elif action == "suspend":
        if org not in link["suspended_by"]:
            link["suspended_by"].append(org)
        link["state"] = "suspended"
    elif action == "resume":
        link["suspended_by"].remove(org)
        if not link["suspended_by"]:
            link["state"] = "active"
    elif action == "end":
        link["state"] = "ended"
    elif action == "terms":
        link["terms"][org] = terms


def _forget_ended(state: RedsynState) -> None:
    ended = [i for i, link in state.links.items() if link["state"] == "ended"]
    for id_ in ended[:max(0, len(ended) - MAX_ENDED_LINKS)]:
        del state.links[id_]


# -- decisions


def _reason(doc: dict):
    reason = doc.get("reason")
    if reason is not None and (not isinstance(reason, str) or len(reason) > MAX_REASON):
        raise RedsynError(400, f"reason is a string of at most {MAX_REASON} characters")
    return reason


def _admin(node: Node, org: str) -> None:
    principal = node.principal
    if principal is None or not principal.admins_org(org):
        who = principal.name if principal is not None else node.id
        raise forbidden(f"{who} is not an admin of {org} (hubd redsyn org add-admin {org} ...)")


def _acting_org(node: Node, link: dict, doc: dict, prefer: str | None = None) -> str:
    """The side the caller acts for: `org` when given, else the side it admins."""
    named = doc.get("org")
    if named is not None:
        if named not in link["orgs"]:
            raise RedsynError(400, f"link {link['id']} is between {' and '.join(link['orgs'])}, "
                                   f"not {named!r}")
        _admin(node, named)
        return named
    sides = [o for o in link["orgs"]
             if node.principal is not None and node.principal.admins_org(o)]
    if not sides:
        _admin(node, prefer or link["orgs"][0])
    if len(sides) == 2:
        if prefer is None:
            raise RedsynError(400, f"this node admins both sides of link {link['id']}; name "
                                   "the side it acts for in \"org\"")
        return prefer
    return sides[0]


def decide_propose(state: RedsynState, node: Node, doc, orgs: dict, now: float,
                   new_id, owner_of=lambda org: None) -> Decision:
    """POST /links: one organization's admin proposes a link with another:
    one of this hub (`orgs`), or one a peer hub owns (`owner_of(org)`)."""
    if not isinstance(doc, dict):
        raise RedsynError(400, "a proposal is {\"org\", \"peer\", \"terms\"?, \"reason\"?}")
    org, peer = check_org(doc.get("org")), check_org(doc.get("peer"))
    if org == peer:
        raise RedsynError(400, f"a link is between two organizations; {org} is both sides")
    _admin(node, org)
    for name in (org, peer):
        if name not in orgs and (name == org or owner_of(name) is None):
            raise RedsynError(404, f"no organization {name} (hubd redsyn org create {name})")
    terms, reason = check_terms(org, doc.get("terms")), _reason(doc)
    existing = link_between(state, org, peer)
    if existing is not None:
        raise RedsynError(409, f"{org} and {peer} already have link {existing['id']} "
                               f"({existing['state']}); end it first")
    for name in (org, peer):
        if _open_links(state, name) >= MAX_OPEN_LINKS:
            raise forbidden(f"{name} has {MAX_OPEN_LINKS} links that have not ended, the most "
                            "it may have", quota=True)
    id_ = new_id()
    payload = {"id": id_, "action": "propose", "orgs": [org, peer], "org": org,
               "by": node.id, "terms": terms, "reason": reason}
    preview = _preview(state, payload, now)
    return Decision([(LINK, payload)], public(preview, with_log=False))


def _open_links(state: RedsynState, org: str) -> int:
    return sum(1 for pair in state.link_pairs if org in pair)


def decide_change(state: RedsynState, node: Node, id_: str, action: str, doc,
                  now: float) -> tuple[Decision, dict]:
    """accept, suspend, resume, end, terms: (the decision, the link after it).
    The caller gives up what waits that the changed link no longer admits."""
    if not isinstance(doc, dict):
        raise RedsynError(400, "the body is a JSON object ({} will do)")
    link = state.links.get(id_)
    if link is None:
        raise RedsynError(404, f"no link {id_}")
    org = _acting_org(node, link, doc, prefer=link["orgs"][1] if action == "accept" else None)
    reason = _reason(doc)
    terms = _check_transition(link, org, action, doc.get("terms"))
    payload = {"id": id_, "action": action, "org": org, "by": node.id, "terms": terms,
               "reason": reason}
    after = _preview(state, payload, now)
    return Decision([(LINK, payload)], public(after, with_log=False)), after


def _check_transition(link: dict, org: str, action: str, terms) -> dict | None:
    """Whether `org` may do `action` to the link in its state (RedsynError if
    not); the checked terms for accept and terms."""
    id_, current = link["id"], link["state"]
    proposer, peer = link["orgs"]
    if action not in ACTIONS[1:]:
        raise RedsynError(400, f"a link's actions are {', '.join(ACTIONS[1:])}")
    if current == "ended":
        raise RedsynError(409, f"link {id_} has ended; propose a new one")
    if action == "accept":
        if org == proposer:
            raise forbidden(f"{proposer} proposed link {id_}; an admin of {peer} accepts it")
        if current != "proposed":
            raise RedsynError(409, f"link {id_} is {current}, not proposed")
    elif action == "suspend":
        if current == "proposed":
            raise RedsynError(409, f"link {id_} is proposed, not active; end it to decline")
        if org in link["suspended_by"]:
            raise RedsynError(409, f"{org} has already suspended link {id_}")
    elif action == "resume":
        if org not in link["suspended_by"]:
            raise RedsynError(409, f"{org} has not suspended link {id_}")
    if action == "terms" and terms is None:
        raise RedsynError(400, "a change of terms is {\"terms\": {...}}")
    if action == "accept" and terms is None:
        return dict(link["terms"][org])  # the terms its side set before, or the defaults
    return check_terms(org, terms) if action in ("accept", "terms") else None


def peer_change_refusal(state: RedsynState, payload, origin: str, owner_of,
                        orgs: dict) -> str | None:
    """A link change a peer hub made and forwarded (docs/redsyn.md, "Across
    sites"): why this hub does not take it, or None. The side it acts for must
    be an organization the peer hub owns (`owner_of(org)`, the namespace
    owners), and the change must fit this hub's copy of the link as it would
    have fitted the peer's; a proposal must name an organization of this hub."""
    if not isinstance(payload, dict) or not isinstance(payload.get("id"), str) or \
            not isinstance(payload.get("org"), str) or not isinstance(payload.get("by"), str):
        return "not a link change"
    org, action = payload["org"], payload.get("action")
    if owner_of(org) != origin:
        return f"hub {origin} does not own {org}, so it cannot act for it"
    try:
        if action == "propose":
            sides = payload.get("orgs")
            if not isinstance(sides, list) or len(sides) != 2 or sides[0] != org:
                return "a proposal names [its org, the peer]"
            peer = check_org(sides[1])
            if peer not in orgs:
                return f"no organization {peer} on this hub"
            if payload["id"] in state.links or link_between(state, org, peer) is not None:
                return f"{org} and {peer} already have a link here"
            if check_terms(org, payload.get("terms")) != payload.get("terms"):
                return "its terms are not in their checked form"
            return None
        link = state.links.get(payload["id"])
        if link is None or org not in link["orgs"]:
            return f"no link {payload['id']} of {org} here"
        terms = _check_transition(link, org, action, payload.get("terms"))
        if terms is not None and terms != payload.get("terms"):
            return "its terms are not in their checked form"
    except RedsynError as exc:
        return exc.error
    return None


def _preview(state: RedsynState, payload: dict, now: float) -> dict:
    """The link as it will be once the payload is applied (the state is untouched)."""
    scratch = RedsynState(links=OrderedDict(), link_pairs={})
    if payload["action"] != "propose":
        link = state.links[payload["id"]]
        scratch.links[payload["id"]] = {**link, "orgs": list(link["orgs"]),
                                        "suspended_by": list(link["suspended_by"]),
                                        "terms": dict(link["terms"]), "log": []}
        scratch.link_pairs[frozenset(link["orgs"])] = payload["id"]
    apply_link(scratch, payload, now)
    return scratch.links[payload["id"]]


def public(link: dict, with_log: bool = True) -> dict:
    out = {k: link[k] for k in ("id", "orgs", "state", "suspended_by", "terms", "created",
                                "changed")}
    if with_log:
        out["log"] = list(link["log"])
        out["log_dropped"] = link["log_dropped"]
    return out


def _sees(node: Node, link: dict) -> bool:
    """A node of either side: a person of it, or an admin of it (or of every
    organization)."""
    principal = node.principal
    admins = set(principal.org_admin or ()) if principal is not None else set()
    return "*" in admins or bool(({node.person.split("/")[0]} | admins) & set(link["orgs"]))


def read_link(state: RedsynState, node: Node, id_: str) -> dict:
    """GET /links/{id}: its change log with it."""
    link = state.links.get(id_)
    if link is None or not _sees(node, link):
        raise RedsynError(404, f"no link {id_}")
    return public(link)


def list_links(state: RedsynState, node: Node) -> dict:
    return {"links": [public(link, with_log=False) for link in state.links.values()
                      if _sees(node, link)]}

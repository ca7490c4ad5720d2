"""Read-only queries: who, state, history, resume. All replies are private.

Replies still travel through the JournalWriter's release order, so a reply
never reports an event that is not yet durable.
"""

from __future__ import annotations


from hubd import __version__
from hubd.actors.router import Router
from hubd.core.plugin import Verbs
from hubd.state.presence import RX_SUFFIX, Session
from hubd.wire.envelope import strict_int
from hubd.wire.targets import parse_target

from . import delivery, inbox, receipts, routing

# this module's verbs (its plugin installs them)
verbs = Verbs()

MAILBOX_PENDING_IDENTITIES = 512

# Other modules add sections to state_snapshot.snapshot: name -> builder.


def mailbox_pending(router: Router) -> dict[str, int]:
    """Pending counts for online identities and the most recently addressed
    ones, bounded like the reference (512 identities)."""
    state = router.state
    presence = router.presence
    names = list(presence.by_name)
    seen = set(names)
    for key in reversed(state.mailbox.by_key):
        if len(names) >= MAILBOX_PENDING_IDENTITIES:
            break
        if key not in seen and "/" in key:
            names.append(key)
            seen.add(key)
    return {name: state.mailbox.pending(name, presence.roles_of(name))
            for name in names[:MAILBOX_PENDING_IDENTITIES]}


@verbs.handles("who_request")
def who(router: Router, session: Session, frame: dict, size: int) -> None:
    hub = frame.get("hub")
    if isinstance(hub, str) and hub and hub != router.hub_id:
        routing.remote_who(router, session, frame, hub)
        return
    presence = router.presence
    by_name = presence.by_name
    extra = {}
    sessions = delivery.who_sessions(router, session)
    if sessions is not None:  # v3 requesters only
        extra["delivery_sessions"] = sessions
    router.reply(
        session, "who_snapshot", "Who snapshot",
        online_agents=presence.online(),
        agent_roles={n: list(s.roles) for n, s in by_name.items() if s.roles},
        connected_clients=len(presence.endpoints),
        hub_version=f"hubd {__version__}",
        mailbox_pending=mailbox_pending(router),
        wake_capabilities={n: s.wake_capability for n, s in by_name.items() if s.wake_capability},
        agent_liveness=receipts.agent_liveness(router),
        **extra)


@verbs.handles("state_request")
def state_request(router: Router, session: Session, frame: dict, size: int) -> None:
    fields = {}
    request_id = frame.get("request_id")
    if isinstance(request_id, str) and 1 <= len(request_id) <= 128:
        fields["request_id"] = request_id
    sections = router.installed.state_sections
    if "release_confirmation" in frame and "release_confirmation" in sections:
        # the exact read-only release confirmation: this alone, no snapshot
        fields["release_confirmation"] = sections["release_confirmation"](
            router, session, frame["release_confirmation"])
        router.reply(session, "state_snapshot", "Release confirmation", **fields)
        return
    state = router.state
    agents = dict(state.agents.last_seen)
    for name, s in router.presence.by_name.items():
        agents[name] = max(agents.get(name, 0.0), s.last_reaction)
    snapshot = {
        "active_claims": [],  # the claims module's state section fills it
        "agents": [{"agent": n, "last_seen": ts} for n, ts in sorted(agents.items())],
        "generated_at": router.now,
        "dead_letters": state.chat.dead_letters.listing(),
        "pending_relay_approvals": [],
    }
    for name, build in sections.items():
        if name != "release_confirmation":
            snapshot[name] = build(router)
    fields["snapshot"] = snapshot
    router.reply(session, "state_snapshot", "State snapshot", **fields)


def visible_history(router: Router, session: Session) -> list[dict]:
    """The retained chats this session may read: all of them under the
    compatibility routing (every client saw every chat live anyway); under
    private routing only broadcasts and the directed chats it sent or was
    addressed by (its -rx sidecar reads its seat's)."""
    entries = router.state.chat.history
    if not router.private_directed:
        return list(entries)
    name = session.name or ""
    seat = name[:-len(RX_SUFFIX)] if name.endswith(RX_SUFFIX) else name
    roles = session.roles
    visible = []
    for entry in entries:
        target = parse_target(entry.get("target") or "")
        if (target.is_broadcast or entry.get("channel") or entry.get("sender") in (name, seat)
                or target.matches(seat, roles) or target.matches(name, roles)):
            visible.append(entry)
    return visible


@verbs.handles("history_request")
def history(router: Router, session: Session, frame: dict, size: int) -> None:
    if "inbox_query" in frame:
        inbox.serve(router, session, frame)
        return
    entries = visible_history(router, session)
    by_id = "history_client_msg_id" in frame
    by_target = "history_target" in frame
    if by_id or by_target:
        # Exact selectors apply before the limit; an empty or non-string
        # selector selects nothing, never the whole history.
        wanted_id = frame.get("history_client_msg_id")
        wanted_target = frame.get("history_target")
        if (by_id and not (isinstance(wanted_id, str) and wanted_id)) or (
                by_target and not (isinstance(wanted_target, str) and wanted_target)):
            entries = []
        else:
            entries = [e for e in entries
                       if (not by_id or e.get("client_msg_id") == wanted_id)
                       and (not by_target or e.get("target") == wanted_target)]
    limit = strict_int(frame.get("limit"))
    if limit is not None and limit >= 0:
        entries = entries[-limit:] if limit else []
        requested = limit
    else:
        requested = "all"
    router.reply(session, "history_snapshot", "History snapshot", history=entries,
                 requested_limit=requested)


@verbs.handles("resume_request")
def resume(router: Router, session: Session, frame: dict, size: int) -> None:
    since = strict_int(frame.get("since"))
    if since is None or since < 0:
        since = 0
    messages = [e for e in visible_history(router, session) if e.get("msg_id", 0) > since]
    router.reply(session, "resume_snapshot", "Resume snapshot", since=since, messages=messages)

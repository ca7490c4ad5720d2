"""The local broker's read side: result shapes and the exact text a session sees.

Pure functions of `BrokerState` (and, for presence, the live set of handles
with a connection). docs/broker.md shows every shape built here.
"""

from __future__ import annotations

from typing import Container

from . import broker as bs
from .broker import BrokerState, Message, first_line

# Inbox views are bounded: the newest threads with deliveries, the newest
# deliveries of each (unread ones are bounded by the unread cap anyway).
INBOX_THREADS = 100
INBOX_MESSAGES_PER_THREAD = 50


def message_view(message: Message, full: bool) -> dict:
    view = {"messageId": message.id, "threadId": message.thread_id, "seq": message.seq,
            "from": message.sender, "via": message.via, "to": list(message.to),
            "replyTo": message.reply_to, "verdict": message.verdict,
            "references": list(message.references), "mode": message.mode, "ts": message.ts,
            "firstLine": first_line(message.body), "bodyLength": message.body_length,
            "truncated": message.body_length > len(message.body)}
    if full:
        view["body"] = message.body
    return view


# -- the text a session sees

def tag_line(message: Message) -> str:
    """`[murmur m<id> from <sender>[ via <via>] | thread <t> #<seq>[ | reply to m<r>][ | <verdict>]]`:
    the tag `[murmur m<id>` is what delivery proof looks for in a transcript."""
    parts = [f"[murmur m{message.id} from {message.sender}"]
    if message.via:
        parts.append(f" via {message.via}")
    parts.append(f" | thread {message.thread_id} #{message.seq}")
    if message.reply_to is not None:
        parts.append(f" | reply to m{message.reply_to}")
    if message.verdict:
        parts.append(f" | {message.verdict}")
    parts.append("]")
    return "".join(parts)


def footer(message: Message) -> str:
    return (f"(reply with messageId {message.id}, verdict agree, disagree or info; "
            f"the reply goes to everyone in thread {message.thread_id})")


def cut_note(message: Message) -> str | None:
    if message.body_length > len(message.body):
        return (f"[cut to {len(message.body)} of {message.body_length} characters]")
    return None


def push_text(message: Message, mode: str | None = None) -> str:
    mode = mode or message.mode
    lines = [tag_line(message)]
    if mode == "notify":
        lines.append(first_line(message.body))
        lines.append(f"(notify: read m{message.id} for the whole message)")
    else:
        lines.append(message.body)
        note = cut_note(message)
        if note:
            lines.append(note)
    lines.append(footer(message))
    return "\n".join(lines)


def push_payload(message: Message) -> dict:
    return {"message": message_view(message, True), "mode": message.mode,
            "footer": footer(message), "text": push_text(message)}


def notification_text(item: dict) -> str:
    kind = item["kind"]
    if kind == "reply_arrived":
        return (f"reply m{item['messageId']} from {item['fromHandle']} arrived in thread "
                f"{item['threadId']}")
    if kind == "queued_delivered":
        return (f"m{item['messageId']} (thread {item['threadId']}), queued for "
                f"{item['handle']}, was delivered")
    if kind == "peer_offline":
        return (f"{item['handle']} is not listening; m{item['messageId']} (thread "
                f"{item['threadId']}) is queued for it")
    raise ValueError(f"unknown notification kind {kind!r}")


def notification(kind: str, **fields) -> dict:
    item = {"kind": kind, **fields}
    item["text"] = notification_text(item)
    return item


# -- results

def thread_view(state: BrokerState, thread_id: int, since_seq: int | None, full: bool,
                message_id: int | None = None) -> dict:
    thread = state.threads[thread_id]
    messages = [state.messages[i] for i in thread.messages]
    if message_id is not None:
        messages = [m for m in messages if m.id == message_id or m.reply_to == message_id]
        full = True
    if since_seq is not None:
        messages = [m for m in messages if m.seq > since_seq]
    return {"threadId": thread_id, "subject": thread.subject, "latestSeq": len(thread.messages),
            "messages": [message_view(m, full) for m in messages]}


def inbox_view(state: BrokerState, handle: str, unread_only: bool) -> dict:
    by_thread: dict[int, list] = {}
    for message_id, delivery in state.deliveries.get(handle, {}).items():
        if unread_only and delivery not in bs.UNREAD_STATES:
            continue
        by_thread.setdefault(state.messages[message_id].thread_id, []).append(
            (message_id, delivery))
    threads = []
    for thread_id in sorted(by_thread, reverse=True)[:INBOX_THREADS]:
        thread = state.threads[thread_id]
        entries = by_thread[thread_id][-INBOX_MESSAGES_PER_THREAD:]
        threads.append({
            "threadId": thread_id, "subject": thread.subject, "latestSeq": len(thread.messages),
            "unread": sum(1 for _, d in by_thread[thread_id] if d in bs.UNREAD_STATES),
            "messages": [dict(message_view(state.messages[i], False), state=d)
                         for i, d in entries]})
    return {"handle": handle, "unreadTotal": state.unread_of(handle), "threads": threads}


def recipient_matrix(state: BrokerState, thread_id: int) -> list[dict]:
    """Per recipient of the thread's first message: its delivery state and its
    latest verdict in the thread."""
    thread = state.threads[thread_id]
    verdicts: dict[str, tuple] = {}
    replied: dict[str, int] = {}
    for message_id in thread.messages:
        message = state.messages[message_id]
        if message.reply_to is not None:
            replied[message.sender] = message.id
            if message.verdict:
                verdicts[message.sender] = (message.verdict, message.id)
    rows = []
    for recipient in thread.ask_recipients:
        delivery = state.delivery_state(recipient, thread.ask_id) or "queued"
        if recipient in replied:
            delivery = "replied"
        verdict = verdicts.get(recipient)
        rows.append({"handle": recipient, "state": delivery,
                     "verdict": verdict[0] if verdict else None,
                     "replyId": replied.get(recipient)})
    return rows


def collect_view(state: BrokerState, thread_id: int) -> dict:
    rows = recipient_matrix(state, thread_id)
    tally = {"agree": 0, "disagree": 0, "info": 0, "none": 0}
    for row in rows:
        tally[row["verdict"] or "none"] += 1
    return {"threadId": thread_id, "askMessageId": state.threads[thread_id].ask_id,
            "recipients": rows, "verdictTally": tally}


def wait_condition(state: BrokerState, thread_id: int, until: str) -> tuple[bool, list[dict]]:
    rows = recipient_matrix(state, thread_id)
    replied = [row["state"] == "replied" for row in rows]
    met = all(replied) if until == "all_replied" else any(replied)
    return bool(rows) and met, rows


def presence(state: BrokerState, handle: str, connected: Container[str]) -> str:
    session = state.session_of(handle)
    if session is None:
        return "online" if handle in connected else "offline"
    if session.state == "offline":
        return "offline"
    if handle not in connected:
        return "presumed-offline"
    return {"busy": "busy", "idle": "idle"}.get(session.state, "online")


def peer_view(state: BrokerState, peer: bs.Peer, connected: Container[str],
              listening: Container[str]) -> dict:
    session = state.session_of(peer.handle)
    return {"handle": peer.handle, "display": peer.display, "role": peer.role,
            "clientKind": peer.client_kind, "client": peer.client, "cwd": peer.cwd,
            "owner": peer.owner, "presence": presence(state, peer.handle, connected),
            "listening": peer.handle in listening, "unread": state.unread_of(peer.handle),
            "session": None if session is None else {
                "client": session.client, "cliSessionId": session.cli_session_id,
                "title": session.title, "pinned": session.pinned, "state": session.state,
                "transcriptPath": session.transcript_path}}


def status_view(state: BrokerState, now: float, connected: Container[str],
                listening: Container[str]) -> dict:
    return {"now": now, "owner": state.owner,
            "peers": [peer_view(state, peer, connected, listening)
                      for _, peer in sorted(state.peers.items())]}


class NotificationBatcher:
    """Per-handle batching of notification items (live, not journaled).

    The first item goes out at once; items that arise within the batch window
    after a notification event are held and go out together when the window
    ends. Time is passed in, so the schedule is tested without sleeping.
    Held items per handle are bounded; past the bound the oldest are dropped
    and counted in `dropped`.
    """

    MAX_HELD = 200

    def __init__(self, window: float = bs.NOTIFICATION_BATCH_SECONDS):
        self.window = window
        self.last_sent: dict[str, float] = {}
        self.held: dict[str, list] = {}
        self.dropped = 0

    def add(self, handle: str, item: dict, now: float) -> list | None:
        """Returns the batch to send now, or None when the item is held."""
        last = self.last_sent.get(handle)
        if last is None or now - last >= self.window:
            held = self.held.pop(handle, [])
            self.last_sent[handle] = now
            return held + [item]
        held = self.held.setdefault(handle, [])
        held.append(item)
        if len(held) > self.MAX_HELD:
            del held[0]
            self.dropped += 1
        return None

    def due(self, now: float) -> list[tuple[str, list]]:
        """Batches whose window has ended, to send now."""
        out = []
        for handle in list(self.held):
            if now - self.last_sent.get(handle, now) >= self.window:
                out.append((handle, self.held.pop(handle)))
                self.last_sent[handle] = now
        return out

    def next_due(self) -> float | None:
        times = [self.last_sent[h] + self.window for h in self.held]
        return min(times) if times else None

    def forget(self, handle: str) -> None:
        self.held.pop(handle, None)
        self.last_sent.pop(handle, None)

"""Chat projection: history, retry identities, dead letters, agents seen."""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field

RETRY_MEMORY_PAIRS = 4096
RETRY_MEMORY_SECONDS = 24 * 3600
DEAD_LETTER_TARGETS = 1024
AGENTS_SEEN = 10_000

# Fields that make up a chat's content for retry deduplication: the same
# client_msg_id with any of these changed is a different message.
CONTENT_FIELDS = ("target", "type", "payload", "channel", "metadata", "priority", "reply_to")


def same_content(a: dict, b: dict) -> bool:
    return all(a.get(name) == b.get(name) for name in CONTENT_FIELDS)


@dataclass(frozen=True)
class Planned:
    """A mailbox's part of one chat (hubd/core/plugin.py Mailbox): the route
    entries it journals, and the seats they reach (added to the chat's
    recipients: its receipt counts them)."""

    entries: list
    seats: tuple = ()


def is_directed(frame: dict, target) -> bool:
    """A chat to named seats of this hub: not a broadcast, not on a channel,
    and not to a seat on a peer hub (local names never hold '@'; those
    recipients and mailboxes are there). The routing service and the chat
    projection both ask this."""
    if not target.items:  # a broadcast
        return False
    return not frame.get("channel") and "@" not in target.raw


@dataclass(slots=True)
class Remembered:
    """The first accepted copy of a (sender, client_msg_id). Its frame is kept
    (history holds it anyway), so content is compared only when a retry
    actually arrives rather than digested for every chat."""

    frame: dict
    msg_id: int
    seq: int
    ts: float
    forward_id: str | None = None


@dataclass
class RetryMemory:
    """(sender, client_msg_id) -> first accepted copy, bounded in count and age."""

    entries: OrderedDict = field(default_factory=OrderedDict)

    def remember(self, sender: str, client_msg_id: str, entry: Remembered) -> None:
        key = (sender, client_msg_id)
        self.entries[key] = entry
        self.entries.move_to_end(key)
        while len(self.entries) > RETRY_MEMORY_PAIRS:
            self.entries.popitem(last=False)

    def forget(self, sender: str, client_msg_id: str) -> None:
        self.entries.pop((sender, client_msg_id), None)

    def lookup(self, sender: str, client_msg_id: str, now: float) -> Remembered | None:
        entry = self.entries.get((sender, client_msg_id))
        if entry is None or now - entry.ts > RETRY_MEMORY_SECONDS:
            return None
        return entry


@dataclass
class DeadLetters:
    """Directed chats that reached no live connection, per target; and, per
    target still in the ledger, its last escalation in this episode (count,
    ts: hubd/state/dead_letter_escalation.py), dropped with its entry."""

    by_target: OrderedDict = field(default_factory=OrderedDict)
    escalated: dict = field(default_factory=dict)

    def record(self, target: str, sender: str, ts: float) -> int:
        """Count one; returns the target's count after it."""
        entry = self.by_target.pop(target, None) or {"target": target, "count": 0}
        entry["count"] += 1
        entry["last_ts"] = ts
        entry["last_sender"] = sender
        self.by_target[target] = entry
        while len(self.by_target) > DEAD_LETTER_TARGETS:
            evicted, _ = self.by_target.popitem(last=False)
            self.escalated.pop(evicted, None)
        return entry["count"]

    def clear(self, target: str) -> None:
        self.by_target.pop(target, None)
        self.escalated.pop(target, None)

    def escalated_at(self, target: str, count: int, ts: float) -> None:
        if target in self.by_target:
            self.escalated[target] = (count, ts)

    def listing(self) -> list[dict]:
        return [dict(entry) for entry in self.by_target.values()]


@dataclass
class AgentsSeen:
    last_seen: OrderedDict = field(default_factory=OrderedDict)

    def touch(self, name: str, ts: float) -> None:
        self.last_seen[name] = ts
        self.last_seen.move_to_end(name)
        if len(self.last_seen) > AGENTS_SEEN:
            self.last_seen.popitem(last=False)


@dataclass
class ChatState:
    history_limit: int = 1000
    last_msg_id: int = 0
    history: deque = field(default_factory=deque)
    retry: RetryMemory = field(default_factory=RetryMemory)
    dead_letters: DeadLetters = field(default_factory=DeadLetters)

    def append_history(self, frame: dict) -> None:
        self.history.append(frame)
        while len(self.history) > self.history_limit:
            self.history.popleft()

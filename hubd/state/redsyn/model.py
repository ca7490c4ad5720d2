"""The REDSYN mailbox's model: what the projection holds, its event kinds and bounds.

`RedsynState` is changed only by the projection's `apply`
(hubd/state/redsyn/projection.py); the decisions (agents.py, posting.py,
boxes.py) read it and return `Decision`s.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

KEY = "redsyn_key"
ANNOUNCE = "redsyn_announce"
MESSAGE = "redsyn_message"
TAKE = "redsyn_take"
ACK = "redsyn_ack"
UNDELIVERABLE = "redsyn_undeliverable"
CANCEL = "redsyn_cancel"
SUBSCRIBE = "redsyn_subscribe"
WEBHOOK_FAILED = "redsyn_webhook_failed"
LINK = "redsyn_link"
KINDS = (KEY, ANNOUNCE, MESSAGE, TAKE, ACK, UNDELIVERABLE, CANCEL, SUBSCRIBE, WEBHOOK_FAILED,
         LINK)

DEFAULT_LEASE = 900
MAX_LEASE = 3600
MAX_TAKES = 10
MAX_ITEMS_PER_TAKE = 100
PRESENCE_SECONDS = 60
# Finished messages are remembered (for duplicate ids and late replies) in a
# bounded window; messages still owed to someone are always kept.
REMEMBERED_FINISHED = 100_000
MAX_SUBSCRIBERS = 10_000
MAX_DESCRIPTION = 1024


@dataclass(frozen=True)
class Limits:
    """Per person (docs/redsyn.md, "Limits")."""
    messages_per_day: int = 100_000
    pending_messages: int = 10_000
    pending_bytes: int = 512 * 1024 * 1024


@dataclass
class Delivery:
    message_id: str
    session: str
    order: int
    attempts: int = 0
    lease_until: float = 0.0
    lease_node: str | None = None
    not_before: float = 0.0      # webhook retry back-off
    webhook_failures: int = 0
    reserved_node: str | None = None


@dataclass
class Message:
    envelope: dict               # as stored: from/to with sessions, sig with payload
    person: str
    node: str
    digest: str
    size: int
    expires: float
    files: str | None            # base64url of the zip, until delivered
    files_sha256: str
    owed: set = field(default_factory=set)      # agents it still waits on
    recipients: set = field(default_factory=set)  # every agent it was for
    taken_by: set = field(default_factory=set)  # agents that took it at least once
    closed: bool = False         # a request that has its reply
    cancelled: bool = False
    client: str | None = None    # the address the door saw it come from (link allow-lists)


@dataclass
class Agent:
    listening: bool = False
    description: str = ""
    policy: dict = field(default_factory=dict)
    webhook: dict | None = None
    node: str | None = None      # the node that last listened for it


@dataclass
class Decision:
    events: list              # [(kind, payload)]
    answer: object = None
    chats: list = field(default_factory=list)  # [{"sender", "frame"}] for the chat path


@dataclass
class RedsynState:
    keys: dict = field(default_factory=dict)         # node -> {public_key, enc_key, enc_sig}
    agents: dict = field(default_factory=dict)       # agent address -> Agent
    sessions: dict = field(default_factory=dict)     # (agent, thread) -> "sN"
    session_counts: dict = field(default_factory=dict)  # agent -> last N
    messages: OrderedDict = field(default_factory=OrderedDict)  # id -> Message
    boxes: dict = field(default_factory=dict)        # agent -> OrderedDict(id -> Delivery)
    topics: dict = field(default_factory=dict)       # topic -> {agent: True} (ordered)
    day_counts: dict = field(default_factory=dict)   # person -> (day, count)
    pending: dict = field(default_factory=dict)      # person -> [messages, bytes]
    order: int = 0
    # REDSYN requests sent to a WebSocket seat, still waiting for its answer:
    # (seat, asking agent) -> [request ids], oldest first
    seat_requests: dict = field(default_factory=dict)
    # (deadline, agent, id): when a delivery may need the sweeper (lease or
    # expiry); stale entries are skipped when popped.
    deadlines: list = field(default_factory=list)
    # links between organizations (links.py): id -> link, and the pair of
    # organizations -> the id of their link that has not ended
    links: OrderedDict = field(default_factory=OrderedDict)
    link_pairs: dict = field(default_factory=dict)

    def snapshot(self) -> dict:
        """Everything that matters, as plain data (the projection property)."""
        return {
            "keys": self.keys, "sessions": self.sessions, "session_counts": self.session_counts,
            "agents": {a: vars(r) for a, r in self.agents.items()},
            "messages": {i: {**vars(m), "owed": sorted(m.owed), "taken_by": sorted(m.taken_by),
                             "recipients": sorted(m.recipients)}
                         for i, m in self.messages.items()},
            "boxes": {a: {i: vars(d) for i, d in box.items()} for a, box in self.boxes.items()},
            "topics": {t: list(s) for t, s in self.topics.items()},
            "day_counts": self.day_counts, "pending": self.pending, "order": self.order,
            "seat_requests": {f"{k[0]} {k[1]}": v for k, v in self.seat_requests.items()},
            "links": dict(self.links),
            "link_pairs": {" ".join(sorted(k)): v for k, v in self.link_pairs.items()},
        }


def known_here(state: RedsynState, address: str) -> bool:
    """A REDSYN agent: it announced, or REDSYN messages were delivered to it."""
    return address in state.agents or address in state.session_counts


def request_asker(request: Message) -> str:
    return request.envelope["from"].partition("#")[0]

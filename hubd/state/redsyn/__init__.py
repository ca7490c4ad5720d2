"""REDSYN (seed 003) mailbox: a projection of the hub's journal, and the
decisions that produce its events.

- model.py: the state, its event kinds and bounds;
- projection.py: `apply`, the only thing that changes the state (live and at
  replay), and the chats that land in REDSYN boxes;
- links.py: links between organizations and the one rule for crossing them;
- agents.py, posting.py, boxes.py, links.py: the pure decisions (`decide_*`, `sweep`):
  they read the state and the clock they are given and return
  `Decision(events, answer)`, changing nothing themselves, so a refused call
  (RedsynError) has changed nothing.

The names below are the mailbox's public face (`from hubd.state import redsyn`).
"""

from .agents import check_policy, decide_announce, decide_key, key_of, own_agent
from .boxes import (ack_ids, check_lease, decide_ack, decide_cancel, decide_poll, decide_subscribe,
                    decide_take, delivered, files_of, give_up_refused, next_ready, sweep,
                    webhook_failed)
from .model import (ACK, ANNOUNCE, CANCEL, DEFAULT_LEASE, KEY, KINDS, LINK, MAX_ITEMS_PER_TAKE,
                    MAX_LEASE, MAX_TAKES, MESSAGE, PRESENCE_SECONDS, SUBSCRIBE, TAKE,
                    UNDELIVERABLE, WEBHOOK_FAILED, Agent, Decision, Delivery, Limits, Message,
                    RedsynState, known_here, request_asker)
from .posting import chat_payload, decide_post
from .projection import PROJECTIONS, apply, apply_chat, appliers, chat_delivery, plan_chat
from hubd.state.redsyn_nodes import Node

__all__ = [
    "ack_ids",
    "ACK",
    "ANNOUNCE",
    "Agent",
    "CANCEL",
    "DEFAULT_LEASE",
    "Decision",
    "Delivery",
    "KEY",
    "KINDS",
    "LINK",
    "Limits",
    "MAX_ITEMS_PER_TAKE",
    "MAX_LEASE",
    "MAX_TAKES",
    "MESSAGE",
    "Message",
    "Node",
    "PRESENCE_SECONDS",
    "PROJECTIONS",
    "RedsynState",
    "SUBSCRIBE",
    "TAKE",
    "UNDELIVERABLE",
    "WEBHOOK_FAILED",
    "appliers",
    "apply",
    "apply_chat",
    "chat_delivery",
    "chat_payload",
    "check_lease",
    "check_policy",
    "decide_ack",
    "decide_announce",
    "decide_cancel",
    "decide_key",
    "decide_poll",
    "decide_post",
    "decide_subscribe",
    "decide_take",
    "delivered",
    "files_of",
    "give_up_refused",
    "key_of",
    "known_here",
    "next_ready",
    "own_agent",
    "plan_chat",
    "request_asker",
    "sweep",
    "webhook_failed",
]

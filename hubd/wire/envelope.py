"""The JSON envelope: reading inbound frames and building hub frames (the
field rules every inbound frame is held to are hubd/wire/fields.py).

Every frame is `{sender, target, type, payload, timestamp, ...extra}`; frames the
hub originates carry `sender: "SynapseHub"` and `hub_id`.
"""

from __future__ import annotations

import math
import re

HUB_SENDER = "SynapseHub"
# the door name (Opened.door) of endpoints that speak the hub wire: whose
# dialect their commands are (hubd/core/commands.py)
HUB_WIRE = "hub"
BROADCAST = "all"
SYSTEM = "System"

# Wire version advertised in welcome and /health: the highest whose verbs hubd
# serves in full. Version 2 is the mailbox ack and the deferred receipt it
# drives; 3 the session-bound delivery verbs (docs/delivery.md); 4 the scoped
# attachments (docs/attachments.md); 6 the cross-hub attachment reads a peer
# hub asks (attachment_peer_request, docs/attachments.md). (Cross-hub forwarding, the seed's version 5, is
# between hubs and negotiated on the peer link, not by this number.)
PROTOCOL_VERSION = 6

RESERVED_NAMES = frozenset({HUB_SENDER})
HUB_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
MAX_NAME_BYTES = 256
MAX_CLIENT_MSG_ID_BYTES = 256


def frame_type(frame: dict) -> str:
    """A frame without a type is a chat."""
    return frame.get("type") or "chat"


def frame_target(frame: dict) -> str:
    """A frame without a target is a broadcast."""
    return frame.get("target") or BROADCAST


def finite_number(value) -> float | None:
    """A client timestamp is kept only when it is a finite real number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def strict_int(value) -> int | None:
    """Integers exclude booleans (JSON true is not 1 on this wire)."""
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value


def reserved_name_reason(name: str) -> str | None:
    """Why a client may not register this name, or None if it may."""
    if name in RESERVED_NAMES:
        return f"Name '{name}' is reserved for hub protocol provenance."
    if "@" in name:
        return f"Name '{name}' is reserved for seats on peer hubs (names containing '@')."
    if len(name.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
        return f"Name is longer than {MAX_NAME_BYTES} bytes."
    return None


def valid_client_msg_id(value) -> str | None:
    """A printable client_msg_id of at most 256 UTF-8 bytes, else None."""
    if not isinstance(value, str) or not value or not value.isprintable():
        return None
    try:
        if len(value.encode("utf-8")) > MAX_CLIENT_MSG_ID_BYTES:
            return None
    except UnicodeEncodeError:
        return None
    return value


def hub_frame(hub_id: str, type_: str, target: str, payload, ts: float, **fields) -> dict:
    frame = {"sender": HUB_SENDER, "target": target, "type": type_, "payload": payload,
             "timestamp": ts, "hub_id": hub_id}
    frame.update(fields)
    return frame


def error_frame(hub_id: str, target: str, text: str, ts: float, **fields) -> dict:
    return hub_frame(hub_id, "error", target, text, ts, **fields)

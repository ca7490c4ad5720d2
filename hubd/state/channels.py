"""Private channels: invite-only named audiences for chat (docs/channels.md;
docs/reference-observed.md §20 and "Private channels: membership, routing,
observe").

A channel has an owner (its creator, its first member), a label, its joined
members and its outstanding invites. Only the owner invites; an invite is one
join (consumed by it); a member who leaves needs a fresh invite (the owner may
always join back); a channel whose last member leaves is gone. The decisions
and their texts are the reference's (synapse-channel 0.99.38), observed.

Unlike the reference, whose registry lives in the hub process, membership is
journaled (channel_created / channel_invited / channel_joined / channel_left)
and is rebuilt by replay, so it survives a restart. A channel's history is the
last HISTORY_LIMIT chats journaled with its `channel`, projected by the same
replay.

Bounds (a bound hit is a refusal the requester reads, never a silent drop):
MAX_CHANNELS per hub, MAX_MEMBERS members and MAX_INVITES outstanding invites
per channel, MAX_CHANNEL_ID characters per id, MAX_LABEL characters per label,
HISTORY_LIMIT chats of history per channel.

Every decision here is pure: `decide_*` reads the book and returns a Decision
(the answer, and the event to journal when the request is granted); the
appliers are the only writers.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from .events import CHAT, Event
from .hub import Appliers, HubState

EXTENSION = "channels"

CHANNEL_CREATED = "channel_created"
CHANNEL_INVITED = "channel_invited"
CHANNEL_JOINED = "channel_joined"
CHANNEL_LEFT = "channel_left"

MAX_CHANNEL_ID = 200  # characters (the reference's MAX_CHANNEL_ID_LENGTH)
MAX_CHANNELS = 4096  # the reference's MAX_CHANNELS
MAX_MEMBERS = 1024
MAX_INVITES = 1024
MAX_LABEL = 200
MAX_NAME = 256  # an invitee's name (MAX_NAME_BYTES at the wire)
HISTORY_LIMIT = 200


@dataclass
class Channel:
    channel_id: str
    owner: str
    label: str
    members: set = field(default_factory=set)
    invites: set = field(default_factory=set)
    history: deque = field(default_factory=lambda: deque(maxlen=HISTORY_LIMIT))


@dataclass
class ChannelBook:
    channels: dict = field(default_factory=dict)  # channel id -> Channel

    def get(self, channel_id) -> Channel | None:
        return self.channels.get(normalise_id(channel_id))

    def is_member(self, channel_id, name: str) -> bool:
        channel = self.get(channel_id)
        return channel is not None and name in channel.members

    def members(self, channel_id) -> frozenset:
        channel = self.get(channel_id)
        return frozenset(channel.members) if channel is not None else frozenset()

    def channels_for(self, name: str) -> list[str]:
        return sorted(cid for cid, ch in self.channels.items() if name in ch.members)

    def history_for(self, channel_id, member: str, limit: int) -> list[dict]:
        channel = self.get(channel_id)
        if channel is None or member not in channel.members or limit <= 0:
            return []
        kept = list(channel.history)
        return [dict(m) for m in kept[-limit:]]

    def view(self) -> list[dict]:
        """Channels as plain data (tests compare live state with a replay)."""
        return [{"channel": ch.channel_id, "owner": ch.owner, "label": ch.label,
                 "members": sorted(ch.members), "invites": sorted(ch.invites),
                 "history": [m.get("msg_id") for m in ch.history]}
                for ch in sorted(self.channels.values(), key=lambda c: c.channel_id)]


PROJECTIONS = {EXTENSION: ChannelBook}
appliers = Appliers()


def channels_of(state: HubState) -> ChannelBook:
    return state.extensions[EXTENSION]


def normalise_id(channel_id) -> str:
    """The trimmed id, or "" when it is unusable (the reference's rule: a
    string of 1..MAX_CHANNEL_ID characters after trimming)."""
    if not isinstance(channel_id, str):
        return ""
    cid = channel_id.strip()
    if not cid or len(cid) > MAX_CHANNEL_ID:
        return ""
    return cid


def requested_id(channel_id) -> str:
    """The id an answer names: the request's trimmed text (the reference
    echoes it even when it is unusable)."""
    return channel_id.strip() if isinstance(channel_id, str) else ""


@dataclass(frozen=True, slots=True)
class Decision:
    ok: bool
    text: str
    event: tuple[str, dict] | None = None  # (kind, payload) to journal when ok


def _no(text: str) -> Decision:
    return Decision(False, text)


def decide_create(book: ChannelBook, channel_id, owner: str, label) -> Decision:
    cid = normalise_id(channel_id)
    if not cid:
        return _no("invalid channel id")
    if not owner:
        return _no("invalid owner")
    label_text = label.strip() if isinstance(label, str) else ""
    if len(label_text) > MAX_LABEL:
        return _no(f"invalid channel label (at most {MAX_LABEL} characters)")
    if cid in book.channels:
        return _no(f"channel '{cid}' already exists")
    if len(book.channels) >= MAX_CHANNELS:
        return _no("channel registry is full")
    return Decision(True, f"created channel '{cid}'",
                    (CHANNEL_CREATED, {"channel": cid, "owner": owner,
                                       "label": label_text or cid}))


def decide_invite(book: ChannelBook, channel_id, inviter: str, invitee) -> Decision:
    cid = normalise_id(channel_id)
    channel = book.channels.get(cid)
    if channel is None or inviter != channel.owner:
        # one text for "absent" and "not yours": no existence oracle
        return _no(f"cannot invite to '{requested_id(channel_id)}': no such channel or you "
                   "are not its owner")
    name = invitee.strip() if isinstance(invitee, str) else ""
    if not name or len(name) > MAX_NAME:
        return _no("invalid invitee")
    if name in channel.members:
        return _no(f"'{name}' is already a member of '{cid}'")
    if name in channel.invites:
        return _no(f"'{name}' is already invited to '{cid}'")
    if len(channel.invites) >= MAX_INVITES:
        return _no(f"channel '{cid}' has {MAX_INVITES} outstanding invites (the limit)")
    return Decision(True, f"invited '{name}' to '{cid}'",
                    (CHANNEL_INVITED, {"channel": cid, "invitee": name}))


def decide_join(book: ChannelBook, channel_id, member: str) -> Decision:
    cid = normalise_id(channel_id)
    if not member:
        return _no("invalid member")
    channel = book.channels.get(cid)
    if channel is not None and member in channel.members:
        return _no(f"already a member of '{cid}'")
    if channel is None or (member != channel.owner and member not in channel.invites):
        return _no(f"cannot join '{requested_id(channel_id)}': no such channel or you were "
                   "not invited")
    if len(channel.members) >= MAX_MEMBERS:
        return _no(f"channel '{cid}' has {MAX_MEMBERS} members (the limit)")
    return Decision(True, f"joined '{cid}'", (CHANNEL_JOINED, {"channel": cid, "member": member}))


def decide_leave(book: ChannelBook, channel_id, member: str) -> Decision:
    cid = normalise_id(channel_id)
    channel = book.channels.get(cid)
    if channel is None:
        return _no(f"channel '{requested_id(channel_id)}' does not exist")
    if member not in channel.members:
        return _no(f"not a member of '{cid}'")
    return Decision(True, f"left '{cid}'", (CHANNEL_LEFT, {"channel": cid, "member": member}))


def not_a_member(channel_id) -> str:
    """A non-member's channel chat or history request (the reference's text)."""
    return f"not a member of channel '{requested_id(channel_id)}'"


def chat_channel(frame: dict) -> str:
    """The channel a chat is sent to ("" for none): its trimmed `channel`
    text (a blank one is no channel, as the reference reads it)."""
    value = frame.get("channel")
    return value.strip() if isinstance(value, str) else ""


def history_limit(value) -> int:
    """channel_history_request's limit, read as the reference does: a
    non-integer is 20, a negative is 0; hubd also caps it at HISTORY_LIMIT."""
    if isinstance(value, bool) or not isinstance(value, int):
        value = 20
    return max(0, min(value, HISTORY_LIMIT))


# -- appliers: the only writers (a replay lands in the same book)

def _text(payload: dict, key: str) -> str:
    value = payload.get(key)
    return value if isinstance(value, str) else ""


@appliers.applies(CHANNEL_CREATED)
def _apply_created(state: HubState, event: Event) -> None:
    payload = event.payload
    cid, owner = _text(payload, "channel"), _text(payload, "owner")
    book = channels_of(state)
    if cid and owner and cid not in book.channels:
        book.channels[cid] = Channel(cid, owner, _text(payload, "label") or cid, {owner})


@appliers.applies(CHANNEL_INVITED)
def _apply_invited(state: HubState, event: Event) -> None:
    channel = channels_of(state).channels.get(_text(event.payload, "channel"))
    invitee = _text(event.payload, "invitee")
    if channel is not None and invitee and invitee not in channel.members:
        channel.invites.add(invitee)


@appliers.applies(CHANNEL_JOINED)
def _apply_joined(state: HubState, event: Event) -> None:
    channel = channels_of(state).channels.get(_text(event.payload, "channel"))
    member = _text(event.payload, "member")
    if channel is not None and member:
        channel.members.add(member)
        channel.invites.discard(member)


@appliers.applies(CHANNEL_LEFT)
def _apply_left(state: HubState, event: Event) -> None:
    book = channels_of(state)
    cid = _text(event.payload, "channel")
    channel = book.channels.get(cid)
    if channel is None:
        return
    channel.members.discard(_text(event.payload, "member"))
    if not channel.members:
        del book.channels[cid]


@appliers.applies(CHAT)
def _apply_channel_chat(state: HubState, event: Event) -> None:
    """A chat journaled with a `channel` joins that channel's history."""
    payload = event.payload
    cid = chat_channel(payload) if isinstance(payload, dict) else ""
    if not cid:
        return
    channel = channels_of(state).get(cid)
    if channel is not None:
        channel.history.append(payload)

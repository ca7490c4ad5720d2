"""The durable inbox query (history_request's `inbox_query`, version 1): the
pure decisions. docs/inbox.md says what a page holds and why.

`read_query` checks the query against the asking connection and the journal's
extent; `page` walks committed journal rows in seq order and builds the page.
The handler (hubd/handlers/inbox.py) reads the rows off the Router's thread.
Error texts are the reference hub's, as observed (docs/reference-observed.md
section 9), so a client that matches them works against either hub.
"""

from __future__ import annotations

from dataclasses import dataclass

from hubd.state.presence import RX_SUFFIX
from hubd.wire.targets import parse_target

VERSION = 1
MAX_LIMIT = 100
MAX_SEQ = 2**63 - 1  # SQLite's largest signed 64-bit integer
# one page looks at most this many chat rows, and at most this many journal
# rows of any kind (other events lie between chats); a page that stops at a
# bound says has_more, with its cursor past what it looked at
SCAN_CHAT_ROWS = 1_000
SCAN_ROWS = 10_000
PAGE_BYTES = 7 * 1024 * 1024  # encoded messages in one page

INVALID = "invalid inbox query"
NOT_OWNED = "inbox identity is not owned by this connection"
OTHER_HUB = "inbox cursor belongs to a different hub"
PAST_JOURNAL = "inbox cursor exceeds the retained journal"
TOO_BIG = "inbox message exceeds the page budget"


@dataclass(frozen=True, slots=True)
class Query:
    identity: str
    since_seq: int
    limit: int


@dataclass(frozen=True, slots=True)
class Refused:
    """The page that says no: `identity` and `cursor` as the reference echoes
    them (the connection's name for a malformed query)."""
    error: str
    identity: str
    cursor: int = 0


def _count(value, low: int, high: int) -> int | None:
    """A JSON integer (not a boolean) within [low, high], else None."""
    if type(value) is not int or not low <= value <= high:
        return None
    return value


def read_query(query, asker: str, hub_id: str, journal_seq: int) -> Query | Refused:
    """Whether `asker` (the connection's registered name) may read this page.

    The identity must be the asker's own, or the seat whose -rx wake sidecar
    the asker is. A first page has since_seq 0 and an empty hub_id; every
    later one names this hub (a cursor from another hub's journal means
    nothing here) and a seq this journal has reached."""
    if not isinstance(query, dict) or query.get("version") != VERSION \
            or type(query.get("version")) is not int:
        return Refused(INVALID, asker)
    identity = query.get("identity")
    since = _count(query.get("since_seq"), 0, MAX_SEQ)
    limit = _count(query.get("limit"), 1, MAX_LIMIT)
    bound = query.get("hub_id")
    if not isinstance(identity, str) or not identity or since is None or limit is None \
            or not isinstance(bound, str):
        return Refused(INVALID, asker)
    if bound == "" and since != 0:
        return Refused(INVALID, asker)
    if identity != asker and asker != identity + RX_SUFFIX:
        return Refused(NOT_OWNED, identity)
    if bound not in ("", hub_id):
        return Refused(OTHER_HUB, identity, since)
    if since > journal_seq:
        return Refused(PAST_JOURNAL, identity, since)
    return Query(identity, since, limit)


def addressed(frame: dict, identity: str, roles) -> bool:
    """A chat this identity's inbox holds: addressed to it (exactly, in a
    comma list, its project, a wildcard, a role it holds, or everyone), not
    its own, and not channel-tagged (a channel is not an inbox)."""
    if frame.get("sender") == identity or frame.get("channel"):
        return False
    target = parse_target(str(frame.get("target") or ""))
    return target.is_broadcast or target.matches(identity, roles)


@dataclass(slots=True)
class Page:
    cursor: int
    messages: list
    has_more: bool
    error: str | None = None


def page(rows, query: Query, roles, encoded_size) -> Page:
    """Build one page from `rows`: (seq, kind, frame or None) in seq order
    after query.since_seq, at most SCAN_ROWS + 1 of them (the extra one says
    whether more follow). `encoded_size(frame)` is a message's bytes on the
    wire. The cursor moves past every row looked at; the page ends when it
    holds `limit` messages, when the next message would overflow its byte
    budget (the cursor stops before it, so the next page starts there), or
    at a scan bound."""
    cursor, messages, budget, chats = query.since_seq, [], PAGE_BYTES, 0
    for index, (seq, kind, frame) in enumerate(rows):
        if index >= SCAN_ROWS or chats >= SCAN_CHAT_ROWS:
            return Page(cursor, messages, True)
        if kind == "chat":
            chats += 1
            if frame is not None and addressed(frame, query.identity, roles):
                message = dict(frame, seq=seq)
                size = encoded_size(message)
                if size > budget:
                    if not messages:
                        return Page(query.since_seq, [], False, TOO_BIG)
                    return Page(cursor, messages, True)
                budget -= size
                messages.append(message)
                if len(messages) == query.limit:
                    return Page(seq, messages, index + 1 < len(rows))
        cursor = seq
    return Page(cursor, messages, False)

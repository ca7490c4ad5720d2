"""Chat target grammar and matching.

A target is `all` (or empty) for a broadcast, or a comma list of items. Each
item is an exact name, a role, a bare project (reaching every `project/...`
seat), or a glob (`*`, `?`, `[`). An item `PROJECT/seat@HUB` names one seat on
a peer hub.
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase

from .envelope import BROADCAST, HUB_ID_RE

GLOB_CHARS = frozenset("*?[")


def is_glob(item: str) -> bool:
    return not GLOB_CHARS.isdisjoint(item)


def project_of(name: str) -> str | None:
    head, sep, _ = name.partition("/")
    return head if sep else None


@dataclass(frozen=True, slots=True)
class RemoteSeat:
    seat: str
    hub: str


@dataclass(frozen=True, slots=True)
class Target:
    raw: str
    items: tuple[str, ...]  # empty for a broadcast
    globs: tuple[bool, ...] = ()  # per item: is it a glob (computed once per target)
    # the projects its items name (`<project>/...`), globs too: which
    # mailboxes a chat to it may reach is asked once per target, not per chat
    projects: frozenset[str] = frozenset()

    @property
    def is_broadcast(self) -> bool:
        return not self.items

    def matches(self, identity: str, roles: frozenset[str] | tuple = ()) -> bool:
        """Is identity (holding roles) an addressee of this target?"""
        for item in self.items:
            if item_matches(item, identity, roles):
                return True
        return False


def item_matches(item: str, identity: str, roles=()) -> bool:
    if item == identity:
        return True
    if is_glob(item):
        return fnmatchcase(identity, item)
    if item in roles:
        return True
    return "/" not in item and identity.startswith(item + "/")


_BROADCAST_TARGET = Target(BROADCAST, ())
_PARSED: dict[str, Target] = {}
_PARSED_LIMIT = 4096


def parse_target(raw: str) -> Target:
    """Parse (and remember: agents reuse a few targets over and over)."""
    if not raw or raw == BROADCAST:
        return _BROADCAST_TARGET
    target = _PARSED.get(raw)
    if target is None:
        items = tuple(part.strip() for part in raw.split(",") if part.strip())
        target = Target(raw, items, tuple(is_glob(item) for item in items),
                        frozenset(filter(None, map(project_of, items))))
        if len(_PARSED) >= _PARSED_LIMIT:
            _PARSED.clear()
        _PARSED[raw] = target
    return target


@dataclass(frozen=True, slots=True)
class RemoteTargetError:
    text: str


_REMOTE: dict[str, "RemoteSeat | RemoteTargetError"] = {}


def parse_remote(raw: str) -> RemoteSeat | RemoteTargetError | None:
    """`PROJECT/seat@HUB` -> RemoteSeat; None when the target is not remote."""
    if "@" not in raw:
        return None
    parsed = _REMOTE.get(raw)
    if parsed is None:
        if len(_REMOTE) >= _PARSED_LIMIT:
            _REMOTE.clear()
        parsed = _REMOTE[raw] = _parse_remote(raw)
    return parsed


def _parse_remote(raw: str) -> RemoteSeat | RemoteTargetError:
    if "," in raw:
        return RemoteTargetError(
            f"Cross-hub target '{raw}' must name exactly one seat, not a comma list.")
    seat, _, hub = raw.rpartition("@")
    if is_glob(seat) or not seat or seat == BROADCAST:
        return RemoteTargetError(
            f"Cross-hub target '{raw}' must name one seat, not an audience or a glob.")
    if not HUB_ID_RE.match(hub) or "@" in seat:
        return RemoteTargetError(f"Cross-hub target '{raw}' has an invalid hub id.")
    return RemoteSeat(seat, hub)

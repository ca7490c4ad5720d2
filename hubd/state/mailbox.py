"""Mailbox projection: which directed chats each identity has, and its watermark.

Directed chats are indexed by target item. An exact item (`proj/bob`, a role
name, or a bare project) keys a list of (seq, sender); glob items go to one
shared list that is scanned with fnmatch. Both are bounded windows: the journal
keeps every chat, the index only the recent ones it needs for replay and for
pending counts.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import OrderedDict, deque
from dataclasses import dataclass, field

from hubd.wire.targets import Target, item_matches, project_of

PER_KEY_WINDOW = 10_000
# a full key is trimmed back to its window once it holds this many more: one
# list move per TRIM_SLACK chats, not one per chat (at 10,000 entries that
# move cost ~5 us a chat, 8% of the loop at saturation)
TRIM_SLACK = 1_000
GLOB_WINDOW = 10_000
INDEXED_KEYS = 50_000
# All exact-key entries together: the least recently addressed keys go first.
INDEXED_ENTRIES = 1_000_000
MAX_REPLAY = 1000


@dataclass(slots=True)
class _Entries:
    seqs: list = field(default_factory=list)
    senders: list = field(default_factory=list)

    def add(self, seq: int, sender: str) -> int:
        """Add one entry; returns how many the key holds more than before
        (1, or negative when a trim back to the window dropped the oldest)."""
        seqs = self.seqs
        seqs.append(seq)
        self.senders.append(sender)
        over = len(seqs) - PER_KEY_WINDOW
        if over > TRIM_SLACK:
            del seqs[:over]
            del self.senders[:over]
            return 1 - over
        return 1

    def after(self, seq: int, exclude_sender: str):
        start = bisect_right(self.seqs, seq)
        for i in range(start, len(self.seqs)):
            if self.senders[i] != exclude_sender:
                yield self.seqs[i]

    def holds(self, seq: int, exclude_sender: str) -> bool:
        i = bisect_right(self.seqs, seq) - 1
        return i >= 0 and self.seqs[i] == seq and self.senders[i] != exclude_sender


@dataclass
class MailboxState:
    by_key: OrderedDict = field(default_factory=OrderedDict)  # item -> _Entries
    globbed: deque = field(default_factory=lambda: deque(maxlen=GLOB_WINDOW))  # (seq, item, sender)
    watermarks: dict = field(default_factory=dict)  # identity -> seq
    entries: int = 0  # exact-key entries held, across keys

    def index(self, seq: int, sender: str, target: Target) -> None:
        for item, glob in zip(target.items, target.globs):
            if glob:
                self.globbed.append((seq, item, sender))
                continue
            entries = self.by_key.get(item)
            if entries is None:
                entries = self.by_key[item] = _Entries()
            else:
                self.by_key.move_to_end(item)
            self.entries += entries.add(seq, sender)
            while len(self.by_key) > INDEXED_KEYS or self.entries > INDEXED_ENTRIES:
                _, evicted = self.by_key.popitem(last=False)
                self.entries -= len(evicted.seqs)

    def oldest_seq(self) -> int | None:
        """The oldest chat the index may still read back from the journal."""
        firsts = [entries.seqs[0] for entries in self.by_key.values() if entries.seqs]
        firsts += [seq for seq, _item, _sender in self.globbed]
        return min(firsts) if firsts else None

    def advance(self, identity: str, seq: int) -> None:
        if seq > self.watermarks.get(identity, 0):
            self.watermarks[identity] = seq

    def watermark(self, identity: str) -> int:
        return self.watermarks.get(identity, 0)

    def _keys_for(self, identity: str, roles) -> list[str]:
        keys = [identity]
        project = project_of(identity)
        if project:
            keys.append(project)
        keys.extend(role for role in roles if role not in keys)
        return keys

    def seqs_after(self, identity: str, roles, after: int) -> list[int]:
        """Directed chats for identity with seq > after, oldest first, not self-sent."""
        found: set[int] = set()
        for key in self._keys_for(identity, roles):
            entries = self.by_key.get(key)
            if entries is not None:
                found.update(entries.after(after, identity))
        for seq, item, sender in self.globbed:
            if seq > after and sender != identity and item_matches(item, identity, roles):
                found.add(seq)
        return sorted(found)

    def pending(self, identity: str, roles) -> int:
        return len(self.seqs_after(identity, roles, self.watermark(identity)))

    def replay_seqs(self, identity: str, roles, since: int) -> list[int]:
        return self.seqs_after(identity, roles, since)[:MAX_REPLAY]

    def directed_to(self, seq: int, identity: str, roles) -> bool:
        for key in self._keys_for(identity, roles):
            entries = self.by_key.get(key)
            if entries is not None and entries.holds(seq, identity):
                return True
        return any(s == seq and sender != identity and item_matches(item, identity, roles)
                   for s, item, sender in self.globbed)

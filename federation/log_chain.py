"""A log pull's hash chain: what the serving hub adds to a page, and the
follower's check of it (pure; no IO). docs/journal.md, "Log pulls serve the
chain".

The page's `chain` field (beside `events`, which keep the reference's
shape):

    {"prev": <the link at after_seq, hex>,
     "links": [[<link>, <S: digest of route and principal>, <E or null>], ...],
     "checkpoints": [<signed checkpoint>, ...]}      (those in the page's range)

one entry per event, in the events' order. E (the digest of the event's
stored content, hubd/journal/chain.py) is sent only where the follower
cannot make it from what it was shown: a withheld event's placeholder, or a
payload whose stored text orjson does not give back byte for byte (a row
hubd did not write with orjson). Everywhere else the follower computes E
from the event itself, so the content it was shown is bound to the link.

The follower (`ChainWatch`, one per watched peer) then checks, before the
page reaches the union:
- every link: link = H(prev, E, S) from the page's prev on; a link that does
  not hold is a row changed after it was written (ChainBroken);
- the page's prev against the link it accepted at that seq before (a
  history rewritten under it: ChainBroken);
- every checkpoint: its signature holds, its key is the one this peer signed
  with before (the first one seen is pinned), and it names the link at its
  seq; and against the checkpoints seen before for the same seq: a second
  head is CheckpointEquivocation, carrying both signed checkpoints as proof.
A page without a chain (a reference hub, an older hubd) is not checked.
"""

from __future__ import annotations

from collections import OrderedDict

import orjson

from federation.log_model import Equivocation, SnapshotInvalid
from hubd.journal import chain
from hubd.journal import chain_checkpoints as checkpoints

# links remembered per peer (a page's prev is checked against them) and
# checkpoints remembered per peer (a second head for one seq is the proof)
REMEMBERED_LINKS = 4096
REMEMBERED_CHECKPOINTS = 1024


class ChainBroken(Equivocation):
    """The peer served a row whose link does not hold, or a chain that is not
    the one it served before: its history was changed after it was written.
    Quarantines the peer like a conflicting offer."""

    reason = "chain_broken"

    def __init__(self, hub_id: str, seq: int, expected: str, served: str, detail: str):
        super().__init__(hub_id, seq, expected, served)
        self.args = (f"hub {hub_id!r}: hash chain broken at seq {seq}: {detail}",)
        self.detail = detail


class CheckpointEquivocation(Equivocation):
    """Two checkpoints of one peer for one seq, both signed by its key, with
    different heads: a proof anyone can check that it rewrote its history."""

    reason = "checkpoint_equivocation"

    def __init__(self, hub_id: str, accepted: checkpoints.Checkpoint,
                 offered: checkpoints.Checkpoint):
        super().__init__(hub_id, accepted.seq, accepted.head, offered.head)
        self.args = (f"hub {hub_id!r} signed two heads for seq {accepted.seq}: "
                     f"{accepted.head} and {offered.head}",)
        self.proof = [accepted.to_json(), offered.to_json()]


# -- the serving side

def served_chain(prev: bytes, rows: list, shown: list[bool], checkpoints_in_range: list) -> dict:
    """The page's chain field. `rows` are (seq, ts, kind, payload, route,
    principal, link) as stored; `shown[i]` says whether the event is shown
    (False: a withheld placeholder)."""
    links = []
    for row, visible in zip(rows, shown):
        seq, ts, kind, payload, route, principal, link = row
        event = None
        if not visible or not _reencodes(payload):
            event = chain.event_digest(seq, float(ts), kind, payload).hex()
        links.append([bytes(link).hex() if link is not None else None,
                      chain.sealed_digest(route, principal).hex(), event])
    return {"prev": prev.hex(), "links": links,
            "checkpoints": [cp.to_json() for cp in checkpoints_in_range]}


def _reencodes(payload: str) -> bool:
    try:
        return orjson.dumps(orjson.loads(payload)).decode() == payload
    except (orjson.JSONDecodeError, TypeError):
        return False


# -- the follower's side

def _hex32(value, what: str) -> bytes:
    if not isinstance(value, str) or len(value) != 64:
        raise SnapshotInvalid(f"chain {what} must be 32 bytes of hex")
    try:
        return bytes.fromhex(value)
    except ValueError:
        raise SnapshotInvalid(f"chain {what} is not hex") from None


class ChainWatch:
    """One peer's chain as this follower has seen it: links by seq (bounded)
    and checkpoints by seq (bounded), the pinned key."""

    def __init__(self, peer: str):
        self.peer = peer
        self.links: OrderedDict[int, bytes] = OrderedDict()
        self.checkpoints: OrderedDict[int, checkpoints.Checkpoint] = OrderedDict()
        self.key: str | None = None
        self.checked_events = 0

    def check(self, after: int, events, field) -> None:
        """Check a decoded page (events as decode_snapshot gives them) and its
        chain field; remember what it showed. Raises ChainBroken,
        CheckpointEquivocation or SnapshotInvalid; remembers nothing then."""
        if field is None:
            return
        if not isinstance(field, dict) or not isinstance(field.get("links"), list) or (
                not isinstance(field.get("checkpoints", []), list)):
            raise SnapshotInvalid("chain must be an object with links and checkpoints")
        links = field["links"]
        if len(links) != len(events):
            raise SnapshotInvalid(f"chain has {len(links)} links for {len(events)} events")
        prev = _hex32(field.get("prev"), "prev")
        known = self.links.get(after)
        if known is not None and known != prev and after > 0:
            raise ChainBroken(self.peer, after, known.hex(), prev.hex(),
                              f"the link at seq {after} is not the one it served before")
        computed: dict[int, bytes] = {}
        for event, entry in zip(events, links):
            if not isinstance(entry, list) or len(entry) != 3:
                raise SnapshotInvalid("a chain link must be [link, sealed, event digest]")
            served = _hex32(entry[0], "link")
            sealed = _hex32(entry[1], "sealed digest")
            if entry[2] is not None:
                digest = _hex32(entry[2], "event digest")
            else:
                digest = chain.event_digest(event["seq"], event["ts"], event["kind"],
                                            orjson.dumps(event["payload"]))
            expected = chain.link(prev, digest, sealed)
            if expected != served:
                raise ChainBroken(self.peer, event["seq"], expected.hex(), served.hex(),
                                  "the row's content does not make the link it was served "
                                  "with: it was changed after it was written")
            computed[event["seq"]] = prev = served
        offered = self._checkpoints(field.get("checkpoints", []), computed)
        self._remember(computed, offered)
        self.checked_events += len(events)

    def _checkpoints(self, raw: list, computed: dict[int, bytes]) -> list:
        offered = []
        for value in raw[:REMEMBERED_CHECKPOINTS]:
            try:
                checkpoint = checkpoints.from_json(value)
            except checkpoints.CheckpointInvalid as exc:
                seq = value.get("seq") if isinstance(value, dict) else None
                raise ChainBroken(self.peer, seq if type(seq) is int else 0, "", "",
                                  str(exc)) from None
            before = self.checkpoints.get(checkpoint.seq)
            if before is not None and checkpoints.conflict(before, checkpoint):
                raise CheckpointEquivocation(self.peer, before, checkpoint)
            if self.key is not None and checkpoint.key != self.key:
                raise ChainBroken(self.peer, checkpoint.seq, self.key, checkpoint.key,
                                  "a checkpoint signed by another key than the peer's "
                                  "earlier ones")
            link = computed.get(checkpoint.seq)
            if link is not None and link.hex() != checkpoint.head:
                raise ChainBroken(self.peer, checkpoint.seq, link.hex(), checkpoint.head,
                                  "a checkpoint that does not name the link at its seq")
            offered.append(checkpoint)
        return offered

    def _remember(self, computed: dict[int, bytes], offered: list) -> None:
        for seq, link in computed.items():
            self.links[seq] = link
            self.links.move_to_end(seq)
        while len(self.links) > REMEMBERED_LINKS:
            self.links.popitem(last=False)
        for checkpoint in offered:
            if self.key is None:
                self.key = checkpoint.key
            self.checkpoints[checkpoint.seq] = checkpoint
            self.checkpoints.move_to_end(checkpoint.seq)
        while len(self.checkpoints) > REMEMBERED_CHECKPOINTS:
            self.checkpoints.popitem(last=False)

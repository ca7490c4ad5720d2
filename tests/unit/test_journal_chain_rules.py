"""The pure decisions of the journal's hash chain and its signed checkpoints
(hubd/journal/chain.py, chain_checkpoints.py) and of a follower's check of a
served page (federation/log_chain.py)."""

from __future__ import annotations

import orjson
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from federation.log_chain import ChainBroken, ChainWatch, CheckpointEquivocation, served_chain
from federation.log_model import SnapshotInvalid
from hubd.journal import chain
from hubd.journal import chain_checkpoints as checkpoints


def stored_rows(n: int, start: int = 1, text: str = "hello"):
    rows = [(seq, 1000.0 + seq, "chat", orjson.dumps({"payload": f"{text} {seq}"}).decode(),
             '{"recipients":[]}' if seq % 2 else None, "p/alice" if seq % 3 else None)
            for seq in range(start, start + n)]
    return rows


def test_each_link_binds_every_field_and_the_row_before():
    rows = stored_rows(3)
    linked, head = chain.chained(chain.GENESIS, rows)
    assert head == linked[-1][6] and len({row[6] for row in linked}) == 3
    base = chain.row_link(chain.GENESIS, rows[0])
    for index in range(6):  # any field changed, another link
        changed = list(rows[0])
        changed[index] = {0: 99, 1: 1.5, 2: "chat2", 3: '{"payload":"x"}', 4: "{}",
                          5: "p/bob"}[index]
        assert chain.row_link(chain.GENESIS, tuple(changed)) != base
    assert chain.row_link(b"\x01" * 32, rows[0]) != base  # the row before is bound too
    # None and "" are not the same route or principal
    assert chain.sealed_digest(None, "a") != chain.sealed_digest("", "a")
    assert chain.sealed_digest("a", None) != chain.sealed_digest(None, "a")


def test_first_break_names_the_first_changed_row():
    linked, head = chain.chained(chain.GENESIS, stored_rows(5))
    assert chain.first_break(chain.GENESIS, linked) == (None, head)
    tampered = list(linked)
    tampered[2] = (*linked[2][:3], '{"payload":"other"}', *linked[2][4:])
    assert chain.first_break(chain.GENESIS, tampered)[0] == 3
    tampered[1] = (*linked[1][:6], None)  # a row without a link
    assert chain.first_break(chain.GENESIS, tampered)[0] == 2


def test_checkpoints_fall_on_fixed_seqs_whatever_the_commits():
    assert list(checkpoints.due(1, 9, 4)) == [4, 8]
    assert list(checkpoints.due(4, 4, 4)) == [4]
    assert list(checkpoints.due(5, 7, 4)) == []
    assert list(checkpoints.due(1, 100, 0)) == []
    # one history committed in two groupings signs the same seqs
    assert [s for a, b in ((1, 3), (4, 10)) for s in checkpoints.due(a, b, 3)] == \
        list(checkpoints.due(1, 10, 3))


def test_a_checkpoint_holds_only_as_signed():
    key = Ed25519PrivateKey.generate()
    signed = checkpoints.sign(key, "west", 8, b"\x07" * 32)
    assert checkpoints.from_json(signed.to_json()) == signed
    for field, value in (("head", "08" * 32), ("seq", 9), ("hub_id", "east")):
        with pytest.raises(checkpoints.CheckpointInvalid, match="signature does not hold"):
            checkpoints.from_json({**signed.to_json(), field: value})
    with pytest.raises(checkpoints.CheckpointInvalid, match="head must be 32 bytes"):
        checkpoints.from_json({**signed.to_json(), "head": "07"})
    with pytest.raises(checkpoints.CheckpointInvalid, match="seq must be a positive integer"):
        checkpoints.from_json({**signed.to_json(), "seq": True})


def test_two_heads_for_one_seq_of_one_key_conflict():
    key = Ed25519PrivateKey.generate()
    a = checkpoints.sign(key, "west", 8, b"\x01" * 32)
    assert checkpoints.conflict(a, checkpoints.sign(key, "west", 8, b"\x02" * 32))
    assert not checkpoints.conflict(a, checkpoints.sign(key, "west", 8, b"\x01" * 32))
    assert not checkpoints.conflict(a, checkpoints.sign(key, "west", 9, b"\x02" * 32))
    other = Ed25519PrivateKey.generate()  # another key's word proves nothing about this one
    assert not checkpoints.conflict(a, checkpoints.sign(other, "west", 8, b"\x02" * 32))


def page(rows, prev=chain.GENESIS, shown=None, signed=(), mangle=None):
    """A served page as decode_snapshot gives it, and its chain field."""
    linked, _ = chain.chained(prev, rows)
    shown = shown or [True] * len(rows)
    field = served_chain(prev, linked, shown, list(signed))
    events = [{"seq": r[0], "ts": r[1], "kind": r[2] if ok else "withheld",
               "payload": orjson.loads(r[3]) if ok else {"reason_code": "x"}}
              for r, ok in zip(rows, shown)]
    if mangle:
        mangle(events, field)
    return events, field, linked


def test_a_follower_checks_every_link_and_remembers_them():
    watch = ChainWatch("west")
    events, field, linked = page(stored_rows(4), shown=[True, False, True, True])
    assert field["links"][0][2] is None and field["links"][1][2] is not None
    watch.check(0, events, field)
    assert watch.links[4] == linked[-1][6]
    watch.check(0, events, field)  # the same page again: nothing new, nothing wrong
    watch.check(0, events, None)  # a page without a chain (a reference peer): not checked


def test_a_served_row_whose_content_is_not_its_links_is_refused():
    def change(events, _field):
        events[2]["payload"] = {"payload": "rewritten"}
    events, field, _ = page(stored_rows(4), mangle=change)
    with pytest.raises(ChainBroken) as caught:
        ChainWatch("west").check(0, events, field)
    assert caught.value.seq == 3 and caught.value.reason == "chain_broken"


def test_a_page_whose_prev_is_not_the_link_served_before_is_refused():
    watch = ChainWatch("west")
    events, field, linked = page(stored_rows(4))
    watch.check(0, events, field)
    rewritten = stored_rows(3, start=3, text="other")
    events, field, _ = page(rewritten, prev=b"\x09" * 32)
    with pytest.raises(ChainBroken, match="the link at seq 2 is not the one it served before"):
        watch.check(2, events, field)


def test_two_signed_heads_for_one_seq_are_the_proof():
    key = Ed25519PrivateKey.generate()
    watch = ChainWatch("west")
    rows = stored_rows(4)
    linked, _ = chain.chained(chain.GENESIS, rows)
    events, field, _ = page(rows, signed=[checkpoints.sign(key, "west", 4, linked[3][6])])
    watch.check(0, events, field)
    other = stored_rows(4, text="another history")
    relinked, _ = chain.chained(chain.GENESIS, other)
    events, field, _ = page(other, signed=[checkpoints.sign(key, "west", 4, relinked[3][6])])
    with pytest.raises(CheckpointEquivocation) as caught:
        watch.check(0, events, field)
    first, second = (checkpoints.from_json(v) for v in caught.value.proof)
    assert checkpoints.conflict(first, second) and caught.value.seq == 4


def test_a_checkpoint_must_name_the_link_and_the_peers_key():
    key, other = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    rows = stored_rows(4)
    linked, _ = chain.chained(chain.GENESIS, rows)
    events, field, _ = page(rows, signed=[checkpoints.sign(key, "west", 4, b"\x05" * 32)])
    with pytest.raises(ChainBroken, match="does not name the link at its seq"):
        ChainWatch("west").check(0, events, field)
    watch = ChainWatch("west")
    watch.check(0, *page(rows, signed=[checkpoints.sign(key, "west", 4, linked[3][6])])[:2])
    more = stored_rows(4, start=5)
    more_linked, _ = chain.chained(linked[3][6], more)
    events, field, _ = page(more, prev=linked[3][6],
                            signed=[checkpoints.sign(other, "west", 8, more_linked[3][6])])
    with pytest.raises(ChainBroken, match="another key"):
        watch.check(4, events, field)


def test_a_malformed_chain_field_is_refused_as_invalid():
    events, field, _ = page(stored_rows(2))
    with pytest.raises(SnapshotInvalid, match="2 events"):
        ChainWatch("west").check(0, events, {**field, "links": field["links"][:1]})
    with pytest.raises(SnapshotInvalid, match="prev"):
        ChainWatch("west").check(0, events, {**field, "prev": "zz"})

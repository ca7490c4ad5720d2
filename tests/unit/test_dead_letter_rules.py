"""The dead-letter escalation decisions (hubd/state/dead_letter_escalation.py)
and the ledger's escalation table (hubd/state/chat.py DeadLetters)."""

from __future__ import annotations

import math

import pytest

from federation.config import FederationConfigError, build_federation_config
from hubd.state import chat
from hubd.state import dead_letter_escalation as rules


def test_off_unless_a_threshold():
    assert not any(rules.escalation_due(n, 0, None, 0.0, 0.0) for n in range(1, 50))
    assert not rules.escalation_due(0, 1, None, 0.0, 0.0)


def test_window_zero_is_the_references_exact_multiples():
    last, fired = None, []
    for count in range(1, 11):
        if rules.escalation_due(count, 3, last, float(count), 0.0):
            fired.append(count)
            last = (count, float(count))
    assert fired == [3, 6, 9]


def test_the_window_holds_back_and_the_first_dead_letter_after_it_fires():
    assert rules.escalation_due(2, 2, None, 100.0, 60.0)
    last = (2, 100.0)
    assert not rules.escalation_due(4, 2, last, 159.9, 60.0)
    assert not rules.escalation_due(3, 2, last, 500.0, 60.0)  # not threshold more yet
    assert rules.escalation_due(5, 2, last, 160.0, 60.0)  # a held-back crossing, picked up


def test_texts_are_the_references():
    assert rules.escalation_notice("p/g", 2, "p/a") == (
        "dead-letter escalation: 2 directed messages to 'p/g' have reached no live connection "
        "(most recent from 'p/a'); nobody is draining that name")
    assert rules.incoming_notice("p/g", 3, "east").startswith(
        "dead-letter forwarding: peer hub 'east' reports 3 directed messages to 'p/g'")


def test_flag_problems():
    assert rules.flag_problems(0, 60.0) == []
    assert rules.flag_problems(1_000_000, 0.0) == []
    assert len(rules.flag_problems(-1, 60.0)) == 1
    assert len(rules.flag_problems(1_000_001, 60.0)) == 1
    assert len(rules.flag_problems(1, math.nan)) == 1
    assert len(rules.flag_problems(1, -1.0)) == 1
    assert len(rules.flag_problems(1, math.inf)) == 1


GOOD = {"target": "p/g", "count": 2, "origin_hub_id": "east", "owner_hub_id": "west"}


def test_a_good_pointer_decodes():
    assert rules.decode_pointer({"forwarding": GOOD}) == rules.Pointer("p/g", 2, "east", "west")


@pytest.mark.parametrize("forwarding", [
    None, "p/g", [], {**GOOD, "target": ""}, {**GOOD, "target": "  "}, {**GOOD, "target": 5},
    {**GOOD, "target": "x" * 257}, {**GOOD, "target": "p/\n"}, {**GOOD, "target": "p/\ud800"},
    {**GOOD, "count": -1}, {**GOOD, "count": True}, {**GOOD, "count": 1.0},
    {**GOOD, "count": 2 ** 60}, {**GOOD, "origin_hub_id": None},
    {**GOOD, "owner_hub_id": "h" * 65}, {k: v for k, v in GOOD.items() if k != "count"},
])
def test_a_bad_pointer_is_refused_malformed(forwarding):
    frame = {} if forwarding is None else {"forwarding": forwarding}
    refused = rules.decode_pointer(frame)
    assert isinstance(refused, rules.PointerRefused) and refused.code == rules.MALFORMED


def test_the_ledger_forgets_an_escalation_with_its_entry():
    ledger = chat.DeadLetters()
    assert ledger.record("p/g", "p/a", 1.0) == 1
    ledger.escalated_at("p/g", 1, 1.0)
    ledger.escalated_at("p/none", 1, 1.0)  # not in the ledger: nothing kept
    assert ledger.escalated == {"p/g": (1, 1.0)}
    ledger.clear("p/g")
    assert ledger.escalated == {} and ledger.by_target == {}
    ledger.record("p/g", "p/a", 2.0)
    ledger.escalated_at("p/g", 1, 2.0)
    for i in range(chat.DEAD_LETTER_TARGETS):  # p/g is evicted as the oldest
        ledger.record(f"p/x{i}", "p/a", 3.0 + i)
    assert "p/g" not in ledger.by_target and ledger.escalated == {}
    assert ledger.listing()[0].keys() == {"target", "count", "last_ts", "last_sender"}


def test_received_pointers_are_bounded_and_windowed():
    table = rules.ReceivedPointers()
    table.record("east", "p/g", 10.0)
    assert table.repeated("east", "p/g", 20.0, 60.0)
    assert not table.repeated("east", "p/g", 70.0, 60.0)
    assert not table.repeated("north", "p/g", 20.0, 60.0)
    for i in range(rules.RECEIVED_POINTERS):
        table.record("east", f"p/{i}", 11.0)
    assert len(table.told) == rules.RECEIVED_POINTERS
    assert not table.repeated("east", "p/g", 20.0, 60.0)  # the oldest was dropped


def _config(**kw):
    base = dict(message_peers=[], message_peer_pins=[], message_peer_token=None,
                client_certfile=None, client_keyfile=None, forward_ttl=86400.0,
                tls_certfile=None, tls_keyfile=None, serving_policy=None, hub_id="east")
    base.update(kw)
    return build_federation_config(**base)


def test_relay_peer_flags_are_checked_as_the_reference_does():
    with pytest.raises(FederationConfigError, match="--relay-peer requires --namespace-owner"):
        _config(relay_peers=["west=ws://127.0.0.1:1/"])
    with pytest.raises(FederationConfigError, match="--relay-peer-pin requires --relay-peer"):
        _config(relay_peer_pins=["west=sha256:" + "a" * 64], namespace_owners=["P=west"])
    with pytest.raises(FederationConfigError, match="ws:// or wss://"):
        _config(relay_peers=["west=http://x/"], namespace_owners=["P=west"])
    with pytest.raises(FederationConfigError, match="one hub, one link"):
        _config(relay_peers=["west=ws://127.0.0.1:1/"], claim_peers=["west=ws://127.0.0.1:2/"],
                namespace_owners=["P=west"])
    config = _config(relay_peers=["west=ws://127.0.0.1:1/"], namespace_owners=["P=west"])
    assert list(config.relay_peers) == ["west"]
    assert config.rebuild() == config

"""Which events a log pull shows a peer (federation/logscope.py)."""

from __future__ import annotations

import pytest

from federation.logscope import (NO_NAMESPACE, NOT_GRANTED, event_namespaces, placeholder,
                                 withheld_reason)

PROJ = frozenset({"PROJ"})


@pytest.mark.parametrize("kind,payload,namespaces", [
    ("chat", {"sender": "PROJ/a", "target": "PROJ/b"}, {"PROJ"}),
    ("chat", {"sender": "PROJ/a@east", "target": "PROJ/b"}, {"PROJ"}),
    ("chat", {"sender": "PROJ/a", "target": "all"}, {"PROJ"}),
    ("chat", {"sender": "PROJ/a"}, {"PROJ"}),
    ("chat", {"sender": "PROJ/a", "target": "OTHER/b"}, {"PROJ", "OTHER"}),
    ("chat", {"sender": "PROJ/a", "target": "PROJ/b,OTHER/c"}, {"PROJ", "OTHER"}),
    ("chat", {"sender": "PROJ/a", "target": "OTHER/b@west"}, {"PROJ", "OTHER"}),
    ("chat", {"sender": "PROJ/a", "target": "PROJ/*"}, {"PROJ"}),
    ("chat", {"sender": "PROJ/a", "target": "reviewer"}, {"PROJ", "reviewer"}),
    ("chat", {"sender": "PROJ/a", "target": "*"}, None),
    ("chat", {"sender": "anon-3", "target": "PROJ/b"}, None),
    ("chat", {"sender": "PROJ/a", "target": 7}, None),
    ("claim", {"owner": "PROJ/a", "task_id": "t"}, {"PROJ"}),
    ("handoff", {"owner": "OTHER/b"}, {"OTHER"}),
    ("release", {"owner": "PROJ/a"}, {"PROJ"}),
    ("lease_expired", {"owner": None}, None),
    ("claim_denial", {"claimant": "PROJ/a"}, {"PROJ"}),
    ("ledger_task", {"created_by": "PROJ/a", "project": ""}, {"PROJ"}),
    ("ledger_task", {"created_by": "PROJ/a", "project": "OTHER"}, {"PROJ", "OTHER"}),
    ("ledger_progress", {"author": "PROJ/a"}, {"PROJ"}),
    ("forward_settled", {"forward_id": "f"}, None),
    ("multihub_partition", {}, None),
    ("broker_message", {"sender": "renn"}, None),
    ("chat", "not an object", None),
])
def test_event_namespaces(kind, payload, namespaces):
    found = event_namespaces(kind, payload)
    assert found == (frozenset(namespaces) if namespaces is not None else None)


def test_withheld_unless_every_namespace_is_granted():
    assert withheld_reason("chat", {"sender": "PROJ/a", "target": "PROJ/b"}, PROJ) is None
    assert withheld_reason("chat", {"sender": "PROJ/a", "target": "OTHER/b"}, PROJ) == NOT_GRANTED
    assert withheld_reason("chat", {"sender": "OTHER/a", "target": "OTHER/b"},
                           PROJ | {"OTHER"}) is None
    assert withheld_reason("forward_settled", {"forward_id": "f"}, PROJ) == NO_NAMESPACE
    assert withheld_reason("claim", {"owner": "PROJ/a"}, frozenset()) == NOT_GRANTED


def test_placeholder_has_exactly_the_event_fields():
    assert placeholder(3, 1.5, NOT_GRANTED) == {
        "seq": 3, "ts": 1.5, "kind": "withheld", "payload": {"reason_code": NOT_GRANTED}}

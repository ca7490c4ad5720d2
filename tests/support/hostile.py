"""Seeded hostile frames for the WebSocket door (issue 22 items 2 and 8,
issue 30 item 1): every verb the hub answers, with fields of the wrong type,
out of bounds, or holding lone surrogates; duplicate keys; malformed text.

The frames are written here as JSON text by hand (not with json.dumps) so a
frame can hold what a JSON encoder would never write: a key twice, a `\\ud800`
escape, a number past a double, nesting past the wire's bound. Each frame
keeps its connection's own `sender` (or a sender of the wrong type): a
different name would be a name switch, which closes the socket by design.

This module knows the verbs from the hub's documented wire (the seed and
docs/), not from hubd/wire's rule table, so it cannot inherit a gap of the
table it tests.
"""

from __future__ import annotations

import json
import random

# field -> values a well-behaved client sends (as Python values)
_VALID = {
    "payload": ["hello", "t-1", ""],
    "target": ["all", "System"],
    "client_msg_id": ["c-1", "c-2"],
    "receipt_requested": [True],
    "channel": ["ops"],
    "metadata": [{"k": "v"}],
    "priority": ["high", 1],
    "reply_to": ["m-1"],
    "mailbox": [True],
    "since_seq": [0, 3],
    "mailbox_for": [None],
    "seq": [1, 2, 5],
    "roles": [["reviewer"]],
    "wake_capability": ["direct"],
    "protocol_version": [3],
    "takeover": [False],
    "request_id": ["r-1", "r-2"],
    "limit": [5, 0],
    "since": [0, 1],
    "history_client_msg_id": ["c-1"],
    "history_target": ["all"],
    "inbox_query": [{"version": 1, "identity": "", "hub_id": "", "since_seq": 0, "limit": 5}],
    "release_confirmation": [{"task_id": "t-1", "operation_id": "k-1",
                              "request_digest": "0" * 64}],
    "hub": ["test-hub"],
    "task_id": ["t-1", "t-2"],
    "id": ["t-1"],
    "note": ["working"],
    "ttl_seconds": [60, 120.5],
    "worktree": ["/repo"],
    "paths": [["src/a.py"], ["lib/"]],
    "idem_key": ["k-1", "k-2"],
    "data_ref": ["ref"],
    "git": [{"branch": "main"}],
    "path_identity": [None],
    "epoch": [1, 2],
    "status": ["in_progress", "done"],
    "expected_version": [0, 1],
    "checkpoint": ["step 2"],
    "to_agent": ["fz/peer"],
    "evidence": [["tests pass"]],
    "known_failures": [[]],
    "confidence": ["high", 0.9],
    "freshness_seconds": [10],
    "title": ["a task"],
    "description": ["does things"],
    "project": ["fz"],
    "depends_on": [["t-2"]],
    "suggested_owner": ["fz/a"],
    "causal_parent": [None],
    "kind": ["note"],
    "text": ["progress"],
    "skills": [["python"]],
    "task_classes": [["review"]],
    "model": ["m"],
    "contracts": [[]],
    "persist": [False],
    "dispatchable": [True],
    "agent": [None],
    "meta": [{}],
    "signature": [{}],
    "manifest_digest": ["d"],
    "idempotency_key": ["i-1"],
    "target_incarnation": ["0" * 64],
    "mode": ["next_turn"],
    "allowed_fallbacks": [[]],
    "body": ["do it"],
    "deadline": [4e9],
    "operation_key": ["0" * 64],
    "mutation_id": ["m-1"],
    "stage": ["completed"],
    "delivery_session_token": ["a" * 64],
    "delivery_capabilities": [{"next_turn": "native"}],
    "forward_id": ["f-1"],
    "forwards": [[{"forward_id": "f-2", "kind": "chat"}]],
    "sender_seat": ["fz/a"],
    "target_seat": ["fz/b"],
    "after_seq": [0],
    "namespace": ["fz"],
    "claimant": ["fz/a"],
    "claim": [{"task_id": "t-1"}],
    "token": ["nope"],
    "timestamp": [1.7e9],
}

# verb -> fields it reads (beyond the envelope)
VERBS = {
    "chat": ["payload", "client_msg_id", "receipt_requested", "channel", "metadata",
             "priority", "reply_to"],
    "heartbeat": ["payload", "mailbox", "since_seq", "mailbox_for", "roles",
                  "wake_capability", "protocol_version", "takeover",
                  "delivery_session_token", "delivery_capabilities"],
    "ack": ["seq", "mailbox_for"],
    "who_request": ["hub"],
    "state_request": ["request_id", "release_confirmation"],
    "history_request": ["limit", "history_client_msg_id", "history_target", "inbox_query",
                        "request_id"],
    "resume_request": ["since"],
    "claim": ["task_id", "payload", "note", "ttl_seconds", "worktree", "paths", "idem_key",
              "data_ref", "git", "path_identity"],
    "release": ["task_id", "payload", "epoch", "idem_key", "evidence", "known_failures",
                "confidence", "freshness_seconds"],
    "task_update": ["task_id", "id", "status", "note", "data_ref", "expected_version", "epoch",
                    "idem_key"],
    "checkpoint": ["task_id", "id", "checkpoint", "payload", "epoch", "idem_key"],
    "handoff": ["task_id", "id", "payload", "to_agent", "note", "ttl_seconds", "epoch",
                "idem_key"],
    "wait_request": ["task_id", "id", "payload"],
    "ledger_task": ["task_id", "title", "description", "project", "depends_on",
                    "suggested_owner", "causal_parent", "expected_version", "idem_key"],
    "ledger_task_update": ["task_id", "status", "title", "project", "depends_on",
                           "suggested_owner", "expected_version", "causal_parent", "idem_key"],
    "ledger_progress": ["task_id", "kind", "text", "payload", "idem_key"],
    "board_request": [],
    "manifest_request": [],
    "advertise": ["description", "skills", "task_classes", "model", "contracts", "persist",
                  "dispatchable", "agent", "meta", "signature", "manifest_digest"],
    "delivery_request": ["protocol_version", "request_id", "idempotency_key",
                         "target_incarnation", "mode", "allowed_fallbacks", "task_id", "body",
                         "deadline"],
    "delivery_status_request": ["protocol_version", "operation_key"],
    "delivery_cancel": ["protocol_version", "operation_key", "mutation_id"],
    "delivery_boundary": ["protocol_version", "operation_key", "request_id", "task_id",
                          "mutation_id", "evidence"],
    "delivery_ack": ["protocol_version", "operation_key", "request_id", "task_id",
                     "mutation_id"],
    "delivery_outcome": ["protocol_version", "operation_key", "request_id", "task_id",
                         "mutation_id", "stage", "evidence"],
    "multihub_message_forward": ["forward_id", "kind", "sender_seat", "target_seat", "body"],
    "multihub_message_forward_batch": ["forwards"],
    "multihub_log_request": ["after_seq", "limit"],
    "multihub_claim_request": ["namespace", "claimant", "task_id", "claim", "request_id"],
}

# hostile values, as JSON text
HOSTILE = [
    "[]", '["x"]', "[1,2,3]", "{}", '{"a":[1,{"b":null}]}', '[{"task_id":"t"}]',
    "0", "-1", "7", "18446744073709551616", "99999999999999999999999", "-9223372036854775809",
    "1.5", "-0.0", "1e308", "1e-320", "true", "false", "null",
    '""', '" "', '"x"', '"all"', '"*"', '"System"', '"SynapseHub"', '"fz/a@other"',
    '"../../etc/passwd"', '"/abs"', '"a,b"', '"\\u0000"', '"line\\nbreak"', '"\\u007f"',
    '"\\ud800"', '"x\\udc00"', '"\\ud83d\\ude00"', '"caf\\u00e9"',
    json.dumps("k" * 300), json.dumps("w" * 5000),
    '{"version":1,"identity":["x"],"since_seq":"0","limit":true}',
    '{"next_turn":["native"]}', '{"\\ud800":1}', '[["a"]]',
]

# text that is not a JSON object, or not JSON at all
MALFORMED = [
    "{not json", "", "[1,2,3]", '"just a string"', "42", "null",
    '{"type":"chat","payload":NaN}', '{"type":"chat","deadline":Infinity}',
    '{"type":"chat","deadline":1e400}', '{"type":"chat"', '{"type":"chat",}',
    "[" * 70 + "]" * 70, '{"a":' * 70 + "1" + "}" * 70,
]


def _value(rng: random.Random, field: str) -> str:
    return json.dumps(rng.choice(_VALID.get(field, ["x"])))


def _obj(pairs: list[tuple[str, str]]) -> str:
    """An object from (key JSON text, value JSON text) pairs, in order."""
    return "{" + ",".join(f"{k}:{v}" for k, v in pairs) + "}"


class HostileFrames:
    """A deterministic stream of hostile frames for one connection named `me`."""

    def __init__(self, seed: int, me: str, peers: list[str]):
        self.rng = random.Random(seed)
        self.me, self.peers = me, peers
        self.counter = 0

    def _base(self, verb: str) -> list[tuple[str, str]]:
        rng = self.rng
        self.counter += 1
        target = rng.choice(["System", "all", *self.peers])
        pairs = [('"type"', json.dumps(verb)), ('"sender"', json.dumps(self.me)),
                 ('"target"', json.dumps(target))]
        for field in VERBS[verb]:
            if rng.random() < 0.6:
                pairs.append((json.dumps(field), _value(rng, field)))
        if verb == "chat" and rng.random() < 0.7:
            # the combination behind the crash issue 22 reports
            pairs.append(('"receipt_requested"', "true"))
            pairs.append(('"target"', json.dumps(rng.choice(self.peers))))
        return _dedupe_keys(pairs)

    def next(self) -> str:
        rng = self.rng
        roll = rng.random()
        verb = rng.choice(list(VERBS))
        pairs = self._base(verb)
        if roll < 0.05:
            return rng.choice(MALFORMED)
        if roll < 0.15:
            # a duplicate key, at the top or nested
            key, _ = rng.choice(pairs)
            if rng.random() < 0.5 or key in ('"type"', '"sender"'):
                pairs.append((key, rng.choice(HOSTILE)))
            else:
                pairs.append(('"metadata"', '{"a":1,"a":2}'))
            return _obj(pairs)
        if roll < 0.25:
            # a lone surrogate in a key or a value, at the top or nested
            where = rng.choice(['"\\ud800"', '"p\\udfff"'])
            if rng.random() < 0.3:
                pairs.append((where, "1"))
            else:
                field = rng.choice(VERBS[verb] or ["payload"])
                pairs.append((json.dumps(field), rng.choice([where, f"[{where}]",
                                                             f'{{"k":{where}}}'])))
            return _obj(_dedupe_keys(pairs))
        if roll < 0.35:
            return _obj(pairs)  # a valid frame: keeps leases, chats and receipts about
        # one to three fields of the verb (or the envelope) with a hostile value
        fields = VERBS[verb] + ["target", "type", "channel", "sender", "roles", "timestamp",
                                "protocol_version", "token", "mailbox_for"]
        for field in rng.sample(fields, min(len(fields), rng.randint(1, 3))):
            value = rng.choice(HOSTILE)
            if field == "sender" and value.startswith('"'):
                continue  # another name is a name switch, which closes by design
            pairs.append((json.dumps(field), value))
        return _obj(_dedupe_keys(pairs))


def _dedupe_keys(pairs: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Keep the last value of each key (frames other than the duplicate-key
    kind must not carry one by accident)."""
    last = {k: v for k, v in pairs}
    return list(last.items())

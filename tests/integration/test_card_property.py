"""Property: signed capability cards (`advertise` with a card signature under
--capability-card-trust; hubd/state/card_trust.py, docs/capabilities.md).
Random sequences of valid cards, capability downgrades, replayed or stale
sequence numbers, tampered cards, unknown keys, a wrong private key, another
agent's card, unsigned cards, bad sequences and hub restarts: the lifecycle
history remembers a card exactly when a model says (a good signature and a
sequence above the last one remembered for that agent and key, across
restarts), a card it does not remember leaves the history as it was (the
advertisement itself is still journaled: cards are advisory), and after
every step the Router's projection equals a fresh replay of the journal.
Real in-process hub (its flags parsed by hubd.cli.load), real sockets, real
SQLite."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from hubd.state import card_trust as ct
from tests.integration.test_capability_cards import signed_frame, trust_file
from tests.integration.test_evidence_property import Hub
from tests.support.wsprobe import joined

KINDS = ["valid"] * 4 + ["downgrade", "tampered", "unknown-key", "wrong-private-key",
                         "other-agent", "unsigned", "sequence-zero"]
REMEMBERED = {"valid", "downgrade"}  # a good signature: remembered if its sequence is new

steps_of = st.lists(st.one_of(st.tuples(st.sampled_from(KINDS), st.integers(1, 6)),
                              st.just("restart")), min_size=1, max_size=12)


def frame_for(kind: str, sequence: int, trusted, stranger) -> dict:
    if kind == "downgrade":  # a route capability fewer than "code"
        return signed_frame(trusted, sequence, task_classes=())
    if kind == "tampered":
        return dict(signed_frame(trusted, sequence), description="changed after signing")
    if kind == "unknown-key":
        return signed_frame(stranger, sequence, key_id="card-9")
    if kind == "wrong-private-key":
        return signed_frame(stranger, sequence)
    if kind == "other-agent":  # card-1 is for p/alice only
        return signed_frame(trusted, sequence, sender="p/bob")
    if kind == "unsigned":
        frame = signed_frame(trusted, sequence)
        del frame["signature"]
        return frame
    if kind == "sequence-zero":
        return signed_frame(trusted, 0)
    return signed_frame(trusted, sequence)


@settings(max_examples=15, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(steps=steps_of)
@example(steps=[("valid", 2), ("valid", 2), ("tampered", 3), "restart", ("valid", 1),
                ("valid", 3), ("downgrade", 4), ("unknown-key", 5), ("other-agent", 5)])
def test_the_card_history_follows_the_model_and_live_equals_replay(steps):
    with tempfile.TemporaryDirectory() as folder:
        asyncio.run(scenario(Path(folder), steps))


async def scenario(root: Path, steps) -> None:
    trusted, stranger = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    hub = Hub(root, ["--capability-card-trust", trust_file(root, trusted)])
    await hub.start()
    remembered = 0  # the model: the last sequence remembered for (p/alice, card-1)
    try:
        for step in steps:
            if step == "restart":
                await hub.stop()
                await hub.start()
                continue
            kind, sequence = step
            live, replayed = await hub.snapshot()
            assert live == replayed
            history = dict(ct.history_of(live).entries)
            frame = frame_for(kind, sequence, trusted, stranger)
            sender = frame["sender"]
            probe = await joined(hub.server.url, sender)
            await probe.send_json(frame)
            shown = (await probe.recv_type("capability_advertised", agent=sender))["card"]
            await probe.close()
            live, replayed = await hub.snapshot()
            assert live == replayed
            after = dict(ct.history_of(live).entries)
            if kind in REMEMBERED and sequence > remembered:
                remembered = sequence
                assert after[("p/alice", "card-1")][0] == sequence, (step, shown)
                expected = "valid" if kind == "valid" or not history else None
                if expected:
                    assert shown["verification"]["result"] == expected, (step, shown)
            else:
                assert after == history, (step, shown["verification"])
                assert shown["verification"]["result"] != "valid", (step, shown)
    finally:
        await hub.stop()

"""Property, one per verb (identity_pin_reclaim, identity_enroll,
identity_revoke: sequences mostly of that verb; over all examples each verb
is checked to have been both applied and refused) and one over everything
mixed: random sequences of first-use pins, reclaims, enrolments,
revocations, ill-typed requests and restarts, by a proven operator and by
requesters that are not, keep the Router's projection equal to a fresh
replay of the journal, and every refused request (a verdict with
applied: false, or a typed wire error) leaves the projection as it was.

Real in-process hub, real sockets, real SQLite.
"""

from __future__ import annotations

import asyncio
import base64
import json
import secrets
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hubd.config import SecurityConfig
from hubd.state import identity_recovery as ir
from tests.support.inproc import flushed, running_hub
from tests.support.wsprobe import WsProbe

KEYS = [Ed25519PrivateKey.generate() for _ in range(4)]
PUBLIC = [base64.b64encode(k.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)).decode()
          for k in KEYS]
OPERATOR_KEY = Ed25519PrivateKey.generate()
OPERATOR_PUBLIC = base64.b64encode(OPERATOR_KEY.public_key().public_bytes(
    Encoding.Raw, PublicFormat.Raw)).decode()
NAMES = ["p/a", "p/b", "q/c", "bad"]
KEY_IDS = ["k0", "k1", "k2", "k3", "op-key", "static-key"]
REQUESTERS = ["p/op", "p/plain"]  # proven (pinned) and not


def signed(name: str, private, key_id: str, public: str) -> dict:
    frame = {"sender": name, "target": "System", "type": "heartbeat", "payload": "online",
             "timestamp": time.time(), "identity_public_key": public,
             "signature": {"version": 1, "key_id": key_id, "algorithm": "ed25519",
                           "nonce": secrets.token_hex(12), "sequence": 1,
                           "signed_at": time.time()}}
    body = json.dumps(frame, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    frame["signature"]["value"] = base64.b64encode(private.sign(body.encode())).decode()
    return frame


# weighted towards requests that pass every gate, so changes are applied too
reason = st.sampled_from(["lost laptop"] * 5 + ["", "  ", "r" * 501])
requester = st.sampled_from(REQUESTERS[:1] * 3 + REQUESTERS[1:])
name = st.sampled_from(NAMES[:2] * 3 + NAMES[2:])
key_id = st.sampled_from(KEY_IDS[:4] * 3 + KEY_IDS[4:])
ACTIONS = [  # (kind, strategy of its steps)
    ("pin", st.tuples(st.just("pin"), st.sampled_from(NAMES[:2]), st.integers(0, 3))),
    ("reclaim", st.tuples(st.just("reclaim"), requester, name, key_id, reason, st.booleans())),
    ("enroll", st.tuples(st.just("enroll"), requester, name, key_id,
                         st.sampled_from([0, 1, 2, 3, "junk"]),
                         st.sampled_from(["", "", "", "k0", "k1", "k2"]), reason)),
    ("revoke", st.tuples(st.just("revoke"), requester, name, key_id, reason)),
    # aimed at what exists now (the i-th pin, the i-th enrolled key), so that
    # applied changes are as common as refusals
    ("reclaim_live", st.tuples(st.just("reclaim_live"), requester, st.integers(0, 3), reason,
                               st.booleans())),
    ("revoke_live", st.tuples(st.just("revoke_live"), requester, st.integers(0, 5), reason)),
    ("enroll_fresh", st.tuples(st.just("enroll_fresh"), requester, name, st.integers(0, 3),
                               st.booleans(), reason)),
    ("ill_typed", st.tuples(st.just("ill_typed"), st.sampled_from([
        ("identity_pin_reclaim", "break_glass", "yes"),
        ("identity_pin_reclaim", "pin_name", 5),
        ("identity_enroll", "public_key", 7),
        ("identity_enroll", "expires_at", "soon"),
        ("identity_revoke", "reason", ["r"]),
        ("identity_revoke", "name", "x" * 300)]))),
    ("restart", st.tuples(st.just("restart"))),
]
actions = st.one_of(*[st.one_of(*[a for k, a in ACTIONS if k != "restart"])] * 12,
                    st.tuples(st.just("restart")))


class Run:
    def __init__(self, folder: Path):
        self.folder = folder
        self.cm = self.server = None
        self.probes: dict[str, WsProbe] = {}
        self.fresh = 0
        trust = folder / "trust.json"
        trust.write_text(json.dumps({"keys": [{"key_id": "static-key",
                                               "public_key": PUBLIC[3],
                                               "senders": ["p/static"]}]}))
        acl = folder / "acl.json"
        acl.write_text(json.dumps({"rules": [
            {"permission": p, "target_kind": "agent", "target_pattern": "p/*"}
            for p in ("identity-pin-reclaim", "identity-enroll")]}))
        roles = folder / "roles.json"
        roles.write_text(json.dumps({"grants": {"p/identity-enroller": ["p/op", "p/plain"]}}))
        for path in (trust, acl, roles):
            path.chmod(0o600)
        self.security = SecurityConfig(
            identity_trust=trust, acl_policy=acl, role_grants=roles,
            identity_enrollments=folder / "enrolled.json",
            identity_enrollment_namespaces=("p",), identity_enrollment_rate=12)

    async def start(self):
        self.cm = running_hub(self.folder, security=self.security)
        self.server = await self.cm.__aenter__()

    async def stop(self):
        for probe in self.probes.values():
            await probe.close()
        self.probes.clear()
        await self.cm.__aexit__(None, None, None)

    @property
    def projection(self) -> ir.IdentityRecovery:
        return ir.recovery_of(self.server.hub.router.state)

    def snapshot(self) -> ir.IdentityRecovery:
        p = self.projection
        return replace(p, pins=dict(p.pins), enrolled=dict(p.enrolled))

    async def requester(self, name: str) -> WsProbe:
        probe = self.probes.get(name)
        if probe is None or probe.closed is not None:
            probe = await WsProbe.open(self.server.url)
            if name == "p/op":
                await probe.send_json(signed(name, OPERATOR_KEY, "op-key", OPERATOR_PUBLIC))
            else:
                await probe.register(name)
            await probe.recv_type("presence_update", agent=name, timeout=10)
            self.probes[name] = probe
        probe._cursor = len(probe.frames)
        return probe

    async def pin(self, name: str, index: int) -> None:
        probe = await WsProbe.open(self.server.url)
        await probe.send_json(signed(name, KEYS[index], f"k{index}", PUBLIC[index]))
        await probe.recv(lambda f: f.get("type") == "error" or (
            f.get("type") == "presence_update" and f.get("agent") == name), timeout=10)
        await probe.close()

    async def ask(self, requester: str, type_: str, **fields) -> dict:
        probe = await self.requester(requester)
        await probe.send_json({"sender": requester, "target": "System", "type": type_,
                               "payload": "", "timestamp": time.time(), **fields})
        return await probe.recv(lambda f: f.get("type") in (
            "identity_pin_reclaim_result", "identity_enroll_result", "identity_revoke_result",
            "error"), timeout=10)

    async def check(self):
        await flushed(self.server)
        router = self.server.hub.router
        assert await self.server.hub.load_state() == router.state


VERB_OF = {"reclaim": "identity_pin_reclaim", "reclaim_live": "identity_pin_reclaim",
           "enroll": "identity_enroll", "enroll_fresh": "identity_enroll",
           "revoke": "identity_revoke", "revoke_live": "identity_revoke"}


async def scenario(folder: Path, steps) -> set:
    """Runs the steps; returns the (verb, applied) outcomes seen."""
    outcomes = set()
    run = Run(folder)
    await run.start()
    try:
        await run.requester("p/op")  # the operator's key is pinned first
        for step in steps:
            kind = step[0]
            before = run.snapshot()
            answer = None
            if kind == "pin":
                await run.pin(step[1], step[2])
            elif kind == "reclaim":
                _, who, name, key_id, why, glass = step
                answer = await run.ask(who, "identity_pin_reclaim", pin_name=name,
                                       expected_key_id=key_id, reason=why, break_glass=glass)
            elif kind == "enroll":
                _, who, name, key_id, public, expected, why = step
                fields = dict(name=name, key_id=key_id, reason=why,
                              public_key=PUBLIC[public] if public != "junk" else "junk")
                if expected:
                    fields["expected_key_id"] = expected
                answer = await run.ask(who, "identity_enroll", **fields)
            elif kind == "revoke":
                _, who, name, key_id, why = step
                answer = await run.ask(who, "identity_revoke", name=name, key_id=key_id,
                                       reason=why)
            elif kind == "reclaim_live":
                _, who, index, why, glass = step
                pins = sorted(run.projection.pins.items())
                if pins:
                    name, pin = pins[index % len(pins)]
                    answer = await run.ask(who, "identity_pin_reclaim", pin_name=name,
                                           expected_key_id=pin.key_id, reason=why,
                                           break_glass=glass)
            elif kind == "revoke_live":
                _, who, index, why = step
                keys = sorted(run.projection.enrolled.values(), key=lambda k: k.key_id)
                if keys:
                    key = keys[index % len(keys)]
                    answer = await run.ask(who, "identity_revoke", name=key.name,
                                           key_id=key.key_id, reason=why)
            elif kind == "enroll_fresh":  # a new key id; a rotation of the live key
                _, who, name, public, rotate, why = step
                run.fresh += 1
                fields = dict(name=name, key_id=f"f{run.fresh}", reason=why,
                              public_key=PUBLIC[public])
                live = run.projection.live_key(name, time.time())
                if rotate and live is not None:
                    fields["expected_key_id"] = live.key_id
                answer = await run.ask(who, "identity_enroll", **fields)
            elif kind == "ill_typed":
                type_, field, value = step[1]
                answer = await run.ask("p/op", type_, **{field: value})
                assert answer["type"] == "error" and answer["error_code"] == "invalid_field"
            elif kind == "restart":
                await run.check()
                await run.stop()
                await run.start()
                assert run.snapshot() == before
            if answer is not None and not answer.get("applied"):
                assert run.snapshot() == before, answer  # a refusal changed nothing
            if answer is not None and answer.get("applied"):
                assert answer["audit_seq"] is not None
                assert step[1] == "p/op"  # only the proven operator applies a change
            if answer is not None and kind in VERB_OF:
                outcomes.add((VERB_OF[kind], bool(answer.get("applied"))))
            await run.check()
    finally:
        await run.stop()
    return outcomes


def property_for(verb: str, kinds: tuple[str, ...]):
    """One hypothesis property per verb: live state equals a replay after
    every step, a refusal changes nothing; over all examples the verb was
    both applied and refused (the property cannot pass vacuously)."""
    focus = st.one_of(*[a for kind, a in ACTIONS if kind in kinds])
    steps = st.lists(st.one_of(*[focus] * 3, *[a for _, a in ACTIONS]), min_size=3,
                     max_size=20)

    def check():
        seen: set = set()

        @settings(max_examples=30, deadline=None, derandomize=True,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
        @given(steps)
        def run(steps):
            with tempfile.TemporaryDirectory() as folder:
                seen.update(asyncio.run(scenario(Path(folder), steps)))
        run()
        assert {(verb, True), (verb, False)} <= seen, seen
    check.__name__ = f"test_{verb}_state_equals_replay_and_refusals_change_nothing"
    return check


test_identity_pin_reclaim_state_equals_replay_and_refusals_change_nothing = property_for(
    "identity_pin_reclaim", ("reclaim", "reclaim_live"))
test_identity_enroll_state_equals_replay_and_refusals_change_nothing = property_for(
    "identity_enroll", ("enroll", "enroll_fresh"))
test_identity_revoke_state_equals_replay_and_refusals_change_nothing = property_for(
    "identity_revoke", ("revoke", "revoke_live"))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                HealthCheck.data_too_large])
@given(st.lists(actions, min_size=3, max_size=25))
def test_identity_recovery_state_equals_replay_and_refusals_change_nothing(steps):
    with tempfile.TemporaryDirectory() as folder:
        asyncio.run(scenario(Path(folder), steps))

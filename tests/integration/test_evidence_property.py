"""Property, one per verb (guard_denial, entitlement_advert, spend_request):
random sequences of valid and invalid requests, keyed retries and restarts
leave the Router's projection equal to a fresh replay of the journal, and a
refused request changes nothing: neither the journal (last seq, rows) nor
the live projection nor, for spend_request, the owner-only ledger file.

Real in-process hub (the hub's own flags parsed by hubd.cli.load), real
sockets, real SQLite; the spend peer is a real mTLS connection with a
granted peer hub's client certificate.
"""

from __future__ import annotations

import asyncio
import copy
import json
import tempfile
from dataclasses import replace
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from federation.tls import peer_client_context
from hubd.actors.journal_writer import Flush
from hubd.cli import load
from hubd.core.commands import Request
from hubd.server import HubServer
from tests.integration.test_entitlement_advert import ACL, ADVERT
from tests.support.federation import make_pki, site_flags, write_serving_policy
from tests.support.signed_site import SignedProbe, SignedSite, envelope
from tests.support.spend_docs import ledger_file, pool_config, query_doc, reserve_doc, settle_doc
from tests.support.wsprobe import WsProbe

TOKEN = "prop-token-0123456789"
SETTINGS = settings(max_examples=12, deadline=None, derandomize=True,
                    suppress_health_check=list(HealthCheck))


OUTCOMES: list[tuple[str, bool]] = []  # (answer type, accepted) of the property running


def accepted_and_refused(prop):
    """The property, checked to have seen its verb both accepted and refused
    over all its examples (so it cannot pass vacuously)."""
    def check():
        OUTCOMES.clear()
        prop()
        assert {True, False} <= {ok for _, ok in OUTCOMES}, OUTCOMES
    check.__name__ = prop.__name__
    return check


class Hub:
    def __init__(self, folder: Path, flags: list[str]):
        _, config = load(["--db", str(folder / "hub.db"), "--hub-id", "prop", *flags])
        self.config = replace(config, host="127.0.0.1", port=0, quota=None)
        self.server = None

    async def start(self):
        self.server = HubServer(self.config)
        await self.server.start()

    async def stop(self):
        await self.server.stop()
        assert self.server.hub.metrics.handler_crashes == 0

    async def settle(self):
        hub = self.server.hub
        handled = asyncio.get_running_loop().create_future()
        await hub.router.inbox.put(Request(None, "hub.health", {}, handled))
        await handled
        done = asyncio.get_running_loop().create_future()
        await hub.writer.inbox.put(Flush(done))
        await done

    async def snapshot(self):
        """(live projection, replayed projection), after everything is committed."""
        await self.settle()
        return self.server.hub.router.state, await self.server.hub.load_state()


async def exchange(probe: WsProbe, frame: dict, types: tuple[str, ...]) -> dict:
    probe._cursor = len(probe.frames)
    await probe.send_json(frame)
    return await probe.recv(lambda f: f.get("type") in types, timeout=10)


async def run_steps(hub: Hub, connect, steps, ask, accepted, check_extra=lambda: None):
    await hub.start()
    try:
        conn = await connect(hub)
        for step in steps:
            if step == "restart":
                await conn.close()
                await hub.stop()
                await hub.start()
                conn = await connect(hub)
                continue
            live, replayed = await hub.snapshot()
            assert live == replayed
            before_seq, extra = live.last_seq, check_extra()
            answer = await ask(conn, step)
            live, replayed = await hub.snapshot()
            assert live == replayed
            OUTCOMES.append((answer.get("type"), accepted(answer)))
            if not accepted(answer):
                assert live.last_seq == before_seq, (step, answer)
                assert check_extra() == extra, (step, answer)
        await conn.close()
    finally:
        await hub.stop()


# -- guard_denial

SHA = "ab" * 32
guard_steps = st.lists(st.one_of(
    st.fixed_dictionaries({
        "reason_code": st.sampled_from(["GUARD_NO_CLAIM"] * 4 + ["GUARD_TARGET_INVALID", "NOPE"]),
        "provider": st.sampled_from(["claude"] * 4 + ["shell", "vim"]),
        "path_count": st.sampled_from([1] * 6 + [0, 512, 513, -1, True, "1"]),
        "call_sha256": st.sampled_from([SHA] * 6 + [SHA.upper(), "", None]),
        "idem_key": st.sampled_from([None, "k1", "k2"]),
    }),
    st.just("restart")), max_size=14)


@accepted_and_refused
@SETTINGS
@given(steps=guard_steps)
def test_guard_denial_live_equals_replay_and_refusals_change_nothing(steps):
    async def connect(hub):
        probe = await WsProbe.open(hub.server.url)
        await probe.register("claim-hook/a-1", token=TOKEN)
        await probe.recv_type("welcome")
        return probe

    async def ask(probe, step):
        frame = {"sender": "claim-hook/a-1", "target": "SynapseHub", "type": "guard_denial",
                 "actor_sha256": SHA, "scope_sha256": SHA,
                 **{k: v for k, v in step.items() if v is not None}}
        return await exchange(probe, frame, ("guard_denial_recorded", "error"))

    with tempfile.TemporaryDirectory() as folder:
        hub = Hub(Path(folder), ["--token", TOKEN, "--guard-evidence-window-events", "6"])
        asyncio.run(run_steps(hub, connect, steps, ask,
                              lambda a: a["type"] == "guard_denial_recorded"))


# -- entitlement_advert

advert_steps = st.lists(st.one_of(
    st.tuples(st.sampled_from(["team-gpu", "team-cpu", "other"]),
              st.sampled_from([None, None, None, ("schema", 2), ("as_of", "2026-12-02"),
                               ("extra", 1), ("remaining_bucket", "lots")])),
    st.just("restart")), max_size=10)


@accepted_and_refused
@SETTINGS
@given(steps=advert_steps)
def test_entitlement_advert_live_equals_replay_and_refusals_change_nothing(steps):
    async def ask(conn, step):
        alias, change = step
        doc = copy.deepcopy(ADVERT)
        doc["pool_alias"] = alias
        if change is not None:
            key, value = change
            if key == "remaining_bucket":
                doc["windows"][0][key] = value
            else:
                doc[key] = value
        return await exchange(conn.probe, envelope(conn.seat.name, "entitlement_advert",
                                                   advert=doc),
                              ("entitlement_advert_result", "error"))

    with tempfile.TemporaryDirectory() as folder:
        site = SignedSite.make(Path(folder) / "site", None, {"p/owner": []}, ACL)
        hub = Hub(Path(folder), site.flags)

        async def connect(hub):
            return await SignedProbe.open(hub.server.url, site.seats["p/owner"])
        asyncio.run(run_steps(hub, connect, steps, ask, lambda a: a.get("applied") is True))


# -- spend_request

spend_steps = st.lists(st.one_of(
    st.tuples(st.sampled_from(["reserve"] * 3 + ["settle"] * 2 + ["query", "drain"]),
              st.sampled_from(["gpu"] * 3 + ["cpu", "none"]), st.sampled_from(["k1", "k2", ""]),
              st.sampled_from(["1", "4", "5.5", "-1", "x", "1e400"])),
    st.just("restart")), max_size=14)



@accepted_and_refused
@SETTINGS
@given(steps=spend_steps)
def test_spend_request_live_equals_replay_and_refusals_change_nothing(steps):
    granted: dict[str, str] = {}  # key -> the reservation_id its reserve was admitted with

    async def ask(probe, step):
        action, pool, key, amount = step
        if action == "reserve":
            document = reserve_doc(key, amount, pool_id=pool)
        elif action == "settle":
            document = settle_doc(granted.get(key, "rsv-none"), "u-" + amount, amount,
                                  pool_id=pool)
        else:
            document = query_doc(key, pool_id=pool)
        answer = await exchange(probe, {"sender": "east", "target": "System",
                                        "type": "spend_request", "spend_action": action,
                                        "spend": document}, ("spend_result", "error"))
        result = answer.get("spend_result") or {}
        if result.get("admitted") is True:
            granted[key] = result["reservation_id"]
        return answer

    def admitted(answer) -> bool:
        result = answer.get("spend_result") or {}
        return result.get("admitted") is True or result.get("settled") is True

    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        pki = make_pki(root / "pki", ["prop", "east"])
        policy = write_serving_policy(root / "policy", pki, {"east": ["PROJ"]})
        ledger = Path(ledger_file(root, pool_config("gpu", owner="prop", hard_bound="10"),
                                  pool_config("cpu", owner="prop", hard_bound="10",
                                              grantees=(("north", "PROJ"),))))
        hub = Hub(root, [*site_flags(pki, "prop", policy).serve, "--spend-ledger", str(ledger)])

        async def connect(hub):
            context = peer_client_context(pki.file("east", "client", "cert"),
                                          pki.file("east", "client", "key"))
            return await WsProbe.open(hub.server.url.replace("ws://", "wss://"), ssl=context)

        asyncio.run(run_steps(hub, connect, steps, ask, admitted,
                              check_extra=lambda: ledger.read_bytes()))
        # nothing of the ledger ever reached the journal
        import sqlite3
        conn = sqlite3.connect(root / "hub.db")
        try:
            assert conn.execute("SELECT count(*) FROM events WHERE payload LIKE '%pool_id%'"
                                ).fetchone()[0] == 0
        finally:
            conn.close()

"""Property: the hub-to-hub verb `dead_letter_forwarding` at the namespace's
owner (issue 24 item 6; federation/handlers/dead_letter_pointer.py,
docs/dead-letters.md). Random pointers from a granted peer's mutual-TLS link
(good ones for a few targets, and ones for another namespace, another
owner, another origin, with a bad count, an empty target, not an object)
and restarts of the owner: a pointer is journaled and told exactly when a
model says (well formed, owned here, from its own origin, and not the same
peer's pointer for that target within the window, which survives a
restart); one that is not changes neither the journal nor the projection;
after every step the Router's projection equals a fresh replay.
Real in-process hub (its flags parsed by hubd.cli.load), real sockets, real
SQLite, the test CA's certificates."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from federation.tls import peer_client_context
from tests.integration.test_evidence_property import Hub
from tests.support.federation import make_pki, site_flags, write_serving_policy
from tests.support.procs import free_port
from tests.support.wsprobe import WsProbe, joined

POINTER = "dead_letter_forwarding"
VARIANTS = ["good"] * 4 + ["other-namespace", "other-owner", "other-origin", "negative-count",
                           "bool-count", "empty-target", "not-an-object"]

steps_of = st.lists(st.one_of(st.tuples(st.sampled_from(VARIANTS),
                                        st.sampled_from(["PROJ/a", "PROJ/b", "PROJ/c"])),
                              st.just("restart")), min_size=1, max_size=10)


def pointer(variant: str, target: str) -> dict:
    body: object = {"target": target, "count": 3, "origin_hub_id": "east",
                    "owner_hub_id": "west"}
    if variant == "other-namespace":
        body["target"] = "OTHER/" + target.split("/")[1]
    elif variant == "other-owner":
        body["owner_hub_id"] = "north"
    elif variant == "other-origin":
        body["origin_hub_id"] = "north"
    elif variant == "negative-count":
        body["count"] = -1
    elif variant == "bool-count":
        body["count"] = True
    elif variant == "empty-target":
        body["target"] = ""
    elif variant == "not-an-object":
        body = target
    return {"sender": "east", "target": "all", "type": POINTER, "payload": "",
            "forwarding": body}


async def east_link(hub: Hub, pki) -> WsProbe:
    context = peer_client_context(pki.file("east", "client", "cert"),
                                  pki.file("east", "client", "key"))
    link = await WsProbe.open(hub.server.url.replace("ws://", "wss://"), ssl=context)
    await link.send_json({"sender": "east", "target": "System", "type": "heartbeat",
                          "payload": "online", "protocol_version": 6})
    return link


@settings(max_examples=15, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(steps=steps_of)
@example(steps=[("good", "PROJ/a"), ("good", "PROJ/a"), ("other-origin", "PROJ/b"),
                "restart", ("good", "PROJ/a"), ("good", "PROJ/b"), ("not-an-object", "PROJ/c")])
def test_pointers_are_told_as_the_model_says_and_live_equals_replay(steps):
    with tempfile.TemporaryDirectory() as folder:
        asyncio.run(scenario(Path(folder), steps))


async def scenario(root: Path, steps) -> None:
    pki = make_pki(root / "pki", ["east", "west"])
    policy = write_serving_policy(root / "policy", pki, {"east": ["PROJ"]})
    site = site_flags(pki, "west", policy)
    # east is a configured peer that is never up: its pointers come over its
    # inbound link (the test's), as a relay route's would
    hub = Hub(root, ["--hub-id", "west", *site.serve, *site.connect,
                     *site.peer_flags(pki, "east", f"wss://127.0.0.1:{free_port()}/"),
                     "--namespace-owner", "PROJ=west", "--dead-letter-escalation-window", "3600"])
    await hub.start()
    told_targets: set[str] = set()  # the model: (east, target) told within the window
    try:
        for step in steps:
            if step == "restart":
                await hub.stop()
                await hub.start()
                continue
            variant, target = step
            watcher = await joined(hub.server.url, "PROJ/watcher")
            link = await east_link(hub, pki)
            live, replayed = await hub.snapshot()
            assert live == replayed
            before = live.last_seq
            await link.send_json(pointer(variant, target))
            # a round trip on the same link: the pointer before it was handled
            await link.send_json({"sender": "east", "target": "all", "payload": "",
                                  "type": "multihub_log_request", "after_seq": 0, "limit": 1})
            await link.recv_type("multihub_log_snapshot", timeout=10)
            errors = link.seen("error")
            await watcher.send_json({"sender": "PROJ/watcher", "target": "System",
                                     "type": "who_request"})
            await watcher.recv_type("who_snapshot")
            told = [f["forwarding_target"] for f in watcher.seen(POINTER)]
            await link.close()
            await watcher.close()
            live, replayed = await hub.snapshot()
            assert live == replayed
            expected = variant == "good" and target not in told_targets
            if expected:
                told_targets.add(target)
                assert told == [target] and errors == [], (step, told, errors)
                assert live.last_seq > before
            else:
                assert told == [], (step, told)
                assert live.last_seq == before, step
                # every refusal but a repeat (fire-and-forget) is a typed error
                assert bool(errors) == (variant != "good"), (step, errors)
    finally:
        await hub.stop()

"""When a hub that accepts a forward answers the forwarding peer, relative to
delivering the chat to its own recipients (both only after the commit): with
no consume-live recipient the verdict is known at routing and the answer is
handed out first; with a live one the answer reports a completed write, so it
follows the chat (docs/receipts.md, "Forwarded chats").

West runs in-process (a real HubServer serving pinned mTLS with a serving
policy, its config built by the `hubd` command line's own parser; a PKI made
by `hubd certs`); the forwarding peer is a raw mTLS WebSocket presenting
east's client certificate, and bob a WebSocket agent. Across two sockets the
order the frames arrive in proves nothing, so the test notes the order in
which the journal writer's release hands them to the two endpoints (each
endpoint's own deliver, wrapped), and checks that both frames still arrive.
"""

from __future__ import annotations

import asyncio

from federation.tls import peer_client_context
from hubd.cli import build_parser, config_from_args
from hubd.timing import Timing
from tests.support.federation import make_pki, site_flags, write_serving_policy
from tests.support.inproc import running_hub
from tests.support.wsprobe import WsProbe, joined


def west_federation(pki, policy):
    """West's FederationConfig, built as `hubd --multihub-serving-policy ...` builds it."""
    parser = build_parser()
    args = parser.parse_args(["--hub-id", "west", *site_flags(pki, "west", policy).serve])
    return config_from_args(args, parser).federation


def noting(endpoint, who: str, handed: list) -> None:
    deliver = endpoint.deliver

    def noted(message) -> None:
        handed.append((who, message.type))
        deliver(message)
    endpoint.deliver = noted


def forward(forward_id: str, payload: str) -> dict:
    return {"forward_id": forward_id, "kind": "chat", "sender_seat": "PROJ/alice",
            "target_seat": "PROJ/bob", "body": {"payload": payload}}


async def exchange(peer, bob, handed: list, tag: str) -> tuple[list, dict, dict]:
    """One forward and one batch of two to bob; the order their frames were
    handed to the two endpoints."""
    del handed[:]
    await peer.send_json({"sender": "east", "target": "System",
                          "type": "multihub_message_forward", **forward(f"{tag}-one", "one")})
    answer = await peer.recv_type("multihub_message_result", forward_id=f"{tag}-one", timeout=10)
    assert answer["disposition"] == "accepted"
    await bob.recv_type("chat", forward_id=f"{tag}-one", timeout=10)
    await peer.send_json({"sender": "east", "target": "System",
                          "type": "multihub_message_forward_batch", "payload": "",
                          "forwards": [forward(f"{tag}-two", "two"),
                                       forward(f"{tag}-three", "three")]})
    batch = await peer.recv(lambda f: f.get("type") == "multihub_message_result_batch" and
                            f["results"][0]["forward_id"] == f"{tag}-two", timeout=10)
    assert [r["disposition"] for r in batch["results"]] == ["accepted", "accepted"]
    await bob.recv_type("chat", forward_id=f"{tag}-two", timeout=10)
    await bob.recv_type("chat", forward_id=f"{tag}-three", timeout=10)
    return [h for h in handed if h[1] in (
        "chat", "multihub_message_result", "multihub_message_result_batch")], answer, batch


async def test_the_answer_precedes_the_deliveries_only_when_no_write_is_awaited(tmp_path):
    pki = make_pki(tmp_path / "pki", ["east", "west"])
    policy = write_serving_policy(tmp_path / "west-policy", pki, {"east": ["PROJ"]})
    # a two-second reaction window, so bob goes stale in a test's time
    async with running_hub(tmp_path, hub_id="west", redsyn=False,
                           timing=Timing(reaction_window=2.0, waiter_window=2.0),
                           federation=west_federation(pki, policy)) as west:
        bob = await joined(west.url, "PROJ/bob")
        peer = await WsProbe.open(west.url, ssl=peer_client_context(
            pki.file("east", "client", "cert"), pki.file("east", "client", "key")))
        try:
            await peer.send_json({"sender": "east", "target": "System", "type": "heartbeat",
                                  "protocol_version": 5})
            await peer.recv_type("welcome")
            endpoints = {e.id: e for e in west.hub.endpoints}
            sessions = west.hub.router.presence.sessions
            bob_endpoint = next(i for i, s in sessions.items() if s.name == "PROJ/bob")
            handed: list = []
            noting(endpoints[bob_endpoint], "bob", handed)
            for endpoint_id, endpoint in endpoints.items():
                if endpoint_id != bob_endpoint:
                    noting(endpoint, "east", handed)

            # bob just registered: live; each answer waits for the write to him
            order, answer, batch = await exchange(peer, bob, handed, "live")
            assert answer["result"]["delivered"] is True
            assert all(r["result"]["delivered"] for r in batch["results"])
            assert order == [
                ("bob", "chat"), ("east", "multihub_message_result"),
                ("bob", "chat"), ("bob", "chat"), ("east", "multihub_message_result_batch")]

            # bob reacts to nothing: stale, decided at routing, answered first
            session = sessions[bob_endpoint]
            while west.hub.router.now - session.last_reaction <= 2.0:
                await asyncio.sleep(0.2)
            order, answer, batch = await exchange(peer, bob, handed, "stale")
            assert answer["result"]["reason"] == "no_live_recipient"
            assert [r["result"]["reason"] for r in batch["results"]] == ["no_live_recipient"] * 2
            assert order == [
                ("east", "multihub_message_result"), ("bob", "chat"),
                ("east", "multihub_message_result_batch"), ("bob", "chat"), ("bob", "chat")]
        finally:
            await peer.close()
            await bob.close()

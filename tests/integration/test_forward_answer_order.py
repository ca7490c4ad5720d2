"""A hub that accepts a forward answers the forwarding peer before it delivers
the chat to its own recipients (both only after the commit).

West runs in-process (a real HubServer serving pinned mTLS with a serving
policy, its config built by the `hubd` command line's own parser; a PKI made
by `hubd certs`); the forwarding peer is a raw mTLS WebSocket presenting
east's client certificate, and bob a WebSocket agent. Across two sockets the
order the frames arrive in proves nothing, so the test notes the order in
which the journal writer's release hands them to the two endpoints (each
endpoint's own deliver, wrapped), and checks that both frames still arrive.
"""

from __future__ import annotations

from federation.tls import peer_client_context
from hubd.cli import build_parser, config_from_args
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


async def test_the_answer_is_handed_out_before_the_local_deliveries(tmp_path):
    pki = make_pki(tmp_path / "pki", ["east", "west"])
    policy = write_serving_policy(tmp_path / "west-policy", pki, {"east": ["PROJ"]})
    async with running_hub(tmp_path, hub_id="west", redsyn=False,
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

            await peer.send_json({"sender": "east", "target": "System",
                                  "type": "multihub_message_forward", **forward("f-one", "one")})
            answer = await peer.recv_type("multihub_message_result", timeout=10)
            assert answer["forward_id"] == "f-one" and answer["disposition"] == "accepted"
            await bob.recv_type("chat", payload="one")

            await peer.send_json({"sender": "east", "target": "System",
                                  "type": "multihub_message_forward_batch", "payload": "",
                                  "forwards": [forward("f-two", "two"),
                                               forward("f-three", "three")]})
            batch = await peer.recv_type("multihub_message_result_batch", timeout=10)
            assert [r["disposition"] for r in batch["results"]] == ["accepted", "accepted"]
            await bob.recv_type("chat", payload="two")
            await bob.recv_type("chat", payload="three")

            of_the_forwards = [h for h in handed if h[1] in (
                "chat", "multihub_message_result", "multihub_message_result_batch")]
            assert of_the_forwards == [
                ("east", "multihub_message_result"), ("bob", "chat"),
                ("east", "multihub_message_result_batch"), ("bob", "chat"), ("bob", "chat")]
        finally:
            await peer.close()
            await bob.close()

"""Resource offers on real hub processes: typed refusals of what the wire
or the decision does not take (nothing stored), offers signed under
--require-message-auth (docs/resources.md). The reference's answers, the
broadcast, replacement, quota and restart: tests/interop/test_resources_interop.py."""

from __future__ import annotations

import asyncio

from tests.support.procs import hubd_process
from tests.support.signed_site import SignedProbe, envelope, mac, start_signed_hub
from tests.support.wsprobe import joined


async def _answer(probe, sender: str, **fields) -> dict:
    await probe.send_json({"sender": sender, "target": "all", "type": "resource", "payload": "",
                           **fields})
    return await probe.recv(lambda f: f.get("type") in ("resource_offered", "error"))


def test_bad_offers_are_refused_with_their_reason_and_store_nothing(tmp_path):
    hub = hubd_process(tmp_path / "hub").start()
    try:
        async def scenario():
            alice = await joined(hub.url, "p/alice")
            refusals = {
                "kind a number": ({"kind": 5, "name": "x"},
                                  "Malformed frame: 'kind' must be a string of at most 256 bytes."),
                "capacity text": ({"kind": "g", "name": "x", "capacity": "lots"},
                                  "Malformed frame: 'capacity' must be an integer."),
                "capacity -1": ({"kind": "g", "name": "x", "capacity": -1},
                                "resource offer capacity must be a whole number of at least 1"),
                "meta a list": ({"kind": "g", "name": "x", "meta": [1]},
                                "Malformed frame: 'meta' must be an object."),
                "meta too big": ({"kind": "g", "name": "x", "meta": {"b": "x" * 5000}},
                                 "resource offer meta must be an object of at most 4096 bytes"),
                "no name": ({"kind": "g"}, "resource offer requires kind+name"),
            }
            for label, (fields, text) in refusals.items():
                got = await _answer(alice, "p/alice", **fields)
                assert (got["type"], got["payload"]) == ("error", text), label
            await alice.send_json({"sender": "p/alice", "target": "System",
                                   "type": "state_request"})
            snap = await alice.recv_type("state_snapshot")
            assert snap["snapshot"]["resources"] == []
            await alice.close()
        asyncio.run(scenario())
        metrics = hub.get_text("/metrics")
        assert "hubd_resource_refusals_total 3.0" in metrics  # the three the decision refused
    finally:
        hub.stop()


def test_under_message_auth_an_offer_must_be_signed(tmp_path):
    name = "p/alice"
    # the signed site requires the ACL too: the reference's generic gate for a
    # resource offer is `board` on resource:*
    site = start_signed_hub("hubd", tmp_path, {name: []}, [
        {"permission": "board", "target_kind": "resource", "target_pattern": "*"}],
        reference_files=False)
    try:
        async def scenario():
            conn = await SignedProbe.open(site.proc.url, site.seats[name])
            unsigned = envelope(name, "resource", target="all", kind="gpu", name="a100")
            await conn.probe.send_json(unsigned)
            got = await conn.probe.recv(lambda f: f.get("type") in ("resource_offered", "error"))
            assert (got["type"], got.get("verification_result")) == ("error", "missing"), got
            await conn.probe.send_json(mac(unsigned, conn.seat.mac_kid))
            got = await conn.probe.recv(lambda f: f.get("type") in ("resource_offered", "error"))
            assert (got["type"], got.get("agent"), got.get("key")) == \
                ("resource_offered", name, f"{name}:gpu:a100"), got
            await conn.close()
        asyncio.run(scenario())
    finally:
        site.proc.stop()

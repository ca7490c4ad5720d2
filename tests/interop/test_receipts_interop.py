"""Consume-live receipts side by side: hubd and the reference hub, each with a
three-second --recipient-liveness-window, give the reference client the same
verdicts for a fresh and for an idle (keepalives only) recipient."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import pytest

from tests.support.procs import hubd_process, reference_hub_process
from tests.support.wsprobe import WsProbe

# long enough for one `synapse send` after bob's reaction (the reference CLI's
# start alone is ~2 CPU-s, 5 s or more on a busy 2-core machine: with 3 s the
# "just registered, so live" send failed there), short enough to wait out
WINDOW_SECONDS = 8
WINDOW = ["--recipient-liveness-window", str(WINDOW_SECONDS)]
HUB_ID = "iop-east"


@dataclass
class QuickHub:
    kind: str
    proc: object

    @property
    def url(self) -> str:
        return self.proc.url


@pytest.fixture(params=["reference", "hubd"])
def quick_stale_hub(request, tmp_path):
    if request.param == "reference":
        request.getfixturevalue("reference_venv_status")
        proc = reference_hub_process(tmp_path / "ref", "--no-durable-ingress-quota", *WINDOW,
                                     hub_id=HUB_ID)
    else:
        proc = hubd_process(tmp_path / "hubd", *WINDOW, hub_id=HUB_ID)
    proc.start()
    yield QuickHub(request.param, proc)
    proc.stop()


async def _liveness(url: str, name: str) -> dict:
    async with WsProbe.connect(url) as probe:
        await probe.recv_type("welcome")
        await probe.register("iop/looker")
        await probe.send_json({"sender": "iop/looker", "target": "System",
                               "type": "who_request"})
        return (await probe.recv_type("who_snapshot"))["agent_liveness"].get(name, {})


def test_an_idle_recipient_is_stale_on_both_hubs(quick_stale_hub, make_ref):
    hub = quick_stale_hub
    ref = make_ref(hub)
    bob = ref.agent("iop/bob")
    bob.send("who_request")  # a reaction: bob is live for the window
    fresh = ref.send("iop/bob", "are you there", "--require-recipient")
    assert fresh.returncode == 0, str(fresh)  # a just-registered recipient is live
    # the reference client's agent sends only keepalives while idle
    deadline = time.monotonic() + 30
    while asyncio.run(_liveness(hub.url, "iop/bob")).get("proven_live", True):
        assert time.monotonic() < deadline, "bob never went stale"
        time.sleep(0.3)
    entry = asyncio.run(_liveness(hub.url, "iop/bob"))
    assert entry["has_live_waiter"] is False and entry["last_reaction_age"] > WINDOW_SECONDS
    since = bob.mark()
    alice = ref.agent("iop/alice")
    mark = alice.mark()
    alice.send("chat", target="iop/bob", payload="still there?", receipt_requested=True,
               client_msg_id="st-1")
    receipt = alice.wait_frame(type="delivery_receipt", client_msg_id="st-1", since=mark)
    assert receipt["delivered"] is False and receipt["reason"] == "no_live_recipient", receipt
    assert receipt["dead_lettered"] is True, receipt
    assert receipt["matched_recipients"] == ["iop/bob"], receipt
    assert receipt["stale_recipients"] == ["iop/bob"], receipt
    warning = alice.wait_frame(type="recipient_liveness_warning", since=mark)
    assert warning["stale_recipients"] == ["iop/bob"] and warning["message_target"] == "iop/bob"
    # the chat still reached bob's socket (best effort)
    bob.wait_frame(type="chat", payload="still there?", since=since)

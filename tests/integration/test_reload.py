"""SIGHUP: rotate west's server certificate and east's pins while agents stay
connected; forwarding goes on. A broken policy file is refused, the old one kept."""

import asyncio
import json
import signal
import subprocess
import sys

from tests.support.federation import make_pki, site_flags, write_serving_policy
from tests.support.procs import hubd_process
from tests.support.wsprobe import WsProbe
from tests.support.waiting import wait_for


def link(east):
    return east.get_json("/health")["message_forward"]["west"]


def metric(hub, name):
    import ssl
    import urllib.request
    context = ssl._create_unverified_context()  # the test PKI's self-signed CA
    text = urllib.request.urlopen(hub.http_url + "/metrics", timeout=5,
                                  context=context).read().decode()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def test_rotation_and_broken_policy_under_sighup(tmp_path):
    pki = make_pki(tmp_path / "pki", ["east", "west"])
    policy = write_serving_policy(tmp_path / "west-policy", pki, {"east": ["PROJ"]})
    west = hubd_process(tmp_path / "west", *site_flags(pki, "west", policy).serve, hub_id="west",
                        scheme="wss")
    west.start()
    old_pin = pki.server_pin("west")
    pins = tmp_path / "east-west.pins"
    pins.write_text(f"# west's server certificate\n{old_pin}\n")
    east = hubd_process(tmp_path / "east", "--message-peer", f"west=wss://127.0.0.1:{west.port}/",
                        "--message-peer-pin", f"west=@{pins}",
                        *site_flags(pki, "east", None).connect, hub_id="east")
    east.start()

    async def scenario():
        bob = await WsProbe.open(west.url)
        await bob.register("PROJ/bob")
        await bob.recv_type("presence_update", agent="PROJ/bob")
        alice = await WsProbe.open(east.url)
        await alice.register("PROJ/alice")
        await alice.recv_type("presence_update", agent="PROJ/alice")

        async def across(text):
            await alice.chat("PROJ/alice", "PROJ/bob@west", text, receipt_requested=True)
            await bob.recv_type("chat", payload=text, timeout=15)
            receipt = await alice.recv_type("delivery_receipt", timeout=15)
            assert receipt["delivered"] is True, receipt

        await across("before rotation")
        connects = link(east)["connects"]

        # 1. east learns the new pin beside the old one
        out = subprocess.run([sys.executable, "-m", "hubd", "certs", "server", "--dir",
                              str(pki.folder), "--hub-id", "west", "--force", "--json"],
                             check=True, capture_output=True, text=True).stdout
        new_pin = json.loads(out)["pins"]["sha256"]
        assert new_pin != old_pin
        pins.write_text(f"{old_pin}\n{new_pin}\n")
        east.signal(signal.SIGHUP)
        wait_for(lambda: metric(east, "hubd_config_reloads_total") == 1)
        # 2. west serves the new certificate to new connections
        west.signal(signal.SIGHUP)
        wait_for(lambda: metric(west, "hubd_config_reloads_total") == 1)
        await across("both pins")
        # 3. east drops the old pin: its live link (old certificate) is closed and
        # comes back against the new certificate
        pins.write_text(f"{new_pin}\n")
        east.signal(signal.SIGHUP)
        wait_for(lambda: metric(east, "hubd_config_reloads_total") == 2)
        wait_for(lambda: link(east)["connects"] > connects and link(east)["link"] == "up")
        await across("after rotation")

        # a broken policy file is refused and the old policy keeps working
        policy.write_text("{not json")
        west.signal(signal.SIGHUP)
        wait_for(lambda: metric(west, "hubd_config_reload_failures_total") == 1)
        assert "reload refused" in west.log()
        await across("old policy kept")
        # the agents never reconnected
        assert alice.closed is None and bob.closed is None
        for probe in (alice, bob):
            await probe.close()

    try:
        asyncio.run(scenario())
    finally:
        east.stop()
        west.stop()

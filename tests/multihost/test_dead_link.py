"""A black-holed link between two hubs in network namespaces: an nftables
drop rule between east and west while chats flow (no error, no reset: the
packets vanish). East notices the silence (pings unanswered), closes the link
and redials; after the rule is lifted everything arrives once and east's
backlog drains. East's /health and /metrics say what happened."""

import json
import subprocess
import time

from tests.support.federation import make_pki, site_flags, write_serving_policy
from tests.support.netns import Topology, require_nft
from tests.support.sitecmd import REPO, driver, env, python

PORT = 8876
COUNT = 200  # at 20 chats/s: 10 s of sending


def get(topo, site, path):
    return topo.run(site, driver("get", "--url", f"http://127.0.0.1:{PORT}{path}"),
                    timeout=10).stdout


def metric(text, name, peer="west"):
    for line in text.splitlines():
        if line.startswith(f'{name}{{peer="{peer}"}}'):
            return float(line.rsplit(" ", 1)[1])
    return None


def wait_for(what, check, timeout=60.0):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_black_holed_link_is_noticed_redialled_and_drained(tmp_path):
    require_nft()
    pki = make_pki(tmp_path / "pki", ["east", "west"])
    policy = write_serving_policy(tmp_path / "west-policy", pki, {"east": ["PROJ"]})
    with Topology() as topo:
        topo.link("east", "west", "203.0.113.0/30")
        west_addr = topo.addr("west", "east-west")
        west = topo.popen("west", python(
            "-m", "hubd", "--host", "0.0.0.0", "--port", str(PORT), "--db",
            str(tmp_path / "west.db"), "--hub-id", "west", "--no-durable-ingress-quota", "--no-broker",
            *site_flags(pki, "west", policy).serve), cwd=REPO, env=env(),
            stdout=open(tmp_path / "west.log", "w"), stderr=open(tmp_path / "west.err", "w"))
        east = topo.popen("east", python(
            "-m", "hubd", "--host", "127.0.0.1", "--port", str(PORT), "--db",
            str(tmp_path / "east.db"), "--hub-id", "east", "--no-durable-ingress-quota", "--no-broker",
            *site_flags(pki, "east", None).connect,
            "--message-peer", f"west=wss://{west_addr}:{PORT}/",
            "--message-peer-pin", f"west={pki.server_pin('west')}"), cwd=REPO, env=env(),
            stdout=open(tmp_path / "east.log", "w"), stderr=open(tmp_path / "east.err", "w"))

        def link():
            try:
                return json.loads(get(topo, "east", "/health"))["message_forward"]["west"]
            except Exception:  # east not listening yet
                return None
        wait_for("east's link to west", lambda: (link() or {}).get("link") == "up")
        receiver = topo.popen("west", driver(
            "receive", "--url", f"wss://127.0.0.1:{PORT}/", "--name", "PROJ/bob",
            "--expect", str(COUNT), "--timeout", "120", "--linger", "2"),
            cwd=REPO, env=env(), stdout=subprocess.PIPE, text=True)
        assert json.loads(receiver.stdout.readline())["event"] == "ready"
        sender = topo.popen("east", driver(
            "send", "--url", f"ws://127.0.0.1:{PORT}/", "--name", "PROJ/alice",
            "--target", "PROJ/bob@west", "--count", str(COUNT), "--rate", "20",
            "--timeout", "120"), cwd=REPO, env=env(), stdout=subprocess.PIPE, text=True)
        wait_for("a first forward accepted", lambda: (link() or {}).get("last_success"))
        topo.block("east", "west")
        down = wait_for("east to notice the silent link", lambda: (
            lambda e: e if e and e["link"] == "down" and e["silence_closes"] >= 1 else None)(
            link()))
        # last_error may already be the next dial's (a connect timeout while
        # still cut); the silence close itself is in the log.
        assert down["last_error"]["cause"] in ("silent", "timeout"), down
        assert "cause=silent" in (tmp_path / "east.err").read_text()
        assert "pings unanswered" in (tmp_path / "east.err").read_text()
        wait_for("a backlog while cut", lambda: link()["pending"] > 0)
        cut_metrics = get(topo, "east", "/metrics")
        assert metric(cut_metrics, "hubd_peer_link_up") == 0
        assert metric(cut_metrics, "hubd_peer_link_stalled") == 0  # down is not stalled
        heard_before = metric(cut_metrics, "hubd_peer_last_inbound_timestamp_seconds")
        topo.unblock("east", "west")

        sent_out, _ = sender.communicate(timeout=180)
        out, _ = receiver.communicate(timeout=180)
        done = json.loads(out.splitlines()[-1])
        assert done == {"event": "done", "unique": COUNT, "duplicates": 0}, done
        receipts = [json.loads(line) for line in sent_out.splitlines()
                    if json.loads(line).get("event") == "receipts"][0]
        states = receipts["states"]
        assert states.get("accepted", 0) + states.get("duplicate", 0) == COUNT, receipts
        wait_for("east's backlog to drain", lambda: link()["pending"] == 0)
        after = link()
        assert after["link"] == "up" and after["stalled"] is False
        assert after["connects"] >= 2
        metrics = get(topo, "east", "/metrics")
        assert metric(metrics, "hubd_peer_link_up") == 1
        assert metric(metrics, "hubd_peer_last_inbound_timestamp_seconds") > heard_before
        assert metric(metrics, "hubd_forward_last_success_timestamp_seconds") > heard_before
        assert metric(metrics, "hubd_peer_link_silence_closes_total") >= 1
        topo.stop(east)
        topo.stop(west)
    for hub in ("east", "west"):
        log = (tmp_path / f"{hub}.err").read_text()
        assert "handler failed" not in log and "Traceback" not in log, log[-3000:]

"""Two hubs in two network namespaces joined by a veth link: the seed's
complete agent (REDSYN, HTTP only) serves at west; a REDSYN agent at east asks
it through east's hub, which forwards to west (west owns the namespace), and
the reply comes back the same way, over a link between the two organizations
their admins agreed first."""

import json
import os
import sys
import time
from pathlib import Path

from tests.support.federation import make_pki, site_flags, write_serving_policy
from tests.support.netns import Topology, require_netns
from tests.support.redsyn_client import login
from tests.support.redsyn_link import org_with_admin
from tests.support.sitecmd import REPO, env

PORT = 8876


def wait_for_line(path: Path, text: str, proc, timeout=60.0):
    deadline = time.monotonic() + timeout
    while text not in (path.read_text() if path.exists() else ""):
        assert proc.poll() is None, path.read_text()
        assert time.monotonic() < deadline, f"no {text!r} in {path}"
        time.sleep(0.1)


ADMINS = {"east": ("acme", "acme/it/ivan"), "west": ("globex", "globex/it/gus")}


def organization(db, site: str) -> str:
    """The site's organization and its admin; the admin's token."""
    org, admin = ADMINS[site]
    token = login(db, admin, "laptop")
    org_with_admin(db, org, admin)
    return token


def agree_link(topo, admins: dict, ca: str):
    """acme's admin at east proposes a link to globex, globex's at west accepts
    it (each step run in its site's namespace; the first ones retried until
    the hub there answers): nothing crosses organizations without one.
    Returns the step runner and the link's id."""
    relay = f"https://127.0.0.1:{PORT}/redsyn/v1"

    def run(site: str, *args) -> dict:
        for _ in range(120):
            done = topo.run(site, [sys.executable, "-m", "tests.support.redsyn_link", relay,
                                   admins[site], *args],
                            check=False, timeout=120, cwd=REPO, env=env(REDSYN_CA=ca))
            if done.returncode == 0:
                return json.loads(done.stdout)
            time.sleep(0.5)
        raise AssertionError(done.stderr[-2000:])

    link = run("east", "propose", "acme", "globex")["id"]
    run("west", "wait", link, "proposed")
    run("west", "accept", link, json.dumps({"expose": ["globex"], "signed_only": False}))
    run("east", "wait", link, "active")
    return run, link



def test_a_redsyn_agent_asks_the_complete_agent_at_another_site(tmp_path):
    require_netns()
    pki = make_pki(tmp_path / "pki", ["east", "west"])
    grants = {"east": {"west": ["acme"]}, "west": {"east": ["globex"]}}
    people = {"east": "acme/general/ana", "west": "globex/erp/bob"}
    with Topology() as topo:
        topo.link("east", "west", "203.0.113.8/30")
        tokens, hubs, admins = {}, {}, {}
        for site, peer in (("west", "east"), ("east", "west")):
            db = tmp_path / f"{site}.db"
            tokens[site] = login(db, people[site], "box")
            admins[site] = organization(db, site)
            policy = write_serving_policy(tmp_path / f"{site}-policy", pki, grants[site])
            flags = site_flags(pki, site, policy)
            hubs[site] = topo.popen(site, [
                sys.executable, "-m", "hubd", "--host", "0.0.0.0", "--port", str(PORT),
                "--db", str(db), "--hub-id", site, "--no-broker", *flags.serve, *flags.connect,
                "--message-peer", f"{peer}=wss://{topo.addr(peer, 'east-west')}:{PORT}/",
                "--message-peer-pin", f"{peer}={pki.server_pin(peer)}",
                "--namespace-owner", "acme=east", "--namespace-owner", "globex=west"],
                cwd=REPO, env=env(), stdout=open(tmp_path / f"{site}.log", "w"),
                stderr=open(tmp_path / f"{site}.err", "w"))
        ca = str(pki.folder / "ca.pem")
        relay = f"https://127.0.0.1:{PORT}/redsyn/v1"
        agent_out = tmp_path / "agent.out"
        agent = None
        for _ in range(120):  # west's hub takes a while to start on a loaded box
            if agent is None or agent.poll() is not None:
                agent = topo.popen("west", [
                    sys.executable, str(REPO / "tests/support/redsyn_complete_agent.py")],
                    env=env(REDSYN_RELAY=relay, REDSYN_TOKEN=tokens["west"], REDSYN_CA=ca,
                            REDSYN_ME="globex/erp/bob/shout"),
                    stdout=open(agent_out, "w"), stderr=open(tmp_path / "agent.err", "w"))
            time.sleep(0.5)
            if "announced: 200" in agent_out.read_text():
                break
        wait_for_line(agent_out, "announced: 200", agent)
        step, link = agree_link(topo, admins, ca)
        asked = None
        for _ in range(60):  # until east's hub answers
            asked = topo.run("east", [sys.executable, "-m", "tests.support.redsyn_ask", relay,
                                      tokens["east"], "cli", "globex/erp/bob/shout",
                                      "hello west"],
                             check=False, timeout=200, cwd=REPO, env=env(REDSYN_CA=ca))
            if asked.returncode == 0 or '"sent"' in asked.stdout:
                break
            time.sleep(0.5)
        assert asked.returncode == 0, (asked.stdout, asked.stderr[-2000:],
                                       (tmp_path / "east.log").read_text()[-2000:])
        out = [json.loads(line) for line in asked.stdout.splitlines() if line.startswith("{")]
        sent = out[0]["sent"]
        reply = out[-1]["reply"]
        assert sent["to"] == "globex/erp/bob/shout@west"
        assert reply["kind"] == "reply" and reply["body"]["text"] == "HELLO WEST"
        assert reply["from"] == "globex/erp/bob/shout@west" and reply["to"] == sent["from"]
        assert "answered" in agent_out.read_text()
        # globex suspends at west; once east has it, east refuses at once
        step("west", "suspend", link)
        step("east", "wait", link, "suspended")
        refused = topo.run("east", [sys.executable, "-m", "tests.support.redsyn_ask", relay,
                                    tokens["east"], "cli", "globex/erp/bob/shout", "again"],
                           check=False, timeout=120, cwd=REPO, env=env(REDSYN_CA=ca))
        assert refused.returncode != 0 and "403" in refused.stderr, refused.stderr[-2000:]
        # globex resumes it at west: once east has it, the same ask crosses again
        step("west", "resume", link)
        step("east", "wait", link, "active")
        again = topo.run("east", [sys.executable, "-m", "tests.support.redsyn_ask", relay,
                                  tokens["east"], "cli", "globex/erp/bob/shout", "again"],
                         check=False, timeout=120, cwd=REPO, env=env(REDSYN_CA=ca))
        assert again.returncode == 0, (again.stdout, again.stderr[-2000:])
        replies = [json.loads(line) for line in again.stdout.splitlines() if line.startswith("{")]
        assert replies[-1]["reply"]["body"]["text"] == "AGAIN"
        # acme ends it at east: west has it ended too, and east refuses once more
        step("east", "end", link)
        step("west", "wait", link, "ended")
        ended = topo.run("east", [sys.executable, "-m", "tests.support.redsyn_ask", relay,
                                  tokens["east"], "cli", "globex/erp/bob/shout", "over"],
                         check=False, timeout=120, cwd=REPO, env=env(REDSYN_CA=ca))
        assert ended.returncode != 0 and "403" in ended.stderr, ended.stderr[-2000:]


def test_a_redsyn_agent_and_a_websocket_agent_at_different_sites(tmp_path):
    """The reference client's agent holds a seat at west; a REDSYN agent at
    east asks it; the WebSocket agent's chat back is the REDSYN reply."""
    import subprocess

    from tests.support.procs import reference_venv
    from tests.support.refclient import DRIVER, RefAgent

    require_netns()
    pki = make_pki(tmp_path / "pki", ["east", "west"], sans=["127.0.0.1"])
    grants = {"east": {"west": ["acme"]}, "west": {"east": ["globex"]}}
    with Topology() as topo:
        topo.link("east", "west", "203.0.113.12/30")
        tokens, admins = {}, {}
        for site, peer in (("west", "east"), ("east", "west")):
            db = tmp_path / f"{site}.db"
            if site == "east":
                tokens[site] = login(db, "acme/general/ana", "box")
            admins[site] = organization(db, site)
            policy = write_serving_policy(tmp_path / f"{site}-policy", pki, grants[site])
            flags = site_flags(pki, site, policy)
            topo.popen(site, [
                sys.executable, "-m", "hubd", "--host", "0.0.0.0", "--port", str(PORT),
                "--db", str(db), "--hub-id", site, "--no-broker", *flags.serve, *flags.connect,
                "--message-peer", f"{peer}=wss://{topo.addr(peer, 'east-west')}:{PORT}/",
                "--message-peer-pin", f"{peer}={pki.server_pin(peer)}",
                "--namespace-owner", "acme=east", "--namespace-owner", "globex=west"],
                cwd=REPO, env=env(), stdout=open(tmp_path / f"{site}.log", "w"),
                stderr=open(tmp_path / f"{site}.err", "w"))
        ca = str(pki.folder / "ca.pem")
        home = tmp_path / "ref-home"
        home.mkdir()
        ref_env = dict(os.environ, HOME=str(home), SSL_CERT_FILE=ca, PYTHONUNBUFFERED="1")
        ref_env.pop("PYTHONPATH", None)
        agent = None
        for _ in range(120):  # until west's hub is up
            err = tmp_path / "ws-agent.err"
            proc = topo.popen("west", [
                str(reference_venv() / "bin" / "python"), str(DRIVER), "--uri",
                f"wss://127.0.0.1:{PORT}/", "--name", "globex/erp/bob/ws"],
                env=ref_env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=open(err, "w"),
                text=True, bufsize=1)
            proc.stderr_path = err
            candidate = RefAgent(proc, "globex/erp/bob/ws")
            try:
                candidate.wait_ready(timeout=10)
                candidate.wait_registered()
                agent = candidate
                break
            except AssertionError:
                proc.kill()
                time.sleep(0.5)
        assert agent is not None, (tmp_path / "ws-agent.err").read_text()[-2000:]
        agree_link(topo, admins, ca)
        relay = f"https://127.0.0.1:{PORT}/redsyn/v1"
        asked_out = tmp_path / "ask.out"
        asker = None
        for _ in range(60):
            asker = topo.popen("east", [sys.executable, "-m", "tests.support.redsyn_ask", relay,
                                        tokens["east"], "cli", "globex/erp/bob/ws", "hello ws"],
                               cwd=REPO, env=env(REDSYN_CA=ca), stdout=open(asked_out, "w"),
                               stderr=open(tmp_path / "ask.err", "w"))
            deadline = time.monotonic() + 20
            while asker.poll() is None and '"sent"' not in asked_out.read_text() \
                    and time.monotonic() < deadline:
                time.sleep(0.1)
            if '"sent"' in asked_out.read_text():
                break
            asker.kill()
            time.sleep(0.5)
        chat = agent.wait_frame(type="chat", sender="acme/general/ana/cli@east", timeout=60)
        assert chat["payload"] == "hello ws"
        agent.chat("acme/general/ana/cli@east", "HELLO WS")
        asker.wait(timeout=150)
        out = [json.loads(line) for line in asked_out.read_text().splitlines()
               if line.startswith("{")]
        sent, reply = out[0]["sent"], out[-1]["reply"]
        assert sent["to"] == "globex/erp/bob/ws@west"
        assert reply["kind"] == "reply" and reply["body"]["text"] == "HELLO WS"
        assert reply["from"] == "globex/erp/bob/ws@west" and reply["to"] == sent["from"]
        agent.stop()

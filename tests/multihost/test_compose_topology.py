"""compose/docker-compose.yml, run without docker.

The compose file is read as written: the one-shot `certs` service's command
runs first (it makes the CA, certificates, serving policies, federation stores
and pin files), then every hub service's command starts in a network
namespace of its own, on shared segments wired like the compose networks,
with the service's environment, its mounts mapped to temporary folders and
compose service names in URIs rewritten to the namespace addresses (see
tests/support/compose.py). Hubs run as the image's user when this machine's
interpreter is usable by it.

Then: every pinned link comes up, chats cross east -> north and north -> east,
east's link to the inter-site network is cut and restored, and each hub's
Prometheus /metrics shows the backlog rise and fall; every chat arrives once.
And claims made at any site are decided by their namespace's owner under the
compose file's owner map.
"""

from __future__ import annotations

import json
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.support.compose import COMPOSE_DIR, REPO, SUBNETS, ComposeProject, image_user
from tests.support.netns import Topology, require_netns
from tests.support.sitecmd import driver, env

PER_SENDER = 100
PORT = 8876
FORWARD_GAUGES = ("synapse_message_forward_pending", "synapse_message_forward_oldest_pending_seconds",
                  "hubd_peer_link_up", "hubd_forward_last_success_timestamp_seconds")


def http_get(topo, site, path) -> tuple[int, bytes]:
    """GET https://127.0.0.1:PORT/path inside the site's namespace, over a
    socket of this process (no subprocess): (status, body)."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # the hub's own certificate, over its loopback
    sock = topo.socket(site)
    try:
        sock.settimeout(10)
        sock.connect(("127.0.0.1", PORT))
        with context.wrap_socket(sock) as tls:
            tls.sendall(f"GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n".encode())
            chunks = []
            while chunk := tls.recv(65536):
                chunks.append(chunk)
    finally:
        sock.close()
    head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


def scrape(topo, site) -> dict[tuple[str, tuple], float]:
    """The hub's /metrics parsed as Prometheus text: (name, sorted labels) -> value."""
    from prometheus_client.parser import text_string_to_metric_families

    status, body = http_get(topo, site, "/metrics")
    assert status == 200, (site, status, body[:200])
    samples = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def gauge(samples, name, peer):
    return samples.get((name, (("peer", peer),)))


def user_prefix(uid: int, gid: int, env: dict, cwd: Path) -> list[str] | None:
    """setpriv argv to run as uid:gid, or None when this interpreter is not
    usable by that user (e.g. a Python under /root)."""
    setpriv = shutil.which("setpriv")
    if setpriv is None or os.geteuid() != 0:
        return None
    prefix = [setpriv, f"--reuid={uid}", f"--regid={gid}", "--clear-groups"]
    probe = subprocess.run([*prefix, sys.executable, "-c", "import hubd.cli, federation.config"],
                           env=env, cwd=cwd, capture_output=True, timeout=60)
    return prefix if probe.returncode == 0 else None


def wait_until(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out: {what}"
        time.sleep(0.2)


def lines(proc, timeout):
    out, _ = proc.communicate(timeout=timeout)
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def start_project(topo, root, logs):
    project = ComposeProject(COMPOSE_DIR / "docker-compose.yml", root)
    hubs = project.hubs()
    assert {h.name for h in hubs} == {"east", "west", "north"}
    [setup] = project.setup_services()

    uid, gid = image_user()
    probe_env = project.env(hubs[0])
    as_user = user_prefix(uid, gid, probe_env, root)
    owner = (uid, gid) if as_user is not None else (os.geteuid(), os.getegid())

    # 1. the certs service, as compose runs it first (root, no network)
    project.prepare_mounts(setup)
    argv = project.argv(setup)
    if as_user is None:  # hubs will run as this user: hand the folders to it instead
        argv = [a if not a.startswith("--owner=") else f"--owner={owner[0]}:{owner[1]}"
                for a in argv]
    result = subprocess.run(argv, env=project.env(setup), cwd=project.workdir(setup),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr

    # 2. the compose networks, as shared segments between the hubs' namespaces
    networks = project.networks_of(hubs)
    for (name, members), subnet in zip(sorted(networks.items()), SUBNETS):
        topo.network(name, subnet, members)

    def address_of(caller, callee):
        shared = [n for n in project.services[callee].networks
                  if n in project.services[caller].networks]
        assert shared, f"{caller} shares no network with {callee}"
        return topo.addr(callee, shared[0])

    # 3. every hub service's command in its own namespace
    procs = {}
    for hub in hubs:
        project.prepare_mounts(hub, owner)
        argv = project.argv(hub, address_of)
        log = open(logs / f"{hub.name}.log", "w")
        procs[hub.name] = topo.popen(hub.name, [*(as_user or []), *argv],
                                     env=project.env(hub), cwd=project.workdir(hub),
                                     stdout=log, stderr=subprocess.STDOUT)
    for hub in hubs:
        def ready(site=hub.name):
            assert procs[site].poll() is None, \
                f"{site} exited:\n{(logs / f'{site}.log').read_text()[-3000:]}"
            try:
                return http_get(topo, site, "/readyz")[0] == 200
            except OSError:
                return False
        wait_until(ready, 30, f"{hub.name} ready")
    return project, procs, as_user is not None


@pytest.fixture
def mount_root():
    """Where the mapped mounts live: under /tmp and traversable (0711) so a hub
    running as the image user can reach its folders, as it can in a container;
    pytest's own tmp_path sits below a root-only folder."""
    root = Path(tempfile.mkdtemp(prefix="hubd-compose-"))
    os.chmod(root, 0o711)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def test_compose_topology_forwards_across_a_cut(mount_root, tmp_path):
    require_netns()
    t0 = time.monotonic()
    with Topology() as topo:
        project, procs, as_image_user = start_project(topo, mount_root, tmp_path)
        print(f"started in {time.monotonic() - t0:.1f}s")
        sites = [h.name for h in project.hubs()]
        print(f"hubs run as {'the image user' if as_image_user else 'the test user'}")

        # every hub's pinned links to both peers come up (pins read from the
        # files the certs service wrote, policies granting every peer)
        def all_links_up():
            for site in sites:
                samples = scrape(topo, site)
                for peer in sites:
                    if peer != site and gauge(samples, "hubd_peer_link_up", peer) != 1:
                        return False
            return True
        wait_until(all_links_up, 30, "all six peer links up")
        print(f"links up at {time.monotonic() - t0:.1f}s")

        receivers = {
            site: topo.popen(site, driver(
                "receive", "--url", f"wss://127.0.0.1:{PORT}/", "--name", f"PROJ/{seat}",
                "--expect", str(PER_SENDER), "--timeout", "90", "--linger", "1.5"),
                cwd=REPO, env=env(), stdout=subprocess.PIPE, text=True)
            for site, seat in (("north", "bob"), ("east", "carol"))}
        for proc in receivers.values():
            assert json.loads(proc.stdout.readline())["event"] == "ready"
        routes = {"east": "PROJ/bob@north", "north": "PROJ/carol@east"}
        senders = {site: topo.popen(site, driver(
            "send", "--url", f"wss://127.0.0.1:{PORT}/", "--name", f"PROJ/{site}-agent",
            "--target", target, "--count", str(PER_SENDER), "--prefix", f"{site}-",
            "--rate", "40", "--timeout", "90"), cwd=REPO, env=env(),
            stdout=subprocess.PIPE, text=True) for site, target in routes.items()}

        time.sleep(0.8)
        topo.cut("east", "federation")
        peaks = {"east": 0.0, "north": 0.0}
        cut_until = time.monotonic() + 3.0
        while time.monotonic() < cut_until:
            time.sleep(0.2)
            for site, peer in (("east", "north"), ("north", "east")):
                value = gauge(scrape(topo, site), "synapse_message_forward_pending", peer) or 0
                peaks[site] = max(peaks[site], value)
        assert peaks["east"] > 0, "east's backlog to north did not rise during the cut"
        assert peaks["north"] > 0, "north's backlog to east did not rise during the cut"
        topo.restore("east", "federation")
        print(f"restored at {time.monotonic() - t0:.1f}s")

        sent = {site: lines(proc, 120) for site, proc in senders.items()}
        print(f"senders done at {time.monotonic() - t0:.1f}s")
        for site, proc in receivers.items():
            received = lines(proc, 120)
            done = received[-1]
            assert done["event"] == "done" and done["unique"] == PER_SENDER, (site, done)
            assert done["duplicates"] == 0, (site, done)
        for site, out in sent.items():
            receipts = [r for r in out if r["event"] == "receipts"][0]
            states = receipts["states"]
            # a forward resent after the cut is answered `duplicate`: the peer had it
            assert states.get("accepted", 0) + states.get("duplicate", 0) == PER_SENDER, \
                (site, receipts)

        def drained():
            for site, peer in (("east", "north"), ("north", "east")):
                samples = scrape(topo, site)
                if gauge(samples, "synapse_message_forward_pending", peer) != 0:
                    return False
                if gauge(samples, "hubd_peer_link_up", peer) != 1:
                    return False
            return True
        wait_until(drained, 30, "backlogs drained and links back up")
        print(f"drained at {time.monotonic() - t0:.1f}s")

        # each hub's /metrics parses as Prometheus text and carries the forward
        # figures for each of its peers; west, untouched, never had a backlog
        for site in sites:
            samples = scrape(topo, site)
            for peer in sites:
                if peer == site:
                    continue
                for name in FORWARD_GAUGES:
                    assert gauge(samples, name, peer) is not None, (site, name, peer)
                assert gauge(samples, "synapse_message_forward_pending", peer) == 0
            assert samples[("hubd_up", ())] == 1
        accepted = scrape(topo, "east").get(
            ("hubd_forward_total", (("outcome", "accepted"), ("peer", "north"))), 0)
        assert accepted > 0
        for site, proc in procs.items():
            assert proc.poll() is None, f"{site} exited with {proc.returncode}"


def claims(topo, site, *args):
    out = topo.run(site, [sys.executable, "-m", "tests.support.claim_driver", *args,
                          "--url", f"wss://127.0.0.1:{PORT}/"], env=env(), timeout=60)
    return json.loads(out.stdout.strip().splitlines()[-1])


def journal_rows(project, site, kind):
    import sqlite3

    db = project.workdir(project.services[site]) / "hubd.db"
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return [json.loads(p) for (p,) in conn.execute(
            "SELECT payload FROM events WHERE kind = ? ORDER BY seq", (kind,))]
    finally:
        conn.close()


def test_compose_topology_routes_claims_to_their_owner(mount_root, tmp_path):
    """The compose owner map (EAST->east, WEST->west, NORTH->north, PROJ->west):
    a PROJ claim made at east is granted by west and lives in west's journal; a
    conflicting one made at north is refused by west; a NORTH claim made at
    west is north's; an EAST claim at east stays local."""
    require_netns()
    with Topology() as topo:
        project, procs, _ = start_project(topo, mount_root, tmp_path)

        granted = claims(topo, "east", "claim", "--name", "PROJ/amy", "--task", "p-1",
                         "--paths", "src/core")
        assert granted["type"] == "claim_granted", granted
        held = claims(topo, "west", "state", "--name", "PROJ/wes")["active_claims"]
        assert [(c["task_id"], c["owner"]) for c in held] == [("p-1", "PROJ/amy")]
        assert [r["task_id"] for r in journal_rows(project, "west", "claim")] == ["p-1"]
        assert journal_rows(project, "east", "claim") == []

        conflict = claims(topo, "north", "claim", "--name", "PROJ/nia", "--task", "p-2",
                          "--paths", "src/core/x.py")
        assert conflict["type"] == "claim_denied", conflict
        assert conflict.get("owner_hub_id") == "west", conflict

        remote = claims(topo, "west", "claim", "--name", "NORTH/wes", "--task", "n-1",
                        "--paths", "ops")
        assert remote["type"] == "claim_granted", remote
        assert [r["task_id"] for r in journal_rows(project, "north", "claim")] == ["n-1"]

        local = claims(topo, "east", "claim", "--name", "EAST/eve", "--task", "e-1",
                       "--paths", "lib")
        assert local["type"] == "claim_granted", local
        assert [r["task_id"] for r in journal_rows(project, "east", "claim")] == ["e-1"]

        ungoverned = claims(topo, "east", "claim", "--name", "OTHER/oz", "--task", "o-1",
                            "--paths", "x")
        assert ungoverned["type"] == "claim_denied", ungoverned
        for site, proc in procs.items():
            assert proc.poll() is None, f"{site} exited with {proc.returncode}"

"""compose/docker-compose.yml and compose/single-site.yml in real containers.

The images are real (tests/support/containers.py: a debootstrapped bookworm
base, hubd's image built from compose/Dockerfile offline, Debian's Prometheus
on the same base); the compose files are run as written by docker-compose
against podman, with a test override that only

* names the images built here (registries cannot be reached),
* puts the certs service's output in a folder of the test's own,
* gives each compose network a documentation subnet,
* runs Prometheus with 1 s scrapes and evaluations, and with alerts.yml's own
  `for:` durations and age thresholds multiplied by ALERT_SCALE,

and the host side of each published port moved to a free port. Grafana is
not started: its image cannot be had here and Debian does not package it.

Everything is checked from outside the containers: the hubs' published
ports, Prometheus' HTTP API, `podman inspect` / `podman healthcheck run`, and
the journal volumes' files on the host.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support.containers import (COMPOSE_DIR, REPO, ComposeRun, Prometheus, file_modes,
                                      http_json, machine_lock, scaled_rules, seconds,
                                      fast_prometheus_config, wait_until)

pytestmark = pytest.mark.containers

# 5m -> 10s: every `for:` and age threshold in alerts.yml, scaled.
ALERT_SCALE = 1 / 30
HUB_PORT = 8876
HUB_UID = 10001
SITES = ("east", "west", "north")
SUBNETS = {"east-site": "203.0.113.128/28", "west-site": "203.0.113.144/28",
           "north-site": "203.0.113.160/28", "federation": "203.0.113.176/28",
           "site": "203.0.113.192/28"}
BACKLOG_ALERT = "HubdForwardBacklogOld"


def driver(kind: str, *args: str) -> list[str]:
    return [sys.executable, "-m", f"tests.support.{kind}", *args]


DRIVER_ENV = {**os.environ, "PYTHONPATH": str(REPO)}


def json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def claim(url: str, *args: str) -> dict:
    out = subprocess.run(driver("claim_driver", *args, "--url", url), env=DRIVER_ENV,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def receiver(url: str, name: str, expect: int, timeout: float) -> subprocess.Popen:
    proc = subprocess.Popen(driver("chat_driver", "receive", "--url", url, "--name", name,
                                   "--expect", str(expect), "--timeout", str(timeout),
                                   "--linger", "1"),
                            env=DRIVER_ENV, stdout=subprocess.PIPE, text=True)
    assert json.loads(proc.stdout.readline())["event"] == "ready"
    return proc


def send(url: str, name: str, target: str, count: int, prefix: str, timeout: float) -> dict:
    out = subprocess.run(driver("chat_driver", "send", "--url", url, "--name", name,
                                "--target", target, "--count", str(count), "--prefix", prefix,
                                "--rate", "20", "--timeout", str(timeout)),
                         env=DRIVER_ENV, capture_output=True, text=True, timeout=timeout + 60)
    assert out.returncode in (0, 1), out.stderr
    [receipts] = [r for r in json_lines(out.stdout) if r["event"] == "receipts"]
    return receipts["states"]


def received(proc: subprocess.Popen, timeout: float) -> list[dict]:
    out, _ = proc.communicate(timeout=timeout)
    return json_lines(out)


def journal(path: Path, kind: str) -> list[dict]:
    conn = sqlite3.connect(f"file:{path / 'hubd.db'}?mode=ro", uri=True)
    try:
        return [json.loads(p) for (p,) in conn.execute(
            "SELECT payload FROM events WHERE kind = ? ORDER BY seq", (kind,))]
    finally:
        conn.close()


def healthy(run: ComposeRun, service: str) -> bool:
    """The image's HEALTHCHECK, run the way podman's timer would, and the
    status podman records from it."""
    podman = run.engine.podman
    name = run.container(service)
    podman("healthcheck", "run", name, check=False)
    return podman.inspect(name)["State"]["Health"]["Status"] == "healthy"


def wait_healthy(run: ComposeRun, services, start_period: float) -> None:
    for service in services:
        wait_until(lambda: healthy(run, service), start_period, f"{service} healthy", interval=1)


def hub_url(run: ComposeRun, site: str, scheme: str = "wss") -> str:
    return f"{scheme}://127.0.0.1:{run.port(site, HUB_PORT)}/"


def hub_health(run: ComposeRun, site: str, scheme: str = "https") -> dict:
    return http_json(f"{hub_url(run, site, scheme)}health")


def healthcheck_start_period() -> float:
    text = (COMPOSE_DIR / "Dockerfile").read_text()
    return seconds(re.search(r"HEALTHCHECK .*--start-period=(\w+)", text).group(1))


def override_for(deployment, where: Path, networks, prometheus_config: str,
                  services: dict) -> dict:
    rules = scaled_rules(yaml.safe_load((COMPOSE_DIR / "prometheus" / "alerts.yml").read_text()),
                         ALERT_SCALE)
    (where / "alerts.yml").write_text(yaml.safe_dump(rules, sort_keys=False))
    config = fast_prometheus_config(
        yaml.safe_load((COMPOSE_DIR / "prometheus" / prometheus_config).read_text()))
    (where / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    services = json.loads(json.dumps(services))
    services.setdefault("prometheus", {}).setdefault("volumes", []).extend([
        f"{where / 'prometheus.yml'}:/etc/prometheus/prometheus.yml:ro",
        f"{where / 'alerts.yml'}:/etc/prometheus/alerts.yml:ro"])
    services["prometheus"]["image"] = deployment.prometheus
    return {"version": "3.9", "services": services,
            "networks": {n: {"ipam": {"config": [{"subnet": SUBNETS[n]}]}} for n in networks}}


@pytest.fixture
def where(tmp_path):
    path = tmp_path / "run"
    path.mkdir()
    return path


@pytest.fixture
def compose_run(deployment, where):
    """A ComposeRun factory; every project it made is removed at the end, by name."""
    runs = []

    def make(file: str, override: dict) -> ComposeRun:
        # compose project names: lowercase letters and digits
        project = f"hubdtest{os.getpid()}{re.sub('[^a-z0-9]', '', Path(file).stem)}"
        run = ComposeRun(deployment.engine, COMPOSE_DIR / file, override, where, project)
        runs.append(run)
        return run

    with machine_lock():
        try:
            yield make
        finally:
            for run in runs:
                leftovers = run.remove_everything()
                assert not leftovers, f"`down -v` left {leftovers}"


def test_three_sites_in_containers(deployment, compose_run, where):
    hubd = deployment.hubd
    certs = where / "certs"
    certs.mkdir()
    services = {"certs": {"image": hubd, "volumes": [f"{certs}:/certs"]},
                "prometheus": {"volumes": [f"{certs / 'public'}:/etc/prometheus/hubd-ca:ro"]}}
    for site in SITES:
        services[site] = {"image": hubd, "volumes": [f"{certs / site}:/etc/hubd:ro"]}
    override = override_for(deployment, where, ["east-site", "west-site", "north-site",
                                                 "federation"], "prometheus.yml", services)
    run = compose_run("docker-compose.yml", override)
    podman = deployment.podman
    up = ["up", "-d", "certs", *SITES, "prometheus"]
    run.compose(*up)

    # -- the certs service ran first, to completion, and wrote owner-only files
    certs_state = podman.inspect(run.container("certs"))["State"]
    assert certs_state["Status"] == "exited" and certs_state["ExitCode"] == 0, certs_state
    for site in SITES:
        started = podman.inspect(run.container(site))["State"]["StartedAt"]
        assert certs_state["FinishedAt"] < started, (site, certs_state["FinishedAt"], started)
    modes = file_modes(certs)
    for site in SITES:
        for path, (mode, uid, gid) in modes.items():
            if path != site and not path.startswith(f"{site}/"):
                continue
            assert (uid, gid) == (HUB_UID, HUB_UID), (path, uid, gid)
            public = path.endswith(("-server.pem", "-client.pem"))
            assert mode & 0o022 == 0 if public else mode & 0o077 == 0, (path, oct(mode))
        assert modes[site][0] == 0o700 and modes[f"{site}/{site}-server.key"][0] == 0o600
        assert modes[f"{site}/hubd.toml"][0] == 0o600
    assert modes["pki"][0] == 0o700 and modes["pki"][1] == 0

    # -- every hub's HEALTHCHECK turns healthy; the containers run as configured
    wait_healthy(run, SITES, healthcheck_start_period())
    for site in SITES:
        info = podman.inspect(run.container(site))
        assert info["Config"]["User"] == "hubd" and info["HostConfig"]["ReadonlyRootfs"]
        assert {"RLIMIT_NPROC"} <= {u["Name"] for u in info["HostConfig"]["Ulimits"]}

    def links_up():
        return all(link["link"] == "up" and link["peer_protocol_version"]
                   for site in SITES for link in hub_health(run, site)["message_forward"].values())
    wait_until(links_up, 60, "all six peer links up")

    # -- chats cross east -> west and east -> north
    per_route = 10
    listeners = {"west": receiver(hub_url(run, "west"), "PROJ/bob", per_route, 90),
                 "north": receiver(hub_url(run, "north"), "PROJ/nia", per_route, 90)}
    for site, seat in (("west", "PROJ/bob"), ("north", "PROJ/nia")):
        states = send(hub_url(run, "east"), "PROJ/eve", f"{seat}@{site}", per_route,
                      f"to-{site}-", 60)
        assert states == {"accepted": per_route}, (site, states)
    for site, proc in listeners.items():
        done = received(proc, 120)[-1]
        assert done == {"event": "done", "unique": per_route, "duplicates": 0}, (site, done)

    # -- a claim is routed to its namespace's owner (PROJ -> west, NORTH -> north)
    granted = claim(hub_url(run, "east"), "claim", "--name", "PROJ/amy", "--task", "p-1",
                    "--paths", "src/core")
    assert granted["type"] == "claim_granted", granted
    held = claim(hub_url(run, "west"), "state", "--name", "PROJ/wes")["active_claims"]
    assert [(c["task_id"], c["owner"]) for c in held] == [("p-1", "PROJ/amy")]
    conflict = claim(hub_url(run, "north"), "claim", "--name", "PROJ/nia", "--task", "p-2",
                     "--paths", "src/core/x.py")
    assert conflict["type"] == "claim_denied" and conflict.get("owner_hub_id") == "west", conflict
    remote = claim(hub_url(run, "west"), "claim", "--name", "NORTH/wes", "--task", "n-1",
                   "--paths", "ops")
    assert remote["type"] == "claim_granted", remote
    volumes = {site: run.volume_path(f"{site}-journal") for site in SITES}
    assert [c["task_id"] for c in journal(volumes["west"], "claim")] == ["p-1"]
    assert [c["task_id"] for c in journal(volumes["north"], "claim")] == ["n-1"]
    assert journal(volumes["east"], "claim") == []

    # -- cut east off the inter-site network: west's backlog to east, seen by
    # the real Prometheus, rises; the backlog alert goes pending, then firing
    prom = Prometheus(run.port("prometheus", 9090))
    rule = prom.rule(BACKLOG_ALERT)
    hold = seconds(rules_for(BACKLOG_ALERT))
    assert rule["duration"] == max(1, round(hold * ALERT_SCALE)), rule  # the override is loaded
    hold, threshold = rule["duration"], scaled_threshold(rule["query"])
    backlog = 'synapse_message_forward_pending{site="west",peer="east"}'
    age = 'synapse_message_forward_oldest_pending_seconds{site="west",peer="east"}'
    wait_until(lambda: prom.value(backlog) == 0, 30, "Prometheus scraping west")

    # carol's seat exists at east before the cut; she reads her mailbox after
    # it (a socket held across the cut may break: east's published port can
    # be forwarded over either of its networks)
    assert received(receiver(hub_url(run, "east"), "PROJ/carol", 0, 10), 30)[-1]["unique"] == 0
    podman("network", "disconnect", run.network("federation"), run.container("east"))
    states = send(hub_url(run, "west"), "PROJ/wes", "PROJ/carol@east", 5, "cut-", 3)
    assert states == {"pending": 5}, states
    wait_until(lambda: prom.value(backlog) == 5, 30, "west's backlog to east at 5")
    first_age = wait_until(lambda: prom.value(age), 30, "oldest-pending age scraped")
    wait_until(lambda: (prom.value(age) or 0) > first_age + 1, 30, "oldest-pending age rising")

    seen = []

    def backlog_alert(state):
        alerts = [a for a in prom.alerts(BACKLOG_ALERT)
                  if a["labels"].get("site") == "west" and a["labels"].get("peer") == "east"]
        seen.extend(a["state"] for a in alerts if not seen or seen[-1] != a["state"])
        return any(a["state"] == state for a in alerts)
    # bounds: the age must pass the threshold, then hold for `for:`; plus scrapes and slack
    wait_until(lambda: backlog_alert("pending"), threshold + 60, f"{BACKLOG_ALERT} pending")
    wait_until(lambda: backlog_alert("firing"), hold + 60, f"{BACKLOG_ALERT} firing")
    assert seen[:2] == ["pending", "firing"], seen

    # -- reconnect: everything drains, carol has every chat once, the alert resolves
    podman("network", "connect", "--alias", "east", run.network("federation"),
           run.container("east"))
    wait_until(lambda: prom.value(backlog) == 0, 120, "west's backlog to east drained")
    done = received(receiver(hub_url(run, "east"), "PROJ/carol", 5, 60), 120)[-1]
    assert done == {"event": "done", "unique": 5, "duplicates": 0}, done
    wait_until(lambda: not backlog_alert("pending") and not backlog_alert("firing"), 60,
               f"{BACKLOG_ALERT} resolved")
    wait_until(links_up, 60, "all six peer links up again")

    # -- compose down and up again: every journal is kept, the hubs resume
    before = {site: hub_health(run, site)["journal_seq"] for site in SITES}
    run.down("-t", "20")
    for site in SITES:
        assert volumes[site] == run.volume_path(f"{site}-journal")
        assert (volumes[site] / "hubd.db").exists()
    run.compose(*up)
    wait_healthy(run, SITES, healthcheck_start_period())
    for site in SITES:
        assert hub_health(run, site)["journal_seq"] >= before[site] > 0, site
    # west's own lease, and the one north granted west's agent (as north granted it)
    held = claim(hub_url(run, "west"), "state", "--name", "PROJ/wes")["active_claims"]
    assert [(c["task_id"], c["owner"], c.get("owner_hub_id")) for c in held] == \
        [("n-1", "NORTH/wes", "north"), ("p-1", "PROJ/amy", None)]
    wait_until(links_up, 60, "all six peer links up after the restart")
    # a seat new to west (a known one would first be replayed its history)
    bea = receiver(hub_url(run, "west"), "PROJ/bea", 1, 60)
    assert send(hub_url(run, "east"), "PROJ/eve", "PROJ/bea@west", 1, "after-", 30) == \
        {"accepted": 1}
    lines = received(bea, 90)
    assert lines[-1] == {"event": "done", "unique": 1, "duplicates": 0}, lines
    [chat] = [line for line in lines if line["event"] == "chat"]
    assert chat["seq"] > before["west"], (chat, before)


def rules_for(alert: str) -> str:
    document = yaml.safe_load((COMPOSE_DIR / "prometheus" / "alerts.yml").read_text())
    [rule] = [r for g in document["groups"] for r in g["rules"] if r.get("alert") == alert]
    return rule["for"]


def scaled_threshold(query: str) -> float:
    return float(re.search(r">\s*(\d+(?:\.\d+)?)\s*$", query).group(1))


def test_single_site_in_containers(deployment, compose_run, where):
    override = override_for(deployment, where, ["site"], "single-site.yml",
                             {"hub": {"image": deployment.hubd}})
    run = compose_run("single-site.yml", override)
    up = ["up", "-d", "hub", "prometheus"]
    run.compose(*up)
    wait_healthy(run, ["hub"], healthcheck_start_period())

    url = hub_url(run, "hub", "ws")
    listener = receiver(url, "PROJ/bob", 3, 60)
    assert send(url, "PROJ/amy", "PROJ/bob", 3, "local-", 30) == {"local": 3}
    done = received(listener, 90)[-1]
    assert done == {"event": "done", "unique": 3, "duplicates": 0}, done

    prom = Prometheus(run.port("prometheus", 9090))
    wait_until(lambda: prom.value('up{job="hubd",site="site"}') == 1, 60,
               "Prometheus scraping the hub")
    wait_until(lambda: prom.value('hubd_up{site="site"}') == 1, 60, "hubd_up scraped")

    before = hub_health(run, "hub", "http")["journal_seq"]
    volume = run.volume_path("hub-journal")
    run.down("-t", "20")
    assert (volume / "hubd.db").exists()
    run.compose(*up)
    wait_healthy(run, ["hub"], healthcheck_start_period())
    assert hub_health(run, "hub", "http")["journal_seq"] >= before > 0

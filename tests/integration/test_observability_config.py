"""The deployment files checked with real tools and a real hub pair:

- compose/docker-compose.yml and compose/single-site.yml validate with
  `docker-compose config`, and their hub commands (with the config files the
  certs service writes) parse with hubd's own parser;
- compose/prometheus/*.yml pass `promtool check config`, alerts.yml passes
  `promtool check rules`, and its unit tests (`promtool test rules`) pass;
- every metric name the alert rules and the Grafana dashboard read, and every
  label they group by, is exported by a running hubd pair (a message peer, a
  forward settled, a quota refusal) on /metrics;
- the image's HEALTHCHECK command (compose/Dockerfile) reports that hub healthy.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.support.compose import COMPOSE_DIR
from tests.support.prereq import need_tool
from tests.support.broker_client import BrokerClient
from tests.support.procs import HubProcess, broker_files, free_port
from tests.support.promql import grouping_labels, metric_names
from tests.support.wsprobe import WsProbe

PROMETHEUS = COMPOSE_DIR / "prometheus"
COMPOSE_FILES = ("docker-compose.yml", "single-site.yml")
# Series Prometheus makes itself for every target, not the hub.
SCRAPE_SERIES = {"up"}
TARGET_LABELS = {"job", "instance", "site"}


def tool(name: str, package: str) -> str:
    return need_tool(name, package)


def run(argv, **kw) -> subprocess.CompletedProcess:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120, **kw)
    assert result.returncode == 0, f"{shlex.join(map(str, argv))}:\n{result.stdout}\n{result.stderr}"
    return result


# --- compose ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", COMPOSE_FILES)
def test_compose_file_validates(name):
    docker_compose = tool("docker-compose", "docker-compose")
    out = run([docker_compose, "-f", name, "config"], cwd=COMPOSE_DIR).stdout
    resolved = yaml.safe_load(out)
    assert resolved["services"], out


@pytest.fixture(scope="module")
def compose_hubs(tmp_path_factory):
    """docker-compose.yml's hub services with the config files its certs
    service writes (run here as compose would, handing the files to this
    user): service -> (its spec, its flags as hubd reads them)."""
    from hubd import config_file
    from hubd.cli import build_parser
    from tests.support.compose import ComposeProject

    project = ComposeProject(COMPOSE_DIR / "docker-compose.yml", tmp_path_factory.mktemp("compose"))
    [setup] = project.setup_services()
    project.prepare_mounts(setup)
    argv = [a if not a.startswith("--owner=") else f"--owner={os.geteuid()}:{os.getegid()}"
            for a in project.argv(setup)]
    run(argv, env=project.env(setup))
    hubs = {}
    for hub in project.hubs():
        flags = [project.map_paths(hub, a) for a in hub.command[1:]]
        layers = config_file.layer(build_parser, flags)
        assert layers.problems == [], layers.problems
        hubs[hub.name] = (hub.spec, layers.args)
    return hubs


@pytest.mark.parametrize("name", COMPOSE_FILES)
def test_compose_hub_commands_parse(name, compose_hubs):
    """Every hub service's arguments (and config file) are flags hubd knows."""
    from hubd.cli import build_parser

    services = yaml.safe_load((COMPOSE_DIR / name).read_text())["services"]
    hubs = {n: s for n, s in services.items() if (s.get("command") or [None])[0] == "hubd"
            and s["command"][1] != "site"}
    assert hubs
    for service, spec in hubs.items():
        args = compose_hubs[service][1] if name == "docker-compose.yml" else \
            build_parser().parse_args(spec["command"][1:])
        assert args.host == "0.0.0.0" and args.port == 8876, service
        assert args.db.startswith("/var/lib/hubd/"), service
        volumes = [v.split(":")[1] for v in spec.get("volumes", [])]
        assert "/var/lib/hubd" in volumes, f"{service}: the journal must be on a volume"


def test_three_site_compose_is_fully_meshed_and_pinned(compose_hubs):
    services = yaml.safe_load((COMPOSE_DIR / "docker-compose.yml").read_text())["services"]
    sites = ["east", "west", "north"]
    owners = {"EAST": "east", "WEST": "west", "NORTH": "north", "PROJ": "west"}
    for site in sites:
        spec, args = compose_hubs[site]
        assert spec["command"][:2] == ["hubd", "--config=/etc/hubd/hubd.toml"], spec["command"]
        peers = sorted(site_ for site_ in sites if site_ != site)
        assert sorted(p.split("=")[0] for p in args.message_peer) == peers
        assert sorted(p.split("=")[0] for p in args.message_peer_pin) == peers
        for flag in (args.message_peer_pin, args.claim_peer_pin, args.multihub_watch_pin):
            assert flag and all(f"/{site}/pins/" in pin for pin in flag), flag
        assert dict(o.split("=") for o in args.namespace_owner) == owners
        assert args.multihub_serving_policy and args.tls_certfile and \
            args.multihub_client_certfile
        assert services[site]["depends_on"]["certs"]["condition"] == \
            "service_completed_successfully"
        assert set(services[site]["networks"]) == {f"{site}-site", "federation"}
    setup = services["certs"]["command"]
    assert setup[:3] == ["hubd", "site", "setup"]
    assert {a.split("=", 1)[1].split("=")[0] for a in setup if a.startswith("--hub=")} == set(sites)
    assert {a.split("=", 1)[1] for a in setup if a.startswith("--namespace-owner=")} == \
        {f"{ns}={hub}" for ns, hub in owners.items()}


# --- Prometheus --------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["prometheus.yml", "single-site.yml"])
def test_prometheus_config_checks(name):
    promtool = tool("promtool", "prometheus")
    run([promtool, "check", "config", name], cwd=PROMETHEUS)


def test_alert_rules_check_and_unit_tests_pass():
    promtool = tool("promtool", "prometheus")
    out = run([promtool, "check", "rules", "alerts.yml"], cwd=PROMETHEUS).stdout
    assert "SUCCESS" in out
    run([promtool, "test", "rules", "alerts.test.yml"], cwd=PROMETHEUS)


def alert_rules() -> list[dict]:
    document = yaml.safe_load((PROMETHEUS / "alerts.yml").read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


def dashboard_exprs() -> list[str]:
    dashboard = json.loads((COMPOSE_DIR / "grafana" / "hubd-dashboard.json").read_text())
    exprs = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            exprs.append(target["expr"])
    return exprs


def test_alerts_cover_the_issue_list():
    names = {rule["alert"] for rule in alert_rules()}
    assert {"HubdForwardBacklogOld", "HubdPeerLinkDown", "HubdForwardNoProgress",
            "HubdJournalCommitSlow", "HubdQuotaRefusalsRising",
            # the doors' error rates and slow consumers, and the process
            "HubdRedsynServerErrors", "HubdRedsynWebhooksFailing", "HubdRedsynPollsRefused",
            "HubdBrokerErrors", "HubdBrokerSlowConsumers", "HubdWebSocketSlowConsumers",
            "HubdOpenFilesNearLimit"} <= names
    for rule in alert_rules():
        assert rule["labels"]["severity"] in ("warning", "critical"), rule["alert"]
        anchor = rule["annotations"]["runbook"].split("#", 1)[1]
        headings = [re.sub(r"[^a-z0-9 -]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
                    for line in (COMPOSE_DIR.parent / "docs" / "operations.md").read_text()
                    .splitlines() if line.startswith("#")]
        assert anchor in headings, f"{rule['alert']}: no heading for #{anchor} in operations.md"


# --- a real hub pair ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def hub_pair(tmp_path_factory):
    """east and west forward to each other over pinned mTLS, set up by
    `hubd site setup` (east owns PROJ and watches west), each started from
    its config file; east refuses past 3 chats a minute."""
    tmp_path = tmp_path_factory.mktemp("hub-pair")
    ports = {"east": free_port(), "west": free_port()}
    run([sys.executable, "-m", "hubd", "site", "setup", "--dir", str(tmp_path / "sites"),
         *[f"--hub={hub}=wss://127.0.0.1:{port}/" for hub, port in ports.items()],
         "--namespace-owner", "PROJ=east"])
    hubs = {hub: HubProcess([sys.executable, "-m", "hubd", "--config",
                             str(tmp_path / "sites" / hub / "hubd.toml"),
                             *(["--durable-ingress-events", "3"] if hub == "east" else [])],
                            port, scheme="wss", log_path=tmp_path / f"{hub}.log",
                            ready_path="/readyz")
            for hub, port in ports.items()}
    try:
        for hub in hubs.values():
            hub.start()
        yield hubs["east"], hubs["west"]
    finally:
        for hub in hubs.values():
            hub.stop()


def metrics_text(hub) -> str:
    import ssl

    context = ssl._create_unverified_context() if hub.scheme == "wss" else None
    with urllib.request.urlopen(hub.http_url + "/metrics", timeout=5, context=context) as r:
        return r.read().decode()


def exported(hub) -> dict[str, set[str]]:
    """Sample name -> label names seen on /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(metrics_text(hub)):
        for sample in family.samples:
            out.setdefault(sample.name, set()).update(sample.labels)
    return out


def test_alert_and_dashboard_metrics_are_exported_by_a_running_hub(hub_pair):
    east, west = hub_pair

    async def traffic():
        bob = await WsProbe.open(west.url)
        await bob.recv_type("welcome")
        await bob.register("PROJ/bob")
        alice = await WsProbe.open(east.url)
        await alice.recv_type("welcome")
        await alice.register("PROJ/alice")
        await alice.chat("PROJ/alice", "PROJ/bob@west", "hello", client_msg_id="m0",
                         receipt_requested=True)
        receipt = await alice.recv_type("delivery_receipt", timeout=15)
        assert receipt["forward_state"] == "accepted", receipt
        for i in range(1, 5):  # the quota admits 3 chats a minute: some are refused
            await alice.chat("PROJ/alice", "PROJ/alice", f"to me {i}", client_msg_id=f"m{i}")
        await alice.recv_type("error", timeout=5)
        await alice.close()
        await bob.close()
        # the other doors: a REDSYN request without a token (401), a broker
        # connection with a wrong token, and one with the right one asking its
        # status and a thread that does not exist
        try:
            east.get_text("/redsyn/v1/messages")
        except urllib.error.HTTPError as refused:
            assert refused.code == 401
        sock, token = broker_files(east_db)
        wrong = await BrokerClient.connect(str(sock))
        assert not (await wrong.request("auth", token="wrong"))["ok"]
        await wrong.close()
        right = await BrokerClient.connect(str(sock), token.read_text().strip())
        assert (await right.request("status"))["ok"]
        assert not (await right.request("collect", threadId=999999))["ok"]
        await right.close()

    east_db = Path(east.argv[east.argv.index("--config") + 1]).parent / "hubd.db"
    asyncio.run(traffic())
    names = exported(east)
    for name, labels in exported(west).items():
        names.setdefault(name, set()).update(labels)
    assert names.get("hubd_quota_refusals_total") == {"reason"}, "no quota refusal was counted"

    sources = [(f"alert {rule['alert']}", rule["expr"]) for rule in alert_rules()]
    sources += [(f"dashboard: {expr}", expr) for expr in dashboard_exprs()]
    missing, bad_labels = [], []
    for where, expr in sources:
        used = metric_names(expr)
        assert used, f"{where}: reads no metric?"
        for name in used - SCRAPE_SERIES:
            if name not in names:
                missing.append(f"{where}: {name}")
        known = TARGET_LABELS | {"le"} | set().union(*(names.get(n, set()) for n in used))
        for label in grouping_labels(expr) - known:
            bad_labels.append(f"{where}: label {label}")
    assert not missing, "names no running hub exports:\n" + "\n".join(missing)
    assert not bad_labels, "labels the metrics do not carry:\n" + "\n".join(bad_labels)
    # the process and the build, on the hub's own registry
    assert {"process_cpu_seconds_total", "process_resident_memory_bytes", "process_open_fds",
            "process_max_fds", "process_start_time_seconds"} <= set(names)
    assert names["hubd_build_info"] == {"version", "python", "sqlite", "openssl"}


def test_promtool_finds_nothing_wrong_in_a_running_hubs_metrics(hub_pair):
    promtool = tool("promtool", "prometheus")
    for hub in hub_pair:
        text = metrics_text(hub)
        assert "hubd_build_info{" in text and "process_open_fds " in text
        checked = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                                 text=True, timeout=60)
        assert checked.returncode == 0 and checked.stdout + checked.stderr == "", checked


def test_dockerfile_healthcheck_reports_a_running_hub_healthy(hub_pair):
    east, west = hub_pair
    text = (COMPOSE_DIR / "Dockerfile").read_text()
    match = re.search(r"HEALTHCHECK [^\n]*\\\n\s*CMD (\[.*\])", text)
    assert match, "no exec-form HEALTHCHECK in compose/Dockerfile"
    argv = json.loads(match.group(1))
    assert argv[0] == "python"
    for hub, url in ((east, east.http_url + "/health"), (west, west.http_url + "/health")):
        env = {**os.environ, "HUBD_HEALTH_URL": url}
        result = subprocess.run([sys.executable, *argv[1:]], env=env, capture_output=True,
                                text=True, timeout=30)
        assert result.returncode == 0, result.stderr
    # and it fails when nothing answers
    env = {**os.environ, "HUBD_HEALTH_URL": "http://127.0.0.1:9/health"}
    result = subprocess.run([sys.executable, *argv[1:]], env=env, capture_output=True,
                            timeout=30)
    assert result.returncode != 0

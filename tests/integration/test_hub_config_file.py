"""`hubd --config FILE` with real hub processes: --check on a valid file and
on every kind of bad one (all problems named at once, exit 2, nothing
created), a hub started from a file with flags overriding it, and SIGHUP
re-reading the file: live keys applied, restart-only keys and broken files
refused with the running configuration kept."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.support.procs import REPO, HubProcess, free_port
from tests.support.waiting import wait_for


def hubd(*argv: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hubd", *argv], cwd=cwd, capture_output=True,
                          text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})


def hub_from(config: Path, port: int, *flags: str) -> HubProcess:
    return HubProcess([sys.executable, "-m", "hubd", "--config", str(config), *flags], port,
                      env={**os.environ, "PYTHONPATH": str(REPO)},
                      log_path=config.parent / f"hub-{port}.log", ready_path="/readyz")


def test_check_prints_the_effective_configuration_and_creates_nothing(tmp_path):
    config = tmp_path / "site" / "hubd.toml"
    config.parent.mkdir()
    config.write_text('hub-id = "east"\nport = 9101\ndb = "journal.db"\n'
                      'message-peer = ["west=ws://127.0.0.1:9102/"]\nroster-timeout = 4\n')
    out = hubd("--config", str(config), "--check", "--max-clients", "9", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stderr == ""
    lines = out.stdout.splitlines()
    for line in ('hub-id = "east"  # file', "port = 9101  # file", "max-clients = 9  # flag",
                 f'db = "{tmp_path}/site/journal.db"  # file',
                 'message-peer = ["west=ws://127.0.0.1:9102/"]  # file', "max-history = 1000  # default",
                 # a timer flag shows the timing profile's value it leaves or sets
                 "auth-timeout = 10.0  # default", "roster-timeout = 4.0  # file",
                 f"# broker socket {tmp_path}/site/journal.db-bus.sock, token "
                 f"{tmp_path}/site/journal.db-bus.token"):
        assert line in lines, (line, out.stdout)
    assert sorted(p.name for p in config.parent.iterdir()) == ["hubd.toml"]


def test_check_names_every_problem_of_a_bad_file_at_once(tmp_path):
    principals = tmp_path / "principals.json"
    principals.write_text('{"principals": []}')
    os.chmod(principals, 0o644)
    config = tmp_path / "hubd.toml"
    config.write_text(f"""
prot = 1
max-clients = 0
log-level = "LOUD"
open-network = "yes"
db = "no-such-folder/hubd.db"
principals = "{principals}"
tls-certfile = "server.pem"
multihub-serving-policy = "policy.json"
message-peer = ["west"]
token = "a-secret"
""")
    os.chmod(config, 0o644)
    for argv in (["--check"], []):  # a start refuses with the same list
        out = hubd("--config", str(config), *argv, "--port", str(free_port()), cwd=tmp_path)
        assert out.returncode == 2, out
        problems = out.stderr.splitlines()
        assert all(line.startswith("hubd: error: ") for line in problems), out.stderr
        said = "\n".join(problems)
        for fragment in ("unknown key 'prot'; did you mean 'port'?", "--max-clients must be positive",
                         "log-level must be one of", "open-network must be true or false",
                         "native WSS requires both --tls-certfile and --tls-keyfile"):
            assert fragment in said, (fragment, said)
        assert len(problems) == 5, said  # the flags' problems: the files are looked at next
        assert out.stdout == "" and "Traceback" not in out.stderr
    # with the flags fixed, --check goes on to every file the configuration names
    config.write_text(f'db = "no-such-folder/hubd.db"\nprincipals = "{principals}"\n'
                      'multihub-serving-policy = "policy.json"\ntls-certfile = "server.pem"\n'
                      'tls-keyfile = "server.key"\ntoken = "a-secret"\n')
    out = hubd("--config", str(config), "--check", cwd=tmp_path)
    assert out.returncode == 2, out
    said = out.stderr
    assert f"principals file {principals} (mode 0644), config file (it holds token) {config} " \
           "(mode 0644) are accessible by other users" in said, said
    assert f"run: chmod 600 {principals} {config}" in said
    assert f"no-such-folder does not exist; create it" in said
    assert f"serving policy {tmp_path}/policy.json" in said and "server certificate file" in said
    assert len(said.splitlines()) == 4, said
    assert not (tmp_path / "no-such-folder").exists()


def test_a_file_that_cannot_be_read_exits_2_with_one_line(tmp_path):
    (tmp_path / "broken.toml").write_text("port = [\n")
    for name, fragment in (("broken.toml", "is not valid TOML"), ("absent.toml", "cannot read")):
        out = hubd("--config", str(tmp_path / name), "--check", cwd=tmp_path)
        assert out.returncode == 2 and fragment in out.stderr, out
        assert len(out.stderr.splitlines()) == 1


def test_a_hub_runs_from_its_file_and_flags_override_it(tmp_path):
    file_port, port = free_port(), free_port()
    config = tmp_path / "hubd.toml"
    config.write_text(f'hub-id = "from-file"\nport = {file_port}\ndb = "hub.db"\n')
    hub = hub_from(config, port, "--port", str(port)).start()
    try:
        assert hub.get_json("/health")["hub_id"] == "from-file"
        assert (tmp_path / "hub.db").exists()  # beside the file, not in the working directory
    finally:
        hub.stop()


def test_sighup_rereads_the_file(tmp_path):
    """Adding a peer applies live; a port change, a broken file and a change
    of a restart-only key beside a live one are refused whole, the running
    configuration kept; a key the command line sets is the flag's on reload too."""
    port = free_port()
    config = tmp_path / "hubd.toml"
    head = f'hub-id = "east"\nport = {port}\ndb = "hub.db"\n'
    west = f'"west=ws://127.0.0.1:{free_port()}/"'
    north = f'"north=ws://127.0.0.1:{free_port()}/"'
    config.write_text(head + f"message-peer = [{west}]\n")
    hub = hub_from(config, port, "--max-clients", "9").start()

    def reloads():
        return hub.metric("hubd_config_reloads_total"), \
            hub.metric("hubd_config_reload_failures_total")

    def hup_then(expected):
        hub.signal(signal.SIGHUP)
        wait_for(lambda: reloads() == expected, what=f"reloads {expected}")

    try:
        assert sorted(hub.get_json("/health")["message_forward"]) == ["west"]
        config.write_text(head + f"max-clients = 5\nmessage-peer = [{west}, {north}]\n")
        hup_then((1, 0))
        assert sorted(hub.get_json("/health")["message_forward"]) == ["north", "west"]

        config.write_text(head.replace(f"port = {port}", f"port = {free_port()}")
                          + f"max-history = 10\nmessage-peer = [{west}, {north}]\n")
        hup_then((1, 1))
        assert "max-history, port: these need a restart" in hub.log()

        config.write_text(head + "message-peer = [\n")
        hup_then((1, 2))
        assert "is not valid TOML" in hub.log()

        third = f'"south=ws://127.0.0.1:{free_port()}/"'
        config.write_text(head + f'log-format = "json"\nmessage-peer = [{west}, {north}, {third}]\n')
        hup_then((1, 3))
        assert "log-format: this needs a restart" in hub.log()
        assert sorted(hub.get_json("/health")["message_forward"]) == ["north", "west"]
        assert hub.get_json("/health")["hub_id"] == "east"  # still up, on its port
    finally:
        hub.stop()
    assert hub.log().count("reload refused; the running configuration is kept") == 3

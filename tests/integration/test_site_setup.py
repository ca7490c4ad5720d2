"""`hubd site setup` with real hubs: the README's two-site commands, run as
written in an empty folder, start both hubs with no hand edit and a chat
crosses both ways (agents trusting the sites' CA through SSL_CERT_FILE); a
re-run keeps every file and a new hub joins with --refresh; the files it
writes have the modes hubd demands, and a start names every unsafe one in
one refusal."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

from tests.support import readme
from tests.support.procs import REPO
from tests.support.sites import chat_across, links_up, one_machine
from tests.support.sitecmd import env
from tests.support.waiting import wait_for

README_HEADING = "Two sites that forward to each other, both on this machine"


def setup_cli(folder: Path, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hubd", "site", "setup", *argv], cwd=folder,
                          capture_output=True, text=True, timeout=120, env=env())


def test_the_readmes_two_sites_start_from_an_empty_folder_and_chat_both_ways(tmp_path):
    lines = [line for line in readme.block_after(README_HEADING) if line.strip()]
    assert len(lines) == 3 and lines[0].startswith("hubd site setup"), lines
    setup, *starts = [readme.argv(line) for line in lines]
    folder = tmp_path / "empty"
    folder.mkdir()
    done = subprocess.run(setup, cwd=folder, capture_output=True, text=True, timeout=120,
                          env=env())
    assert done.returncode == 0, done.stderr
    for start in starts:  # the start commands it prints are the README's
        assert " ".join(["hubd", *start[3:]]) in done.stdout, (start, done.stdout)
    east, west = "wss://127.0.0.1:8876/", "wss://127.0.0.1:8877/"
    logs = []
    with one_machine([8876, 8877]) as machine:
        hubs = []
        for start in starts:
            logs.append(open(tmp_path / f"hub-{len(logs)}.log", "w"))
            hubs.append(machine.popen(start, cwd=folder, env=env(), stdout=logs[-1],
                                      stderr=subprocess.STDOUT))
        wait_for(lambda: links_up(machine.run, east, ["west"])
                 and links_up(machine.run, west, ["east"]), 60, "both links up")
        ca = folder / "sites" / "public" / "ca.pem"
        run = machine.run
        there = chat_across(ca, (run, east, "PROJ/alice"), (run, west, "PROJ/bob"),
                            "PROJ/bob@west")
        assert there["sender"] == "PROJ/alice@east", there
        back = chat_across(ca, (run, west, "PROJ/bob"), (run, east, "PROJ/alice"),
                           "PROJ/alice@east")
        assert back["sender"] == "PROJ/bob@west", back
        for hub in hubs:
            assert hub.poll() is None
            assert machine.stop(hub) == 0
    for log in logs:
        log.close()
    for path in tmp_path.glob("hub-*.log"):
        text = path.read_text()
        assert "Traceback" not in text and "refusing" not in text, text[-3000:]


def modes(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): stat.S_IMODE(p.stat().st_mode)
            for p in sorted(folder.rglob("*"))}


def test_the_files_have_the_modes_hubd_demands_and_a_rerun_keeps_them(tmp_path):
    first = setup_cli(tmp_path, "--hub", "east", "--hub", "west", "--json")
    assert first.returncode == 0, first.stderr
    result = json.loads(first.stdout)
    assert result["certificates_made_for"] == ["east", "west"] and result["kept"] == []
    sites = tmp_path / "sites"
    found = modes(sites)
    for path, mode in found.items():
        public = path.startswith("public") or path.endswith("-server.pem") \
            or path.endswith("-client.pem")
        expected = (0o755 if (sites / path).is_dir() else 0o644) if public else \
            (0o700 if (sites / path).is_dir() else 0o600)
        assert mode == expected, (path, oct(mode))
    assert {"pki/ca.pem", "pki/ca.key", "east/hubd.toml", "east/pins/west.pins",
            "east/client-ca.pem", "west/serving-policy.json", "west/federation.json",
            "public/ca.pem"} <= set(found)
    assert not [p for p in found if p.startswith(("east/", "west/")) and "ca.key" in p]
    # both directions: each hub names the other as a message peer and grants it
    for hub, peer in (("east", "west"), ("west", "east")):
        assert f'message-peer = ["{peer}=wss://127.0.0.1:' in (sites / hub / "hubd.toml").read_text()
        policy = json.loads((sites / hub / "serving-policy.json").read_text())
        assert [g["sender"] for g in policy["grants"]] == [peer]

    before = {p: (sites / p).read_bytes() for p in found if not (sites / p).is_dir()}
    again = setup_cli(tmp_path, "--hub", "east", "--hub", "west", "--json")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["written"] == []
    assert {p: (sites / p).read_bytes() for p in before} == before

    # a third hub: its certificates are made; the others' files are kept
    # until --refresh rewrites them from pki/, their certificates unchanged
    kept = json.loads(setup_cli(tmp_path, "--hub", "east", "--hub", "west", "--hub", "north",
                                "--json").stdout)
    assert kept["certificates_made_for"] == ["north"]
    assert "sites/east/hubd.toml" in kept["kept"]
    assert "north" not in (sites / "east" / "hubd.toml").read_text()
    assert 'message-peer = ["east=wss://127.0.0.1:8876/", "west=wss://127.0.0.1:8877/"]' in \
        (sites / "north" / "hubd.toml").read_text()
    refreshed = setup_cli(tmp_path, "--hub", "east", "--hub", "west", "--hub", "north",
                          "--refresh")
    assert refreshed.returncode == 0, refreshed.stderr
    assert 'message-peer = ["west=wss://127.0.0.1:8877/", "north=wss://127.0.0.1:8878/"]' in \
        (sites / "east" / "hubd.toml").read_text()
    assert (sites / "east" / "east-server.pem").read_bytes() == before["east/east-server.pem"]
    for hub in ("east", "west", "north"):
        checked = subprocess.run([sys.executable, "-m", "hubd", "--config",
                                  str(sites / hub / "hubd.toml"), "--check"],
                                 capture_output=True, text=True, timeout=60, env=env())
        assert checked.returncode == 0, checked.stderr


def test_a_start_names_every_unsafe_file_at_once(tmp_path):
    assert setup_cli(tmp_path, "--hub", "east", "--hub", "west").returncode == 0
    west = tmp_path / "sites" / "west"
    loose = [west / "serving-policy.json", west / "federation.json", west / "client-ca.pem"]
    for path in loose:
        os.chmod(path, 0o644)
    out = subprocess.run([sys.executable, "-m", "hubd", "--config", str(west / "hubd.toml"),
                          "--port", "0"], capture_output=True, text=True, timeout=60, env=env())
    assert out.returncode == 2, out
    said = [line for line in out.stderr.splitlines() if "refusing to start" in line]
    assert len(said) == 1, out.stderr
    assert f"run: chmod 600 {' '.join(map(str, loose))}" in said[0], said[0]
    assert not (west / "hubd.db").exists()  # refused before the journal was made
    for path in loose:
        os.chmod(path, 0o600)  # the one command it printed, and it is ready
    checked = subprocess.run([sys.executable, "-m", "hubd", "--config", str(west / "hubd.toml"),
                              "--check"], capture_output=True, text=True, timeout=60, env=env())
    assert checked.returncode == 0, checked.stderr


def test_arguments_it_cannot_use_are_refused_before_anything_is_written(tmp_path):
    for argv, fragment in (
            (["--hub", "east"], "at least two --hub"),
            (["--hub", "east", "--hub", "east"], "names the same hub twice"),
            (["--hub", "east=ws://a:1/", "--hub", "west"], "expected ID=wss://HOST:PORT/"),
            (["--hub", "east=wss://a/", "--hub", "west"], "expected ID=wss://HOST:PORT/"),
            (["--hub", "east=wss://127.0.0.1:8877/", "--hub", "west"], "share a port"),
            (["--hub", "e!st", "--hub", "west"], "--hub 'e!st'"),
            (["--hub", "east", "--hub", "west", "--namespace-owner", "PROJ=south"],
             "'south' is not one of the hubs"),
            (["--hub", "east", "--hub", "west", "--namespace", "a/b"], "is not a namespace"),
            (["--hub", "east", "--hub", "west", "--san", "not a name"], "not a name"),
            (["--hub", "east", "--hub", "west", "--days", "0"], "days")):
        out = setup_cli(tmp_path, *argv)
        assert out.returncode == 2 and fragment in out.stderr, (argv, out.stderr)
        assert out.stderr.startswith("hubd site: error: ") and out.stdout == ""
    assert not (tmp_path / "sites").exists()
    # a hub whose certificates are half there is not guessed at
    assert setup_cli(tmp_path, "--hub", "east", "--hub", "west").returncode == 0
    (tmp_path / "sites" / "pki" / "west-client.key").unlink()
    out = setup_cli(tmp_path, "--hub", "east", "--hub", "west")
    assert out.returncode == 2 and "only some of the certificate files of west" in out.stderr


def test_the_repositorys_checkout_ignores_the_default_folder():
    ignored = subprocess.run(["git", "-C", str(REPO), "check-ignore", "--no-index", "-q",
                              "sites/east/hubd.toml"])
    assert ignored.returncode == 0, "sites/ (hubd site setup's default folder) must be git-ignored"

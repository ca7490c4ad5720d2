"""Test sites: a machine where documented commands that use fixed ports can
run (`one_machine`), and agents of federated sites as chat_driver programs
run through a `run(argv, **kw) -> CompletedProcess` of the test's choosing (a
network namespace's, or this host's): is a hub's link to its peers up, and
does a chat cross from one hub to a seat on another, with the hubs'
certificates verified against a CA file as an agent would (SSL_CERT_FILE)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from tests.support.prereq import missing
from tests.support.sitecmd import driver, env

Run = Callable[..., subprocess.CompletedProcess]


@dataclass
class Machine:
    """Where documented commands that use fixed ports run (the README's hubs
    on 8876 and 8877): `popen` starts one in a process group of its own,
    `run` runs a short one to completion (text output captured), `stop`
    ends a started one's group."""

    popen: Callable[..., subprocess.Popen]
    run: Callable[..., subprocess.CompletedProcess]
    stop: Callable[[subprocess.Popen], object]


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _stop_group(proc: subprocess.Popen) -> int:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
    return proc.wait()


@contextlib.contextmanager
def one_machine(ports: list[int]):
    """A network namespace of its own when this machine has them (the ports
    are free there whatever else runs here), else this host if the ports
    are free here, else the test cannot run (prereq.missing)."""
    from tests.support import netns

    if netns.netns_available()[0]:
        with netns.Topology(["site"]) as topo:
            yield Machine(lambda argv, **kw: topo.popen("site", argv, **kw),
                          lambda argv, **kw: topo.run("site", argv, check=False, **kw), topo.stop)
    elif all(_port_free(port) for port in ports):
        started: list[subprocess.Popen] = []

        def popen(argv, **kw):
            started.append(subprocess.Popen(argv, start_new_session=True, **kw))
            return started[-1]
        try:
            yield Machine(popen, lambda argv, **kw: subprocess.run(
                argv, capture_output=True, text=True, **kw), _stop_group)
        finally:
            for proc in started:
                _stop_group(proc)
    else:
        missing(f"no network namespaces, and ports {ports} are taken on this machine")


def links_up(run: Run, url: str, peers: list[str]) -> bool:
    """Does the hub at wss:// `url` have its link to every one of `peers` up?"""
    health = url.replace("wss://", "https://", 1) + "health"
    out = run(driver("get", "--url", health), env=env(), timeout=10)
    if out.returncode != 0:
        return False
    links = json.loads(out.stdout).get("message_forward", {})
    return all(links.get(peer, {}).get("link") == "up" for peer in peers)


def chat_across(ca: Path, sender: tuple[Run, str, str], receiver: tuple[Run, str, str],
                target: str) -> dict:
    """One chat from `sender` (where it runs, the hub's url, its seat) to
    `target`, accepted by the receiving hub; the chat line `receiver` (where
    it runs, url, seat) then reads."""
    agent_env = env(SSL_CERT_FILE=str(ca))
    run, url, seat = sender
    sent = run(driver("send", "--verify", "--url", url, "--name", seat, "--target", target,
                      "--count", "1", "--prefix", "m", "--timeout", "30"),
               env=agent_env, timeout=90)
    assert sent.returncode == 0, sent.stderr[-2000:]
    [receipts] = [json.loads(line) for line in sent.stdout.splitlines() if '"receipts"' in line]
    assert receipts["states"] == {"accepted": 1}, receipts
    run, url, seat = receiver
    got = run(driver("receive", "--verify", "--url", url, "--name", seat, "--expect", "1",
                     "--timeout", "30", "--linger", "0.5"), env=agent_env, timeout=90)
    assert got.returncode == 0, got.stderr[-2000:]
    [chat] = [json.loads(line) for line in got.stdout.splitlines() if '"chat"' in line]
    return chat

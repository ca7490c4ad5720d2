"""Agents of federated test sites, as chat_driver programs run through a
`run(argv, **kw) -> CompletedProcess` of the test's choosing (a network
namespace's, or this host's): is a hub's link to its peers up, and does a
chat cross from one hub to a seat on another, with the hubs' certificates
verified against a CA file as an agent would (SSL_CERT_FILE)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Callable

from tests.support.sitecmd import driver, env

Run = Callable[..., subprocess.CompletedProcess]


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

"""Webhooks never reach the hub's own network (issue 30 item 3), over real
HTTP against real hubd processes: an address in any spelling is refused at
announce time; a webhook whose host leads to a loopback address is never
contacted (the address connected to is checked at send time); a redirect is
never followed. Every listener is on loopback: nothing is sent anywhere else."""

from __future__ import annotations

import pytest

from tests.support.procs import hubd_process
from tests.support.redsyn_client import Client, login
from tests.support.waiting import wait_for
from tests.support.webhook_listener import Hook

JOEL = "acme/dev/joel"
ANA = "acme/dev/ana"
SECRET = "a-long-webhook-secret"

ISSUE_SPELLINGS = ["https://127.1/", "https://0177.0.0.1/", "https://0x7f.0.0.1/",
                   "https://127.000.000.001/", "https://127.0.0.1./",
                   "https://169.254.169.254./", "https://10.0.0.1./", "https://192.0.513/"]
MORE_SPELLINGS = ["https://2130706433/", "https://0x7f000001/", "https://[::1]/",
                  "https://[::ffff:127.0.0.1]/", "https://[fe80::1]/", "https://localhost./",
                  "https://169.254.169.254/latest/meta-data/", "https://metadata.internal/",
                  "https://%31%32%37.0.0.1/"]


def failed_attempts(proc) -> float:
    return proc.metric('hubd_redsyn_webhook_attempts_total{outcome="failed"}')


def test_every_spelling_of_an_address_is_refused_at_announce_time(tmp_path):
    db = tmp_path / "hubd.db"
    joel = login(db, JOEL, "laptop")
    proc = hubd_process(tmp_path, db=db).start()
    try:
        client = Client(proc.http_url, joel)
        for n, url in enumerate(ISSUE_SPELLINGS + MORE_SPELLINGS):
            answer = client.announce(f"{JOEL}/hook{n}", webhook={"url": url, "secret": SECRET})
            assert answer.status == 400, (url, answer.status, answer.body)
            assert answer.json["error"], url
        assert client.announce(f"{JOEL}/fine", webhook={
            "url": "https://hooks.example.com/redsyn", "secret": SECRET}).status == 200
    finally:
        proc.stop()


@pytest.fixture
def hooks():
    made: list[Hook] = []

    def make(**kwargs) -> Hook:
        made.append(Hook(SECRET, **kwargs))
        return made[-1]
    yield make
    for hook in made:
        hook.close()


def test_a_webhook_that_leads_to_loopback_is_never_contacted(tmp_path, hooks):
    """Webhooks stored while loopback webhooks were admitted (by name and by
    address) are, once the hub runs without the flag, still in its journal:
    the pusher tries them, the socket guard refuses the loopback address the
    name resolved to, and the listener never sees a connection."""
    db = tmp_path / "hubd.db"
    tokens = {"joel": login(db, JOEL, "laptop"), "ana": login(db, ANA, "laptop")}
    listener = hooks()
    urls = {"byname": f"http://localhost:{listener.port}/hook", "byaddress": listener.url}
    admitting = hubd_process(tmp_path / "before", "--redsyn-allow-loopback-webhooks",
                             db=db).start()
    try:
        joel = Client(admitting.http_url, tokens["joel"])
        for agent, url in urls.items():
            answer = joel.announce(f"{JOEL}/{agent}", webhook={"url": url, "secret": SECRET})
            assert answer.status == 200, answer.body
    finally:
        admitting.stop()
    assert listener.connections == []

    proc = hubd_process(tmp_path / "after", "--redsyn-webhook-first-retry", "0.01",
                        db=db).start()
    try:
        ana = Client(proc.http_url, tokens["ana"])
        for n, agent in enumerate(urls):
            sent = ana.send({"id": f"guarded-{n}", "kind": "request", "from": "cli",
                             "to": f"{JOEL}/{agent}",
                             "body": {"type": "text/plain", "text": "x"}})
            assert sent.status == 201, sent.body
        # at least four attempts each (or, were the guard missing, a connection)
        wait_for(lambda: failed_attempts(proc) >= 2 * 4 or listener.connections,
                 timeout=60, what="the hub's webhook attempts")
        assert listener.connections == [] and listener.deliveries == []
        refused = [line for line in proc.log().splitlines()
                   if "webhook delivery failed" in line and "address refused" in line]
        assert {a for a in urls if any(f"{JOEL}/{a}" in line for line in refused)} == set(urls)
        assert "127.0.0.1 is a loopback address" in "".join(refused)
    finally:
        proc.stop()
    assert listener.connections == []


def test_a_redirect_is_never_followed(tmp_path, hooks):
    db = tmp_path / "hubd.db"
    tokens = {"joel": login(db, JOEL, "laptop"), "ana": login(db, ANA, "laptop")}
    elsewhere = hooks()
    redirecting = hooks(status=307, headers={"Location": elsewhere.url})
    proc = hubd_process(tmp_path, "--redsyn-allow-loopback-webhooks",
                        "--redsyn-webhook-first-retry", "0.01", db=db).start()
    try:
        joel = Client(proc.http_url, tokens["joel"])
        assert joel.announce(f"{JOEL}/moved", webhook={
            "url": redirecting.url, "secret": SECRET}).status == 200
        ana = Client(proc.http_url, tokens["ana"])
        assert ana.send({"id": "moved-1", "kind": "request", "from": "cli",
                         "to": f"{JOEL}/moved",
                         "body": {"type": "text/plain", "text": "x"}}).status == 201
        wait_for(lambda: failed_attempts(proc) >= 3 or elsewhere.connections,
                 timeout=60, what="three attempts")
        assert elsewhere.connections == []
        assert len(redirecting.deliveries) >= 3
        assert all(genuine for _, _, genuine in redirecting.deliveries)
        assert elsewhere.connections == []
    finally:
        proc.stop()

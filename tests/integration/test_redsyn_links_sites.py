"""A REDSYN link between organizations on two federated hubs (docs/redsyn.md,
"Across sites"): acme lives at east, globex at west (--namespace-owner). The
link is proposed at east and accepted at west, each change forwarded to the
other hub; messages cross through the forward outbox; the receiving hub
enforces the link too: a suspension at west gives up what waits there and
answers the sender at east with the seed's error reply."""

from __future__ import annotations

import asyncio
import time

from tests.integration.test_redsyn_federation import PEOPLE, TlsClient, start_sites
from tests.support.wsprobe import WsProbe

CLI = "acme/general/ana/cli"
BILLING = "globex/erp/bob/billing"


async def forge_a_proposal(url: str) -> None:
    forged = {"id": "lnk-forged", "action": "propose", "orgs": ["acme", "globex"],
              "org": "acme", "by": "acme/it/ivan:laptop",
              "terms": {"expose": ["acme"], "signed_only": False, "allow_ips": []}}
    async with WsProbe.connect(url) as mallory:
        await mallory.recv_type("welcome")
        await mallory.register("acme/mallory")
        await mallory.chat("acme/mallory", "globex/redsyn-links@west", "redsyn link propose",
                           redsyn={"link": forged}, receipt_requested=True)
        receipt = await mallory.recv_type("delivery_receipt", timeout=20)
        assert receipt["forward_state"] == "accepted", receipt


def until(check, what: str, timeout: float = 20.0):
    """Poll a hub's answer until `check` holds (a forwarded change arrives
    when the peer link carries it: no fixed sleep)."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def state_at(client, link: str):
    answer = client.call("GET", f"/links/{link}")
    return answer.json["state"] if answer.status == 200 else None


def request(client, text: str):
    return client.send({"kind": "request", "from": "cli", "to": BILLING,
                        "body": {"type": "text/plain", "text": text}})


def test_a_link_across_two_hubs_is_agreed_used_and_enforced_at_both(tmp_path):
    procs, tokens = start_sites(tmp_path, agree_link=False)
    c = {key: TlsClient(procs["east" if key in PEOPLE["east"] else "west"].http_url, token)
         for key, token in tokens.items()}
    try:
        assert c["bob"].announce(BILLING).status == 200
        refused = request(c["ana"], "no link yet")
        assert refused.status == 403 and "no active link" in refused.json["error"]

        # a WebSocket agent at east cannot forge a link change: a client's
        # chat carries no `redsyn` across (west, which trusts east for acme,
        # would take it); west accepts the chat and takes no link from it
        asyncio.run(forge_a_proposal(procs["east"].url))
        made = c["ivan"].call("POST", "/links", {
            "org": "acme", "peer": "globex",
            "terms": {"expose": ["acme/general"], "signed_only": False}})
        assert made.status == 201, made.body
        link = made.json["id"]
        until(lambda: state_at(c["gus"], link) == "proposed", "the proposal at west")
        assert c["gus"].call("GET", "/links/lnk-forged").status == 404
        assert [x["id"] for x in c["gus"].call("GET", "/links").json["links"]] == [link]
        # west's admin accepts at west; east learns it through the peer link
        accepted = c["gus"].call("POST", f"/links/{link}/accept", {
            "terms": {"expose": ["globex/erp"], "signed_only": False}})
        assert accepted.status == 200, accepted.body
        until(lambda: state_at(c["ana"], link) == "active", "the acceptance at east")

        # used: a request from east, its reply from west
        sent = request(c["ana"], "is invoice 123 paid?")
        assert sent.status == 201, sent.body
        [asked] = c["bob"].take_until(BILLING, 1)
        assert asked["from"] == f"{CLI}@east" and asked["body"]["text"] == "is invoice 123 paid?"
        answer = c["bob"].send({"kind": "reply", "from": "billing", "reply_to": asked["id"],
                                "body": {"type": "text/plain", "text": "paid"}})
        assert answer.status == 201, answer.body
        [reply] = c["ana"].take_until(CLI, 1)
        assert reply["reply_to"] == sent.json["id"] and reply["body"]["text"] == "paid"
        assert reply["error"] is False
        assert c["ana"].ack(CLI, [reply["id"]]).status == 200

        # the receiving hub enforces the link: a message waiting at west when
        # globex suspends is given up there and ana hears it at east
        waiting = request(c["ana"], "second")
        assert waiting.status == 201, waiting.body
        until(lambda: c["bob"].call("GET", f"/agents/{BILLING}").json["waiting"] == 1,
              "the second request at west")
        suspended = c["gus"].call("POST", f"/links/{link}/suspend", {"reason": "audit"})
        assert suspended.status == 200 and suspended.json["state"] == "suspended"
        assert c["bob"].take(BILLING) == []
        [told] = c["ana"].take_until(CLI, 1)
        assert told["error"] is True and told["reply_to"] == waiting.json["id"]
        assert told["body"]["text"] == (f"not delivered: link {link} between acme and globex "
                                        "is suspended by globex")
        assert c["ana"].ack(CLI, [told["id"]]).status == 200
        # and east, once it has the suspension, refuses before anything is sent
        until(lambda: state_at(c["ana"], link) == "suspended", "the suspension at east")
        refused = request(c["ana"], "while suspended")
        assert refused.status == 403 and "suspended by globex" in refused.json["error"]

        # resumed at west, ended from east: both hubs read the same log
        assert c["gus"].call("POST", f"/links/{link}/resume", {}).status == 200
        until(lambda: state_at(c["ana"], link) == "active", "the resumption at east")
        assert c["ivan"].call("POST", f"/links/{link}/end", {}).status == 200
        until(lambda: state_at(c["bob"], link) == "ended", "the end at west")
        logs = {hub: [(e["action"], e["org"], e["by"]) for e in
                      c[who].call("GET", f"/links/{link}").json["log"]]
                for hub, who in (("east", "ana"), ("west", "bob"))}
        assert logs["east"] == logs["west"] == [
            ("propose", "acme", "acme/it/ivan:laptop"),
            ("accept", "globex", "globex/it/gus:laptop"),
            ("suspend", "globex", "globex/it/gus:laptop"),
            ("resume", "globex", "globex/it/gus:laptop"),
            ("end", "acme", "acme/it/ivan:laptop")]
    finally:
        for proc in procs.values():
            proc.stop()

"""A REDSYN agent at one site reaches a REDSYN agent at another: the address's
namespace (its org) is owned by the peer hub (--namespace-owner), so the
message goes through the forward outbox, and the reply comes back the same way
(over a link between the two organizations, agreed by their admins)."""

from __future__ import annotations

from tests.support.federation import make_pki, site_flags, write_serving_policy
from tests.support.procs import free_port, hubd_process
from tests.support.redsyn_client import Client, login
from tests.support.redsyn_link import agree, org_with_admin


PEOPLE = {"east": {"ana": ("acme/general/ana", "laptop"), "ivan": ("acme/it/ivan", "laptop")},
          "west": {"bob": ("globex/erp/bob", "box"), "gus": ("globex/it/gus", "laptop")}}
ORGS = {"east": ("acme", "acme/it/ivan"), "west": ("globex", "globex/it/gus")}


def start_sites(tmp_path, agree_link: bool = True):
    """east holds acme, west globex (each its namespace's owner, its
    organization's record and admin); with agree_link, the admins have
    agreed a link between them. Returns the hubs and a token per person."""
    pki = make_pki(tmp_path / "pki", ["east", "west"])
    ports = {"east": free_port(), "west": free_port()}
    grants = {"east": {"west": ["acme"]}, "west": {"east": ["globex"]}}
    owners = ["--namespace-owner", "acme=east", "--namespace-owner", "globex=west"]
    procs, tokens = {}, {}
    for hub, peer in (("west", "east"), ("east", "west")):
        (tmp_path / hub).mkdir(parents=True, exist_ok=True)
        db = tmp_path / hub / "hubd.db"
        tokens.update({key: login(db, *who) for key, who in PEOPLE[hub].items()})
        org_with_admin(db, *ORGS[hub])
        policy = write_serving_policy(tmp_path / f"{hub}-policy", pki, grants[hub])
        site = site_flags(pki, hub, policy)
        procs[hub] = hubd_process(
            tmp_path / hub, *site.serve, *site.connect,
            *site.peer_flags(pki, peer, f"wss://127.0.0.1:{ports[peer]}/"), *owners,
            hub_id=hub, scheme="wss", port=ports[hub], db=db)
    try:
        for proc in procs.values():
            proc.start()
        if agree_link:  # nothing crosses organizations without one (docs/redsyn.md)
            agree((procs["east"].http_url + "/redsyn/v1", tokens["ivan"]),
                  (procs["west"].http_url + "/redsyn/v1", tokens["gus"]), "acme", "globex",
                  ca=str(pki.folder / "ca.pem"))
    except BaseException:
        for proc in procs.values():
            proc.stop()
        raise
    return procs, tokens


class TlsClient(Client):
    def call(self, *args, **kwargs):
        import ssl
        import urllib.request

        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE  # the test PKI's own CA
        opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=context))
        previous = urllib.request._opener
        urllib.request.install_opener(opener)
        try:
            return super().call(*args, **kwargs)
        finally:
            urllib.request.install_opener(previous)


def test_a_request_and_its_reply_across_two_hubs(tmp_path):
    procs, tokens = start_sites(tmp_path)
    try:
        ana = TlsClient(procs["east"].http_url, tokens["ana"])
        bob = TlsClient(procs["west"].http_url, tokens["bob"])
        assert bob.announce("globex/erp/bob/billing", description="at west").status == 200
        sent = ana.send({"id": "fed-1", "kind": "request", "from": "cli",
                         "to": "globex/erp/bob/billing",
                         "body": {"type": "text/plain", "text": "is invoice 123 paid?"}})
        assert sent.status == 201, sent.body
        assert sent.json["to"] == "globex/erp/bob/billing@west"
        [request] = bob.take_until("globex/erp/bob/billing", 1)
        assert request["from"] == "acme/general/ana/cli@east"
        assert request["body"]["text"] == "is invoice 123 paid?"
        reply = bob.send({"id": "fed-1-reply", "kind": "reply", "from": "billing",
                          "reply_to": request["id"],
                          "body": {"type": "text/plain", "text": "yes, on the 3rd"}})
        assert reply.status == 201, reply.body
        [back] = ana.take_until("acme/general/ana/cli", 1)
        assert back["kind"] == "reply" and back["reply_to"] == "fed-1"
        assert back["from"] == "globex/erp/bob/billing@west"
        assert back["to"] == sent.json["from"]
        assert back["body"]["text"] == "yes, on the 3rd"
    finally:
        for proc in procs.values():
            proc.stop()

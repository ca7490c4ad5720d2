"""Links between REDSYN organizations as pure decisions (hubd/state/redsyn/links.py):
who may change them, the crossing rule on every event, what a change does to
what waits, and that the live state equals a replay of the events."""

import json

import pytest

from hubd.state import redsyn as mb
from hubd.state.principals import make_principal
from hubd.state.redsyn import links
from hubd.wire.redsyn.envelope import RedsynError
from tests.unit.test_redsyn_mailbox import (ACME_ADMIN, BOB, GLOBEX_ADMIN, JOEL, ORGS, SHOUT,
                                            Hub, linked)

BILLING = "globex/erp/bob/billing"


def refused(call, status: int) -> str:
    with pytest.raises(RedsynError) as err:
        call()
    assert err.value.status == status, err.value.error
    return err.value.error


def propose(hub, node=ACME_ADMIN, **doc):
    return hub.run(links.decide_propose(hub.state, node, {"org": "acme", "peer": "globex",
                                                          **doc}, ORGS, hub.now,
                                        new_id=lambda: "lnk-1"))


def change(hub, node, action, doc=None, id_="lnk-1"):
    decision, after = links.decide_change(hub.state, node, id_, action, doc or {}, hub.now)
    if action in ("suspend", "end", "terms"):
        decision.events.extend(mb.give_up_refused(hub.state, after, hub.now))
    return hub.run(decision)


def test_only_admins_change_a_link_and_only_as_its_states_allow():
    hub = Hub()
    before = json.dumps(hub.state.snapshot(), sort_keys=True, default=str)
    assert "not an admin of acme" in refused(lambda: propose(hub, node=JOEL), 403)
    assert "no organization" in refused(lambda: propose(hub, peer="initech"), 404)
    assert refused(lambda: propose(hub, peer="acme"), 400)
    assert refused(lambda: propose(hub, terms={"expose": ["globex/erp"]}), 400)
    assert refused(lambda: propose(hub, terms={"allow_ips": ["not-an-ip"]}), 400)
    assert json.dumps(hub.state.snapshot(), sort_keys=True, default=str) == before
    assert hub.events == []

    made = propose(hub, terms={"expose": ["acme/dev"]}, reason="invoices")
    assert made["state"] == "proposed" and made["orgs"] == ["acme", "globex"]
    assert made["terms"]["globex"] == {"expose": [], "signed_only": True, "allow_ips": []}
    assert "already have link lnk-1" in refused(lambda: propose(hub), 409)
    assert "an admin of globex accepts it" in refused(
        lambda: change(hub, ACME_ADMIN, "accept"), 403)
    assert "not an admin of globex" in refused(lambda: change(hub, BOB, "accept"), 403)
    assert refused(lambda: change(hub, GLOBEX_ADMIN, "suspend"), 409)
    events = len(hub.events)
    assert change(hub, GLOBEX_ADMIN, "accept", {"terms": {"expose": ["globex/erp"]}})[
        "state"] == "active"
    assert refused(lambda: change(hub, GLOBEX_ADMIN, "accept"), 409)

    # each side's suspension holds until that side lifts it
    change(hub, GLOBEX_ADMIN, "suspend", {"reason": "audit"})
    assert "globex has already suspended" in refused(
        lambda: change(hub, GLOBEX_ADMIN, "suspend"), 409)
    assert "acme has not suspended" in refused(lambda: change(hub, ACME_ADMIN, "resume"), 409)
    change(hub, ACME_ADMIN, "suspend")
    assert change(hub, GLOBEX_ADMIN, "resume")["state"] == "suspended"
    assert change(hub, ACME_ADMIN, "resume")["state"] == "active"
    assert change(hub, ACME_ADMIN, "end")["state"] == "ended"
    assert "has ended" in refused(lambda: change(hub, GLOBEX_ADMIN, "resume"), 409)
    assert refused(lambda: change(hub, GLOBEX_ADMIN, "end", id_="lnk-9"), 404)
    assert len(hub.events) == events + 6  # refusals wrote nothing

    log = links.read_link(hub.state, BOB, "lnk-1")["log"]  # a person of either side reads it
    assert [(e["action"], e["org"]) for e in log] == [
        ("propose", "acme"), ("accept", "globex"), ("suspend", "globex"), ("suspend", "acme"),
        ("resume", "globex"), ("resume", "acme"), ("end", "acme")]
    assert log[0]["by"] == ACME_ADMIN.id and log[0]["reason"] == "invoices"
    assert log[2]["reason"] == "audit" and [e["n"] for e in log] == list(range(1, 8))
    outsider = mb.Node("initech/x/y:z", "initech/x/y")
    assert refused(lambda: links.read_link(hub.state, outsider, "lnk-1"), 404)
    assert links.list_links(hub.state, outsider) == {"links": []}
    # an ended link frees the pair for a new proposal
    hub.run(links.decide_propose(hub.state, GLOBEX_ADMIN, {"org": "globex", "peer": "acme"},
                                 ORGS, hub.now, new_id=lambda: "lnk-2"))
    assert [link["id"] for link in links.list_links(hub.state, JOEL)["links"]] == \
        ["lnk-1", "lnk-2"]
    assert hub.replayed().snapshot() == hub.state.snapshot()


def test_an_admin_of_both_sides_names_the_side_it_acts_for():
    hub = Hub()
    both = mb.Node("acme/it/root:x", "acme/it/root", make_principal(
        "acme/it/root", ["acme/it/root/*"], {"org_admin": ["acme", "globex"]}))
    propose(hub, node=both)
    assert change(hub, both, "accept")["state"] == "active"  # accept: the peer's side
    assert "name the side" in refused(lambda: change(hub, both, "suspend"), 400)
    assert change(hub, both, "suspend", {"org": "globex"})["suspended_by"] == ["globex"]


def test_every_event_crosses_only_over_an_active_link_that_admits_it():
    hub = Hub()

    def ask(**extra):
        return hub.post(JOEL, **{"from": "cli", "to": BILLING, **extra})

    assert "acme and globex have no active link" in refused(ask, 403)
    propose(hub)
    assert "is proposed, not active" in refused(ask, 403)
    # terms set before accepting are kept by an accept that names none
    change(hub, GLOBEX_ADMIN, "terms", {"terms": {"expose": ["globex/sales"]}})
    assert change(hub, GLOBEX_ADMIN, "accept")["terms"]["globex"]["expose"] == ["globex/sales"]
    assert "globex does not expose globex/erp/bob/billing" in refused(ask, 403)
    change(hub, GLOBEX_ADMIN, "terms", {"terms": {"expose": ["globex/erp"]}})
    assert "takes only signed messages into globex" in refused(ask, 403)
    assert refused(lambda: change(hub, GLOBEX_ADMIN, "terms", {}), 400)
    change(hub, GLOBEX_ADMIN, "terms", {"terms": {
        "expose": ["globex/erp"], "signed_only": False, "allow_ips": ["10.1.0.0/16"]}})
    assert "only from its allow-list; None" in refused(ask, 403)
    assert not hub.state.messages  # nothing of the refusals was stored

    def from_ip(ip, **extra):
        document = {"v": 1, "kind": "request", "from": "cli", "to": BILLING,
                    "body": {"type": "text/plain", "text": "hi"}, **extra}
        incoming = mb_validate(document, JOEL.person)
        return hub.run(mb.decide_post(hub.state, JOEL, incoming, hub.now,
                                      new_id=lambda: extra.get("id", "q"), client=ip))

    assert "192.0.2.9 is not on it" in refused(lambda: from_ip("192.0.2.9"), 403)
    assert from_ip("::ffff:10.1.2.3", id="q1")["to"].startswith(BILLING)
    # the answer goes back without acme exposing anything, but by acme's terms
    # (signed only, by default): unsigned, it is refused
    [request] = hub.take(BOB, BILLING)
    answer = {"v": 1, "kind": "reply", "from": "billing", "reply_to": request["id"],
              "body": {"type": "text/plain", "text": "paid"}}
    assert "only signed messages into acme" in refused(lambda: hub.run(mb.decide_post(
        hub.state, BOB, mb_validate(answer, BOB.person), hub.now, new_id=lambda: "r1")), 403)
    change(hub, ACME_ADMIN, "terms", {"terms": {"signed_only": False}})
    hub.run(mb.decide_post(hub.state, BOB, mb_validate(answer, BOB.person), hub.now,
                           new_id=lambda: "r1"))
    [reply] = hub.take(JOEL, "acme/dev/joel/cli")
    assert reply["reply_to"] == "q1" and reply["error"] is False


def mb_validate(document, person):
    from hubd.wire.redsyn.envelope import validate
    return validate(document, person, len(json.dumps(document)))


def test_a_suspension_gives_up_what_waits_and_tells_each_sender():
    hub = Hub()
    linked(hub, globex_terms={"expose": ["globex"], "signed_only": False})
    hub.post(JOEL, id="q1", **{"from": "cli", "to": BILLING})
    hub.post(JOEL, id="q2", **{"from": "cli", "to": BILLING})
    hub.post(JOEL, id="local", **{"from": "cli", "to": SHOUT})  # inside acme: untouched
    hub.take(BOB, BILLING)  # q1 and q2 leased (one session each)
    change(hub, GLOBEX_ADMIN, "suspend")
    assert BILLING not in hub.state.boxes
    assert hub.ack(BOB, BILLING, ["q1"]) == {"acked": [], "unknown": ["q1"]}
    told = hub.take(JOEL, "acme/dev/joel/cli")
    assert sorted(e["reply_to"] for e in told) == ["q1", "q2"]
    assert all(e["error"] and e["id"] == f"undelivered.{e['reply_to']}" for e in told)
    assert told[0]["body"]["text"] == ("not delivered: link lnk-1 between acme and globex "
                                       "is suspended by globex")
    assert [i["id"] for i in hub.take(JOEL, SHOUT)] == ["local"]
    assert "suspended by globex" in refused(
        lambda: hub.post(JOEL, id="q3", **{"from": "cli", "to": BILLING}), 403)
    change(hub, GLOBEX_ADMIN, "resume")
    hub.post(JOEL, id="q3", **{"from": "cli", "to": BILLING})
    assert [i["id"] for i in hub.take(BOB, BILLING)] == ["q3"]
    assert hub.replayed().snapshot() == hub.state.snapshot()


def test_a_message_is_checked_again_as_it_is_handed_out():
    """The hand-out rule on its own: a link event applied without the
    give-ups its decision adds (as a journal of another hubd might hold)."""
    hub = Hub()
    id_ = linked(hub, globex_terms={"expose": ["globex"], "signed_only": False})
    hub.post(JOEL, id="q1", **{"from": "cli", "to": BILLING})
    hub.run(mb.Decision([(mb.LINK, {"id": id_, "action": "end", "org": "globex",
                                    "by": GLOBEX_ADMIN.id})]))
    assert hub.take(BOB, BILLING) == []
    [told] = hub.take(JOEL, "acme/dev/joel/cli")
    assert told["error"] and "acme and globex have no active link" in told["body"]["text"]


def test_terms_are_checked():
    for bad in ({"expose": "acme"}, {"expose": ["globex"]}, {"signed_only": "no"},
                {"allow_ips": ["10.0.0.0/33"]}, {"other": 1}, [], {"expose": ["acme/Dev"]}):
        with pytest.raises(RedsynError) as err:
            links.check_terms("acme", bad)
        assert err.value.status == 400
    assert links.check_terms("acme", {"expose": ["acme", "acme/dev/joel/shout"],
                                      "allow_ips": ["10.0.0.7", "2001:db8::/32"]}) == {
        "expose": ["acme", "acme/dev/joel/shout"], "signed_only": True,
        "allow_ips": ["10.0.0.7/32", "2001:db8::/32"]}


# -- across sites: what a hub takes from a peer hub

def test_a_peer_hubs_link_change_is_taken_only_from_the_orgs_owner_and_if_it_fits():
    """acme lives at east; this hub (west) holds globex."""
    west = Hub()
    owner = {"acme": "east"}.get
    local = {"globex": {"redsyn_version": "2026-09-25"}}
    proposal = {"id": "lnk-1", "action": "propose", "orgs": ["acme", "globex"], "org": "acme",
                "by": "acme/it/ivan:laptop", "terms": links.check_terms("acme", None)}
    assert links.peer_change_refusal(west.state, proposal, "north", owner, local) == \
        "hub north does not own acme, so it cannot act for it"
    assert "no organization initech" in links.peer_change_refusal(
        west.state, {**proposal, "orgs": ["acme", "initech"]}, "east", owner, local)
    assert "checked form" in links.peer_change_refusal(
        west.state, {**proposal, "terms": {"expose": ["acme"]}}, "east", owner, local)
    assert links.peer_change_refusal(west.state, proposal, "east", owner, local) is None
    west.run(mb.Decision([(mb.LINK, proposal)]))
    # east may not accept for globex, nor resume what it did not suspend
    accept = {"id": "lnk-1", "action": "accept", "org": "globex", "by": "x",
              "terms": links.check_terms("globex", None)}
    assert "does not own globex" in links.peer_change_refusal(
        west.state, accept, "east", owner, local)
    resume = {"id": "lnk-1", "action": "resume", "org": "acme", "by": "x"}
    assert "acme has not suspended" in links.peer_change_refusal(
        west.state, resume, "east", owner, local)
    assert links.peer_change_refusal(west.state, "nonsense", "east", owner, local) == \
        "not a link change"


def test_a_peer_hubs_message_is_checked_where_it_lands():
    """A chat a REDSYN agent at east sent, forwarded to globex's agent here:
    refused by this hub's link, it lands nowhere and is recorded as refused."""
    west = Hub()
    west.run(mb.decide_announce(west.state, BOB, BILLING, {"listening": True}))
    frame = {"type": "chat", "sender": "acme/general/ana/cli@east", "target": BILLING,
             "payload": "hi", "forwarded_from": "east",
             "redsyn": {"id": "m1", "kind": "request", "signed": False, "client": "10.0.0.1"}}
    entry = mb.chat_delivery(west.state, frame, {"forwarded": {}}, 7)
    assert entry["refused"] == ("acme and globex have no active link (nothing crosses "
                                "organizations without one)")
    assert entry["remote"] == {"signed": False, "client": "10.0.0.1", "id": "m1",
                               "error": False}
    mb.apply_chat(west.state, {**frame, "seq": 7}, {"boxes": {"redsyn": [entry]}}, 7, west.now)
    assert BILLING not in west.state.boxes
    linked(west, globex_terms={"expose": ["globex/erp"], "signed_only": False,
                               "allow_ips": ["10.0.0.0/8"]})
    entry = mb.chat_delivery(west.state, frame, {"forwarded": {}}, 8)
    assert "refused" not in entry
    mb.apply_chat(west.state, {**frame, "seq": 8}, {"boxes": {"redsyn": [entry]}}, 8, west.now)
    assert list(west.state.boxes[BILLING]) == ["chat.8"]
    outside = {**frame, "redsyn": {**frame["redsyn"], "client": "192.0.2.1"}}
    assert "192.0.2.1 is not on it" in mb.chat_delivery(
        west.state, outside, {"forwarded": {}}, 9)["refused"]
    # suspended here: what waits is given up, and the sender at east is told
    # by a chat (the routing service forwards it)
    chats: list = []
    decision, after = links.decide_change(west.state, GLOBEX_ADMIN, "lnk-1", "suspend", {},
                                          west.now)
    decision.events.extend(mb.give_up_refused(west.state, after, west.now, chats))
    west.run(decision)
    assert BILLING not in west.state.boxes
    assert chats == [{"sender": BILLING, "frame": {
        "type": "chat", "target": "acme/general/ana/cli@east",
        "payload": "not delivered: link lnk-1 between acme and globex is suspended by globex",
        "redsyn": {"kind": "reply", "error": True, "reply_to": "m1"}}}]
    # the peer's error replies are not the link's to refuse
    error = {**frame, "redsyn": {"kind": "reply", "error": True, "reply_to": "m0"}}
    assert "refused" not in mb.chat_delivery(west.state, error, {"forwarded": {}}, 10)

"""Issue 24: resources, guard evidence, planning, channels, capability cards, dead-letter escalation."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any

from .harness import (
    TOKEN,
    show,
    owner_only,
    Workdir,
    running,
    startup_refusal,
    envelope,
    Signer,
    connect,
    sha,
    EmbeddedHub,
)


async def probe_resources(work: Workdir) -> None:
    flags = ["--db", str(work.path / "hub.db"), "--hub-id", "src", "--max-offers-per-agent", "4"]
    with running(work, flags) as hub:
        alice = await connect(hub, "p/alice", token=None)
        bob = await connect(hub, "p/bob", token=None)
        await alice.drain(0.4)
        await bob.drain(0.4)
        for extra in ({"kind": "gpu", "name": "a100", "capacity": 2, "meta": {"zone": "eu"}},
                      {"kind": "gpu", "name": "a100", "capacity": 3},
                      {"kind": "gpu"}, {"name": "n"}, {"kind": 5, "name": "n"},
                      {"kind": "k" * 300, "name": "n"}, {"kind": "gpu", "name": "b", "capacity": -1},
                      {"kind": "gpu", "name": "b", "capacity": "lots"},
                      {"kind": "cpu", "name": "x"}, {"kind": "disk", "name": "d"}, {"kind": "net", "name": "n2"}):
            await alice.send(envelope("p/alice", "resource", target="all", **extra))
            await alice.drain(0.5)
            await bob.drain(0.3)
        await alice.send(envelope("p/alice", "resource_offer", target="all", kind="tpu", name="v4"), " (alias verb)")
        await alice.drain(0.5)
        await bob.send(envelope("p/bob", "resource_offer", target="all", kind="tpu", name="v4"), " (alias verb)")
        await bob.drain(0.5)
        await alice.send(envelope("p/alice", "state_request", target="SynapseHub"))
        snap = await alice.until("state_snapshot")
        if snap:
            print(f"## snapshot.resources = {json.dumps((snap.get('snapshot') or {}).get('resources'))}", flush=True)
        await alice.ws.close()
        await bob.send(envelope("p/bob", "state_request", target="SynapseHub"))
        snap = await bob.until("state_snapshot")
        if snap:
            print(f"## after alice left: snapshot.resources = {json.dumps((snap.get('snapshot') or {}).get('resources'))}", flush=True)
        await bob.ws.close()
    with running(work, flags, "restarted") as hub:
        carol = await connect(hub, "p/carol", token=None)
        await carol.drain(0.4)
        await carol.send(envelope("p/carol", "state_request", target="SynapseHub"))
        snap = await carol.until("state_snapshot")
        if snap:
            print(f"## after restart: snapshot.resources = {json.dumps((snap.get('snapshot') or {}).get('resources'))}", flush=True)
        await carol.ws.close()


async def probe_guard(work: Workdir) -> None:
    good = dict(provider="claude", reason_code="GUARD_NO_CLAIM", path_count=1,
                actor_sha256=sha("actor"), call_sha256=sha("call"), scope_sha256=sha("scope"))
    print("## open hub (no token, no db)", flush=True)
    with running(work, [], "open") as hub:
        a = await connect(hub, "claim-hook/alice-1", token=None)
        await a.drain(0.4)
        await a.send(envelope("claim-hook/alice-1", "guard_denial", **good))
        await a.recv()
        await a.ws.close()
    print("## token, no db", flush=True)
    with running(work, ["--token", TOKEN], "tokenonly") as hub:
        a = await connect(hub, "claim-hook/alice-1")
        await a.drain(0.4)
        await a.send(envelope("claim-hook/alice-1", "guard_denial", **good))
        await a.recv()
        await a.ws.close()
    print("## token and db", flush=True)
    with running(work, ["--token", TOKEN, "--db", str(work.path / "g.db"), "--hub-id", "g"], "durable") as hub:
        a = await connect(hub, "claim-hook/alice-1")
        b = await connect(hub, "p/bob")
        await a.drain(0.4)
        await b.drain(0.4)
        await a.send(envelope("claim-hook/alice-1", "guard_denial", idem_key="g-1", **good))
        await a.recv()
        await b.drain(0.5)
        await a.send(envelope("claim-hook/alice-1", "guard_denial", idem_key="g-1", **good), " (retry)")
        await a.recv()
        await a.send(envelope("claim-hook/alice-1", "guard_denial", idem_key="g-1", **dict(good, path_count=2)), " (same key, other content)")
        await a.recv()
        await a.send(envelope("claim-hook/alice-1", "guard_denial", **dict(good, call_sha256=sha("call2"))), " (no idem_key)")
        await a.recv()
        for label, bad in (("reason", dict(good, reason_code="NOPE")), ("provider", dict(good, provider="vim")),
                           ("upper hex", dict(good, call_sha256=sha("x").upper())), ("path_count -1", dict(good, path_count=-1)),
                           ("path_count big", dict(good, path_count=10**9)), ("payload", dict(good, payload="text")),
                           ("extra field", dict(good, path="/etc/passwd")), ("missing scope", {k: v for k, v in good.items() if k != "scope_sha256"})):
            await a.send(envelope("claim-hook/alice-1", "guard_denial", **bad), f" ({label})")
            await a.recv()
        await a.ws.close()
        await b.ws.close()
    import sqlite3

    db = sqlite3.connect(f"file:{work.path / 'g.db'}?mode=ro", uri=True)
    cols = [r[1] for r in db.execute("PRAGMA table_info(events)")]
    print(f"## events columns: {cols}", flush=True)
    for row in db.execute("SELECT * FROM events ORDER BY seq"):
        print(f"   row: {row}", flush=True)


async def probe_guard_window(work: Workdir) -> None:
    """The per-credential evidence window: 101 denials in a row on one token."""
    good = dict(provider="claude", reason_code="GUARD_NO_CLAIM", path_count=1,
                actor_sha256=sha("actor"), scope_sha256=sha("scope"))
    with running(work, ["--token", TOKEN, "--db", str(work.path / "g.db"), "--hub-id", "g"]) as hub:
        a = await connect(hub, "claim-hook/alice-1")
        b = await connect(hub, "claim-hook/bob-1", label="claim-hook/bob-1 (same token)")
        await a.drain(0.3)
        await b.drain(0.3)
        answers: dict[str, int] = {}
        last = None
        for i in range(101):
            await a.ws.send(json.dumps(envelope("claim-hook/alice-1", "guard_denial", call_sha256=sha(f"c{i}"), **good)))
            frame = json.loads(await a.ws.recv())
            key = frame.get("type") + ":" + str(frame.get("error_code", ""))
            answers[key] = answers.get(key, 0) + 1
            last = frame
        print(f"## 101 denials from one name: {answers}; last frame:", flush=True)
        show("<< claim-hook/alice-1:", last)
        print("## another name on the same token", flush=True)
        await b.send(envelope("claim-hook/bob-1", "guard_denial", call_sha256=sha("b"), **good))
        await b.recv()
        await a.ws.close()
        await b.ws.close()


ADVERT = {
    "schema": 1, "pool_alias": "team-gpu", "unit": "tokens", "resource_kind": None, "capabilities": ["chat"],
    "data_classes": [], "eligible_projects": ["p"], "account_usable": True, "as_of": "2026-12-02T12:00:00+00:00",
    "windows": [{"window_ref": "0123456789abcdef", "ends_at": "2026-12-03T00:00:00+00:00", "current": True,
                 "remaining_bucket": ">50%", "balance_evidence": "observed", "observation_age_seconds": 5,
                 "forecast_state": "quiet", "confidence": "operator"}],
}


async def probe_entitlement(work: Workdir) -> None:
    """entitlement_advert from an identity-bound sender with the entitlement-advertise ACL grant."""
    trust = work.path / "identity-trust.json"
    pem = work.identity_key("p/owner", "id-owner", trust)
    other = work.identity_key("p/other", "id-other", trust)
    acl = owner_only(work.path / "acl.json", json.dumps({"rules": [
        {"permission": "entitlement-advertise", "target_kind": "pool-alias", "target_pattern": "team-*"}]}))
    flags = ["--db", str(work.path / "hub.db"), "--hub-id", "owner", "--identity-trust", str(trust),
             "--require-identity-binding", "--acl-policy", str(acl)]
    with running(work, flags) as hub:
        o = await connect(hub, "p/owner", signer=Signer(identity_pem=pem, identity_key_id="id-owner"), token=None)
        w = await connect(hub, "p/other", signer=Signer(identity_pem=other, identity_key_id="id-other"), token=None)
        await o.drain(0.4)
        await w.drain(0.4)
        await o.send(envelope("p/owner", "entitlement_advert", advert=ADVERT))
        await o.drain(0.5)
        await w.drain(0.3)
        await o.send(envelope("p/owner", "entitlement_advert", advert=dict(ADVERT, pool_alias="solo-gpu")), " (alias outside the ACL)")
        await o.drain(0.5)
        for label, bad in (("extra field", dict(ADVERT, amount=5)), ("schema 2", dict(ADVERT, schema=2)),
                           ("no offset", dict(ADVERT, as_of="2026-12-02T12:00:00")),
                           ("bad bucket", dict(ADVERT, windows=[dict(ADVERT["windows"][0], remaining_bucket="12%")]))):
            await o.send(envelope("p/owner", "entitlement_advert", advert=bad), f" ({label})")
            await o.drain(0.5)
        await w.send(envelope("p/other", "entitlement_advert", advert=ADVERT), " (another bound sender)")
        await w.drain(0.5)
        await o.ws.close()
        await w.ws.close()
    import sqlite3

    db = sqlite3.connect(f"file:{work.path / 'hub.db'}?mode=ro", uri=True)
    for row in db.execute("SELECT seq, kind, payload FROM events WHERE kind LIKE '%entitlement%'"):
        print(f"   journal row: {row}", flush=True)


async def probe_planning(work: Workdir) -> None:
    """entitlement_advert, spend_request, and their refusals."""
    flags = ["--db", str(work.path / "hub.db"), "--hub-id", "owner", "--token", TOKEN]
    with running(work, flags) as hub:
        a = await connect(hub, "p/alice")
        b = await connect(hub, "p/bob")
        await a.drain(0.4)
        await b.drain(0.4)
        advert = {"pool_alias": "team-gpu", "provider": "openai", "window_seconds": 3600, "remaining_fraction": 0.5}
        await a.send(envelope("p/alice", "entitlement_advert", **advert))
        await a.recv()
        await a.send(envelope("p/alice", "entitlement_advert", advert=advert))
        await a.recv()
        await b.drain(0.4)
        for label, doc in (("no spend doc", None), ("spend not an object", "x")):
            extra = {} if doc is None else {"spend": doc}
            await a.send(envelope("p/alice", "spend_request", spend_action="query", **extra), f" ({label})")
            await a.recv()
        for action in ("reserve", "settle", "query", "bogus"):
            await a.send(envelope("p/alice", "spend_request", spend_action=action, spend={"pool": "team-gpu", "amount": 1}))
            await a.recv()
        await a.ws.close()
        await b.ws.close()


async def probe_channels(work: Workdir) -> None:
    flags = ["--db", str(work.path / "hub.db"), "--hub-id", "ch"]
    with running(work, flags) as hub:
        a = await connect(hub, "p/alice", token=None)
        b = await connect(hub, "p/bob", token=None)
        c = await connect(hub, "p/carol", token=None)
        d = await connect(hub, "p/dan", token=None)
        for conn in (a, b, c, d):
            await conn.drain(0.4)
        await a.send(envelope("p/alice", "channel_create", channel="ops", label="Ops room"))
        await a.recv()
        await a.send(envelope("p/alice", "channel_create", channel="ops"), " (again)")
        await a.recv()
        await a.send(envelope("p/alice", "channel_invite", channel="ops", invitee="p/bob"))
        await a.recv()
        await b.drain(0.5)
        await c.send(envelope("p/carol", "channel_invite", channel="ops", invitee="p/carol"), " (non-member invites)")
        await c.recv()
        await b.send(envelope("p/bob", "channel_join", channel="ops"))
        await b.recv()
        await c.send(envelope("p/carol", "channel_join", channel="ops"), " (uninvited)")
        await c.recv()
        await a.send(envelope("p/alice", "channel_invite", channel="ops", invitee="p/dan"))
        await a.recv()
        await d.drain(0.4)
        print("## chat to the channel, receipt requested (dan invited, not joined)", flush=True)
        await a.send(envelope("p/alice", "chat", target="all", payload="to ops", channel="ops",
                              receipt_requested=True, client_msg_id="m-1"))
        await a.drain(0.6)
        await b.drain(0.6)
        await c.drain(0.6)
        await d.drain(0.6)
        print("## member chat with a directed target inside the channel", flush=True)
        await b.send(envelope("p/bob", "chat", target="p/alice", payload="just alice", channel="ops", receipt_requested=True))
        await a.drain(0.6)
        await b.drain(0.6)
        await c.drain(0.6)
        await c.send(envelope("p/carol", "chat", target="all", payload="let me in", channel="ops"), " (non-member)")
        await c.drain(0.6)
        await a.send(envelope("p/alice", "chat", target="all", payload="x", channel="nosuch"), " (unknown channel)")
        await a.drain(0.6)
        for label, bad in (("no channel", {}), ("space and slash", {"channel": "a b/c"}), ("200 chars", {"channel": "x" * 200})):
            await a.send(envelope("p/alice", "channel_create", **bad), f" ({label})")
            await a.recv()
        await a.send(envelope("p/alice", "channel_list_request"))
        await a.recv()
        await c.send(envelope("p/carol", "channel_list_request"), " (non-member)")
        await c.recv()
        await a.send(envelope("p/alice", "channel_history_request", channel="ops", limit=5))
        await a.recv()
        await c.send(envelope("p/carol", "channel_history_request", channel="ops", limit=5), " (non-member)")
        await c.recv()
        await c.send(envelope("p/carol", "history_request", target="SynapseHub", limit=5), " (global history, non-member)")
        await c.until("history_snapshot")
        await b.send(envelope("p/bob", "channel_leave", channel="ops"))
        await b.recv()
        await b.send(envelope("p/bob", "channel_leave", channel="ops"), " (again)")
        await b.recv()
        for conn in (a, b, c, d):
            await conn.ws.close()
    print("## restart: does the channel survive?", flush=True)
    with running(work, flags, "restarted") as hub:
        a = await connect(hub, "p/alice", token=None)
        await a.drain(0.4)
        await a.send(envelope("p/alice", "channel_list_request"))
        await a.recv()
        await a.ws.close()


async def probe_channels_private(work: Workdir) -> None:
    """Directed chat routing under --private-directed-messages, and the observe grant."""
    acl = owner_only(work.path / "acl.json", json.dumps({"rules": [
        {"permission": "observe", "target_kind": "agent", "target_pattern": "p/*"}]}))
    flags = ["--private-directed-messages", "--insecure-unbound-identity", "--acl-policy", str(acl)]
    with running(work, flags) as hub:
        a = await connect(hub, "p/alice", token=None)
        b = await connect(hub, "p/bob", token=None)
        c = await connect(hub, "p/carol", token=None)
        for conn in (a, b, c):
            await conn.drain(0.3)
        await a.send(envelope("p/alice", "chat", target="p/bob", payload="for bob only", receipt_requested=True))
        for conn in (a, b, c):
            await conn.drain(0.5)
    print("## the same without the ACL observe rule", flush=True)
    with running(work, ["--private-directed-messages", "--insecure-unbound-identity"], "noobserve") as hub:
        a = await connect(hub, "p/alice", token=None)
        b = await connect(hub, "p/bob", token=None)
        c = await connect(hub, "p/carol", token=None)
        for conn in (a, b, c):
            await conn.drain(0.3)
        await a.send(envelope("p/alice", "chat", target="p/bob", payload="for bob only", receipt_requested=True))
        for conn in (a, b, c):
            await conn.drain(0.5)
    print("## --team-secure without its material", flush=True)
    startup_refusal(work, ["--team-secure"])


async def probe_cards(work: Workdir) -> None:
    """Signed capability cards: advertise through the reference client with a card key."""
    from synapse_channel.client.agent import SynapseAgent

    trust = work.path / "card-trust.json"
    good = work.path / "card-good.pem"
    work.synapse("capability-card", "keygen", "--key-id", "card-1", "--private-out", str(good),
                 "--agent", "p/alice", "--project", "p", "--trust", str(trust))
    stray = work.path / "card-stray.pem"
    work.synapse("capability-card", "keygen", "--key-id", "card-9", "--private-out", str(stray),
                 "--agent", "p/alice", "--project", "p")
    owner_only(trust, trust.read_text())
    print(f"## card trust file: {trust.read_text().strip()}", flush=True)
    flags = ["--capability-card-trust", str(trust)]
    with running(work, flags) as hub:
        watcher = await connect(hub, "p/watch", token=None)
        await watcher.drain(0.4)
        captured: list[dict] = []
        for label, pem, kid in (("valid", good, "card-1"), ("unknown key", stray, "card-9")):
            print(f"## advertise signed through SynapseAgent.advertise: {label}", flush=True)
            agent = SynapseAgent("p/alice", None, uri=hub.uri, machine_identity=False,
                                 capability_card_key_path=str(pem), capability_card_key_id=kid,
                                 capability_card_project="p")
            task = asyncio.create_task(agent.connect())
            await agent.wait_until_ready(5)
            orig = agent.connection.send

            async def spy(raw: str, orig: Any = orig) -> None:
                frame = json.loads(raw)
                if frame.get("type") == "advertise":
                    captured.append(frame)
                show(">> agent sends:", frame)
                await orig(raw)

            agent.connection.send = spy  # type: ignore[method-assign]
            await agent.advertise(description="builder", skills=["python"], task_classes=["code"])
            await watcher.until("capability_advertised", 2.0)
            agent.running = False
            await agent.connection.close()
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
            await watcher.drain(0.3)
        print("## the valid signed frame replayed raw: tampered body, another sender, same frame again", flush=True)
        signed = captured[0]
        raw = await connect(hub, "p/alice", token=None, label="p/alice(raw)")
        await raw.drain(0.3)
        await raw.send(dict(signed, description="tampered", timestamp=time.time()), " (tampered)")
        await watcher.until("capability_advertised", 2.0)
        await raw.send(dict(signed, timestamp=time.time()), " (same signed card again)")
        await watcher.until("capability_advertised", 2.0)
        await raw.ws.close()
        other = await connect(hub, "q/mallory", token=None)
        await other.drain(0.3)
        await other.send(dict(signed, sender="q/mallory", timestamp=time.time()), " (other namespace)")
        await watcher.until("capability_advertised", 2.0)
        await other.ws.close()
        print("## advertise unsigned (raw), then a tampered signature", flush=True)
        raw = await connect(hub, "p/raw", token=None)
        await raw.drain(0.3)
        await raw.send(envelope("p/raw", "advertise", target="all", description="plain", skills=["x"]))
        await watcher.until("capability_advertised", 2.0)
        await raw.send(envelope("p/raw", "manifest_request", target="SynapseHub"))
        snap = await raw.until("manifest_snapshot", 2.0)
        await raw.ws.close()
        await watcher.ws.close()
    print("## hub without --capability-card-trust, a signed card", flush=True)
    with running(work, [], "notrust") as hub:
        watcher = await connect(hub, "p/watch", token=None)
        await watcher.drain(0.3)
        agent = SynapseAgent("p/alice", None, uri=hub.uri, machine_identity=False,
                             capability_card_key_path=str(good), capability_card_key_id="card-1",
                             capability_card_project="p")
        task = asyncio.create_task(agent.connect())
        await agent.wait_until_ready(5)
        await agent.advertise(description="builder")
        await watcher.until("capability_advertised", 2.0)
        agent.running = False
        await agent.connection.close()
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
        await watcher.ws.close()


async def probe_deadletter(work: Workdir) -> None:
    print("## CLI hub (no threshold flag exists): three undelivered directed chats", flush=True)
    flags = ["--db", str(work.path / "hub.db"), "--hub-id", "dl"]
    with running(work, flags) as hub:
        a = await connect(hub, "p/alice", token=None)
        w = await connect(hub, "p/watch", token=None)
        await a.drain(0.4)
        for i in range(3):
            await a.send(envelope("p/alice", "chat", target="p/nobody", payload=f"hello {i}"))
            await a.drain(0.4)
        await w.drain(0.5)
        await a.ws.close()
        await w.ws.close()
    print("## embedded SynapseHub(dead_letter_escalation_threshold=2)", flush=True)
    hub = EmbeddedHub(work, {"dead_letter_escalation_threshold": 2, "db_path": str(work.path / "emb.db"),
                             "hub_id": "emb"})
    try:
        hub.start()
    except RuntimeError as exc:
        print(f"## embedded start failed: {str(exc)[-600:]}", flush=True)
        hub = EmbeddedHub(work, {"dead_letter_escalation_threshold": 2})
        hub.start()
    try:
        a = await connect(hub, "p/alice", token=None)
        w = await connect(hub, "p/watch", token=None)
        await a.drain(0.4)
        await w.drain(0.2)
        for i in range(5):
            await a.send(envelope("p/alice", "chat", target="p/nobody", payload=f"hello {i}"))
            await a.drain(0.4)
            await w.drain(0.2)
        await a.ws.close()
        await w.ws.close()
    finally:
        hub.stop()

"""Session-bound delivery (wire v3) on one real hubd process: seed 001's
acceptance matrix over raw v3 clients (tests/support/delivery_driver.py).

One hub serves the whole module (each case uses its own names). Cases that
end in a live stage record what their operations must show; once the
module's cases have run (whichever ran, in whatever order: no case depends
on another), `every_case_replays_from_the_journal` restarts the hub and
checks every recorded operation replays from the journal to the same stage,
facts and latest_event_seq. The two crash cases SIGKILL the hub themselves
and check their own replay.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.support.delivery_driver import (Agent, chat_rows, delivery_rows, incarnation,
                                           operation_key)
from tests.support.procs import hubd_process

HUB_ID = "dlv-hub"
FACTS = ("stage", "selected_mode", "quality", "cancel_requested", "boundary_delivered",
         "explicitly_acknowledged", "task_completed", "latest_event_seq", "request_id",
         "task_id")


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    proc = hubd_process(tmp_path_factory.mktemp("delivery"), hub_id=HUB_ID)
    proc.start()
    proc.db = proc.argv[proc.argv.index("--db") + 1]
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def replay_ledger():
    """(sender, op_key) -> the status facts the operation must still show
    after a restart."""
    return {}


@pytest.fixture(scope="module")
def spent_keys():
    """(sender, target, incarnation, idempotency key) the sender spent: still
    spent after a restart."""
    return []


@pytest.fixture(scope="module")
def offline_notes():
    """audience -> the (stage, notification_id)s queued while it was offline:
    still sent to it after a restart."""
    return {}


@pytest.fixture(scope="module", autouse=True)
def every_case_replays_from_the_journal(hub, replay_ledger, spent_keys, offline_notes):
    """After the module's cases, a restart: what they recorded replays from
    the journal (a failure here is an error at the last case's teardown)."""
    yield
    if not (replay_ledger or spent_keys or offline_notes):
        return
    hub.stop()
    hub.start()

    async def case():
        agents = {}
        for sender, op in replay_ledger:
            if sender not in agents:
                agents[sender] = await Agent.join(hub.url, sender)
        for (sender, op), facts in replay_ledger.items():
            status = await agents[sender].status(op)
            assert {k: status[k] for k in FACTS} == facts, (sender, op)
        for n, (sender, target, inc, key) in enumerate(spent_keys):
            if sender not in agents:
                agents[sender] = await Agent.join(hub.url, sender)
            answer = await agents[sender].request(target, inc, f"after-restart-{n}",
                                                  idempotency_key=key)
            assert answer["reason_code"] == "id_conflict", answer
        # a notification queued while its audience was offline survived the restart
        for audience, expected in offline_notes.items():
            agent = await Agent.join(hub.url, audience)
            await agent.probe.drain(0.4)
            notes = agent.probe.seen("delivery_status")
            assert [(f["stage"], f["notification_id"]) for f in notes] == expected
            await agent.close()
        for agent in agents.values():
            await agent.close()
    run(case())


def run(coro):
    return asyncio.run(coro)


def appended(hub, since: int) -> list:
    """Delivery events (other than notification settlements) after seq `since`."""
    return [r for r in delivery_rows(hub.db) if r[0] > since and r[1] != "delivery_notified"]


def last_seq(hub) -> int:
    rows = delivery_rows(hub.db)
    return rows[-1][0] if rows else 0


def remember(ledger, sender: str, status: dict) -> None:
    ledger[(sender, status["operation_key"])] = {k: status[k] for k in FACTS}


# -- 1. sessions, and clients older than v3


def test_sessions_are_published_only_as_digests_and_only_to_v3(hub):
    async def case():
        bob = await Agent.join(hub.url, "s1/bob", recipient=True)
        assert bob.incarnation == incarnation(HUB_ID, "s1/bob", bob.token)
        session = bob.probe.seen("delivery_session")[0]
        assert session["capabilities"] == {"next_turn": "native", "follow_up": "emulated"}
        assert session["protocol_version"] == 3
        v3 = await Agent.join(hub.url, "s1/new", version=7)  # the reference client says 7
        await v3.send("who_request")
        who = await v3.probe.recv_type("who_snapshot")
        assert who["delivery_sessions"]["s1/bob"] == {
            "incarnation": bob.incarnation, "hub_id": HUB_ID,
            "capabilities": {"next_turn": "native", "follow_up": "emulated"}}
        assert bob.token not in str(who)
        for version in (None, 2):
            old = await Agent.join(hub.url, f"s1/old{version}", version=version)
            await old.send("who_request")
            assert "delivery_sessions" not in await old.probe.recv_type("who_snapshot")
            answer = await old.request("s1/bob", bob.incarnation, f"old-{version}")
            assert answer["type"] == "delivery_refused"
            assert answer["reason_code"] == "unsupported_protocol"
            assert answer["request_id"] == f"old-{version}"
            await old.send("delivery_status_request",
                           operation_key=operation_key(HUB_ID, old.name, "x"))
            assert (await old.answer())["reason_code"] == "unsupported_protocol"
            await old.close()
        # a frame that does not say v3 is not a v3 frame, whoever sends it
        answer = await v3.request("s1/bob", bob.incarnation, "nopv", protocol_version=...)
        assert answer["reason_code"] == "unsupported_protocol"
        await v3.close()
        await bob.close()

    before = last_seq(hub)
    run(case())
    assert appended(hub, before) == []


@pytest.mark.parametrize("extra,code", [
    ({"protocol_version": 2, "delivery_session_token": "ab" * 32,
      "delivery_capabilities": {}}, "unsupported_protocol"),
    ({"protocol_version": 3, "delivery_session_token": "AB" * 32,
      "delivery_capabilities": {}}, "invalid_shape"),
    ({"protocol_version": 3, "delivery_session_token": "ab" * 32,
      "delivery_capabilities": {"next_turn": "superb"}}, "invalid_shape"),
    ({"protocol_version": 3, "delivery_session_token": "ab" * 32,
      "delivery_capabilities": {"shout": "native"}}, "invalid_shape"),
])
def test_a_bad_session_advert_closes_with_4020_and_a_typed_error(hub, extra, code):
    async def case():
        from tests.support.wsprobe import WsProbe
        probe = await WsProbe.open(hub.url)
        await probe.recv_type("welcome")
        await probe.register(f"s2/x{abs(hash(str(extra))) % 10_000}", **extra)
        error = await probe.recv_type("error")
        assert error["reason_code"] == code
        assert "ab" * 32 not in str(error)
        assert (await probe.wait_closed()).code == 4020
        await probe.close()
    run(case())


# -- 2. modes: native, emulated, fallback, unavailable, unknown, control


def test_modes_native_emulated_fallback_and_refusals(hub, replay_ledger):
    async def case():
        bob = await Agent.join(hub.url, "m/bob", recipient=True)
        carl = await Agent.join(hub.url, "m/carl", recipient=True,
                                caps={"interrupt": "native", "steer": "native"})
        alice = await Agent.join(hub.url, "m/alice")

        native = await alice.request("m/bob", bob.incarnation, "native")
        assert (native["stage"], native["selected_mode"], native["quality"]) == \
            ("queued", "next_turn", "native")
        offer = await bob.offer("native")
        assert offer["notification_id"] == f"delivery:{native['operation_key']}:1"
        assert offer["operation_key"] == operation_key(HUB_ID, "m/alice", "native")
        assert (offer["sender"], offer["target"], offer["body"]) == \
            ("m/alice", "m/bob", "please do native")
        remember(replay_ledger, "m/alice", native)

        emulated = await alice.request("m/bob", bob.incarnation, "emulated", mode="follow_up")
        assert (emulated["selected_mode"], emulated["quality"]) == ("follow_up", "emulated")
        remember(replay_ledger, "m/alice", emulated)

        fallback = await alice.request("m/bob", bob.incarnation, "fallback", mode="steer",
                                       allowed_fallbacks=["interrupt", "follow_up"])
        assert (fallback["selected_mode"], fallback["quality"]) == ("follow_up", "emulated")
        offer = await bob.offer("fallback")
        assert (offer["requested_mode"], offer["selected_mode"]) == ("steer", "follow_up")
        remember(replay_ledger, "m/alice", fallback)

        before = last_seq(hub)
        chats = chat_rows(hub.db)
        refusals = [
            ("unavailable", dict(mode="steer"), "unsupported_mode"),
            ("unknown", dict(mode="shout"), "unsupported_mode"),
            ("unknown-fallback", dict(mode="steer", allowed_fallbacks=["loud"]),
             "unsupported_mode"),
            ("four", dict(allowed_fallbacks=["steer", "interrupt", "follow_up", "x"]),
             "invalid_shape"),
            ("big", dict(body="x" * 8193), "invalid_shape"),
            ("late", dict(deadline=time.time() - 1), "deadline_expired"),
            ("far", dict(deadline=time.time() + 2 * 86_400), "invalid_shape"),
        ]
        for rid, fields, code in refusals:
            answer = await alice.request("m/bob", bob.incarnation, rid, **fields)
            assert (answer["type"], answer["reason_code"], answer["request_id"]) == \
                ("delivery_refused", code, rid), answer
        for mode in ("interrupt", "steer"):
            answer = await alice.request("m/carl", carl.incarnation, f"ctl-{mode}", mode=mode,
                                         allowed_fallbacks=[])
            assert answer["reason_code"] == "unauthorised_requester"
        answer = await alice.request("m/nobody", "c" * 64, "nobody")
        assert answer["reason_code"] == "unavailable_recipient"
        # an invalid request id is not echoed, nor is the body
        answer = await alice.request("m/bob", bob.incarnation, "r" * 129, body="secret-body")
        assert answer["request_id"] == "" and "secret" not in str(answer)
        # an escaped unpaired surrogate reaches the verb and is refused by shape
        await alice.probe.send_text(
            '{"sender":"m/alice","target":"m/bob","type":"delivery_request",'
            '"protocol_version":3,"request_id":"sur","idempotency_key":"k",'
            f'"target_incarnation":"{bob.incarnation}","mode":"next_turn",'
            '"allowed_fallbacks":[],"task_id":"","body":"\\ud800x",'
            f'"deadline":{time.time() + 60}}}')
        answer = await alice.answer()
        assert (answer["reason_code"], answer["request_id"]) == ("invalid_shape", "sur")
        await alice.probe.send_text(
            '{"sender":"m/alice","target":"m/bob","type":"delivery_request",'
            '"protocol_version":3,"request_id":"\\udc00","idempotency_key":"k"}')
        answer = await alice.answer()
        assert (answer["reason_code"], answer["request_id"]) == ("invalid_shape", "")
        assert appended(hub, before) == [], "a refusal appended to the journal"
        assert chat_rows(hub.db) == chats, "a refused delivery became chat"
        # the connection is still usable, and nothing reached the recipients
        ok = await alice.request("m/bob", bob.incarnation, "after")
        assert ok["stage"] == "queued"
        remember(replay_ledger, "m/alice", ok)
        offers = [f["request_id"] for f in await bob.probe.drain(0.3)
                  if f.get("type") == "delivery_offer"]
        assert offers == ["after"]
        assert not [f for f in bob.probe.seen() if f.get("type") == "chat"]
        assert not carl.probe.seen("delivery_offer")
        for agent in (alice, bob, carl):
            await agent.close()
    run(case())


def test_caps_refuse_before_anything_is_appended(hub):
    async def case():
        bob = await Agent.join(hub.url, "q/bob", recipient=True)
        senders = [await Agent.join(hub.url, f"q/s{i}") for i in range(9)]
        for i in range(16):
            assert (await senders[0].request("q/bob", bob.incarnation, f"a{i}"))["stage"] == "queued"
        before = last_seq(hub)
        answer = await senders[0].request("q/bob", bob.incarnation, "a16")
        assert answer["reason_code"] == "recipient_queue_full"
        assert appended(hub, before) == []
        for s in senders[1:8]:
            for i in range(16):
                assert (await s.request("q/bob", bob.incarnation, f"b{i}"))["stage"] == "queued"
        before = last_seq(hub)
        answer = await senders[8].request("q/bob", bob.incarnation, "first")
        assert answer["reason_code"] == "recipient_queue_full"  # 128 unfinished already
        assert appended(hub, before) == []
        for agent in (bob, *senders):
            await agent.close()
    run(case())


# -- 3. duplicates


def test_identical_retry_returns_the_original_and_altered_content_conflicts(hub,
                                                                            replay_ledger):
    async def case():
        bob = await Agent.join(hub.url, "d/bob", recipient=True)
        alice = await Agent.join(hub.url, "d/alice")
        deadline = time.time() + 300
        first = await alice.request("d/bob", bob.incarnation, "dup", deadline=deadline)
        await bob.offer("dup")
        before = last_seq(hub)
        again = await alice.request("d/bob", bob.incarnation, "dup", deadline=deadline)
        assert again == {**first, "timestamp": again["timestamp"]}
        for change in (dict(body="other"), dict(idempotency_key="other"),
                       dict(mode="follow_up")):
            answer = await alice.request("d/bob", bob.incarnation, "dup", deadline=deadline,
                                         **change)
            assert (answer["reason_code"], answer["request_id"]) == ("id_conflict", "dup")
        assert appended(hub, before) == []
        assert [f for f in await bob.probe.drain(0.3) if f.get("type") == "delivery_offer"] == []
        accepted = [r for r in delivery_rows(hub.db) if r[1] == "delivery_intent_accepted"
                    and r[2]["operation_key"] == first["operation_key"]]
        assert len(accepted) == 1
        remember(replay_ledger, "d/alice", first)
        await bob.close()
        await alice.close()
    run(case())


def test_an_idempotency_key_names_one_request_of_its_sender(hub, replay_ledger, spent_keys):
    """Seed 001: a reused id is refused. The reference refuses a sender's
    idempotency key under a new request id (id_conflict), whatever the
    content and before it looks at the recipient; hubd did not (d590ccf
    admitted a second operation)."""
    conflict = ("delivery_refused", "id_conflict", "request identity was reused with new content")

    def refused(answer, rid):
        assert (answer["type"], answer["reason_code"], answer["payload"]) == conflict, answer
        assert answer["request_id"] == rid

    async def case():
        bob = await Agent.join(hub.url, "ik/bob", recipient=True)
        alice = await Agent.join(hub.url, "ik/alice")
        carol = await Agent.join(hub.url, "ik/carol")
        deadline = time.time() + 300
        first = await alice.request("ik/bob", bob.incarnation, "pay", idempotency_key="pay-1",
                                    deadline=deadline)
        assert first["stage"] == "queued"
        offer = await bob.offer("pay")
        before = last_seq(hub)
        refused(await alice.request("ik/bob", bob.incarnation, "pay-again",
                                    idempotency_key="pay-1", deadline=deadline), "pay-again")
        refused(await alice.request("ik/bob", bob.incarnation, "pay-other",
                                    idempotency_key="pay-1", body="other"), "pay-other")
        # answered before the recipient is looked at, as the reference does
        refused(await alice.request("ik/nobody", "0" * 64, "pay-elsewhere",
                                    idempotency_key="pay-1"), "pay-elsewhere")
        assert appended(hub, before) == []
        assert [f for f in await bob.probe.drain(0.3) if f.get("type") == "delivery_offer"] == []
        # the retry (same request id, same content) is still the original
        again = await alice.request("ik/bob", bob.incarnation, "pay", idempotency_key="pay-1",
                                    deadline=deadline)
        assert again == {**first, "timestamp": again["timestamp"]}
        # the key is its sender's: another sender's request with it is its own
        carols = await carol.request("ik/bob", bob.incarnation, "pay", idempotency_key="pay-1")
        assert (carols["type"], carols["stage"]) == ("delivery_status", "queued")
        assert carols["operation_key"] != first["operation_key"]
        # spent for as long as the operation is kept, finished or not
        for stage in ("boundary_delivered", "acknowledged", "completed"):
            await bob.report(offer, stage)
        refused(await alice.request("ik/bob", bob.incarnation, "pay-later",
                                    idempotency_key="pay-1"), "pay-later")
        remember(replay_ledger, "ik/alice", await alice.status(first["operation_key"]))
        spent_keys.append(("ik/alice", "ik/bob", bob.incarnation, "pay-1"))
        for agent in (alice, bob, carol):
            await agent.close()
    run(case())


# -- 4. the stages, ACK without an outcome, outcomes, mutation ids


def test_stages_each_commit_with_a_notification_and_ack_is_not_completion(hub, replay_ledger):
    async def case():
        bob = await Agent.join(hub.url, "st/bob", recipient=True)
        alice = await Agent.join(hub.url, "st/alice")
        eve = await Agent.join(hub.url, "st/eve")
        queued = await alice.request("st/bob", bob.incarnation, "job")
        offer = await bob.offer("job")
        op = queued["operation_key"]

        # only the recipient reports, only in order, only with its evidence
        assert (await eve.report(offer, "boundary_delivered"))["reason_code"] == \
            "unauthorised_requester"
        assert (await eve.status(op))["reason_code"] == "unauthorised_requester"
        assert (await bob.report(offer, "acknowledged"))["reason_code"] == "invalid_transition"
        assert (await bob.report({**offer, "task_id": "other"}, "boundary_delivered"))[
            "reason_code"] == "invalid_shape"
        assert (await bob.report(offer, "boundary_delivered", boundary="x", more="y"))[
            "reason_code"] == "invalid_shape"

        boundary = await bob.report(offer, "boundary_delivered", mutation_id="m-b")
        assert (boundary["stage"], boundary["boundary_delivered"]) == ("boundary_delivered", True)
        note = await alice.notification("job", "boundary_delivered")
        assert (note["source"], note["notification_id"], note["audience"]) == \
            ("recipient", f"delivery:{op}:2", "st/alice")
        # the same mutation again changes nothing; changed content conflicts
        seq = last_seq(hub)
        assert (await bob.report(offer, "boundary_delivered", mutation_id="m-b"))["stage"] == \
            "boundary_delivered"
        assert (await bob.report(offer, "boundary_delivered", mutation_id="m-b",
                                 boundary="other"))["reason_code"] == "id_conflict"
        assert appended(hub, seq) == []

        acked = await bob.report(offer, "acknowledged", mutation_id="m-a")
        assert (await alice.notification("job", "acknowledged"))["notification_id"] == \
            f"delivery:{op}:3"
        status = await alice.status(op)
        assert (status["stage"], status["explicitly_acknowledged"], status["task_completed"],
                status["receiver_reachable"], status["active_session"]) == \
            ("acknowledged", True, False, True, True)
        assert status["latest_event_seq"] == acked["latest_event_seq"]
        remember(replay_ledger, "st/alice", status)  # an ACK without an outcome, replayed

        # a second operation runs to a completed outcome, and nothing after it
        queued2 = await alice.request("st/bob", bob.incarnation, "job2")
        offer2 = await bob.offer("job2")
        await bob.report(offer2, "boundary_delivered")
        await bob.report(offer2, "acknowledged")
        assert (await bob.report(offer2, "completed", executor_ref="exec-7"))[
            "reason_code"] == "invalid_shape"
        done = await bob.report(offer2, "completed")
        assert (done["stage"], done["task_completed"]) == ("completed", True)
        assert (await alice.notification("job2", "completed"))["source"] == "recipient"
        assert (await bob.report(offer2, "failed", mutation_id="late"))["reason_code"] == \
            "invalid_transition"
        assert (await alice.cancel(queued2["operation_key"], "c-late"))["reason_code"] == \
            "invalid_transition"
        remember(replay_ledger, "st/alice", await alice.status(queued2["operation_key"]))
        for agent in (alice, bob, eve):
            await agent.close()
    run(case())


# -- 5. cancellation


def test_queued_cancellation_and_a_completion_racing_a_cancel(hub, replay_ledger):
    async def case():
        bob = await Agent.join(hub.url, "c/bob", recipient=True)
        alice = await Agent.join(hub.url, "c/alice")
        queued = await alice.request("c/bob", bob.incarnation, "stop-me")
        offer = await bob.offer("stop-me")
        op = queued["operation_key"]
        asked = await alice.cancel(op, "cx-1")
        assert (asked["stage"], asked["cancel_requested"]) == ("queued", True)  # a request only
        note = await bob.notification("stop-me", "queued")
        assert (note["source"], note["cancel_requested"], note["audience"]) == \
            ("sender", True, "c/bob")
        seq = last_seq(hub)
        assert (await alice.cancel(op, "cx-2"))["cancel_requested"] is True
        assert appended(hub, seq) == [], "a repeated cancel appended"
        assert (await bob.status(op))["stage"] == "queued"  # the recipient may ask too

        # the race: cancel asked while the executor runs; it completes anyway
        racing = await alice.request("c/bob", bob.incarnation, "race")
        offer2 = await bob.offer("race")
        await bob.report(offer2, "boundary_delivered")
        await bob.report(offer2, "acknowledged")
        await alice.cancel(racing["operation_key"], "cx-race")
        done = await bob.report(offer2, "completed")
        assert (done["stage"], done["cancel_requested"], done["task_completed"]) == \
            ("completed", True, True)
        remember(replay_ledger, "c/alice", await alice.status(racing["operation_key"]))

        # the executor confirms a cancellation: only then is it terminal
        await bob.report(offer, "boundary_delivered")
        await bob.report(offer, "acknowledged")
        stopped = await bob.report(offer, "cancelled",
                                   executor_ref="exec-1", outcome_code="stopped")
        assert (stopped["stage"], stopped["task_completed"]) == ("cancelled", False)
        remember(replay_ledger, "c/alice", await alice.status(op))
        for agent in (alice, bob):
            await agent.close()
    run(case())


def test_the_executor_confirms_a_queued_cancellation_as_terminal(hub, replay_ledger):
    """queued -> the sender's cancel request -> the executor's `cancelled`
    (before it started the turn, as the reference bridge reports it: no
    boundary, evidence {"reason_code": "sender_cancelled"}); and a
    `cancelled` nobody asked for is refused, nothing appended."""
    async def case():
        bob = await Agent.join(hub.url, "xc/bob", recipient=True)
        alice = await Agent.join(hub.url, "xc/alice")

        # no cancel request on record: the executor cannot end it as cancelled
        unasked = await alice.request("xc/bob", bob.incarnation, "unasked")
        offer_u = await bob.offer("unasked")
        seq = last_seq(hub)
        no = await bob.report(offer_u, "cancelled", mutation_id="bridge:cancelled:u",
                              reason_code="sender_cancelled")
        assert (no["type"], no["reason_code"], no["request_id"]) == \
            ("delivery_refused", "invalid_transition", "unasked")
        assert "cancel" in no["payload"]
        assert appended(hub, seq) == [], "a refused cancelled outcome appended"
        assert (await alice.status(unasked["operation_key"]))["stage"] == "queued"
        # nor with the executor's own evidence, from a later stage
        await bob.report(offer_u, "boundary_delivered")
        await bob.report(offer_u, "acknowledged")
        seq = last_seq(hub)
        no = await bob.report(offer_u, "cancelled", mutation_id="x-u",
                              executor_ref="exec-u", outcome_code="stopped")
        assert no["reason_code"] == "invalid_transition"
        assert appended(hub, seq) == []
        # bad evidence is a shape refusal before any transition
        assert (await bob.report(offer_u, "cancelled", mutation_id="y-u",
                                 reason_code="Sender Cancelled"))["reason_code"] == "invalid_shape"
        assert (await bob.report(offer_u, "cancelled", mutation_id="z-u", reason_code="x",
                                 executor_ref="e"))["reason_code"] == "invalid_shape"
        assert appended(hub, seq) == []
        remember(replay_ledger, "xc/alice", await alice.status(unasked["operation_key"]))

        # asked, then confirmed while still queued
        queued = await alice.request("xc/bob", bob.incarnation, "asked")
        offer = await bob.offer("asked")
        op = queued["operation_key"]
        asked = await alice.cancel(op, "cancel-asked")
        assert (asked["stage"], asked["cancel_requested"]) == ("queued", True)
        told = await bob.notification("asked", "queued")
        assert told["notification_id"] == f"delivery:{op}:2"
        seq = last_seq(hub)
        # (completed or failed still cannot skip the boundary)
        assert (await bob.report(offer, "completed"))["reason_code"] == "invalid_transition"
        confirmed = await bob.report(offer, "cancelled", mutation_id=f"bridge:cancelled:{op}",
                                     reason_code="sender_cancelled")
        assert (confirmed["type"], confirmed["stage"], confirmed["cancel_requested"],
                confirmed["task_completed"], confirmed["boundary_delivered"],
                confirmed["explicitly_acknowledged"]) == \
            ("delivery_status", "cancelled", True, False, False, False)
        rows = appended(hub, seq)
        assert [(kind, p["stage"], p["source"], p["evidence"]) for _, kind, p in rows] == \
            [("delivery_stage", "cancelled", "recipient", {"reason_code": "sender_cancelled"})]
        assert confirmed["latest_event_seq"] == rows[0][0]
        # the sender is told, with the next stable id
        note = await alice.notification("asked", "cancelled")
        assert (note["source"], note["cancel_requested"], note["notification_id"],
                note["event_seq"]) == ("recipient", True, f"delivery:{op}:3", rows[0][0])
        status = await alice.status(op)
        assert {k: status[k] for k in FACTS} == {k: confirmed[k] for k in FACTS}
        # terminal: the same mutation again is the status; anything else is refused
        seq = last_seq(hub)
        again = await bob.report(offer, "cancelled", mutation_id=f"bridge:cancelled:{op}",
                                 reason_code="sender_cancelled")
        assert (again["stage"], again["latest_event_seq"]) == ("cancelled", rows[0][0])
        assert (await bob.report(offer, "cancelled", mutation_id="other",
                                 reason_code="sender_cancelled"))["reason_code"] == \
            "invalid_transition"
        assert (await bob.report(offer, "boundary_delivered"))["reason_code"] == \
            "invalid_transition"
        assert (await alice.cancel(op, "cancel-again"))["reason_code"] == "invalid_transition"
        assert appended(hub, seq) == []
        # a reconnect with the same token does not offer terminal work again
        await bob.close()
        bob2 = await Agent.join(hub.url, "xc/bob", token=bob.token)
        await bob2.probe.drain(0.3)
        assert bob2.probe.seen("delivery_offer") == []  # nothing of xc/bob's is still queued
        remember(replay_ledger, "xc/alice", status)
        for agent in (alice, bob2):
            await agent.close()
    run(case())


# -- 6. deadlines


def test_the_deadline_sweep_commits_expired(hub, replay_ledger):
    async def case():
        bob = await Agent.join(hub.url, "e/bob", recipient=True)
        alice = await Agent.join(hub.url, "e/alice")
        queued = await alice.request("e/bob", bob.incarnation, "soon",
                                     deadline=time.time() + 1.2)
        offer = await bob.offer("soon")
        note = await alice.notification("soon", "expired", timeout=5)
        assert (note["source"], note["notification_id"]) == \
            ("hub", f"delivery:{queued['operation_key']}:2")
        status = await alice.status(queued["operation_key"])
        assert status["stage"] == "expired"
        assert (await bob.report(offer, "boundary_delivered"))["reason_code"] == \
            "invalid_transition"
        remember(replay_ledger, "e/alice", status)
        for agent in (alice, bob):
            await agent.close()
    run(case())


# -- 7. incarnations: fresh, stale, reconnect, switch


def test_reconnect_replays_the_offer_and_a_new_token_supersedes(hub, replay_ledger):
    async def case():
        bob = await Agent.join(hub.url, "i/bob", recipient=True)
        alice = await Agent.join(hub.url, "i/alice")
        queued = await alice.request("i/bob", bob.incarnation, "wait")
        first = await bob.offer("wait")
        busy = await alice.request("i/bob", bob.incarnation, "busy")
        busy_offer = await bob.offer("busy")
        await bob.report(busy_offer, "boundary_delivered")
        await bob.close()
        offline = await alice.status(queued["operation_key"])
        assert (offline["receiver_reachable"], offline["active_session"]) == (False, False)

        # the same token: the same incarnation, its queued offer again, same id
        bob = await Agent.join(hub.url, "i/bob", token=bob.token)
        again = await bob.offer("wait")
        assert again == first
        assert not [f for f in await bob.probe.drain(0.3)
                    if f.get("type") == "delivery_offer" and f["request_id"] == "busy"]
        assert (await alice.status(queued["operation_key"]))["receiver_reachable"] is True

        # a new token: a new incarnation; the old one's unfinished work ends
        old = bob.incarnation
        await bob.close()
        bob = await Agent.join(hub.url, "i/bob", recipient=True)
        assert bob.incarnation != old
        for rid in ("wait", "busy"):
            note = await alice.notification(rid, "superseded")
            assert note["source"] == "hub" and note["target_incarnation"] == old
        assert not [f for f in await bob.probe.drain(0.3) if f.get("type") == "delivery_offer"]
        stale = await alice.request("i/bob", old, "stale")
        assert (stale["reason_code"], stale["request_id"]) == ("stale_incarnation", "stale")
        fresh = await alice.request("i/bob", bob.incarnation, "fresh")
        assert fresh["stage"] == "queued"
        for rid in ("wait", "busy", "fresh"):
            remember(replay_ledger, "i/alice",
                     await alice.status(operation_key(HUB_ID, "i/alice", rid)))
        for agent in (alice, bob):
            await agent.close()
    run(case())


def test_sender_notifications_missed_offline_replay_by_stable_id(hub, offline_notes):
    async def case():
        bob = await Agent.join(hub.url, "o/bob", recipient=True)
        alice = await Agent.join(hub.url, "o/alice")
        await alice.request("o/bob", bob.incarnation, "away")
        offer = await bob.offer("away")
        await alice.close()
        await bob.report(offer, "boundary_delivered")
        await bob.report(offer, "acknowledged")
        # an old client under the same name sees nothing new
        old = await Agent.join(hub.url, "o/alice", version=2)
        await old.probe.drain(0.3)
        assert not [f for f in old.probe.seen() if "delivery" in f.get("type", "")]
        await old.close()
        alice = await Agent.join(hub.url, "o/alice")
        op = offer["operation_key"]
        await alice.probe.drain(0.4)  # they came with the registration, before its presence
        got = [(f["stage"], f["notification_id"]) for f in alice.probe.seen("delivery_status")]
        assert got == [("boundary_delivered", f"delivery:{op}:2"),
                       ("acknowledged", f"delivery:{op}:3")]
        await alice.close()
        await asyncio.sleep(0.2)  # the settlement commits after the release
        alice = await Agent.join(hub.url, "o/alice")
        await alice.probe.drain(0.3)
        assert not alice.probe.seen("delivery_status")
        # one more while offline, kept across the restart (checked at the end)
        await alice.close()
        await bob.report(offer, "completed")
        offline_notes["o/alice"] = [("completed", f"delivery:{op}:4")]
        await bob.close()
    run(case())


def _metric(hub, name: str) -> float:
    for line in hub.get_text("/metrics").splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


def test_settlements_ride_on_later_commits_not_a_commit_of_their_own(hub):
    """A request -> completed round trip commits four times (admission, boundary, ack,
    outcome). The settlement of a notification the sender was sent joins a commit
    that happens anyway, or the once-a-second sweep; journaled on its own it put one
    more fsync in front of every next stage (seven serial commits per round trip)."""
    rounds = 8

    async def case():
        bob = await Agent.join(hub.url, "perf/bob", recipient=True)
        alice = await Agent.join(hub.url, "perf/alice")
        commits = _metric(hub, "hubd_journal_commit_seconds_count")
        started = time.monotonic()
        notes = []
        for i in range(rounds):
            rid = f"rt-{i}"
            await alice.request("perf/bob", bob.incarnation, rid)
            offer = await bob.offer(rid)
            for stage in ("boundary_delivered", "acknowledged", "completed"):
                await bob.report(offer, stage)
                notes.append((await alice.notification(rid, stage))["notification_id"])
        spent = _metric(hub, "hubd_journal_commit_seconds_count") - commits
        sweeps = int(time.monotonic() - started) + 2  # each may commit held settlements
        assert spent <= 4 * rounds + sweeps, (spent, rounds)
        # ... and every one of them is settled soon (by the sweep at the latest)
        deadline = time.monotonic() + 5
        while True:
            settled = {nid for _, kind, p in delivery_rows(hub.db) if kind == "delivery_notified"
                       and p["audience"] == "perf/alice" for nid in p["notification_ids"]}
            if set(notes) <= settled or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.1)
        assert set(notes) <= settled
        assert _metric(hub, "hubd_delivery_settlements_held") == 0
        # settled notifications are not sent again when the sender registers again
        await alice.close()
        alice = await Agent.join(hub.url, "perf/alice")
        await alice.probe.drain(0.3)
        assert not alice.probe.seen("delivery_status")
        await alice.close()
        await bob.close()
    run(case())


def test_a_reconnect_right_after_the_release_gets_no_second_copy(hub):
    """Held settlements of an audience are journaled before its replay: a sender that
    registers again at once is not sent what its earlier socket already got."""
    async def case():
        bob = await Agent.join(hub.url, "perf2/bob", recipient=True)
        alice = await Agent.join(hub.url, "perf2/alice")
        await alice.request("perf2/bob", bob.incarnation, "quick")
        offer = await bob.offer("quick")
        await bob.report(offer, "boundary_delivered")
        await alice.notification("quick", "boundary_delivered")
        await alice.close()
        alice = await Agent.join(hub.url, "perf2/alice")
        await alice.probe.drain(0.3)
        assert not alice.probe.seen("delivery_status")
        await alice.close()
        await bob.close()
    run(case())


# -- 8. crashes


def test_sigkill_after_the_committed_queue_before_delivery(hub):
    async def before():
        bob = await Agent.join(hub.url, "k1/bob", recipient=True)
        alice = await Agent.join(hub.url, "k1/alice")
        queued = await alice.request("k1/bob", bob.incarnation, "crash")
        hub.kill()  # right after the sender heard "queued": the offer may or may not be out
        await asyncio.gather(alice.close(), bob.close(), return_exceptions=True)
        return bob.token, queued

    token, queued = run(before())
    kinds = [k for _, k, p in delivery_rows(hub.db)
             if p.get("operation_key") == queued["operation_key"]]
    assert kinds == ["delivery_intent_accepted", "delivery_intent_queued"]
    hub.start()

    async def after():
        bob = await Agent.join(hub.url, "k1/bob", token=token)
        offer = await bob.offer("crash")
        assert offer["notification_id"] == f"delivery:{queued['operation_key']}:1"
        alice = await Agent.join(hub.url, "k1/alice")
        status = await alice.status(queued["operation_key"])
        assert {k: status[k] for k in FACTS} == {k: queued[k] for k in FACTS}
        boundary = await bob.report(offer, "boundary_delivered")
        assert boundary["stage"] == "boundary_delivered"
        await alice.close()
        await bob.close()
    run(after())


def test_sigkill_after_delivery_before_ack(hub):
    async def before():
        bob = await Agent.join(hub.url, "k2/bob", recipient=True)
        alice = await Agent.join(hub.url, "k2/alice")
        await alice.request("k2/bob", bob.incarnation, "crash2")
        offer = await bob.offer("crash2")
        boundary = await bob.report(offer, "boundary_delivered")
        hub.kill()
        await asyncio.gather(alice.close(), bob.close(), return_exceptions=True)
        return bob.token, offer, boundary

    token, offer, boundary = run(before())
    hub.start()

    async def after():
        bob = await Agent.join(hub.url, "k2/bob", token=token)
        alice = await Agent.join(hub.url, "k2/alice")
        status = await alice.status(offer["operation_key"])
        assert {k: status[k] for k in FACTS} == {k: boundary[k] for k in FACTS}
        assert status["explicitly_acknowledged"] is False
        # a retried boundary report after the crash is the same mutation: no change
        assert (await bob.report(offer, "boundary_delivered"))["latest_event_seq"] == \
            boundary["latest_event_seq"]
        acked = await bob.report(offer, "acknowledged")
        assert acked["stage"] == "acknowledged"
        assert (await alice.notification("crash2", "acknowledged"))["notification_id"] == \
            f"delivery:{offer['operation_key']}:3"
        await alice.close()
        await bob.close()
    run(after())

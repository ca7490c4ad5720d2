"""`resource` -> `resource_offered`: the same frames, sent by the reference
client, against the reference hub and hubd (docs/resources.md;
docs/reference-observed.md §16): the same broadcasts, refusals and
state_snapshot listing, across a restart too."""

from __future__ import annotations

import pytest

from tests.interop.conftest import KINDS, _need_reference, _wait_healthy
from tests.support.procs import hubd_process, reference_hub_process
from tests.support.refclient import RefClient

pytestmark = pytest.mark.interop

FLAGS = ("--max-offers-per-agent", "2")


def _process(kind: str, folder, request):
    if kind == "reference":
        _need_reference(request.getfixturevalue("reference_venv_status"))
        return reference_hub_process(folder, "--no-durable-ingress-quota", *FLAGS,
                                     hub_id="iop-east")
    return hubd_process(folder, *FLAGS, hub_id="iop-east")


@pytest.fixture(params=KINDS)
def offers_hub(request, tmp_path):
    proc = _process(request.param, tmp_path / request.param, request)
    proc.start()
    _wait_healthy(proc)
    proc.kind = request.param
    yield proc
    proc.stop()


def _offered(frame: dict) -> tuple:
    return (frame["sender"], frame["target"], frame["agent"], frame["kind"], frame["name"],
            frame["key"], frame["payload"], "capacity" in frame, "meta" in frame)


def _snapshot(agent) -> list:
    since = agent.mark()
    agent.send("state_request")
    return agent.wait_frame(since=since, type="state_snapshot")["snapshot"]["resources"]


def test_the_reference_clients_offers_get_the_same_answers(offers_hub, request, tmp_path):
    kind = offers_hub.kind
    ref = RefClient(offers_hub.url, tmp_path / "home")
    try:
        alice, bob = ref.agent("p/alice"), ref.agent("p/bob")

        def offer(agent, verb="resource", **fields) -> tuple[dict, dict]:
            """The offer's answer to its sender and what bob saw (None: nothing)."""
            since_a, since_b = agent.mark(), bob.mark()
            agent.send(verb, target="all", **fields)
            got = agent.wait_frame(lambda f: f["type"] in ("resource_offered", "error"),
                                   since=since_a)
            seen = None
            if got["type"] == "resource_offered" and agent is not bob:
                seen = bob.wait_frame(since=since_b, type="resource_offered")
            return got, seen

        got, seen = offer(alice, kind="gpu", name="a100", capacity=2, meta={"zone": "eu"})
        want = ("SynapseHub", "all", "p/alice", "gpu", "a100", "p/alice:gpu:a100",
                "Resource offered by p/alice", False, False)
        assert _offered(got) == want and _offered(seen) == want, kind
        # the same key again replaces the record (no meta now: {})
        got, _ = offer(alice, kind="gpu", name="a100", capacity=3)
        assert got["key"] == "p/alice:gpu:a100", kind
        got, _ = offer(alice, "resource_offer", kind="cpu", name="x")
        assert _offered(got)[2:6] == ("p/alice", "cpu", "x", "p/alice:cpu:x"), kind
        # a third distinct key past --max-offers-per-agent 2; bob's own still counts apart
        got, _ = offer(alice, kind="disk", name="d")
        assert (got["type"], got["payload"]) == ("error", "resource offer quota exceeded"), kind
        got, _ = offer(alice, kind="gpu")
        assert (got["type"], got["payload"]) == \
            ("error", "resource offer requires kind+name"), kind
        got, _ = offer(bob, kind="gpu", name="h100")
        assert got["type"] == "resource_offered", kind

        listing = [{"agent": "p/alice", "kind": "cpu", "name": "x", "capacity": 1, "meta": {}},
                   {"agent": "p/alice", "kind": "gpu", "name": "a100", "capacity": 3,
                    "meta": {}},
                   {"agent": "p/bob", "kind": "gpu", "name": "h100", "capacity": 1, "meta": {}}]
        key = lambda r: (r["agent"], r["kind"], r["name"])  # noqa: E731
        assert sorted(_snapshot(bob), key=key) == listing, kind
    finally:
        ref.stop_all()
    # a restart on the same journal: the offers are still there
    offers_hub.stop()
    offers_hub.start()
    _wait_healthy(offers_hub)
    ref = RefClient(offers_hub.url, tmp_path / "home")
    try:
        carol = ref.agent("p/carol")
        assert sorted(_snapshot(carol), key=key) == listing, kind
    finally:
        ref.stop_all()

"""What the composition root installs: a door's projection does not depend on
whether the door serves, so a journal replays to the same state either way."""
from pathlib import Path

from hubd.composition import plugins_for
from hubd.config import BrokerConfig, HubConfig
from hubd.core.plugin import Installed
from hubd.state import broker as bs
from hubd.state.events import Event
from hubd.state.hub import HubState, apply


def _installed(broker: BrokerConfig | None) -> Installed:
    # the REDSYN door off: these tests count the broker's hooks alone
    return Installed(plugins_for(HubConfig(db=Path("unused.db"), broker=broker, redsyn=False)))


def _replayed(installed: Installed) -> HubState:
    state = HubState.fresh(installed.appliers, installed.projections)
    peer = {"handle": "alice", "display": None, "role": None, "clientKind": "adapter",
            "client": "claude", "cwd": "/w", "owner": None, "host": "h"}
    apply(state, Event(1, 1000.0, bs.PEER, peer))
    return state


def test_broker_events_replay_alike_with_and_without_the_door(tmp_path):
    served = _installed(BrokerConfig(socket_path=tmp_path / "bus.sock",
                                     token_file=tmp_path / "bus.token"))
    off = _installed(None)
    for installed in (served, off):
        assert "broker" in installed.projections
        assert set(bs.KINDS) <= set(installed.appliers)
    with_door, without = _replayed(served), _replayed(off)
    assert bs.of(with_door).peers == bs.of(without).peers
    assert set(bs.of(without).peers) == {"alice"}


def test_only_a_serving_broker_reaches_local_seats_or_opens_a_socket(tmp_path):
    served = _installed(BrokerConfig(socket_path=tmp_path / "bus.sock",
                                     token_file=tmp_path / "bus.token"))
    off = _installed(None)
    # the broker's boxes are a mailbox of the routing service (issue 26: the
    # directed_chat hook it replaces is gone)
    broker_boxes = [[m for m in i.mailboxes if m.kind == "broker"] for i in (served, off)]
    assert len(broker_boxes[0]) == 1 and broker_boxes[1] == []
    assert len(served.hooks("opening")) == 1 and off.hooks("opening") == []

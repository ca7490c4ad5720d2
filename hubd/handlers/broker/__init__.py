"""The local broker on the Router's side (docs/broker.md), as a plugin: its
projection and appliers (hubd/state/broker.py), always, so a journal replays
the same with or without the broker; with a broker configuration, its
dialect and verbs (the connections' commands: dialect.py, verbs.py), its
boxes as a mailbox of the routing service (hub_side.py), its notification
tick and its wait timers (outputs.py).

A hub without a broker configuration serves no socket and reaches no broker
handle.
"""

from __future__ import annotations

from hubd.config import BrokerConfig
from hubd.core.plugin import Plugin
from hubd.state import broker as bs

from .dialect import DIALECTS
from .hub_side import mailbox
from .live import BrokerLive, WaitExpired
from .outputs import tick, wait_expired


def broker_plugin(config: BrokerConfig | None) -> Plugin:
    if config is None:
        return Plugin("broker", appliers=bs.appliers, projections=bs.PROJECTIONS)
    return Plugin("broker", appliers=bs.appliers, projections=bs.PROJECTIONS,
                  mailboxes=(mailbox(config.namespace),), periodic=(tick,),
                  commands={WaitExpired: wait_expired}, live=(BrokerLive,),
                  dialects=DIALECTS)

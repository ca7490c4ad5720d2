"""The composition root: which plugins a hub runs. The only module of the
core, with the command line, that knows federation exists."""

from __future__ import annotations

from federation.config import FederationConfig
from federation.plugin import Federation
from hubd.config import HubConfig
from hubd.core.plugin import Plugin
from hubd.doors.broker.install import broker_door
from hubd.doors.redsyn.install import redsyn_door
from hubd.handlers import core_plugin
from hubd.handlers.attachments import attachments_plugin
from hubd.handlers.broker import broker_plugin
from hubd.handlers.evidence import evidence_plugin
from hubd.handlers.identity_recovery import identity_recovery_plugin
from hubd.handlers.redsyn import redsyn_plugin
from hubd.handlers.signed import signed_plugin
from hubd.hub import Hub


def plugins_for(config: HubConfig) -> list[Plugin]:
    """The core, federation, the REDSYN mailbox and the broker, always (a hub
    without peers still replays forwards it journaled earlier and answers peer
    verbs with their refusals; one with --no-redsyn or --no-broker replays
    those doors' events); the REDSYN and broker doors when they serve."""
    federation = config.federation if config.federation is not None else FederationConfig()
    plugins = [core_plugin(), signed_plugin(config.security),
               identity_recovery_plugin(config.security), attachments_plugin(config),
               Federation(federation).plugin(),
               redsyn_plugin(config.redsyn), broker_plugin(config.broker), evidence_plugin()]
    if config.redsyn:
        plugins.append(redsyn_door())
    if config.broker is not None:
        plugins.append(broker_door(config.broker))
    return plugins


def build_hub(config: HubConfig) -> Hub:
    return Hub(config, plugins_for(config))

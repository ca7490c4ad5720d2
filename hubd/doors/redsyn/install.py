"""The REDSYN mailbox as a plugin: its projection and appliers
(hubd/state/redsyn.py) and its expiry sweep.

Installed whether or not the door serves (`--no-redsyn`): replaying a journal
must give the same state either way.
"""

from __future__ import annotations

from hubd.core.plugin import Plugin
from hubd.state import redsyn as mb

from .door import sweep


def redsyn_plugin() -> Plugin:
    # its chat applier runs after the core's (the core plugin is installed first)
    return Plugin("redsyn", appliers=mb.appliers, projections=mb.PROJECTIONS,
                  periodic=(sweep,))

"""The REDSYN mailbox on the Router's side, as a plugin: its projection and
appliers (hubd/state/redsyn/) and its boxes as a mailbox of the routing
service, always (replaying a journal gives the same state with or without
the door, and a chat to a REDSYN agent lands in its box either way); with the
door serving (`--no-redsyn` not given), its dialect and verbs and the
once-a-second sweep.
"""

from __future__ import annotations

from hubd.core.plugin import Plugin
from hubd.state import redsyn as mb

from .dialect import DIALECT
from hubd.wire.redsyn.envelope import DOOR

from .mailbox import MAILBOX, RedsynLive, sweep


def redsyn_plugin(serving: bool) -> Plugin:
    # its chat applier runs after the core's (the core plugin is installed first)
    if not serving:
        return Plugin("redsyn", appliers=mb.appliers, projections=mb.PROJECTIONS,
                      mailboxes=(MAILBOX,), live=(RedsynLive,))
    return Plugin("redsyn", appliers=mb.appliers, projections=mb.PROJECTIONS,
                  mailboxes=(MAILBOX,), live=(RedsynLive,),
                  dialects={DOOR: DIALECT}, periodic=(sweep,))

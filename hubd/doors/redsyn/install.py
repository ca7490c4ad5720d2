"""The REDSYN mailbox as a plugin: its projection, appliers and timer.

Installed whether or not the door serves (`--no-redsyn`): replaying a journal
must give the same state either way.
"""

from __future__ import annotations

from hubd.core.plugin import Plugin
from hubd.state import events as ev
from hubd.state import redsyn as mb

from .door import sweep


def _apply(state, event) -> None:
    mb.apply(state.extensions["redsyn"], event.kind, event.payload, event.ts)


def _apply_chat(state, event) -> None:
    mb.apply_chat(state.extensions["redsyn"], event.payload, event.route, event.seq, event.ts)


def redsyn_plugin() -> Plugin:
    appliers: dict[str, list] = {kind: [_apply] for kind in mb.KINDS}
    # after the core's own chat applier (the core plugin is installed first)
    appliers.setdefault(ev.CHAT, []).append(_apply_chat)
    return Plugin("redsyn", appliers=appliers, projections={"redsyn": mb.RedsynState},
                  periodic=(sweep,))

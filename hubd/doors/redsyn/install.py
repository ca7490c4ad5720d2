"""Puts the REDSYN mailbox into the hub's journal projection and timers.

Registered whether or not the door serves (`--no-redsyn`): replaying a
journal must give the same state either way.
"""

from __future__ import annotations

from hubd.actors.router import PERIODIC
from hubd.state import events as ev
from hubd.state import redsyn as mb
from hubd.state.hub import APPLIERS, EXTENSIONS

from .door import sweep


def _apply(state, event) -> None:
    mb.apply(state.extensions["redsyn"], event.kind, event.payload, event.ts)


def _apply_chat(state, event) -> None:
    mb.apply_chat(state.extensions["redsyn"], event.payload, event.route, event.seq, event.ts)


def install() -> None:
    if "redsyn" in EXTENSIONS:
        return
    EXTENSIONS["redsyn"] = mb.RedsynState
    for kind in mb.KINDS:
        APPLIERS.setdefault(kind, []).append(_apply)
    # after the core's own chat applier (hubd.state.hub registers it at import)
    APPLIERS.setdefault(ev.CHAT, []).append(_apply_chat)
    PERIODIC.append(sweep)


install()

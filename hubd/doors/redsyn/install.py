"""The REDSYN mailbox and door as a plugin: its projection and appliers
(hubd/state/redsyn.py) always, and unless --no-redsyn the door itself
(hubd/doors/redsyn/door.py): its routes under /redsyn/v1, its webhook tasks,
the wake after each commit, and its expiry sweep.

The projection is installed whether or not the door serves: replaying a
journal must give the same state either way.
"""

from __future__ import annotations

from hubd.core.plugin import Plugin
from hubd.state import redsyn as mb

from .door import RedsynDoor, sweep


def redsyn_plugin(serving: bool) -> Plugin:
    # its chat applier runs after the core's (the core plugin is installed first)
    if not serving:
        return Plugin("redsyn", appliers=mb.appliers, projections=mb.PROJECTIONS)
    door: dict = {}  # the door, once the hub is built

    def bind(hub) -> None:
        door["door"] = RedsynDoor(hub)

    async def opening(hub) -> None:
        await door["door"].open()

    async def closing() -> None:
        await door["door"].close()

    return Plugin("redsyn", appliers=mb.appliers, projections=mb.PROJECTIONS,
                  periodic=(lambda router: sweep(door["door"], router),),
                  bind=bind, opening=opening, closing=closing,
                  http_routes=lambda app: door["door"].add_routes(app),
                  committed=lambda: door["door"].committed(),
                  start=lambda router, group: door["door"].start(group))

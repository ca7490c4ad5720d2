"""The REDSYN door as a plugin of the hub's lifetime: with --no-redsyn it is
not installed. Its routes under /redsyn/v1, its endpoint (opened after the
replay) and its webhook pusher. What REDSYN calls mean is the REDSYN
mailbox plugin's (hubd/handlers/redsyn/), which the composition root
installs beside it.
"""

from __future__ import annotations

from hubd.core.plugin import Plugin

from .door import RedsynDoor


def redsyn_door() -> Plugin:
    door: dict = {}  # the door, once the hub is built

    def bind(hub) -> None:
        door["door"] = RedsynDoor(hub)

    async def opening(hub) -> None:
        await door["door"].open()

    async def closing() -> None:
        await door["door"].shutting_down()

    return Plugin("redsyn-door", bind=bind, opening=opening, closing=closing,
                  http_routes=lambda app: door["door"].add_routes(app),
                  start=lambda router, group: door["door"].start(group))

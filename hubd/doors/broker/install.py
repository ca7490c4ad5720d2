"""The broker door as a plugin of the hub's lifetime (installed with a broker
configuration, not with --no-broker): its Unix socket and token file, its
connections and its transcript watcher (server.py, proof.py). What a line
means is the broker mailbox plugin's (hubd/handlers/broker/), which the
composition root installs beside it.
"""

from __future__ import annotations

from hubd.config import BrokerConfig
from hubd.core.plugin import Plugin

from .server import BrokerDoor, TokenFileError


class BrokerStartError(ValueError):
    """The broker cannot serve (its socket or token file): the hub must not start."""


def broker_door(config: BrokerConfig) -> Plugin:
    door: dict = {}  # the door, once the hub is built

    def bind(hub) -> None:
        door["door"] = BrokerDoor(hub, config)

    async def opening(hub) -> None:
        try:
            await door["door"].start()
        except (TokenFileError, OSError) as exc:
            raise BrokerStartError(f"broker: {exc}") from exc

    async def closing() -> None:
        if "door" in door:
            await door["door"].close()

    return Plugin("broker-door", bind=bind, opening=opening, closing=closing)

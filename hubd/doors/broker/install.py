"""The local broker as a plugin: its projection and appliers
(hubd/state/broker.py), the hub side of chats to <ns>/<handle> seats, the
notification tick, and the door itself (the Unix socket and its transcript
watcher, hubd/doors/broker/server.py).

The projection is installed whether or not the door serves (`--no-broker`):
replaying a journal must give the same state either way. A hub without a
broker configuration serves no socket and reaches no broker handle.
"""

from __future__ import annotations

from hubd.config import BrokerConfig
from hubd.core.plugin import Plugin
from hubd.handlers import broker as verbs
from hubd.state import broker as bs

from .server import BrokerDoor, TokenFileError


class BrokerStartError(ValueError):
    """The broker cannot serve (its socket or token file): the hub must not start."""


def broker_plugin(config: BrokerConfig | None) -> Plugin:
    if config is None:
        return Plugin("broker", appliers=bs.appliers, projections=bs.PROJECTIONS)
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

    def start(router, group) -> None:
        verbs.live_of(router).proofs = door["door"].proofs

    return Plugin("broker", appliers=bs.appliers, projections=bs.PROJECTIONS,
                  directed_chat=(verbs.plan_hub_chat,), periodic=(verbs.tick,),
                  commands={verbs.WaitExpired: verbs.wait_expired}, live=(verbs.BrokerLive,),
                  bind=bind, opening=opening, closing=closing, start=start)

"""Who a REDSYN call speaks for: the node its bearer token names, and which
agents that node may act as (docs/redsyn.md, "Nodes and tokens"). Pure."""

from __future__ import annotations

from dataclasses import dataclass

from hubd.state.principals import Principal
from hubd.wire.redsyn.envelope import Address, Forbidden, RedsynError


@dataclass(frozen=True)
class Node:
    """The caller: the node a bearer token names."""
    id: str        # person:machine
    person: str    # org/team/user
    # the principal whose token it is: the node speaks for the agents of its
    # person that are its principal's seats. None only for the hub's own
    # webhook pusher, which acts for one agent the door already chose.
    principal: Principal | None = None


def forbidden(error: str, **extra) -> RedsynError:
    return Forbidden(error, **extra)


def speaks_for(node: Node, agent: str) -> bool:
    """Whether the node may act as this agent (announce, take, ack,
    subscribe, send from it, cancel what it sent, read the files of what it
    sent or was sent): an agent of its person that is one of its principal's
    seats."""
    if agent.rpartition("/")[0] != node.person:
        return False
    return node.principal is None or node.principal.speaks_for(agent)


def check_speaks_for(node: Node, agent: Address) -> None:
    """403 unless the node may act as this agent, naming why."""
    if agent.person != node.person:
        raise forbidden(f"this node speaks for the agents of {node.person}, not {agent}")
    if not speaks_for(node, agent.agent_address):
        principal = node.principal
        raise forbidden(f"principal '{principal.name}' may not speak for {agent.agent_address} "
                        f"(its seats: {', '.join(principal.seats)})")

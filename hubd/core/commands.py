"""The commands on the Router's one bounded inbox: the vocabulary every door speaks.

A door turns its wire into these and nothing else: it names its endpoint by
id, never hands the Router a socket or a function. Commands are immutable
tuples: cheap to make on the hot path (one per inbound frame) and safe to
share. The Router dispatches on a command's type through one table
(hubd/actors/router.py); a plugin adds its own types (`Plugin.commands`).

Where a door waits for an answer, the answer travels as a future inside the
command (`reply`): the Router resolves it once the command is handled, after
the commit when the command changed state (`Router.answer`), and sets the
exception on it when the command was refused or failed.

The shared verbs (what every door can carry):
- `Opened`/`Closed`: an endpoint comes and goes (`door` names whose dialect
  its commands speak: the hub wire's, REDSYN's, the broker's, or a door
  speaking only the shared vocabulary);
- `Inbound`: one hub-wire frame (its verb is its `type`);
- `Register`: an endpoint speaks for an identity;
- `Send`: a message from an identity to a target, whichever door either is on;
- `Take`/`Ack`: take from a box and acknowledge what was taken;
- `Request`: a door verb that is not shared, looked up by name in the
  installed request tables like a hub-wire verb (`broker.inbox`, `redsyn.key`,
  `hub.health`).
"""

from __future__ import annotations

import asyncio
from typing import Any, NamedTuple

from hubd.wire.envelope import HUB_WIRE



class Opened(NamedTuple):
    """A door admitted an endpoint (on a hub with a token: after it proved
    it). The Router opens its session; a hub-wire endpoint gets the welcome."""

    endpoint: int
    # the principal's name (docs/identity.md): what the ingress quota charges
    # and the journal records; open-host:<address> on an open hub
    principal: str
    # the remote address, for the per-host connection bound
    peer_host: str
    # the DER client certificate the endpoint presented over TLS, if any (a
    # peer hub's link is recognised by it)
    peer_cert: bytes | None = None
    # the digest of the token it proved (None on an open hub): a revoked
    # token's sessions are found by it
    credential: str | None = None
    # whose dialect the endpoint's Register/Send/Take/Ack speak (HUB_WIRE,
    # "redsyn", "broker"; any other name: the shared vocabulary only)
    door: str = HUB_WIRE


class Inbound(NamedTuple):
    """One decoded hub-wire frame from an endpoint (a dict that passed the wire bounds)."""

    endpoint: int
    frame: dict
    size: int


class Closed(NamedTuple):
    """The endpoint went away; its session ends and what it served is freed."""

    endpoint: int


class Credit(NamedTuple):
    """An endpoint admitted without a token at connect proved one in its first
    frame: it speaks as this principal from its registration on."""

    endpoint: int
    principal: str
    credential: str


class Register(NamedTuple):
    """The endpoint speaks for `identity` (a seat, a REDSYN agent, a broker
    handle); `fields` hold what the door's dialect adds (roles, a policy...)."""

    endpoint: int
    identity: str
    fields: dict
    reply: asyncio.Future | None = None


class Send(NamedTuple):
    """A message from `sender` (an identity the endpoint speaks for) to `target`."""

    endpoint: int
    sender: str
    target: Any
    body: Any
    fields: dict
    reply: asyncio.Future | None = None


class Take(NamedTuple):
    """Take up to `limit` waiting items from `identity`'s box, leased for
    `lease` seconds (None: the box's default)."""

    endpoint: int
    identity: str
    limit: int
    lease: float | None
    fields: dict
    reply: asyncio.Future | None = None


class Ack(NamedTuple):
    """What was taken from `identity`'s box is done with (`fields` say how far:
    delivered, acknowledged)."""

    endpoint: int
    identity: str
    ids: list
    fields: dict
    reply: asyncio.Future | None = None


class Request(NamedTuple):
    """A verb of one door that the others do not share, by name."""

    endpoint: int | None
    verb: str
    fields: dict
    reply: asyncio.Future | None = None


class Tick(NamedTuple):
    """Once a second (the hub's sweeper): the plugins' periodic work."""


class TimersDue(NamedTuple):
    """Timers the Router set (`Router.at`) are due."""


class ConfigReloaded(NamedTuple):
    """SIGHUP: the hub's configuration after the plugins re-read their files."""

    config: Any


class PrincipalsChanged(NamedTuple):
    """The identity actor swapped the principal table: re-check every session."""


class Wake(NamedTuple):
    """Nothing to do: wakes the Router so it drains its control queue."""


WAKE = Wake()
TICK = Tick()
TIMERS_DUE = TimersDue()
PRINCIPALS_CHANGED = PrincipalsChanged()

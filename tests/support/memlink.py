"""An in-memory link pair for the federation actors' unit tests.

`MemoryLink` is the hub's end: the surface of federation.actors.link.PeerLink the
actors use (up, up_since, batching, send, request, the on_* callbacks,
health). `FarEnd` is the peer's end, driven by the test: it connects and cuts
the link, sees every frame that arrived, answers, and decides what happens to
the frames the hub sends: deliver them, drop them (the send succeeds, nothing
arrives), hang them (the send never returns until the link is cut) or delay
them by some seconds of the injected clock. Nothing sleeps; time moves only
when the test advances its ManualClock.
"""

from __future__ import annotations

import asyncio
from federation.clock import ManualClock, wait_for
from federation.actors.link import CLOSED, TIMEOUT, Answers, LinkError

DELIVER, DROP, HANG = "deliver", "drop", "hang"


class MemoryLink:
    def __init__(self, peer: str, hub_id: str, clock: ManualClock, *, batching: bool = False,
                 on_up=lambda peer: None, on_down=lambda peer, cause: None,
                 on_result=lambda peer, frame: None, on_rejected=lambda peer, text: None):
        self.peer = peer
        self.hub_id = hub_id
        self.clock = clock
        self.batching = batching
        self.up = False
        self.up_since: float | None = None
        self.last_error: dict | None = None
        self.clock_skew: float | None = 0.0
        self.connects = 0
        self.wakes = 0  # wake() calls: a sign of life from the peer elsewhere
        self.on_up, self.on_down = on_up, on_down
        self.answers = Answers(peer, on_result, on_rejected)  # as PeerLink routes them
        self.far = FarEnd(self)
        self._hung: list[asyncio.Future] = []

    # the subscriber's callbacks for answers nobody waits for (a test may set them late)
    on_result = property(lambda self: self.answers.on_result,
                         lambda self, fn: setattr(self.answers, "on_result", fn))
    on_rejected = property(lambda self: self.answers.on_rejected,
                           lambda self, fn: setattr(self.answers, "on_rejected", fn))

    async def send(self, frame: dict) -> bool:
        if not self.up:
            return False
        mode, delay = self.far.mode, self.far.delay
        if mode == HANG:
            hung = asyncio.get_running_loop().create_future()
            self._hung.append(hung)
            return await hung  # False once the link is cut
        if mode == DROP:
            self.far.dropped.append(frame)
            return True
        if delay:
            async def later():
                await self.clock.sleep(delay)
                if self.up:
                    self.far.arrive(frame)
            self.far.delayed.add(asyncio.ensure_future(later()))
            return True
        self.far.arrive(frame)
        return True

    async def request(self, frame: dict, timeout: float | None, *, key: str | None = None,
                      reply_type: str | None = None) -> dict:
        if not self.up:
            raise LinkError(CLOSED, "link down")
        future = self.answers.expect(key, reply_type)
        try:
            if not await self.send(frame):
                raise LinkError(CLOSED, "link went down")
            if timeout is None:
                return await future
            return await wait_for(self.clock, future, timeout)
        except TimeoutError as exc:
            raise LinkError(TIMEOUT, f"no answer from {self.peer} within {timeout:g}s") from exc
        finally:
            if future.done() and not future.cancelled():
                future.exception()  # seen: a cut after the send failed is not news
            self.answers.forget(future, key, reply_type)

    def wake(self) -> None:
        self.wakes += 1

    def health(self) -> dict:
        return {"link": "up" if self.up else "down", "connects": self.connects,
                "batching": self.batching, "last_error": self.last_error,
                "peer_protocol_version": 5, "clock_skew_seconds": self.clock_skew}


class FarEnd:
    """The peer hub's side of a MemoryLink."""

    def __init__(self, link: MemoryLink):
        self.link = link
        self.mode = DELIVER
        self.delay = 0.0
        self.received: list[dict] = []
        self.dropped: list[dict] = []
        self.delayed: set[asyncio.Future] = set()
        self._arrived = asyncio.Event()

    def connect(self) -> None:
        link = self.link
        link.up = True
        link.up_since = link.clock.monotonic()
        link.connects += 1
        link.on_up(link.peer)

    def cut(self, cause: str = CLOSED) -> None:
        """The link goes down: waiters fail, hung sends return False."""
        link = self.link
        was_up = link.up
        link.up = False
        link.up_since = None
        link.last_error = {"cause": cause, "detail": "cut by the test", "at": link.clock.wall()}
        for hung in link._hung:
            if not hung.done():
                hung.set_result(False)
        link._hung.clear()
        link.answers.fail_all()
        if was_up:
            link.on_down(link.peer, cause)

    def arrive(self, frame: dict) -> None:
        self.received.append(frame)
        self._arrived.set()

    def take(self, type_: str | None = None) -> list[dict]:
        """Every frame that arrived (of that type), removed from `received`."""
        taken = [f for f in self.received if type_ is None or f.get("type") == type_]
        self.received = [f for f in self.received if f not in taken]
        return taken

    def answer(self, frame: dict) -> None:
        """The peer sends a frame to the hub."""
        self.link.answers.route(frame)

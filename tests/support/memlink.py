"""An in-memory link pair for the federation actors' unit tests.

`MemoryLink(...)` is a real federation.actors.link.PeerLink (its inbox,
writer loop, watchdog, answer correlation and reconnects, on the injected
clock) whose dialer opens an in-memory connection instead of a socket.
`link.far` is the peer's end (`FarEnd`), driven by the test: it accepts the
link's dial (`connect`) and cuts it (`cut`), welcomes the link as a hub
would, answers pings, sees every frame that arrived, answers, and decides
what happens to the frames the hub writes: deliver them, drop them (the
write succeeds, nothing arrives), hang them (the write never completes until
the link is cut or the link's own stall cut-off aborts it), or stop reading
altogether (`silent`: no pong either), never welcome the link, or raise a
defect from the link's next write. Nothing sleeps; time moves only when
the test advances its ManualClock.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import NamedTuple

from aiohttp import WSMsgType

from federation.actors.link import INBOX, PeerLink
from federation.actors.peers import Subscribers
from federation.actors.link_socket import PONG, TEXT
from federation.clock import ManualClock
from federation.config import PeerRoute
from hubd.timing import Timing
from hubd.wire import codec

DELIVER, DROP, HANG = "deliver", "drop", "hang"


class Message(NamedTuple):
    """What a connection reads, shaped as aiohttp's WSMessage."""

    type: WSMsgType
    data: object


ENDED = Message(WSMsgType.CLOSED, None)


def MemoryLink(peer: str, hub_id: str, clock: ManualClock, *, batching: bool = False,
               features: list[str] | None = None, protocol_version: int = 5,
               inbox: int = INBOX, timing: Timing = Timing(), **events) -> PeerLink:
    """A PeerLink to `peer` over an in-memory pair, running (a task on the
    current loop); `events` (on_up, on_down, ...) are subscribed, as are those
    given to `link.far.subscribe` later (the fan-out PeerLinks gives a link)."""
    if batching and features is None:
        features = ["forward_batch"]
    far = FarEnd(peer, features, protocol_version)
    subscribers = Subscribers()
    subscribers.add(**events)
    far.subscribe = subscribers.add
    link = PeerLink(PeerRoute(peer, f"memory://{peer}/", None, None), hub_id, None, timing,
                    on_up=subscribers.on_up, on_down=subscribers.on_down,
                    on_result=subscribers.on_result, on_rejected=subscribers.on_rejected,
                    clock=clock, dialer=far, inbox=inbox)
    far.link = link
    link.far = far
    far.task = asyncio.get_running_loop().create_task(link.run(), name=f"memlink-{peer}")
    return link


class MemoryConnection:
    """The hub's end of one in-memory connection."""

    def __init__(self, far: "FarEnd"):
        self.far = far
        self.close_code: int | None = None
        self.closed = False
        self._incoming: deque = deque()
        self._readable = asyncio.Event()
        self._hung: list[asyncio.Future] = []

    # the link's side

    async def send_text(self, data: bytes) -> None:
        if self.closed:
            raise ConnectionError("closed")
        far = self.far
        frame = codec.decode_frame(data)
        if frame.get("type") == "heartbeat" and not far.welcomed:
            far.welcome(self, frame)
            return
        if far.defect is not None:
            raise far.defect  # a bug below the link, not a connection that ended
        if far.mode == HANG:
            hung = asyncio.get_running_loop().create_future()
            self._hung.append(hung)
            await hung  # ConnectionError once the connection ends
        elif far.mode == DROP:
            far.dropped.append(frame)
        else:
            far.arrive(frame)

    async def ping(self) -> None:
        if self.closed:
            raise ConnectionError("closed")
        self.far.pings += 1
        if self.far.mode != HANG and not self.far.silent:
            self.feed(PONG, None)

    async def pong(self, data) -> None:
        if self.closed:
            raise ConnectionError("closed")

    async def receive(self) -> "Message":
        while not self._incoming:
            if self.closed:
                return ENDED
            self._readable.clear()
            await self._readable.wait()
        return self._incoming.popleft()

    async def close(self, code: int = 1000, message: bytes = b"") -> None:
        self.end(code)

    def abort(self) -> None:
        self.end(1006)

    def certificate_der(self) -> None:
        return None

    # the far end's side

    def feed(self, kind, data) -> None:
        if not self.closed:
            self._incoming.append(Message(kind, data))
            self._readable.set()

    def end(self, code: int) -> None:
        if self.closed:
            return
        self.closed = True
        self.close_code = code
        self._readable.set()
        for hung in self._hung:
            if not hung.done():
                hung.set_exception(ConnectionError("the connection ended"))
        self._hung.clear()
        if self.far.conn is self:
            self.far.conn = None


class FarEnd:
    """The peer hub's side of a MemoryLink, and the link's dialer."""

    def __init__(self, peer: str, features: list[str] | None, protocol_version: int):
        self.peer = peer
        self.features = features
        self.protocol_version = protocol_version
        self.link: PeerLink | None = None
        self.task: asyncio.Task | None = None
        self.mode = DELIVER
        self.silent = False  # reads nothing: no pong, as a black-holed peer
        self.welcomes = True  # False: takes the link's registration and never answers it
        self.defect: Exception | None = None  # raised by the link's next write of a frame
        self.received: list[dict] = []
        self.dropped: list[dict] = []
        self.pings = 0
        self.conn: MemoryConnection | None = None
        self.welcomed = False
        self.registered: dict | None = None
        self._accepting = False
        self._dialing: asyncio.Future | None = None

    # the dialer the link uses

    async def __aenter__(self) -> "FarEnd":
        return self

    async def __aexit__(self, *exc) -> None:
        pass

    async def dial(self, route, ssl_context) -> MemoryConnection:
        if not self._accepting:
            self._dialing = asyncio.get_running_loop().create_future()
            await self._dialing  # until the test connects
        self.welcomed = False
        self.conn = MemoryConnection(self)
        return self.conn

    def welcome(self, conn: MemoryConnection, register: dict) -> None:
        self.welcomed = True
        self.registered = register
        if not self.welcomes:
            return
        welcome = {"type": "welcome", "sender": "System", "target": register["sender"],
                   "protocol_version": self.protocol_version, "timestamp": time.time()}
        if self.features is not None:
            welcome["hubd_features"] = list(self.features)
        conn.feed(TEXT, codec.encode(welcome))

    # what the test does

    def connect(self) -> None:
        """Accept the link's dial (now, or its next one)."""
        self._accepting = True
        if self._dialing is not None and not self._dialing.done():
            self._dialing.set_result(None)
        self.link.wake()  # a link waiting out its backoff dials now

    def cut(self) -> None:
        """The connection ends: the link's waiters fail, hung writes fail,
        and the link's next dial waits for connect()."""
        self._accepting = False
        if self.conn is not None:
            self.conn.end(1006)

    def arrive(self, frame: dict) -> None:
        self.received.append(frame)

    def take(self, type_: str | None = None) -> list[dict]:
        """Every frame that arrived (of that type), removed from `received`."""
        taken = [f for f in self.received if type_ is None or f.get("type") == type_]
        self.received = [f for f in self.received if f not in taken]
        return taken

    def answer(self, frame: dict) -> None:
        """The peer answers: the frame goes to the link's correlation at once,
        as its reader hands it on (a test can then assert what the answer did
        before any task ran)."""
        if self.conn is not None:
            self.link.answers.route(frame)

    def send(self, frame: dict) -> None:
        """The peer writes a frame: the link's reader reads it."""
        if self.conn is not None:
            self.conn.feed(TEXT, codec.encode(frame))

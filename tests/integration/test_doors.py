"""The core is door-neutral: an agent that came through another door than
the WebSocket one is online, chats, gets receipts and mail alike. The second
door here lives in the test (a door is only: commands in, messages out); the
hub, its Router and its journal are the real ones."""

import asyncio

import orjson

from hubd.core.commands import Call, Closed, Inbound, Opened
from hubd.core.endpoints import next_endpoint_id
from tests.support.inproc import running_hub
from tests.support.wsprobe import WsProbe


def json_lines(message) -> bytes:
    """This door's wire: one JSON text per line."""
    return message.json + b"\n"


class LineDoorEndpoint:
    """One agent on the line door: what it is sent arrives as lines."""

    def __init__(self, hub):
        self.hub = hub
        self.id = next_endpoint_id()
        self.lines: asyncio.Queue = asyncio.Queue(1000)
        self.closed = None

    async def open(self) -> None:
        self.hub.endpoints.add(self)
        # a door in the hub's own process: its agents are local (an open hub
        # admits agents from loopback only)
        await self.hub.router.inbox.put(Opened(self.id, "line:test", "127.0.0.1"))

    async def send(self, frame: dict) -> None:
        data = orjson.dumps(frame)
        await self.hub.router.inbox.put(Inbound(self.id, orjson.loads(data), len(data)))

    async def leave(self) -> None:
        await self.hub.router.inbox.put(Closed(self.id))
        self.hub.endpoints.remove(self)

    async def recv_type(self, type_: str, **match) -> dict:
        while True:
            line = await asyncio.wait_for(self.lines.get(), 5.0)
            assert line.endswith(b"\n")
            frame = orjson.loads(line)
            if frame.get("type") == type_ and all(frame.get(k) == v for k, v in match.items()):
                return frame

    # Endpoint
    def deliver(self, message) -> None:
        self.lines.put_nowait(message.encoded(json_lines))

    def close(self, code: int, reason: str) -> None:
        self.closed = (code, reason)

    def write_stalled_for(self, now: float) -> float:
        return 0.0

    def abort(self) -> None:
        self.closed = (1013, "aborted")


async def test_agents_on_two_doors_see_each_other_chat_and_get_receipts(tmp_path):
    async with running_hub(tmp_path) as server:
        hub = server.hub
        line = LineDoorEndpoint(hub)
        await line.open()
        welcome = await line.recv_type("welcome")
        assert welcome["hub_id"] == "test-hub"
        await line.send({"type": "heartbeat", "sender": "p/line"})
        await line.recv_type("presence_update", agent="p/line", event="joined")

        ws = await WsProbe.open(server.url)
        await ws.recv_type("welcome")
        await ws.register("p/ws")
        joined = await ws.recv_type("presence_update", agent="p/ws", event="joined")
        assert joined["online_agents"] == ["p/line", "p/ws"]

        await line.send({"type": "chat", "sender": "p/line", "target": "p/ws",
                         "payload": "from the line door", "receipt_requested": True,
                         "client_msg_id": "c1"})
        chat = await ws.recv_type("chat", sender="p/line")
        assert chat["payload"] == "from the line door"
        receipt = await line.recv_type("delivery_receipt", client_msg_id="c1")
        assert receipt["delivered"] is True and receipt["recipients"] == ["p/ws"]

        await ws.chat("p/ws", "p/line", "back over the websocket")
        back = await line.recv_type("chat", sender="p/ws")
        assert back["payload"] == "back over the websocket"

        await line.leave()
        left = await ws.recv_type("presence_update", agent="p/line", event="left")
        assert left["online_agents"] == ["p/ws"]
        # mail for the line agent while it is away waits in its mailbox
        await ws.chat("p/ws", "p/line", "while you were away")
        await ws.recv_type("chat", payload="while you were away")  # the sender's echo: committed
        again = LineDoorEndpoint(hub)
        await again.open()
        await again.recv_type("welcome")
        await again.send({"type": "heartbeat", "sender": "p/line", "mailbox": True,
                          "since_seq": 0})
        replayed = await again.recv_type("chat", payload="while you were away")
        assert replayed["replayed"] is True and replayed["sender"] == "p/ws"
        await ws.close()
        await again.leave()


async def test_a_call_answers_through_its_future(tmp_path):
    async with running_hub(tmp_path, allow_crashes=True) as server:
        router = server.hub.router
        loop = asyncio.get_running_loop()
        answer = loop.create_future()
        await router.inbox.put(Call(lambda r: r.state.last_seq, answer))
        assert await answer == router.state.last_seq

        def explode(r):
            raise RuntimeError("on purpose")

        failed = loop.create_future()
        await router.inbox.put(Call(explode, failed))
        try:
            await failed
        except RuntimeError as exc:
            assert str(exc) == "on purpose"
        else:
            raise AssertionError("the Call's future did not carry its exception")
        # the Router goes on serving
        after = loop.create_future()
        await router.inbox.put(Call(lambda r: "still here", after))
        assert await after == "still here"

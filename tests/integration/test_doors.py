"""The core is door-neutral: an agent that came through another door than
the WebSocket one is online, chats, gets receipts and mail alike. The second
door here lives in the test (a door is only: commands in, messages out); the
hub, its Router and its journal are the real ones."""

import asyncio

import orjson

from hubd.config import BrokerConfig, broker_files_beside
from hubd.core.commands import Ack, Closed, Inbound, Opened, Request, Send, Take
from hubd.core.refusals import CommandRefused
from hubd.core.endpoints import next_endpoint_id
from tests.support.broker_client import BrokerClient
from tests.support.inproc import running_hub
from tests.support.memdoor import MemoryAgent
from tests.support.redsyn_client import Client, login
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


async def test_a_call_answers_through_its_future(tmp_path, monkeypatch):
    # a door's verb (a Request) answers through its command's future; a test
    # verb in the Router's installed request table
    async with running_hub(tmp_path, allow_crashes=True) as server:
        router = server.hub.router
        loop = asyncio.get_running_loop()
        monkeypatch.setitem(router.requests, "test.last_seq",
                            lambda r, session, command: r.answer(command.reply, r.state.last_seq))
        answer = loop.create_future()
        await router.inbox.put(Request(None, "test.last_seq", {}, answer))
        assert await answer == router.state.last_seq

        def explode(r, session, command):
            raise RuntimeError("on purpose")

        monkeypatch.setitem(router.requests, "test.explode", explode)
        failed = loop.create_future()
        await router.inbox.put(Request(None, "test.explode", {}, failed))
        try:
            await failed
        except RuntimeError as exc:
            assert str(exc) == "on purpose"
        else:
            raise AssertionError("the Call's future did not carry its exception")
        # the Router goes on serving
        monkeypatch.setitem(router.requests, "test.still",
                            lambda r, session, command: r.answer(command.reply, "still here"))
        after = loop.create_future()
        await router.inbox.put(Request(None, "test.still", {}, after))
        assert await after == "still here"


async def test_a_fourth_door_reaches_a_redsyn_agent_a_broker_handle_and_a_websocket_agent(
        tmp_path):
    """An in-memory door that speaks only the shared vocabulary (Opened,
    Register, Send: tests/support/memdoor.py, installed nowhere) reaches an
    agent of each other door by name, and hears each one answer: a REDSYN
    agent's inbox, a broker handle's listening connection, a WebSocket agent."""
    db = tmp_path / "hub.db"
    joel = await asyncio.to_thread(login, db, "acme/general/joel", "laptop")
    sock, token = broker_files_beside(db)
    async with running_hub(tmp_path, broker=BrokerConfig(sock, token)) as server:
        mem = MemoryAgent(server.hub)
        assert (await mem.open("p/mem"))["registered"] is True

        # a WebSocket agent, by its seat
        ws = await WsProbe.open(server.url)
        await ws.recv_type("welcome")
        await ws.register("p/ws")
        await ws.recv_type("presence_update", agent="p/ws", event="joined")
        sent = await mem.send("p/ws", "to the websocket")
        assert sent["msg_id"] and sent["seq"]
        chat = await ws.recv_type("chat", sender="p/mem")
        assert chat["payload"] == "to the websocket"
        await ws.chat("p/ws", "p/mem", "back from the websocket")
        assert (await mem.recv("chat", sender="p/ws"))["payload"] == "back from the websocket"

        # a REDSYN agent, by its address: its inbox
        redsyn = Client(server.url.replace("ws://", "http://"), joel)
        echo = "acme/general/joel/echo"
        assert (await asyncio.to_thread(redsyn.announce, echo)).status == 200
        await mem.send(echo, "to the redsyn agent")
        [request] = await asyncio.to_thread(redsyn.take_until, echo, 1)
        assert request["from"] == "p/mem" and request["kind"] == "request"
        assert request["body"] == {"type": "text/plain", "text": "to the redsyn agent"}
        answered = await asyncio.to_thread(redsyn.send, {
            "id": "echo-1", "kind": "reply", "from": "echo", "reply_to": request["id"],
            "body": {"type": "text/plain", "text": "back from redsyn"}})
        assert answered.status == 201, answered.body
        back = await mem.recv("chat", sender=echo)
        assert back["payload"] == "back from redsyn"
        assert back["redsyn"]["reply_to"] == request["id"]

        # a broker handle, by its seat local/<handle>: its listening connection
        broker = await BrokerClient.connect(str(sock), token.read_text().strip())
        session = await broker.call("session", event="session-start", client="claude",
                                    cliSessionId="mem-1", host={"hostPid": 4242,
                                                                "hostStart": 1},
                                    listen=True)
        handle = session["handle"]
        await mem.send(f"local/{handle}", "to the broker handle")
        push = (await broker.event("push"))["payload"]
        assert push["message"]["from"] == "p/mem" and "to the broker handle" in push["text"]
        await broker.call("reply", messageId=push["message"]["messageId"],
                          body="back from the broker")
        reply = await mem.recv("chat", sender=f"local/{handle}")
        assert "back from the broker" in reply["payload"]

        await broker.close()
        await ws.close()
        await mem.leave()


async def test_a_door_without_a_dialect_is_refused_what_it_cannot_carry(tmp_path):
    """The shared verbs a seat has no use for (Take, Ack: its mail comes to its
    endpoint), another door's own verbs (only that door's endpoints may ask
    them) and commands from an endpoint that is not open are refused, typed,
    through the reply: nothing crashes, nothing is journaled."""
    sock, token = broker_files_beside(tmp_path / "hub.db")
    async with running_hub(tmp_path, broker=BrokerConfig(sock, token)) as server:
        mem = MemoryAgent(server.hub)
        await mem.open("p/mem")
        seq = server.hub.router.state.last_seq
        refusals = []
        for ask in (mem.ask(Take, "p/mem", 10, None, {}), mem.ask(Ack, "p/mem", [1], {}),
                    mem.ask(Request, "broker.inbox", {}), mem.ask(Request, "redsyn.key", {})):
            try:
                await ask
            except CommandRefused as refused:
                refusals.append(refused.code)
        assert refusals == ["unknown_verb"] * 4
        stranger = MemoryAgent(server.hub)  # never opened
        try:
            await stranger._ask(Send(stranger.id, "p/x", "p/mem", "hi", {},
                                     asyncio.get_running_loop().create_future()))
        except CommandRefused as refused:
            assert refused.code == "endpoint_not_open"
        else:
            raise AssertionError("a command from an endpoint that is not open was served")
        assert server.hub.router.state.last_seq == seq
        assert server.hub.metrics.handler_crashes == 0

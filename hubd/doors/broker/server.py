"""The broker door's IO: the Unix socket, its token, and one reader per connection.

The door translates and nothing else. A connection that authenticates is an
endpoint of the hub (Opened, door "broker"); each request line becomes a
command of the shared vocabulary on the Router's inbox (`command_for`:
register and session are Register, send and reply Send, fetch-push Take,
delivered and ack Ack, the rest Requests named `broker.<verb>`), carrying a
future that hears only of a failure; the answer itself, and pushes and
notifications, are door-neutral messages the Router's release path hands to
`BrokerConnection.deliver`, each written as one line. A connection's lines
are handled in order (up to PIPELINE in flight, answered in that order).
What a line means is decided inside the Router (hubd/handlers/broker/).

Bounds: connections are admitted by `Admission` (admission.py: one bound for
authenticated connections, another for those not yet authenticated); a
connection must authenticate within timing.broker_auth; a connection whose unsent
output passes MAX_WRITE_BUFFER (a listener that does not read) is closed;
lines are at most 1 MiB.
"""

from __future__ import annotations

import asyncio
import hmac
import os
import secrets
import socket
import stat
import struct
from collections import deque
from pathlib import Path

import orjson
import structlog

from hubd.config import BrokerConfig
from hubd.core.commands import Ack, Closed, Opened, Register, Request, Send, Take
from hubd.core.endpoints import next_endpoint_id
from hubd.core.message import Message
from hubd.owner_only import open_to_others
from hubd.wire import broker as wire
from hubd.wire.broker import LineSplitter, LineTooLong, WireError, parse_line
from hubd.wire.broker import Request as Line

from . import admission

log = structlog.get_logger("hubd.broker")

# connections the kernel queues before the door accepts them: room for a burst
# of both bounds at once (asyncio's default, 100, turns a burst of CLI hooks
# into failed connects; Linux caps it at net.core.somaxconn)
LISTEN_BACKLOG = 1024
MAX_WRITE_BUFFER = 16 * 1024 * 1024
READ_CHUNK = 256 * 1024
NATIVE_CONNECT_SECONDS = 2.0
# requests of one connection in flight at once (answered in order)
PIPELINE = 64
SEQUENTIAL = frozenset({"wait"})
# AF_UNIX paths are at most 107 bytes on Linux; a longer one is bound through
# its folder's /proc/self/fd entry (still the same file on disk).
UNIX_PATH_MAX = 107

class TokenFileError(RuntimeError):
    pass


def load_or_create_token(path: Path) -> str:
    """The broker token: read it, or create the file (0600) with a random one."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        refused = open_to_others("broker token file", [(path, path.stat().st_mode)])
        if refused is not None:
            raise TokenFileError(refused)
        token = path.read_text(encoding="utf-8").strip()
        if not token:
            raise TokenFileError(f"broker token file {path} is empty")
        return token
    token = secrets.token_hex(32)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(token + "\n")
    log.info("broker token created", path=str(path))
    return token


def broker_line(message: Message) -> bytes:
    """A door-neutral message as one broker line (made once per message)."""
    return message.json + b"\n"


class BrokerConnection:
    """One client of the broker: an endpoint of the hub. The Router's answers,
    pushes and notifications arrive through `deliver` after their commit; an
    answer also releases the reader, which waits for it before the next line."""

    __slots__ = ("id", "writer", "door", "closed", "last_id", "inflight", "opened")

    def __init__(self, writer: asyncio.StreamWriter, door: "BrokerDoor"):
        self.id = next_endpoint_id()
        self.writer = writer
        self.door = door
        self.closed = False
        self.opened = False  # an endpoint of the Router (after it authenticated)
        self.last_id = 0
        # requests handed to the Router whose answers are not written yet, oldest
        # first: (id, future resolved when its answer is written)
        self.inflight: deque = deque()

    def __repr__(self) -> str:
        return f"<BrokerConnection {self.id}>"

    def deliver(self, message: Message) -> None:
        self.write(message.encoded(broker_line))
        answered = message.frame.get("id")
        if answered is not None:
            inflight = self.inflight
            while inflight:
                id_, future = inflight[0]
                if id_ > answered:
                    break
                inflight.popleft()
                if not future.done():
                    future.set_result(None)

    def write(self, data: bytes) -> None:
        if self.closed:
            return
        transport = self.writer.transport
        if transport.is_closing():
            return
        if transport.get_write_buffer_size() > MAX_WRITE_BUFFER:
            self.door.metrics.broker_slow_consumers += 1
            log.warning("broker connection not reading; closing it", conn=self.id)
            self.abort()
            return
        self.writer.write(data)

    def close(self, code: int = 0, reason: str = "") -> None:
        if not self.closed:
            self.closed = True
            self.writer.close()
        self._release_all()

    def _release_all(self) -> None:
        while self.inflight:
            _, future = self.inflight.popleft()
            if not future.done():
                future.set_result(None)

    async def settled(self) -> None:
        """Every request handed to the Router so far has its answer written."""
        while self.inflight:
            await self.inflight[-1][1]

    def write_stalled_for(self, now: float) -> float:
        return 0.0  # bounded by MAX_WRITE_BUFFER instead

    def abort(self) -> None:
        self.closed = True
        self.writer.transport.abort()
        self._release_all()


class NativeEndpoint:
    """A CLI's own socket (native-register): pushes for its handle are written to
    it after an auth line carrying its token. A push-only endpoint of the hub:
    the Router names it to the handle in presence, sends it pushes and closes
    it when it is replaced or its handle's last connection goes."""

    __slots__ = ("id", "handle", "path", "writer", "endpoints")

    def __init__(self, handle: str, path: str, writer: asyncio.StreamWriter, endpoints):
        self.id = next_endpoint_id()
        self.handle, self.path, self.writer, self.endpoints = handle, path, writer, endpoints
        endpoints.add(self)

    @classmethod
    async def connect(cls, handle: str, path: str, token: str, endpoints) -> "NativeEndpoint":
        async with asyncio.timeout(NATIVE_CONNECT_SECONDS):
            _, writer = await asyncio.open_unix_connection(path)
        writer.write(orjson.dumps({"v": wire.PROTOCOL_VERSION, "id": 1, "type": "auth",
                                   "token": token}) + b"\n")
        return cls(handle, path, writer, endpoints)

    def deliver(self, message: Message) -> None:
        transport = self.writer.transport
        if transport.is_closing() or transport.get_write_buffer_size() > MAX_WRITE_BUFFER:
            return
        self.writer.write(message.encoded(broker_line))

    def close(self, code: int = 0, reason: str = "") -> None:
        self.endpoints.remove(self)
        self.writer.close()

    def write_stalled_for(self, now: float) -> float:
        return 0.0  # bounded by MAX_WRITE_BUFFER instead

    def abort(self) -> None:
        self.close()


_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


def peer_process(writer: asyncio.StreamWriter) -> int | None:
    """The pid of the process at the other end of a Unix socket (SO_PEERCRED),
    or None where the system cannot say."""
    sock = writer.get_extra_info("socket")
    try:
        pid, _, _ = _PEERCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                      _PEERCRED.size))
    except (AttributeError, OSError):
        return None
    return pid


class BrokerDoor:
    def __init__(self, hub, config: BrokerConfig):
        self.hub = hub
        self.config = config
        self.metrics = hub.metrics
        self.token = ""
        self.server: asyncio.AbstractServer | None = None
        self.connections: set[BrokerConnection] = set()
        self.admission = admission.Admission()
        self.refusal_log = admission.RefusalLog()
        hub.metrics.gauge("hubd_broker_connections", "Open broker connections, by whether they "
                          "authenticated.", self.admission.counts, "state")
        self.closing = False
        self._dir_fd: int | None = None
        self._tasks: set[asyncio.Task] = set()
        from .proof import ProofWatcher

        self.proofs = ProofWatcher(hub)

    # -- lifetime

    async def start(self) -> None:
        path = self.config.socket_path
        self.token = load_or_create_token(self.config.token_file)
        if path.exists() or path.is_symlink():
            if not stat.S_ISSOCK(path.lstat().st_mode):
                raise TokenFileError(f"{path} exists and is not a socket; refusing to replace it")
            if _socket_answers(path):
                raise TokenFileError(f"another process serves the broker socket {path}")
            path.unlink()  # a stale socket from a hub that was killed
        bind_path = str(path)
        if len(os.fsencode(bind_path)) > UNIX_PATH_MAX:
            self._dir_fd = os.open(path.parent, os.O_PATH | os.O_DIRECTORY)
            bind_path = f"/proc/self/fd/{self._dir_fd}/{path.name}"
        old_umask = os.umask(0o177)  # the socket is 0600 from its first moment
        try:
            self.server = await asyncio.start_unix_server(self._serve, bind_path,
                                                          limit=READ_CHUNK,
                                                          backlog=LISTEN_BACKLOG)
        finally:
            os.umask(old_umask)
        os.chmod(path, 0o600)
        await self.proofs.open(self.config.principal)
        self._tasks.add(asyncio.get_running_loop().create_task(self.proofs.run(),
                                                               name="broker-proof"))
        log.info("broker listening", socket=str(path), namespace=self.config.namespace)

    async def close(self) -> None:
        self.closing = True
        if self.server is not None:
            self.server.close()
        for conn in list(self.connections):
            conn.write(wire.encode_error(None, wire.BROKER_CLOSED, "The hub is shutting down."))
            conn.close()
        for task in self._tasks:
            task.cancel()
        if self.server is not None:
            try:
                await asyncio.wait_for(self.server.wait_closed(), 2.0)
            except TimeoutError:
                pass
        if self.server is not None:  # ours: never a live socket another hub serves
            try:
                self.config.socket_path.unlink()
            except FileNotFoundError:
                pass
        if self._dir_fd is not None:
            os.close(self._dir_fd)
            self._dir_fd = None

    # -- one connection

    def _refuse(self, conn: BrokerConnection, reason: str, request_id: int | None = None) -> None:
        """Close a connection the admission refused, saying why (counted, and
        logged at most once per reason every few seconds)."""
        refused = self.metrics.broker_refused_connections
        refused[reason] = refused.get(reason, 0) + 1
        since = self.refusal_log.refused(reason, asyncio.get_running_loop().time())
        if since is not None:
            log.warning("broker connections refused", reason=reason, refused=since,
                        **self.admission.counts())
        conn.write(wire.encode_error(request_id, wire.BROKER_CLOSED,
                                     admission.SENTENCES[reason]))
        conn.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = BrokerConnection(writer, self)
        refusal, displaced = (admission.CLOSING, None) if self.closing else \
            self.admission.arrive(conn, peer_process(writer))
        if displaced is not None:
            self._refuse(displaced, admission.UNAUTHENTICATED_DISPLACED)
        if refusal is not None:
            self._refuse(conn, refusal)
            return
        self.connections.add(conn)
        self.hub.endpoints.add(conn)
        try:
            await self._read(conn, reader)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self.connections.discard(conn)
            self.admission.leave(conn)
            self.hub.endpoints.remove(conn)
            conn.close()
            if conn.opened and not self.closing and self.hub.ready:
                # after the connection's own commands, which may still be queued
                await self.hub.router.inbox.put(Closed(conn.id))

    async def _read(self, conn: BrokerConnection, reader: asyncio.StreamReader) -> None:
        splitter = LineSplitter()
        authenticated = False
        auth_seconds = self.hub.config.timing.broker_auth
        while not conn.closed:
            try:
                if authenticated:
                    data = await reader.read(READ_CHUNK)
                else:
                    async with asyncio.timeout(auth_seconds):
                        data = await reader.read(READ_CHUNK)
            except TimeoutError:
                conn.write(wire.encode_error(None, wire.TIMEOUT, f"No auth line within "
                                                                f"{auth_seconds:g} s."))
                return
            if not data:
                try:  # the client half-closed: its answers still go out
                    async with asyncio.timeout(auth_seconds):
                        await conn.settled()
                except TimeoutError:
                    pass
                return
            for item in splitter.feed(data):
                if conn.closed:
                    return
                if isinstance(item, LineTooLong):
                    self.metrics.broker_refused_lines += 1
                    error = wire.too_long_error(item.size)
                    await conn.settled()  # answers leave in line order
                    conn.write(wire.encode_error(None, error.code, error.message))
                    continue
                parsed = parse_line(item)
                if isinstance(parsed, WireError):
                    self.metrics.broker_refused_lines += 1
                    await conn.settled()
                    conn.write(wire.encode_error(parsed.id, parsed.code, parsed.message))
                    continue
                if not authenticated:
                    authenticated = self._authenticate(conn, parsed)
                    if authenticated:
                        conn.opened = True
                        await self.hub.router.inbox.put(Opened(
                            conn.id, self.config.principal, "local", door=wire.DOOR))
                    continue
                if parsed.id <= conn.last_id:
                    await conn.settled()
                    conn.write(wire.encode_error(parsed.id, wire.BAD_REQUEST,
                                                f"id {parsed.id} does not follow {conn.last_id}: "
                                                "ids grow on each line of a connection."))
                    continue
                conn.last_id = parsed.id
                await self._answer(conn, parsed)

    def _authenticate(self, conn: BrokerConnection, request: Line) -> bool:
        if request.type != "auth":
            conn.write(wire.encode_error(request.id, wire.AUTH_REQUIRED,
                                        "The first line must be auth with the broker's token."))
            return False
        if not hmac.compare_digest(request.fields["token"].encode("utf-8", "surrogatepass"),
                                   self.token.encode()):
            self.metrics.broker_bad_tokens += 1
            pid = peer_process(conn.writer)
            self.hub.auth_denials.denied(wire.DOOR, "wrong broker token",
                                         peer=f"pid {pid}" if pid is not None else None)
            conn.write(wire.encode_error(request.id, wire.BAD_TOKEN, "Wrong broker token."))
            conn.close()
            return False
        refusal = self.admission.authenticate(conn)
        if refusal is not None:
            self._refuse(conn, refusal, request.id)
            return False
        conn.last_id = request.id
        conn.write(wire.encode_ok(request.id, {}))
        return True

    async def _answer(self, conn: BrokerConnection, request: Line) -> None:
        """Hand one request to the Router. Requests are handled in line order by
        the Router and their answers are written in that order (they are released
        in journal order), so a connection may have up to PIPELINE of them in
        flight; a wait, and a request that first connects a native socket, go
        alone (a wait answers later than the lines behind it would)."""
        native_spec = request.fields.get("native") if request.type == "session" else None
        alone = request.type in SEQUENTIAL or native_spec is not None
        if alone or self.closing:
            await conn.settled()
        if self.closing:
            conn.write(wire.encode_error(request.id, wire.BROKER_CLOSED,
                                         "The hub is shutting down."))
            return
        native = None
        if request.type == "native-register" or native_spec is not None:
            spec = native_spec or request.fields
            try:
                native = await NativeEndpoint.connect(request.fields.get("handle") or "",
                                                      spec["socketPath"], spec["token"],
                                                      self.hub.endpoints)
            except (OSError, TimeoutError) as exc:
                self.metrics.broker_errors[wire.NATIVE_FAILED] = \
                    self.metrics.broker_errors.get(wire.NATIVE_FAILED, 0) + 1
                conn.write(wire.encode_error(request.id, wire.NATIVE_FAILED,
                                             f"Cannot connect to the native socket "
                                             f"{spec['socketPath']}: {exc}."))
                return
        loop = asyncio.get_running_loop()
        answered = loop.create_future()
        earlier = [future for _, future in conn.inflight]
        conn.inflight.append((request.id, answered))
        handled = loop.create_future()

        def failed(done: asyncio.Future) -> None:
            # the Router logged the exception and rebuilt its state; the client
            # hears `internal` (after the answers before it) and nothing of its
            # request remains
            if done.cancelled() or done.exception() is None or answered.done():
                return

            async def answer_internal() -> None:
                for future in earlier:
                    await future
                if not answered.done():
                    conn.write(wire.encode_error(request.id, wire.INTERNAL,
                                                 "The broker failed on this request; nothing "
                                                 "was changed."))
                    if conn.inflight and conn.inflight[0][0] == request.id:
                        conn.inflight.popleft()
                    answered.set_result(None)
            self._tasks.add(loop.create_task(answer_internal()))

        handled.add_done_callback(failed)
        command = command_for(conn.id, request, native.id if native is not None else None,
                              handled)
        try:
            self.hub.router.inbox.put_nowait(command)
        except asyncio.QueueFull:
            await self.hub.router.inbox.put(command)  # back-pressure: stop reading
        if alone:
            await answered
        elif len(conn.inflight) > PIPELINE:
            await conn.inflight[0][1]


def command_for(endpoint: int, request: Line, native: int | None, reply: asyncio.Future):
    """One request line as a command of the shared vocabulary (the line's own
    fields travel as they are, beside its verb and id)."""
    fields = request.fields
    line = {"verb": request.type, "id": request.id, "request": fields, "native": native}
    kind = wire.SHARED_VERBS.get(request.type)
    if kind == "register":
        return Register(endpoint, fields.get("handle") or "", line, reply)
    if kind == "send":
        return Send(endpoint, "", fields.get("to"), fields.get("body"), line, reply)
    if kind == "take":
        return Take(endpoint, fields["handle"], fields["limit"], None, line, reply)
    if kind == "ack":
        return Ack(endpoint, "", fields["ids"], line, reply)
    return Request(endpoint, f"broker.{request.type}", line, reply)


def _socket_answers(path: Path) -> bool:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(0.5)
    try:
        target = str(path)
        if len(os.fsencode(target)) > UNIX_PATH_MAX:
            return False
        probe.connect(target)
        return True
    except OSError:
        return False
    finally:
        probe.close()

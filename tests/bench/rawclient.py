"""Lean client for ``loadgen``: WebSocket spoken directly on asyncio Protocols.

The aiohttp client costs ~40-55 us per chat at >10k msg/s under compatibility
routing (every chat reaches every socket: 8 frames per chat at 4x8), so against a
fast hub the harness measured itself. This module keeps ``loadgen``'s measurement
semantics (a message is in flight from the send call until its receiver reads the
chat frame; same counters, same percentiles, same summary) and removes the
per-frame overhead:

- ``WSClientProtocol``: RFC 6455 client on ``asyncio.Protocol``. It does the
  HTTP/1.1 Upgrade itself (``Sec-WebSocket-Key``/``Accept``, no extensions, no
  compression), sends masked frames (one random 4-byte mask per connection; the
  XOR is one ``int.from_bytes`` per frame against a per-length cached integer),
  and parses server frames in place from ``data_received`` chunks (7/16/64-bit
  lengths, FIN/continuation, ping -> pong, close handshake). A complete frame is
  handed to the handler as ``(buf, start, end, t)``: no copy, no decode.
- Receivers find their own chats with ``bytes.find`` bounded to the frame (the
  pair's payload marker ``BMK<run>.<pair>.<seq>.``) and check ``"target"``/
  ``"type"`` with byte comparisons that accept both compact JSON (orjson, hubd)
  and ``json.dumps`` default separators (the reference hub), in any key order.
  Only when that check cannot decide (a key seen twice, other spacing, escapes)
  is the frame parsed with ``json.loads``. Other pairs' chats are skipped after
  one ``find``; frames without any marker (welcome, presence, errors) are parsed.
- Sending is driven from the receive callback: when a chunk completes some of a
  pair's messages, the freed window slots are refilled at once and the new frames
  go out in one ``transport.write``. Each message's clock starts just before that
  write (the "send call"); its receive time is taken when the chunk holding its
  chat frame is handed to ``data_received``.

Used through ``loadgen`` (``--client raw``, the default); ``client_main`` is the
per-process entry point, selected by ``loadgen._client_main``.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import struct
import time
from urllib.parse import urlsplit

from tests.bench import loadgen as lg

GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
MARK = lg.MARK
_now = time.perf_counter
_MAX_HEADER = 64 * 1024
_MAX_FRAME = 64 * 1024 * 1024


class HandshakeError(Exception):
    pass


def accept_for(key: str | bytes) -> str:
    """Sec-WebSocket-Accept for a Sec-WebSocket-Key (RFC 6455 section 4.2.2)."""
    if isinstance(key, str):
        key = key.encode()
    return base64.b64encode(hashlib.sha1(key + GUID).digest()).decode()


class Masker:
    """Client frame encoder with one fixed random 4-byte mask (a new one per connection)."""

    __slots__ = ("key", "_ints", "_heads")

    def __init__(self, key: bytes | None = None) -> None:
        self.key = key if key is not None else os.urandom(4)
        self._ints: dict[int, int] = {}
        self._heads: dict[tuple[int, int], bytes] = {}

    def _mask_int(self, n: int) -> int:
        m = self._ints.get(n)
        if m is None:
            if len(self._ints) > 4096:
                self._ints.clear()
            m = int.from_bytes((self.key * (n // 4 + 1))[:n], "little")
            self._ints[n] = m
        return m

    def head(self, n: int, opcode: int = 0x1) -> bytes:
        h = self._heads.get((n, opcode))
        if h is None:
            if n < 126:
                h = struct.pack("!BB", 0x80 | opcode, 0x80 | n)
            elif n < 65536:
                h = struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, n)
            else:
                h = struct.pack("!BBQ", 0x80 | opcode, 0x80 | 127, n)
            h += self.key
            if len(self._heads) > 4096:
                self._heads.clear()
            self._heads[(n, opcode)] = h
        return h

    def frame(self, payload: bytes, opcode: int = 0x1) -> bytes:
        n = len(payload)
        if not n:
            return self.head(0, opcode)
        return self.head(n, opcode) + (int.from_bytes(payload, "little") ^ self._mask_int(n)).to_bytes(n, "little")


def unmask(data: bytes, key: bytes) -> bytes:
    """XOR with a 4-byte key (what a server does with a client frame)."""
    n = len(data)
    if not n:
        return b""
    k = (key * (n // 4 + 1))[:n]
    return (int.from_bytes(data, "little") ^ int.from_bytes(k, "little")).to_bytes(n, "little")


def _ignore(buf: bytes, s: int, e: int, t: float) -> None:
    pass


class WSClientProtocol(asyncio.Protocol):
    """A WebSocket client connection (RFC 6455) on an asyncio Protocol.

    ``handler(buf, start, end, t)`` gets every complete text/binary message:
    ``buf[start:end]`` is the payload, ``t`` the ``perf_counter`` time at which the
    chunk holding its last byte arrived. ``chunk_end()``, if set, runs after each
    ``data_received`` call (after all the chunk's frames were handled).

    Optional filter, applied inside the frame loop without a Python call per frame:
    with ``mark`` set, a message whose payload holds no ``mark`` goes to ``handler``;
    one whose first ``mark`` starts ``own`` goes to ``own_handler(buf, start, end, t,
    i)`` (``i``: where ``own`` starts); any other message holding ``mark`` is dropped.
    """

    def __init__(self, host: str, port: int, path: str = "/", key: bytes | None = None) -> None:
        self.host = host
        self.port = port
        self.path = path or "/"
        self.ws_key = base64.b64encode(key if key is not None else os.urandom(16)).decode()
        self.masker = Masker()
        self.transport: asyncio.Transport | None = None
        loop = asyncio.get_running_loop()
        self.opened: asyncio.Future = loop.create_future()    # handshake done (or failed)
        self.closed_fut: asyncio.Future = loop.create_future()  # connection lost
        self.handler = _ignore
        self.mark: bytes | None = None
        self.own: bytes | None = None
        self.own_handler = None
        self.chunk_end = None
        self.on_lost = None
        self.upgraded = False
        self.response_headers: dict[str, str] = {}
        self.close_code: int | None = None
        self.close_sent = False
        self.closed = False
        self.frames = 0
        self._hs = bytearray()
        self._rest: bytearray | None = None   # an incomplete frame carried to the next chunk
        self._need = 0                        # bytes the carried frame needs before parsing again
        self._frag: bytearray | None = None   # fragmented message being assembled
        self._frag_op = 0

    # -- connection ---------------------------------------------------------------------

    def connection_made(self, transport) -> None:
        self.transport = transport
        hostport = self.host if self.port in (80, 443) else f"{self.host}:{self.port}"
        transport.write((
            f"GET {self.path} HTTP/1.1\r\n"
            f"Host: {hostport}\r\n"
            "Upgrade: websocket\r\n"
            "Connection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {self.ws_key}\r\n"
            "Sec-WebSocket-Version: 13\r\n"
            "\r\n").encode("latin-1"))

    def connection_lost(self, exc) -> None:
        self.closed = True
        if not self.opened.done():
            self.opened.set_exception(HandshakeError(f"connection lost during handshake: {exc!r}"))
        if not self.closed_fut.done():
            self.closed_fut.set_result(self.close_code)
        if self.on_lost is not None:
            self.on_lost(self)

    def _fail(self, code: int, why: str) -> None:
        if self.close_code is None:
            self.close_code = code
        if not self.opened.done():
            self.opened.set_exception(HandshakeError(why))
        if self.transport is not None and not self.transport.is_closing():
            if self.upgraded and not self.close_sent:
                self.close_sent = True
                self.transport.write(self.masker.frame(struct.pack("!H", code), 0x8))
            self.transport.close()

    def _handshake(self, data: bytes) -> bytes | None:
        """Accumulate the HTTP response; return the bytes after it once complete."""
        self._hs += data
        end = self._hs.find(b"\r\n\r\n")
        if end < 0:
            if len(self._hs) > _MAX_HEADER:
                self._fail(1002, "handshake response headers too large")
            return None
        head = bytes(self._hs[:end]).decode("latin-1")
        rest = bytes(self._hs[end + 4:])
        self._hs = bytearray()
        lines = head.split("\r\n")
        status = lines[0].split(" ", 2)
        if len(status) < 2 or not status[0].startswith("HTTP/1.") or status[1] != "101":
            self._fail(1002, f"handshake refused: {lines[0]!r}")
            return None
        hdrs: dict[str, str] = {}
        for line in lines[1:]:
            k, sep, v = line.partition(":")
            if not sep:
                continue
            k = k.strip().lower()
            v = v.strip()
            hdrs[k] = f"{hdrs[k]}, {v}" if k in hdrs else v
        self.response_headers = hdrs
        if hdrs.get("upgrade", "").lower() != "websocket":
            self._fail(1002, f"handshake: Upgrade header is {hdrs.get('upgrade')!r}")
            return None
        if "upgrade" not in [t.strip().lower() for t in hdrs.get("connection", "").split(",")]:
            self._fail(1002, f"handshake: Connection header is {hdrs.get('connection')!r}")
            return None
        if hdrs.get("sec-websocket-accept") != accept_for(self.ws_key):
            self._fail(1002, "handshake: wrong Sec-WebSocket-Accept")
            return None
        if hdrs.get("sec-websocket-extensions"):
            self._fail(1002, f"handshake: extension not offered: {hdrs['sec-websocket-extensions']!r}")
            return None
        self.upgraded = True
        self.opened.set_result(True)
        return rest

    # -- receiving ----------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        t = _now()
        if not self.upgraded:
            data = self._handshake(data)
            if not data:
                return
        if self._rest is not None:
            self._rest += data
            if len(self._rest) < self._need:
                return
            data = bytes(self._rest)
            self._rest = None
        n = len(data)
        pos = 0
        handler = self.handler
        mark = self.mark
        own = self.own
        own_handler = self.own_handler
        in_frag = self._frag is not None
        frames = 0
        while n - pos >= 2:
            b0 = data[pos]
            ln = data[pos + 1]
            if ln < 126:
                s = pos + 2
            elif ln == 126:
                if n - pos < 4:
                    break
                ln = (data[pos + 2] << 8) | data[pos + 3]
                s = pos + 4
            elif ln == 127:
                if n - pos < 10:
                    break
                ln = int.from_bytes(data[pos + 2:pos + 10], "big")
                if ln > _MAX_FRAME:
                    self._fail(1009, f"frame of {ln} bytes")
                    return
                s = pos + 10
            else:  # mask bit set: a server must not mask
                self._fail(1002, "masked frame from server")
                return
            e = s + ln
            if e > n:
                break
            pos = e
            frames += 1
            if (b0 == 0x81 or b0 == 0x82) and not in_frag:  # FIN + text/binary: the hot path
                if mark is not None:
                    i = data.find(mark, s, e)
                    if i >= 0:
                        if own is not None and data.startswith(own, i):
                            own_handler(data, s, e, t, i)
                        continue  # someone else's chat
                handler(data, s, e, t)
                # a handler may switch modes (e.g. on the welcome) or close
                handler = self.handler
                mark = self.mark
                own = self.own
                own_handler = self.own_handler
                if self.closed or self.close_sent:
                    break
            else:
                if not self._control(b0, data, s, e, t):
                    return
                in_frag = self._frag is not None
        self.frames += frames
        if pos < n:
            self._rest = bytearray(data[pos:])
            self._need = self._frame_len(self._rest)
        if self.chunk_end is not None:
            self.chunk_end()

    @staticmethod
    def _frame_len(b: bytearray) -> int:
        """Total bytes of the frame starting at b[0], or a lower bound if its header is short."""
        if len(b) < 2:
            return 2
        ln = b[1] & 0x7F
        if ln < 126:
            return 2 + ln
        if ln == 126:
            return 4 if len(b) < 4 else 4 + ((b[2] << 8) | b[3])
        return 10 if len(b) < 10 else 10 + int.from_bytes(b[2:10], "big")

    def _control(self, b0: int, data: bytes, s: int, e: int, t: float) -> bool:
        """Everything except an unfragmented data frame. False: stop reading this chunk."""
        if b0 & 0x70:
            self._fail(1002, "RSV bit set without a negotiated extension")
            return False
        op = b0 & 0x0F
        fin = b0 & 0x80
        if op >= 0x8:
            if not fin or e - s > 125:
                self._fail(1002, "bad control frame")
                return False
            if op == 0x9:  # ping -> pong with the same payload
                if not self.close_sent:
                    self.transport.write(self.masker.frame(data[s:e], 0xA))
            elif op == 0x8:  # close: echo the code, then the server closes TCP
                if e - s >= 2:
                    self.close_code = (data[s] << 8) | data[s + 1]
                elif self.close_code is None:
                    self.close_code = 1005
                if not self.close_sent:
                    self.close_sent = True
                    self.transport.write(self.masker.frame(data[s:s + 2], 0x8))
                self.transport.close()
                return False
            elif op != 0xA:
                self._fail(1002, f"unknown control opcode {op}")
                return False
            return True
        if op in (0x1, 0x2):  # first fragment (or any data frame while one is being assembled)
            if self._frag is not None:
                self._fail(1002, "new message inside a fragmented one")
                return False
            self._frag = bytearray(data[s:e])
            self._frag_op = op
            return True
        if op == 0x0:  # continuation
            if self._frag is None:
                self._fail(1002, "continuation without a message")
                return False
            self._frag += data[s:e]
            if len(self._frag) > _MAX_FRAME:
                self._fail(1009, "message too big")
                return False
            if fin:
                msg = bytes(self._frag)
                self._frag = None
                self.dispatch(msg, 0, len(msg), t)
            return True
        self._fail(1002, f"unknown opcode {op}")
        return False

    def dispatch(self, buf: bytes, s: int, e: int, t: float) -> None:
        """One complete message through the filter (the frame loop inlines this)."""
        if self.mark is None:
            self.handler(buf, s, e, t)
            return
        i = buf.find(self.mark, s, e)
        if i < 0:
            self.handler(buf, s, e, t)
        elif self.own is not None and buf.startswith(self.own, i):
            self.own_handler(buf, s, e, t, i)

    # -- sending ------------------------------------------------------------------------

    def send_text(self, payload: bytes) -> None:
        if self.close_sent or self.transport is None or self.transport.is_closing():
            raise ConnectionError("websocket is closing")
        self.transport.write(self.masker.frame(payload))

    def send_ping(self, payload: bytes = b"") -> None:
        self.transport.write(self.masker.frame(payload, 0x9))

    async def close(self, code: int = 1000, timeout: float = 2.0) -> None:
        """Close handshake: send close, wait for the server to close TCP (or time out)."""
        if self.transport is None or self.closed:
            return
        if not self.close_sent and self.upgraded and not self.transport.is_closing():
            self.close_sent = True
            self.transport.write(self.masker.frame(struct.pack("!H", code), 0x8))
        try:
            await asyncio.wait_for(asyncio.shield(self.closed_fut), timeout)
        except asyncio.TimeoutError:
            pass
        finally:
            if not self.transport.is_closing():
                self.transport.close()


async def connect(url: str, timeout: float = 15.0, setup=None) -> WSClientProtocol:
    """Open ws://host:port/path (or wss://) and finish the Upgrade.

    ``setup(proto)`` runs when the protocol is created, before the first byte is read
    (a server may send its first frame in the same segment as the 101 response), to
    install ``handler``, ``on_lost`` and the like. wss:// is encrypted but not verified
    (``loadgen.ssl_client_context``): the hubs under test use self-signed certificates.
    """
    u = urlsplit(url)
    if u.scheme not in ("ws", "wss"):
        raise ValueError(f"raw client speaks ws:// and wss:// only, not {u.scheme}://")
    secure = u.scheme == "wss"
    host = u.hostname or "127.0.0.1"
    port = u.port or (443 if secure else 80)
    path = (u.path or "/") + (f"?{u.query}" if u.query else "")
    loop = asyncio.get_running_loop()
    proto: WSClientProtocol | None = None

    def factory() -> WSClientProtocol:
        nonlocal proto
        proto = WSClientProtocol(host, port, path)
        if setup is not None:
            setup(proto)
        return proto

    tls = {"ssl": lg.ssl_client_context(), "server_hostname": host} if secure else {}
    await asyncio.wait_for(loop.create_connection(factory, host, port, **tls), timeout)
    try:
        await asyncio.wait_for(asyncio.shield(proto.opened), timeout)
    except BaseException:
        if proto.transport is not None:
            proto.transport.abort()
        raise
    return proto


# ----------------------------------------------------------------------------- fast frame checks

def key_value_is(buf: bytes, s: int, e: int, key: bytes, value: bytes) -> bool | None:
    """Does the JSON object in buf[s:e] hold ``"key": "value"``? None: cannot tell by bytes.

    ``key`` is ``b'"name"'``. Accepts ``:`` with or without one space (orjson compact
    form and ``json.dumps`` defaults) in any key order. Undecided (None) when the key
    occurs more than once (e.g. nested objects) or is spaced differently, or when the
    value is a string with escapes; the caller then parses the frame.
    """
    p = buf.find(key, s, e)
    if p < 0:
        return False
    q = p + len(key)
    if buf.find(key, q, e) >= 0:
        return None
    if buf.startswith(b":", q):
        q += 1
        if buf.startswith(b" ", q):
            q += 1
    else:
        return None
    if buf.startswith(value, q):
        return True
    if buf.startswith(b'"', q):
        close = buf.find(b'"', q + 1, e)
        if close < 0 or buf.find(b"\\", q + 1, close) >= 0:
            return None
        return False  # a plain string with another value
    return None


# ----------------------------------------------------------------------------- one pair

class RawPair(lg.Pair):
    """``loadgen.Pair`` on raw protocols: same bookkeeping, callback-driven sending."""

    def __init__(self, idx: int, run: str, cfg: lg.LoadConfig, shared: lg.Shared):
        super().__init__(idx, run, cfg, shared)
        self.sem = None  # the window is len(inflight) < cfg.window
        self.klen = len(self.key)
        self.c.setdefault("json_fallbacks", 0)  # own chats the byte check could not decide
        esc = lambda x: x.replace("%", "%%")  # noqa: E731
        # the same bytes as Pair.frame(seq), as one bytes template
        self._btmpl = (esc(self._tmpl_head) + "%d" + esc(self._pad) + esc(self._tmpl_mid) + "%d"
                       + esc(self._tmpl_tail)).encode()
        assert self._btmpl % (12, 12) == self.frame(12).encode()
        self.tgt_value = b'"' + self.rname.encode() + b'"'
        self.sp: WSClientProtocol | None = None
        self.rp: WSClientProtocol | None = None
        self._stop = False
        self._budget: int | None = 0
        self._recorded = False
        self._deadline: float | None = None
        self._sent = 0
        self._send_fut: asyncio.Future | None = None
        self._dirty = False
        # open loop (cfg.rate, measured phase only): message k of this send() is due at
        # _t_start + k / _rate; _lag holds, per write, how late its oldest message left
        self._rate: float | None = None
        self._t_start = 0.0
        self.lag: list[float] = []

    # stop_sending is set by Shared.note_close and the sweeper: also end a pending send()
    @property
    def stop_sending(self) -> bool:
        return self._stop

    @stop_sending.setter
    def stop_sending(self, v: bool) -> None:
        self._stop = v
        if v:
            self._finish_send()

    async def connect(self, session=None) -> None:
        self.rp = await self._open_raw(self.rname, self._receiver_mode, self.cfg.recv_url or self.cfg.url)
        self.sp = await self._open_raw(self.sname, self._sender_mode, self.cfg.url)
        self.rws, self.sws = self.rp, self.sp

    def _receiver_mode(self, p: WSClientProtocol) -> None:
        p.mark = MARK
        p.own = self.key                # BMK<run>.<pair>.: this pair's chats
        p.own_handler = self.on_own_chat
        p.handler = self.on_receiver_other
        p.chunk_end = self.after_chunk

    def _sender_mode(self, p: WSClientProtocol) -> None:
        # chats (own echoes, other pairs'): dropped in the frame loop. With receipts every
        # frame goes to on_sender_frame, which looks for a receipt first (as loadgen does).
        p.mark = None if self.cfg.receipts else MARK
        p.own = None
        p.handler = self.on_sender_frame

    async def _open_raw(self, name: str, hot_mode, url: str) -> WSClientProtocol:
        cfg = self.cfg
        welcomed = asyncio.get_running_loop().create_future()
        refusal: list[str] = []

        def setup(p: WSClientProtocol) -> None:
            def until_welcome(buf, s, e, t):  # open hub: the welcome comes first, before registration
                try:
                    d = json.loads(buf[s:e])
                except ValueError:
                    return
                if not isinstance(d, dict):
                    return
                if d.get("type") == "welcome":
                    hot_mode(p)
                    if not welcomed.done():
                        welcomed.set_result(True)
                elif d.get("type") in lg.ERROR_TYPES:  # e.g. auth_denied before the close
                    refusal.append(f"{d.get('type')}: {d.get('payload')!r}")

            def lost(proto):
                if not welcomed.done():
                    welcomed.set_exception(RuntimeError(
                        f"{name}: socket closed before welcome (close code {proto.close_code}"
                        + (f", {refusal[-1]}" if refusal else "") + ")"))
                if not self.shared.closing:
                    self.shared.note_close(name, proto)

            p.handler = until_welcome
            p.on_lost = lost

        p = await connect(url, cfg.connect_timeout, setup=setup)
        if cfg.token is not None:  # secured hub: the token's frame first, then the welcome
            p.send_text(lg.registration_frame(name, cfg.token).encode())
        try:
            await asyncio.wait_for(welcomed, cfg.connect_timeout)
        except BaseException:
            p.transport.abort()
            raise
        if cfg.token is None:
            p.send_text(lg.registration_frame(name).encode())
        return p

    # -- bookkeeping overrides ------------------------------------------------------------

    def _expire(self, seq: int, refused: bool = False) -> None:
        ent = self.inflight.pop(seq)
        self.timed_out.add(seq)
        if ent[1]:
            self.c["refused" if refused else "missing"] += 1
        self.pump()
        self.shared.maybe_idle()

    # -- receiving --------------------------------------------------------------------------

    def on_receiver_other(self, buf: bytes, s: int, e: int, t: float) -> None:
        """A frame without any marker (welcome, presence, errors...): parse it."""
        self.shared.other_frame(buf[s:e], self.rname)

    def on_own_chat(self, buf: bytes, s: int, e: int, t: float, i: int) -> None:
        """A frame whose payload marker is this pair's: ``buf[i:]`` starts ``BMK<run>.<pair>.``."""
        i += self.klen
        seq = int(buf[i:buf.find(b".", i, e)])
        ent = self.inflight.get(seq)
        if ent is None:
            self._chat_anomaly(seq)
            return
        if self.cfg.verify:
            ok = key_value_is(buf, s, e, b'"target"', self.tgt_value)
            if ok:
                ok = key_value_is(buf, s, e, b'"type"', b'"chat"')
            if ok is None:  # the bytes could not decide: parse
                self.c["json_fallbacks"] += 1
                d = json.loads(buf[s:e])
                ok = isinstance(d, dict) and d.get("type") == "chat" and d.get("target") == self.rname
            if not ok:
                if seq >= self.measure_from:
                    self.c["malformed"] += 1
                    self.shared.sample("malformed", buf[s:e].decode(errors="replace"))
                return
        del self.inflight[seq]
        self.done.add(seq)
        sh = self.shared
        if ent[1]:
            sh.lat.append(t - ent[0])
            self.c["delivered"] += 1
            if t > sh.last_done:
                sh.last_done = t
        self._dirty = True

    def after_chunk(self) -> None:
        if self._dirty:
            self._dirty = False
            self.pump()
            if not self.inflight:
                self.shared.maybe_idle()

    def on_sender_frame(self, buf: bytes, s: int, e: int, t: float) -> None:
        if self.cfg.receipts and buf.find(b'"delivery_receipt"', s, e) >= 0:
            self._receipt(buf[s:e], t)
        elif buf.find(MARK, s, e) < 0:
            if self.shared.other_frame(buf[s:e], self.sname) and self.inflight:
                # An error frame names no message (e.g. a quota refusal). Hubs answer in
                # order, so it refers to the oldest chat in flight (as in loadgen).
                self._expire(next(iter(self.inflight)), refused=True)
        # else: our own echo or another pair's chat - ignore

    def _receipt(self, s: bytes, t: float) -> None:
        d = json.loads(s)
        cmid = d.get("client_msg_id") or ""
        if d.get("type") != "delivery_receipt" or not cmid.startswith(self.cmid_prefix):
            self.shared.other_frame(s, self.sname)
            return
        seq = int(cmid[len(self.cmid_prefix):])
        if d.get("forward_state") == "pending":  # a forward not answered yet: the settled
            ent = self.rpending.get(seq)          # receipt follows; count it, keep waiting
            if ent is not None and ent[1]:
                self.c["forward_pending"] += 1
            return
        ent = self.rpending.pop(seq, None)
        if ent is None:
            self._receipt_anomaly(seq)
            return
        self.rdone.add(seq)
        if ent[1]:
            self.shared.rlat.append(t - ent[0])
            if d.get("delivered") is True:
                self.c["receipts_ok"] += 1
            else:
                self.c["receipts_negative"] += 1
                self.shared.sample("negative_receipt", d)
        if not self.rpending:
            self.shared.maybe_idle()

    async def keepalive_loop(self) -> None:
        """Receivers that only receive turn 'stale' on the reference after 90 s: poke them."""
        msg = b'{"sender":"%s","target":"System","type":"who_request","payload":""}' % self.rname.encode()
        while True:
            await asyncio.sleep(self.cfg.keepalive)
            try:
                self.rp.send_text(msg)
            except Exception:
                return

    # -- sending ----------------------------------------------------------------------------

    async def send(self, n: int | None, recorded: bool, deadline: float | None) -> None:
        """Send n messages (None: until the deadline), at most cfg.window in flight."""
        self._budget = n
        self._recorded = recorded
        self._deadline = deadline
        self._sent = 0
        self._rate = self.cfg.rate if recorded and self.cfg.rate else None
        if self._rate:
            # senders are staggered evenly, so the combined stream is evenly spaced too
            self._t_start = _now() + self.idx / (self._rate * self.cfg.senders)
        fut = self._send_fut = asyncio.get_running_loop().create_future()
        self.pump()
        await fut
        if recorded:
            self.c["sent"] += self._sent

    def _finish_send(self) -> None:
        fut = self._send_fut
        if fut is not None:
            self._send_fut = None
            if not fut.done():
                fut.set_result(None)

    def pump(self) -> None:
        """Fill the window: build the frames, start their clocks, write them in one go."""
        if self._send_fut is None:
            return
        if self._stop or (self._deadline is not None and _now() >= self._deadline):
            self._finish_send()
            return
        inflight = self.inflight
        rate = self._rate
        if rate is None:
            k = self.cfg.window - len(inflight)
        else:  # open loop: everything due by now, whatever is in flight
            now = _now()
            k = int((now - self._t_start) * rate) + 1 - self._sent
            if k > 0:
                self.lag.append(now - (self._t_start + self._sent / rate))
        if self._budget is not None:
            k = min(k, self._budget - self._sent)
        if k > 0:
            tmpl = self._btmpl
            enc = self.sp.masker.frame
            seq0 = self.next_seq
            seqs = range(seq0, seq0 + k)
            out = [enc(tmpl % (seq, seq)) for seq in seqs]
            self.next_seq = seq0 + k
            t = _now()
            ent = (t, self._recorded)
            for seq in seqs:
                inflight[seq] = ent
            if self.cfg.receipts:
                for seq in seqs:
                    self.rpending[seq] = ent
            try:
                self.sp.transport.write(out[0] if k == 1 else b"".join(out))
            except Exception as exc:  # noqa: BLE001 - a dead socket: stop this pair
                self.shared.sample(f"send failed at {self.sname}", repr(exc))
                self.stop_sending = True
                return
            self._sent += k
        if self._budget is not None and self._sent >= self._budget:
            self._finish_send()


# ----------------------------------------------------------------------------- one process

async def client_main(cfg: lg.LoadConfig, run: str, pair_ids: list[int], counts: list[int],
                      warm_counts: list[int], sync=None) -> dict:
    """``loadgen._client_main`` for the raw client: same phases, same result dict."""
    shared = lg.Shared()
    pairs = [RawPair(i, run, cfg, shared) for i in pair_ids]
    shared.pairs = pairs
    tasks: list[asyncio.Task] = []
    result: dict = {}
    try:
        await asyncio.wait_for(asyncio.gather(*(p.connect() for p in pairs)), cfg.connect_timeout)
        for p in pairs:
            tasks.append(asyncio.create_task(p.keepalive_loop()))

        async def sweeper():
            while True:
                await asyncio.sleep(0.25)
                t = _now()
                for p in pairs:
                    p.sweep(t)
                    if p._deadline is not None and t >= p._deadline:
                        p.pump()  # duration mode: end a send whose window is stuck full
                lost = shared.counters["missing"] + shared.counters["refused"]
                if lost >= cfg.max_missing and not shared.aborted:
                    shared.aborted = f"stopped sending after {lost} missing or refused messages"
                    for p in pairs:
                        p.stop_sending = True
        tasks.append(asyncio.create_task(sweeper()))

        # Readiness probe: one message per pair until it comes through (registration is
        # asynchronous on the hub; with private routing an unregistered target drops it).
        deadline = time.monotonic() + cfg.connect_timeout
        for p in pairs:
            while True:
                seq = p.next_seq
                await p.send(1, False, None)
                t_end = time.monotonic() + 1.0
                while seq in p.inflight and time.monotonic() < t_end:
                    await asyncio.sleep(0.005)
                if seq in p.done:
                    break
                if seq in p.inflight:
                    p._expire(seq)
                if seq in p.rpending:
                    p._expire_receipt(seq)
                if p.stop_sending or time.monotonic() > deadline:
                    raise RuntimeError(f"pair {p.idx}: probe chat never reached {p.rname}; "
                                       f"samples={shared.samples}")
        # Warm-up phase (not measured)
        await asyncio.gather(*(p.send(w, False, None) for p, w in zip(pairs, warm_counts)))
        await lg._drain(shared, pairs, cfg.drain_timeout)

        if cfg.rate:
            async def pacer():  # open loop: send what is due, about every millisecond
                while True:
                    await asyncio.sleep(0.0005)
                    for p in pairs:
                        if p._rate is not None:
                            p.pump()
            tasks.append(asyncio.create_task(pacer()))
        if sync is not None:
            await asyncio.to_thread(sync)
        # Measured phase
        for p in pairs:
            p.measure_from = p.next_seq
        shared.recording = True
        frames0 = sum(q.frames for p in pairs for q in (p.sp, p.rp))
        cpu0 = time.process_time()
        hub0, peer0 = lg.hubs_cpu(cfg)
        box0 = lg.box_cpu_ticks()
        t0 = _now()
        t0_mono = time.monotonic()
        shared.last_done = t0
        deadline_send = t0 + cfg.duration if cfg.duration else None
        await asyncio.gather(*(p.send(None if cfg.duration else n, True, deadline_send)
                               for p, n in zip(pairs, counts)))
        t_sent = _now()
        drained = await lg._drain(shared, pairs, cfg.drain_timeout)
        t_end = _now()
        cpu1 = time.process_time()
        hub1, peer1 = lg.hubs_cpu(cfg)
        box1 = lg.box_cpu_ticks()
        frames1 = sum(q.frames for p in pairs for q in (p.sp, p.rp))
        if not drained:
            for p in pairs:
                p.expire_all()
        shared.recording = False
        result = {
            "counters": dict(shared.counters),
            "lat": shared.lat,
            "rlat": shared.rlat,
            "t0": t0_mono,
            "elapsed": max(shared.last_done - t0, 1e-9),
            "send_elapsed": t_sent - t0,
            "wall": t_end - t0,
            "client_cpu": cpu1 - cpu0,
            "hub_cpu": lg.cpu_delta(hub0, hub1),
            "peer_hub_cpu": lg.cpu_delta(peer0, peer1),
            "send_lag": [x for p in pairs for x in p.lag],
            "box_busy": box1[0] - box0[0],
            "box_total": box1[1] - box0[1],
            "frames": frames1 - frames0,
            "samples": shared.samples,
            "aborted": shared.aborted,
        }
    finally:
        shared.closing = True
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        closers = [q.close(timeout=1.0) for p in pairs for q in (p.sp, p.rp) if q is not None]
        await asyncio.gather(*closers, return_exceptions=True)
    return result

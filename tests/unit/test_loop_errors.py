"""hubd/loop_errors.py on a real socket pair: CPython's selector transport
runs a closing transport's teardown twice when the protocol's resumed write
meets a broken pipe; the hub's loop handler counts and logs that one fault,
and hands every other loop error to asyncio's own handler."""

from __future__ import annotations

import asyncio
import socket

from hubd import loop_errors


class Counts:
    transport_closed_twice = 0


async def _close_while_the_peer_goes() -> tuple[list, int, list]:
    loop = asyncio.get_running_loop()
    counts = Counts()
    loop_errors.install(loop, counts)
    passed_on = []
    default = loop.default_exception_handler
    loop.default_exception_handler = lambda context: passed_on.append(context)
    ours, peer = socket.socketpair()
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    peer.setblocking(False)
    resumed = asyncio.Event()
    lost = []

    class Writer(asyncio.Protocol):
        def connection_made(self, transport):
            self.transport = transport

        def pause_writing(self):
            pass

        def resume_writing(self):
            loop.remove_reader(peer.fileno())
            peer.close()  # the client is gone before the resumed write
            resumed.set()
            self.transport.write(b"after resume")

        def connection_lost(self, exc):
            lost.append(exc)

    transport, _ = await loop.connect_accepted_socket(Writer, ours)
    transport.set_write_buffer_limits(high=1)
    transport.write(b"x" * 200_000)  # more than the socket takes: buffered
    transport.close()  # closing with a buffer: torn down once it drains
    def drain_peer():
        while True:
            try:
                if not peer.recv(65536):
                    return
            except BlockingIOError:
                return

    loop.add_reader(peer.fileno(), drain_peer)
    await asyncio.wait_for(resumed.wait(), 10)
    for _ in range(10):  # the second teardown is a call_soon
        await asyncio.sleep(0)
    asyncio.get_running_loop().call_exception_handler(
        {"message": "something else", "exception": RuntimeError("not ours")})
    loop.default_exception_handler = default
    return lost, counts.transport_closed_twice, passed_on


def test_a_transport_torn_down_twice_is_counted_and_anything_else_passed_on():
    lost, counted, passed_on = asyncio.run(_close_while_the_peer_goes())
    assert lost == [None]  # the protocol heard of the close once
    assert counted == 1
    assert [c["message"] for c in passed_on] == ["something else"]


def test_the_classifier_needs_the_teardown_callback_of_a_torn_down_transport():
    assert not loop_errors.is_transport_closed_twice({"exception": AttributeError("x")})
    assert not loop_errors.is_transport_closed_twice(
        {"exception": ValueError("x"), "handle": None})

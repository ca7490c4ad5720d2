"""The event loop's exception handler: one known CPython fault is logged as a
structured line and counted; everything else goes to asyncio's own handler
(a traceback on the `asyncio` logger), unchanged.

The known fault (CPython 3.11's selector transport, seen on a peer's TLS link
closing under a storm): `_write_ready` drains the buffer of a transport that
is closing, lets the protocol resume writing (`_maybe_resume_protocol`), and
then tears the transport down itself (`_call_connection_lost(None)`, called
directly). If the protocol's resumed write hit a broken pipe, `_force_close`
has meanwhile scheduled a second `_call_connection_lost`; when it runs, the
transport's socket and protocol are already None and it raises
AttributeError. The connection was already gone and its protocol was told
once; nothing of hubd's is left half-done. It is still counted
(`hubd_transport_closed_twice_total`) and logged, so a rise is visible.
"""

from __future__ import annotations

import asyncio

import structlog

log = structlog.get_logger("hubd.loop")


def is_transport_closed_twice(context: dict) -> bool:
    """Is this loop error the second teardown of an asyncio transport that
    was already torn down (the fault above)?"""
    if not isinstance(context.get("exception"), AttributeError):
        return False
    handle = context.get("handle")
    callback = getattr(handle, "_callback", None)
    if getattr(callback, "__name__", None) != "_call_connection_lost":
        return False
    transport = getattr(callback, "__self__", None)
    return isinstance(transport, asyncio.Transport) and \
        getattr(transport, "_sock", object()) is None and \
        getattr(transport, "_protocol", object()) is None


def install(loop: asyncio.AbstractEventLoop, metrics) -> None:
    def handle(loop: asyncio.AbstractEventLoop, context: dict) -> None:
        if is_transport_closed_twice(context):
            metrics.transport_closed_twice += 1
            log.warning("a closed transport's teardown ran twice (CPython asyncio); the "
                        "connection was already gone", error=repr(context["exception"]),
                        total=metrics.transport_closed_twice)
            return
        loop.default_exception_handler(context)

    loop.set_exception_handler(handle)

"""One question to a peer hub over its link, with a deadline: what a
handler that relays an agent's request to another hub needs (a cross-hub
attachment read, a spend request)."""

from __future__ import annotations

import asyncio
from typing import Callable

from federation.actors.link import Ask


def ask_peer(link, frame: dict, reply_type: str, seconds: float,
             answered: Callable[[dict | None], None]) -> None:
    """Post `frame` on `link`; `answered(answer)` runs in the loop once the
    answer of `reply_type` comes, or `answered(None)` when the link fails or
    `seconds` pass first."""
    loop = asyncio.get_running_loop()
    reply = loop.create_future()
    timer = loop.call_later(seconds, lambda: reply.done() or reply.cancel())

    def done(future: asyncio.Future) -> None:
        timer.cancel()
        answered(None if future.cancelled() or future.exception() is not None
                 else future.result())

    reply.add_done_callback(done)
    link.post(Ask(frame, None, reply_type, reply))

"""A thread that owns one SQLite connection and runs calls for the event loop.

sqlite3 releases the GIL while it waits on the disk, so a commit on this
thread overlaps with the event loop's own work. This is a leaner
run_in_executor: one SimpleQueue in, one call_soon_threadsafe out per call.
"""

from __future__ import annotations

import asyncio
import queue
import threading

_STOP = object()


def resolve(future: asyncio.Future, ok: bool, value) -> None:
    """Settle an awaiting coroutine's future from a result a thread handed back."""
    if future.cancelled():
        return
    if ok:
        future.set_result(value)
    else:
        future.set_exception(value)


class DbThread:
    def __init__(self, name: str):
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    def _work(self) -> None:
        jobs = self._jobs
        while True:
            job = jobs.get()
            if job is _STOP:
                return
            loop, future, fn, args = job
            try:
                result = fn(*args)
            except BaseException as exc:  # handed to the awaiting coroutine
                loop.call_soon_threadsafe(resolve, future, False, exc)
            else:
                loop.call_soon_threadsafe(resolve, future, True, result)

    def call(self, fn, *args) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._jobs.put((loop, future, fn, args))
        return future

    def stop(self) -> None:
        """Finish the calls already queued, then end the thread."""
        self._jobs.put(_STOP)
        self._thread.join()

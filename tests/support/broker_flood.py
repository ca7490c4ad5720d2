"""A process that holds broker connections open without ever authenticating
(the hostile-input run's `--flood`): run as its own process, as an attacker
on the machine would be, so the broker tells it apart from honest clients by
its pid.

    python -m tests.support.broker_flood SOCKET COUNT SECONDS

Prints one JSON line at the end: {"closed": n, "connect_refused": n}.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time


async def flood(sock: str, count: int, seconds: float) -> dict:
    deadline = time.monotonic() + seconds
    counts = {"closed": 0, "connect_refused": 0}

    async def hold() -> None:
        while time.monotonic() < deadline:
            try:
                reader, writer = await asyncio.open_unix_connection(sock)
            except OSError:
                counts["connect_refused"] += 1
                await asyncio.sleep(0.1)
                continue
            try:
                while time.monotonic() < deadline and not reader.at_eof():
                    try:
                        async with asyncio.timeout(0.5):
                            await reader.read(4096)
                    except TimeoutError:
                        pass
            except OSError:
                pass  # the hub closed it
            finally:
                writer.close()
            counts["closed"] += 1

    await asyncio.gather(*(hold() for _ in range(count)))
    return counts


if __name__ == "__main__":
    socket_path, count, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    print(json.dumps(asyncio.run(flood(socket_path, count, seconds))))

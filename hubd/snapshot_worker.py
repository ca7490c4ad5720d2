"""The process that writes one snapshot for a running hub
(hubd/actors/snapshotter.py starts it; docs/journal.md, "Snapshots").

It reads its request (the hub's configuration, hub id and fingerprint) as a
pickle on stdin from its parent, builds the plugins the hub runs from the
same configuration (hubd/composition.py), refuses when their fingerprint is
not the hub's (a hub built with other plugins, as some tests do: its
snapshot would not be the hub's projection), writes the snapshot and prints
one JSON line: its seq, size and time. Exit codes: snapshotter.EXIT_*.

A test can have it crash halfway through the write (hubd/faults.py,
HUBD_SNAPSHOT_FAULT).
"""

from __future__ import annotations

import pickle
import sys

import orjson
import structlog

from hubd import logs
from hubd.actors.snapshotter import EXIT_FAILED, EXIT_REFUSED, EXIT_TOO_LARGE
from hubd.composition import plugins_for
from hubd.core.plugin import Installed
from hubd.faults import snapshot_midway
from hubd.hub import fresh_state
from hubd.journal.restore import SnapshotPolicy, SnapshotTooLarge, take
from hubd.state.frozen import fingerprint

log = structlog.get_logger("hubd.snapshot_worker")


def main() -> int:
    request = pickle.loads(sys.stdin.buffer.read())  # from the parent hub, over a pipe
    config = request["config"]
    logs.configure(config.log_format, config.log_level)
    installed = Installed(plugins_for(config))
    policy = SnapshotPolicy(config.db, request["hub_id"], request["fingerprint"],
                            config.snapshot_max_bytes)
    fresh = lambda: fresh_state(installed, config)  # noqa: E731
    if fingerprint(fresh()) != policy.fingerprint:
        _say({"error": "this hub's plugins are not the ones its configuration composes; "
                       "it cannot be snapshotted by a worker"})
        return EXIT_REFUSED
    try:
        taken = take(config.db, fresh, policy, config.snapshot_keep, snapshot_midway())
    except SnapshotTooLarge as exc:
        _say({"error": str(exc)})
        return EXIT_TOO_LARGE
    except Exception as exc:
        log.exception("snapshot failed")
        _say({"error": f"{type(exc).__name__}: {exc}"})
        return EXIT_FAILED
    _say({"seq": taken.seq, "bytes": taken.bytes, "path": str(taken.path) if taken.path else None,
          "worker_seconds": round(taken.seconds, 3), "from_snapshot": taken.from_snapshot,
          "applied": taken.applied})
    return 0


def _say(report: dict) -> None:
    sys.stdout.buffer.write(orjson.dumps(report) + b"\n")
    sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())

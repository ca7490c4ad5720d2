"""`hubd multihub follow`: pull a peer hub's event log over the network once and
print its observed (advisory) view, as `observe` does for a journal file.

It uses the same PeerLink as a hub's standing watch: nothing is sent before a
wss:// peer's certificate matches `--pin` (or, without a pin, verifies against
the system's CAs), and a client certificate can be presented so a
policy-gated hub actually serves the log (the reference's follow cannot).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

from federation.config import PeerRoute
from federation.fold import FOLDED_KINDS, fold
from federation.actors.link import LinkError, PeerLink
from federation.log_model import MergeError
from federation.log_snapshot import decode_snapshot
from federation.merge import MergedLog
from federation.pins import PinError, PinSet, parse_pin
from federation.tls import peer_client_context, verified_client_context
from hubd.timing import Timing

DEFAULT_LIMIT = 1000
MAX_PAGES = 10_000


class _Contexts:
    def __init__(self, certfile, keyfile):
        self.pinned = peer_client_context(certfile, keyfile)
        self.verified = verified_client_context(certfile, keyfile)

    def for_route(self, route):
        return self.pinned if route.pins is not None else self.verified


async def _pull(args) -> tuple[MergedLog, PeerLink, bool]:
    peer = args.peer_id or "peer"
    pins = PinSet([parse_pin(args.pin)]) if args.pin else None
    route = PeerRoute(peer, args.peer_uri, pins, args.token)
    certfile = getattr(args, "client_certfile", None)
    keyfile = getattr(args, "client_keyfile", None)
    link = PeerLink(route, args.local_id, _Contexts(certfile, keyfile) if route.secure else None,
                    Timing())
    runner = asyncio.get_running_loop().create_task(link.run())
    try:
        deadline = time.monotonic() + args.timeout
        while not link.up:
            if link.last_error is not None and link.last_error["cause"] in ("pin_mismatch",
                                                                             "auth_denied", "tls"):
                raise LinkError(link.last_error["cause"], link.last_error["detail"])
            if time.monotonic() > deadline:
                detail = link.last_error["detail"] if link.last_error else "no answer"
                raise LinkError("timeout", f"could not reach {args.peer_uri}: {detail}")
            await asyncio.sleep(0.05)
        merged = MergedLog(retain=FOLDED_KINDS.__contains__)
        refused = False
        for _ in range(MAX_PAGES):
            after = merged.cursor(peer)
            answer = await link.request(
                {"sender": args.local_id, "target": "all", "type": "multihub_log_request",
                 "payload": "", "after_seq": after, "limit": args.limit or DEFAULT_LIMIT},
                args.timeout, reply_type="multihub_log_snapshot")
            snapshot = decode_snapshot(answer)
            result = merged.accept(peer, after, snapshot.events, snapshot.next_cursor,
                                   snapshot.log_end_seq)
            if result.refused:
                refused = True
                break
            if result.caught_up:
                break
        return merged, link, refused
    finally:
        link.stop()
        runner.cancel()
        try:
            await runner
        except (asyncio.CancelledError, Exception):
            pass


def run(args) -> int:
    """The link's log lines (a version warning, the link coming up) go to
    stderr: stdout is the observed view, JSON with --json. Only for this run,
    uncached, and only when nothing configured logging (an embedding process,
    a test calling the CLI in-process, keeps its own)."""
    import structlog

    if structlog.is_configured():
        return _run(args)
    structlog.configure(
        processors=[structlog.processors.add_log_level,
                    structlog.processors.TimeStamper(fmt="iso", utc=True),
                    structlog.dev.ConsoleRenderer(colors=False)],
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False)
    try:
        return _run(args)
    finally:
        structlog.reset_defaults()


def _run(args) -> int:
    if args.pin:
        try:
            parse_pin(args.pin)
        except PinError as exc:
            print(f"hubd multihub follow: {exc}", file=sys.stderr)
            return 2
    try:
        merged, link, refused = asyncio.run(_pull(args))
    except (LinkError, MergeError, OSError) as exc:
        print(f"hubd multihub follow: could not follow peer hub: {exc}", file=sys.stderr)
        return 2
    peer = args.peer_id or "peer"
    observed = fold(merged.ordered())
    if args.json:
        document = observed.to_json()
        document["peer_id"] = peer
        document["refused"] = refused
        document["cursor"] = merged.cursor(peer)
        document["clock_skew_seconds"] = link.clock_skew
        document["peer_version"] = link.versions.health()
        print(json.dumps(document, indent=2, sort_keys=True))
    else:
        if refused:
            print(f"peer '{peer}' served nothing: it does not grant this hub (an empty answer "
                  "with log_end_seq null); pass --client-certfile/--client-keyfile with a "
                  "certificate its serving policy pins", file=sys.stderr)
        print(observed.render(peer))
    return 0

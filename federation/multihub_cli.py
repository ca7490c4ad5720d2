"""`hubd multihub ...`: the multi-hub operator commands.

    hubd multihub observe --peer-db DB [--peer-id ID] [--json]
        Read a peer hub's journal file (hubd's or the reference hub's schema)
        read-only, fold it as a follower would, print the observed view. It
        grants nothing: a peer's claim is advisory here.
    hubd multihub status [--db DB] [--json]
        What this hub's own journal says about multi-hub authority: contested
        (partitioned) namespaces and quarantined peers, as a restart restores them.
    hubd multihub recover [--db DB] --peer-id ID --operator NAME --reason TEXT
                          --new-log-generation GEN [--json]
        The equivocation recovery ceremony. STOP THE HUB FIRST: the command
        refuses while another process has the journal open, refuses a peer the
        journal does not show quarantined (unknown, or already recovered), and
        otherwise appends multihub_equivocation_recovery at the next seq. Restart
        the hub only after it succeeds; the hub then polls that peer from zero.
    hubd multihub follow --peer-uri URI ...
        One network pull of a peer's log; provided by the hub's network side
        (federation.multihub_follow), a stub until that module exists.

Exit status: 0 success, 2 refused or failed (one line on stderr saying why).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Sequence

from federation.fold import fold
from hubd.config import DEFAULT_DB
from federation.journal_access import HubRunning, JournalError, read_events
from federation.log_model import MergeError
from federation.merge import MergedLog
from federation.partition import MULTIHUB_HEAL, MULTIHUB_PARTITION, PartitionDetector
from federation.ownership import NamespaceOwnership
from federation.quarantine import (MULTIHUB_EQUIVOCATION, MULTIHUB_EQUIVOCATION_RECOVERY,
                                   RecoveryRefused, active_quarantines, record_recovery)

PROG = "hubd multihub"
EXIT_OK = 0
EXIT_ERROR = 2


class _Usage(Exception):
    def __init__(self, status: int, message: str | None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class _Parser(argparse.ArgumentParser):
    def exit(self, status: int = 0, message: str | None = None):  # type: ignore[override]
        raise _Usage(status, message)

    def error(self, message: str):  # type: ignore[override]
        raise _Usage(EXIT_ERROR, f"{self.prog}: error: {message}\n")


class _Failed(Exception):
    """A refusal or failure to report on stderr (exit 2)."""


def _build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="Observe peer hubs and manage multi-hub authority.")
    commands = parser.add_subparsers(dest="command", parser_class=_Parser, metavar="COMMAND")

    observe = commands.add_parser(
        "observe", help="fold a peer hub's journal file and print its observed board and claims",
        description="Read a peer hub's journal (hubd or reference schema) read-only and print "
                    "the observed view. Grants nothing.")
    observe.add_argument("--peer-db", required=True, type=Path, help="the peer hub's journal")
    observe.add_argument("--peer-id", help="hub id to tag the peer's events with "
                                           "(default: the file name without extension)")
    observe.add_argument("--json", action="store_true", help="print the ObservedState as JSON")
    observe.set_defaults(handler=_cmd_observe)

    status = commands.add_parser(
        "status", help="contested namespaces and quarantined peers recorded in a hub's journal",
        description="Read this hub's journal read-only and print the multi-hub authority "
                    "state a restart would restore.")
    _journal_flag(status, "the hub's journal")
    status.add_argument("--json", action="store_true", help="print the result as JSON")
    status.set_defaults(handler=_cmd_status)

    recover = commands.add_parser(
        "recover", help="record explicit recovery of a quarantined peer (hub stopped)",
        description="Stop the hub first. Appends multihub_equivocation_recovery to the "
                    "journal if it shows the peer quarantined; restart the hub after it "
                    "succeeds. The reason is stored only as its SHA-256.")
    _journal_flag(recover, "the stopped local hub's journal")
    recover.add_argument("--peer-id", required=True, help="the quarantined peer's hub id")
    recover.add_argument("--operator", required=True, help="who accepts the recovery")
    recover.add_argument("--reason", required=True,
                         help="why (the journal keeps only its digest)")
    recover.add_argument("--new-log-generation", required=True,
                         help="the log generation or checkpoint the operator accepted")
    recover.add_argument("--json", action="store_true", help="print the result as JSON")
    recover.set_defaults(handler=_cmd_recover)

    follow = commands.add_parser(
        "follow", help="pull a peer hub's log over the network once and print its observed view",
        description="Network counterpart of observe (provided by the hub's network side).")
    follow.add_argument("--peer-uri", required=True, help="ws:// or wss:// URI of the peer hub")
    follow.add_argument("--peer-id", help="hub id to tag the peer's events with")
    follow.add_argument("--local-id", default="multihub-follower",
                        help="the name this pull registers under (default multihub-follower)")
    follow.add_argument("--token", help="connect token of a secured peer hub")
    follow.add_argument("--pin", help="trust the peer's wss certificate by this sha256: pin")
    follow.add_argument("--limit", type=int, help="most events per request")
    follow.add_argument("--timeout", type=float, default=10.0, help="seconds per request")
    follow.add_argument("--client-certfile", help="client certificate to present (a "
                                                  "policy-gated peer serves only pinned peers)")
    follow.add_argument("--client-keyfile", help="private key for --client-certfile")
    follow.add_argument("--json", action="store_true", help="print the ObservedState as JSON")
    follow.set_defaults(handler=_cmd_follow)
    return parser


def _journal_flag(command: argparse.ArgumentParser, what: str) -> None:
    """--db, as the hub and every operator command spell it (--journal: the
    old spelling, still accepted)."""
    command.add_argument("--db", dest="journal", type=Path, default=Path(DEFAULT_DB),
                         metavar="DB", help=f"{what} (default ./{DEFAULT_DB})")
    command.add_argument("--journal", dest="journal", type=Path, help=argparse.SUPPRESS)


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = _build_parser()
    try:
        args = parser.parse_args(argv)
    except _Usage as usage:
        if usage.message:
            (sys.stderr if usage.status else sys.stdout).write(usage.message)
        return usage.status
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_ERROR
    try:
        return args.handler(args)
    except _Failed as exc:
        print(f"{PROG} {args.command}: {exc}", file=sys.stderr)
        return EXIT_ERROR


def _print_json(value) -> None:
    print(json.dumps(value, indent=2, ensure_ascii=False))


# -- observe

def observe_file(path: Path, peer_id: str):
    """(ObservedState, MergedLog, schema) of one peer journal file."""
    try:
        journal = read_events(path)
    except JournalError as exc:
        raise _Failed(str(exc)) from exc
    merged = MergedLog()
    last = journal.events[-1]["seq"] if journal.events else 0
    try:
        merged.accept(peer_id, 0, journal.events, last, last)
    except MergeError as exc:
        raise _Failed(f"the journal cannot be folded as one append-only log: {exc}") from exc
    return fold(merged.ordered()), merged, journal.schema


def _cmd_observe(args) -> int:
    peer_id = args.peer_id or args.peer_db.stem
    if not peer_id.strip():
        raise _Failed("--peer-id must not be empty")
    observed, merged, schema = observe_file(args.peer_db, peer_id)
    if args.json:
        _print_json({"peer_id": peer_id, **observed.to_json(), "journal_schema": schema,
                     "cursor": merged.cursor(peer_id)})
    else:
        print(observed.render(peer_id, now=time.time()))
    return EXIT_OK


# -- status

def _cmd_status(args) -> int:
    try:
        journal = read_events(args.journal, kinds=(
            MULTIHUB_PARTITION, MULTIHUB_HEAL, MULTIHUB_EQUIVOCATION,
            MULTIHUB_EQUIVOCATION_RECOVERY))
    except JournalError as exc:
        raise _Failed(str(exc)) from exc
    detector = PartitionDetector("", NamespaceOwnership({}, ""))
    detector.restore(journal.events)
    quarantined = active_quarantines(journal.events)
    partitions = {ns: list(detector.contesting(ns)) for ns in sorted(detector.partitioned())}
    if args.json:
        _print_json({"journal": str(args.journal), "journal_schema": journal.schema,
                     "partitioned": partitions,
                     "quarantined": {p: q.to_json() for p, q in sorted(quarantined.items())}})
        return EXIT_OK
    if partitions:
        print(f"contested namespaces ({len(partitions)}; claims refused until healed):")
        for ns, hubs in partitions.items():
            print(f"  {ns}: contested by {', '.join(hubs)}")
    else:
        print("contested namespaces: none")
    if quarantined:
        print(f"quarantined peers ({len(quarantined)}; not polled until "
              "`hubd multihub recover`):")
        for peer, q in sorted(quarantined.items()):
            what = {"chain_broken": "hash chain broken",
                    "checkpoint_equivocation": "signed two heads"}.get(q.reason, "equivocated")
            print(f"  {peer}: {what} at seq {q.seq} (accepted "
                  f"{q.accepted_fingerprint[:16]}…, offered {q.conflicting_fingerprint[:16]}…)")
            for checkpoint in q.proof:  # both signed by the peer's key: checkable by anyone
                print(f"    proof: hub {checkpoint.get('hub_id')} seq {checkpoint.get('seq')} "
                      f"head {checkpoint.get('head')} key {checkpoint.get('key')} "
                      f"signature {checkpoint.get('signature')}")
    else:
        print("quarantined peers: none")
    return EXIT_OK


# -- recover

def _cmd_recover(args) -> int:
    try:
        event = record_recovery(args.journal, args.peer_id, args.operator, args.reason,
                                args.new_log_generation)
    except HubRunning as exc:
        raise _Failed(f"could not recover peer quarantine: {exc}") from exc
    except (RecoveryRefused, JournalError) as exc:
        raise _Failed(f"could not recover peer quarantine: {exc}") from exc
    if args.json:
        _print_json({"recorded": True, "journal": str(args.journal), "seq": event.seq,
                     "kind": event.kind, "payload": event.payload})
    else:
        print(f"recorded recovery for peer '{args.peer_id}' with log generation "
              f"'{args.new_log_generation}' (journal seq {event.seq})")
        print(f"start the hub again: it discards {args.peer_id}'s old observed history and "
              "polls it from the beginning")
    return EXIT_OK


# -- follow

def _cmd_follow(args) -> int:
    """The network pull lives with the hub's network code (federation.multihub_follow)."""
    from federation import multihub_follow

    return multihub_follow.run(args)

"""`hubd principal ...`: principals in a hub's journal database (docs/identity.md).

Works whether or not the hub runs; a running hub applies a change within a
second. A token is printed once and only its digest is stored.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
import time

from hubd.config import journal_command
from hubd.journal import principals as store
from hubd.state.principals import PrincipalError, token_digest


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hubd principal",
        description="Principals: who may speak for which seats, and their tokens.")
    sub = parser.add_subparsers(dest="command", required=True)

    def command(name: str, text: str) -> argparse.ArgumentParser:
        return journal_command(sub, name, text)

    add = command("add", "make a principal (or change one with --replace)")
    add.add_argument("name", help="its name, e.g. alice or acme/dev/joel")
    add.add_argument("--seat", action="append", required=True, metavar="PATTERN",
                     help="a seat it may speak for: PROJ/alice, PROJ/* or * (repeatable)")
    add.add_argument("--claim", action="append", metavar="NAMESPACE",
                     help="a namespace it may claim in, or * (repeatable; default: its "
                          "seats' namespaces)")
    add.add_argument("--no-claim", action="store_true", help="it may claim nowhere")
    add.add_argument("--board", action="append", metavar="NAMESPACE",
                     help="a namespace whose board tasks it may post (repeatable; default: "
                          "its seats' namespaces)")
    add.add_argument("--no-board", action="store_true", help="it may post no board task")
    add.add_argument("--mailbox", action="append", metavar="PATTERN",
                     help="another seat whose mailbox it may read with mailbox_for "
                          "(repeatable; default: none)")
    add.add_argument("--control", action="append", metavar="PATTERN",
                     help="a seat whose live turn it may interrupt or steer with a delivery "
                          "request, while it holds that request's task claim (repeatable; "
                          "default: none)")
    add.add_argument("--org-admin", action="append", metavar="ORG",
                     help="a REDSYN organization whose links it may agree to and change "
                          "(repeatable; default: none; hubd redsyn org add-admin does the same)")
    add.add_argument("--replace", action="store_true",
                     help="change an existing principal's seats and grants")

    token = command("token", "make a token for a principal and print it (shown once)")
    token.add_argument("name")
    token.add_argument("--label", default="default", metavar="MACHINE",
                       help="which token this is, e.g. the machine it lives on; a label "
                            "that has a token gets a new one and the old stops working")

    revoke = command("revoke-token", "revoke a principal's token (its connections close)")
    revoke.add_argument("name")
    which = revoke.add_mutually_exclusive_group(required=True)
    which.add_argument("--label", metavar="MACHINE", help="the token's label")
    which.add_argument("--all", action="store_true", help="every token of the principal")

    remove = command("remove", "remove a principal and its tokens")
    remove.add_argument("name")

    command("list", "list principals, their seats, grants and token labels")

    digest = sub.add_parser("digest", help="print the digest of a token read from stdin "
                                           "(for a --principals file)")
    digest.add_argument("--json", action="store_true", help="print JSON")
    return parser


def _grants(args) -> dict:
    grants: dict = {}
    for grant, values, none in (("claim", args.claim, args.no_claim),
                                ("board", args.board, args.no_board),
                                ("mailbox", args.mailbox, False),
                                ("control", args.control, False),
                                ("org_admin", args.org_admin, False)):
        if none and values:
            raise PrincipalError(f"--{grant} and --no-{grant} contradict each other")
        if none:
            grants[grant] = []
        elif values:
            grants[grant] = values
    return grants


def _when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(ts))


def _print_list(rows: list[dict]) -> None:
    if not rows:
        print("no principals (the hub is open, or has only its shared --token)")
        return
    for row in rows:
        print(f"{row['name']}: seats {', '.join(row['seats'])}")
        for grant, value in row["grants"].items():
            # org_admin has no default: none
            shown = ("none" if grant == "org_admin" else "default") if value is None \
                else (", ".join(value) or "none")
            print(f"  {grant}: {shown}")
        tokens = row["tokens"]
        print("  tokens: " + (", ".join(f"{t['label']} ({_when(t['created_at'])})"
                                        for t in tokens) or "none"))


def run(args) -> int:
    if args.command == "digest":
        digest = token_digest(sys.stdin.readline().strip())
        print(json.dumps({"sha256": digest}) if args.json else digest)
        return 0
    if args.command == "add":
        principal = store.add(args.db, args.name, args.seat, _grants(args), replace=args.replace)
        doc = {"name": principal.name, "seats": list(principal.seats),
               "grants": principal.grants()}
        print(json.dumps(doc) if args.json else
              f"{principal.name}: may speak for {', '.join(principal.seats)}")
        return 0
    if args.command == "token":
        secret = store.new_token(args.db, args.name, args.label)
        print(json.dumps({"name": args.name, "label": args.label, "token": secret})
              if args.json else secret)
        return 0
    if args.command == "revoke-token":
        gone = store.revoke_token(args.db, args.name, None if args.all else args.label)
        if args.json:
            print(json.dumps({"name": args.name, "revoked": gone}))
        else:
            print(f"{args.name}: {gone} token(s) revoked")
        return 0 if gone else 1
    if args.command == "remove":
        gone = store.remove(args.db, args.name)
        if args.json:
            print(json.dumps({"name": args.name, "removed": gone}))
        else:
            print(f"{args.name}: removed" if gone else f"{args.name}: no such principal")
        return 0 if gone else 1
    rows = store.listing(args.db)
    if args.json:
        print(json.dumps({"principals": rows}))
    else:
        _print_list(rows)
    return 0


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        return run(args)
    except PrincipalError as exc:
        print(f"hubd principal: {exc}", file=sys.stderr)
        return 2
    except sqlite3.Error as exc:
        print(f"hubd principal: cannot use {getattr(args, 'db', '?')}: {exc}", file=sys.stderr)
        return 2

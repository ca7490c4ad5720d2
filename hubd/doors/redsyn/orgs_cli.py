"""`hubd redsyn org ...`: REDSYN organizations and their admins
(docs/redsyn.md, "Organizations and links").

Works whether or not the hub runs; a running hub applies a change within a
second, like a principal's (hubd/journal/redsyn_orgs.py).
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
import time

from hubd.config import journal_command
from hubd.journal import redsyn_orgs as store
from hubd.state.principals import PrincipalError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hubd redsyn org",
        description="REDSYN organizations: their pinned Redsyn-Version date and their admins "
                    "(principals with the org_admin grant), who agree to links between "
                    "organizations.")
    sub = parser.add_subparsers(dest="command", required=True)

    def command(name: str, text: str) -> argparse.ArgumentParser:
        return journal_command(sub, name, text)

    create = command("create", "make an organization, pinned to a Redsyn-Version date")
    create.add_argument("org")
    create.add_argument("--version", metavar="DATE",
                        help="the date calls without Redsyn-Version get (default: the newest)")
    command("list", "list the organizations and their admins")
    command("show", "one organization and its admins").add_argument("org")
    for name, text in (("add-admin", "give a principal the org_admin grant for the org"),
                       ("remove-admin", "take a principal's org_admin grant for the org back")):
        p = command(name, text)
        p.add_argument("org")
        p.add_argument("principal", help="e.g. acme/it/ivan (hubd redsyn login makes one)")
    return parser


def _line(row: dict) -> str:
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(row["created_at"]))
    return (f"{row['org']}: Redsyn-Version {row['redsyn_version']}, made {when}, admins "
            f"{', '.join(row['admins']) or 'none'}")


def run(args) -> int:
    if args.command == "create":
        made = store.create(args.db, args.org, args.version)
        if made is None:
            print(json.dumps({"org": args.org, "created": False}) if args.json
                  else f"{args.org}: exists", file=sys.stdout if args.json else sys.stderr)
            return 1
        print(json.dumps(made) if args.json else _line(made))
        return 0
    if args.command == "list":
        rows = store.listing(args.db)
        if args.json:
            print(json.dumps({"orgs": rows}))
        else:
            print("\n".join(_line(r) for r in rows) or "no organizations")
        return 0
    if args.command == "show":
        rows = store.listing(args.db, args.org)
        if not rows:
            print(json.dumps({"org": args.org, "exists": False}) if args.json
                  else f"{args.org}: no such organization")
            return 1
        print(json.dumps(rows[0]) if args.json else _line(rows[0]))
        return 0
    admin = args.command == "add-admin"
    changed = store.set_admin(args.db, args.org, args.principal, admin)
    if args.json:
        print(json.dumps({"org": args.org, "principal": args.principal, "admin": admin,
                          "changed": changed}))
    else:
        print(f"{args.principal}: {'now' if admin else 'no longer'} an admin of {args.org}"
              if changed else f"{args.principal}: {'already' if admin else 'not'} an admin "
                              f"of {args.org}")
    # removing an admin that was not one is an error; adding one twice is not
    return 0 if changed or admin else 1


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        return run(args)
    except PrincipalError as exc:
        print(f"hubd redsyn org: {exc}", file=sys.stderr)
        return 2
    except sqlite3.Error as exc:
        print(f"hubd redsyn org: cannot use {args.db}: {exc}", file=sys.stderr)
        return 2

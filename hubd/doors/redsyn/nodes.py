"""Nodes and their bearer tokens (`hubd redsyn login/logout`).

A node is one token of a person's principal (docs/identity.md): the person
ORG/TEAM/USER is a principal whose seats are ORG/TEAM/USER/*, and each of its
machines holds a token labelled with the machine's name. `hubd redsyn login`
makes the principal if it is absent and a token for the machine (shown once;
the journal database keeps only its digest); `logout` revokes it. The hub
applies either within a second, like any principal change.
"""

from __future__ import annotations

import argparse
import json
import re
import sqlite3
import sys
from pathlib import Path

from hubd.config import DEFAULT_DB
from hubd.journal import principals as store
from hubd.state.principals import Credential, PrincipalError
from hubd.state.redsyn import Node
from hubd.wire.redsyn.envelope import NAME, Forbidden, RedsynError, parse_person

_MACHINE = re.compile(NAME)
TOKEN_PREFIX = "rsn_"


def node_id(person: str, name: str) -> str:
    return f"{person}:{name}"


def node_of(credential: Credential) -> Node:
    """The node a principal's token is on the REDSYN door (403 when the
    principal is not a person). It speaks for its principal's seats among
    its person's agents."""
    person = credential.principal.name
    try:
        parse_person(person)
    except RedsynError:
        raise Forbidden(f"principal {person!r} is not a REDSYN person "
                        "(org/team/user)") from None
    return Node(node_id(person, credential.label), person, credential.principal)


def login(path: str | Path, person: str, name: str) -> tuple[str, str]:
    """A new token for the node person:name (replacing any it had)."""
    parse_person(person)
    if not _MACHINE.fullmatch(name):
        raise RedsynError(400, "a machine name is lowercase letters, digits, '.', '-', '_'")
    return store.person_token(path, person, name, TOKEN_PREFIX), node_id(person, name)


def logout(path: str | Path, person: str, name: str) -> bool:
    parse_person(person)
    return store.revoke_token(path, person, name) > 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["org"]:
        from .orgs_cli import main as org_main
        return org_main(argv[1:])
    parser = argparse.ArgumentParser(prog="hubd redsyn",
                                     description="REDSYN nodes: bearer tokens for HTTP agents; "
                                                 "organizations: hubd redsyn org --help")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("org", help="organizations and their admins (hubd redsyn org --help)")
    for verb, text in (("login", "make a node and print its new bearer token (shown once)"),
                       ("logout", "revoke a node's token")):
        p = sub.add_parser(verb, help=text, description=text)
        p.add_argument("--db", default=DEFAULT_DB,
                       help=f"the hub's journal database (default ./{DEFAULT_DB})")
        p.add_argument("--person", required=True, metavar="ORG/TEAM/USER",
                       help="the person whose agents the node speaks for")
        p.add_argument("--name", required=True, metavar="MACHINE", help="the machine's name")
        p.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args(argv)
    try:
        if args.command == "login":
            token, node = login(args.db, args.person, args.name)
            if args.json:
                print(json.dumps({"token": token, "node": node, "person": args.person}))
            else:
                print(token)
            return 0
        gone = logout(args.db, args.person, args.name)
        node = node_id(args.person, args.name)
        if args.json:
            print(json.dumps({"node": node, "revoked": gone}))
        else:
            print(f"{node}: token revoked" if gone else f"{node}: no such node")
        return 0 if gone else 1
    except RedsynError as exc:
        print(f"hubd redsyn: {exc.error}", file=sys.stderr)
        return 2
    except PrincipalError as exc:
        print(f"hubd redsyn: {exc}", file=sys.stderr)
        return 2
    except sqlite3.Error as exc:
        print(f"hubd redsyn: cannot use {args.db}: {exc}", file=sys.stderr)
        return 2

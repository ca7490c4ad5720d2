"""A REDSYN link between two organizations, agreed by their admins (a program
too, so a test can run each step inside a network namespace):

  python -m tests.support.redsyn_link RELAY TOKEN propose ORG PEER [TERMS_JSON]
  python -m tests.support.redsyn_link RELAY TOKEN accept ID TERMS_JSON
  python -m tests.support.redsyn_link RELAY TOKEN wait ID STATE
  python -m tests.support.redsyn_link RELAY TOKEN suspend|resume|end ID

Each prints the link as JSON (REDSYN_CA: the hub's CA). `wait` polls until
the link is in STATE at this hub (a change made at another hub arrives
through the peer link), for at most 60 s.
"""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request

# what agreed links let through in tests that are not about their terms
OPEN_TERMS = {"signed_only": False}


def org_with_admin(db, org: str, admin: str) -> None:
    """`hubd redsyn org create` and `add-admin` (the admin's principal exists:
    `hubd redsyn login` made it)."""
    for args in (("create", org), ("add-admin", org, admin)):
        subprocess.run([sys.executable, "-m", "hubd", "redsyn", "org", *args, "--db", str(db)],
                       check=True, capture_output=True, timeout=60)


def call(relay: str, token: str, method: str, path: str, body=None, ca: str | None = None):
    context = None
    ca = ca or os.environ.get("REDSYN_CA")
    if ca:
        context = ssl.create_default_context(cafile=ca)
        context.check_hostname = False
    request = urllib.request.Request(
        relay + path, method=method, data=json.dumps(body).encode() if body is not None else None,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json",
                 "Redsyn-Version": "2026-09-25"})
    try:
        with urllib.request.urlopen(request, timeout=30, context=context) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"null")


def propose(relay, token, org, peer, terms, ca=None) -> dict:
    status, link = call(relay, token, "POST", "/links", {"org": org, "peer": peer,
                                                         "terms": terms}, ca)
    assert status == 201, link
    return link


def accept(relay, token, id_, terms, ca=None) -> dict:
    status, link = call(relay, token, "POST", f"/links/{id_}/accept", {"terms": terms}, ca)
    assert status == 200, link
    return link


def wait(relay, token, id_, state, ca=None, timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        status, link = call(relay, token, "GET", f"/links/{id_}", ca=ca)
        if status == 200 and link["state"] == state:
            return link
        assert time.monotonic() < deadline, f"link {id_} is not {state} here: {link}"
        time.sleep(0.05)


def agree(east: tuple, west: tuple, org: str, peer: str, ca: str | None = None) -> str:
    """`org`'s admin at one hub proposes, `peer`'s at the other accepts, each
    side's terms OPEN_TERMS exposing its whole organization; both hubs hold it
    active on return. east and west are (relay, admin token)."""
    made = propose(*east, org, peer, {**OPEN_TERMS, "expose": [org]}, ca)
    wait(*west, made["id"], "proposed", ca)
    accept(*west, made["id"], {**OPEN_TERMS, "expose": [peer]}, ca)
    wait(*east, made["id"], "active", ca)
    return made["id"]


def main() -> int:
    relay, token, action, *rest = sys.argv[1:]
    if action == "propose":
        terms = json.loads(rest[2]) if len(rest) > 2 else {**OPEN_TERMS, "expose": [rest[0]]}
        link = propose(relay, token, rest[0], rest[1], terms)
    elif action == "accept":
        link = accept(relay, token, rest[0], json.loads(rest[1]))
    elif action == "wait":
        link = wait(relay, token, rest[0], rest[1])
    else:
        status, link = call(relay, token, "POST", f"/links/{rest[0]}/{action}", {})
        assert status == 200, link
    print(json.dumps(link), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

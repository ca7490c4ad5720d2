"""REDSYN organizations in the journal database (`hubd redsyn org ...`).

An organization's record (its name and the Redsyn-Version date it was pinned
to when it was made) is a row beside the principals; its admins are the
principals holding the `org_admin` grant that names it. Like principals,
these are written whether or not a hub runs and applied by a running hub
within a second (the same version row), and are not journal events: the
command cannot append to a journal whose sequence a running hub owns. What
admins do with them, the links, is journaled (hubd/state/redsyn/links.py).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from hubd.state.principals import PrincipalError, make_principal
from hubd.wire.redsyn.envelope import API_VERSION, KNOWN_VERSIONS, RedsynError, check_org

from .principals import _write, connect

MAX_ORGS = 10_000


def _org_name(name: str) -> str:
    try:
        return check_org(name)
    except RedsynError as exc:
        raise PrincipalError(exc.error) from None


def create(path: str | Path, name: str, version: str | None = None) -> dict:
    """A new organization pinned to `version` (default: the newest known date)."""
    _org_name(name)
    version = version or API_VERSION
    if version not in KNOWN_VERSIONS:
        raise PrincipalError(f"unknown Redsyn-Version {version!r}; known: "
                             f"{', '.join(KNOWN_VERSIONS)}")

    def change(conn):
        if conn.execute("SELECT 1 FROM redsyn_orgs WHERE name = ?", (name,)).fetchall():
            return None
        [(count,)] = conn.execute("SELECT count(*) FROM redsyn_orgs").fetchall()
        if count >= MAX_ORGS:
            raise PrincipalError(f"the hub has {count} organizations, the most it may have")
        now = time.time()
        conn.execute("INSERT INTO redsyn_orgs (name, redsyn_version, created_at) "
                     "VALUES (?, ?, ?)", (name, version, now))
        return {"org": name, "redsyn_version": version, "created_at": now, "admins": []}

    return _write(path, change)


def _admins(conn, name: str) -> list[str]:
    out = []
    for principal, grants in conn.execute("SELECT name, grants FROM principals ORDER BY name"):
        if name in (json.loads(grants).get("org_admin") or ()):
            out.append(principal)
    return out


def listing(path: str | Path, name: str | None = None) -> list[dict]:
    conn = connect(path)
    try:
        rows = conn.execute("SELECT name, redsyn_version, created_at FROM redsyn_orgs "
                            + ("WHERE name = ? " if name is not None else "")
                            + "ORDER BY name", (name,) if name is not None else ()).fetchall()
        return [{"org": org, "redsyn_version": version, "created_at": created,
                 "admins": _admins(conn, org)} for org, version, created in rows]
    finally:
        conn.close()


def set_admin(path: str | Path, name: str, principal: str, admin: bool) -> bool:
    """Give (admin) or take back the principal's org_admin grant for the
    organization; False when there was nothing to change."""
    _org_name(name)

    def change(conn):
        if not conn.execute("SELECT 1 FROM redsyn_orgs WHERE name = ?", (name,)).fetchall():
            raise PrincipalError(f"no organization {name!r} (hubd redsyn org create {name})")
        row = conn.execute("SELECT seats, grants FROM principals WHERE name = ?",
                           (principal,)).fetchall()
        if not row:
            raise PrincipalError(f"no principal {principal!r} (hubd redsyn login or "
                                 "hubd principal add makes one)")
        seats, grants = json.loads(row[0][0]), json.loads(row[0][1])
        orgs = list(grants.get("org_admin") or ())
        if (name in orgs) == admin:
            return False
        orgs = orgs + [name] if admin else [o for o in orgs if o != name]
        grants["org_admin"] = orgs or None
        checked = make_principal(principal, seats,
                                 {g: v for g, v in grants.items() if v is not None})
        conn.execute("UPDATE principals SET grants = ? WHERE name = ?",
                     (json.dumps({g: v for g, v in checked.grants().items() if v is not None}),
                      principal))
        return True

    return _write(path, change)

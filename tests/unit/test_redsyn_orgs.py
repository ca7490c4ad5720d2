"""REDSYN organizations in the journal database (hubd/journal/redsyn_orgs.py):
made, pinned, their admins by grant, read by a hub with its principals."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from hubd.journal import principals as principals_store
from hubd.journal import redsyn_orgs as store
from hubd.state.principals import PrincipalError


def test_an_org_is_pinned_and_its_admins_are_principals_with_the_grant(tmp_path):
    db = tmp_path / "hubd.db"
    principals_store.person_token(db, "acme/it/ivan", "laptop", "rsn_")
    source = principals_store.JournalPrincipals(db)
    assert source.read(None).orgs == {}
    made = store.create(db, "acme")
    assert made["redsyn_version"] == "2026-09-25" and made["admins"] == []
    assert store.create(db, "acme") is None  # exists: nothing changed
    with pytest.raises(PrincipalError, match="unknown Redsyn-Version"):
        store.create(db, "globex", "2020-01-01")
    with pytest.raises(PrincipalError, match="organization is a name"):
        store.create(db, "Acme")
    assert store.set_admin(db, "acme", "acme/it/ivan", True)
    assert not store.set_admin(db, "acme", "acme/it/ivan", True)
    with pytest.raises(PrincipalError, match="no principal"):
        store.set_admin(db, "acme", "acme/it/nobody", True)
    with pytest.raises(PrincipalError, match="no organization"):
        store.set_admin(db, "globex", "acme/it/ivan", True)
    table = source.read(None)  # the version row moved: re-read with the principals
    assert table.orgs["acme"]["redsyn_version"] == "2026-09-25"
    assert table.org_admins("acme") == ["acme/it/ivan"]
    assert table.principals["acme/it/ivan"].admins_org("acme")
    assert not table.principals["acme/it/ivan"].admins_org("globex")
    assert store.listing(db) == [{**made, "admins": ["acme/it/ivan"]}]
    assert store.set_admin(db, "acme", "acme/it/ivan", False)
    assert source.read(None).org_admins("acme") == []
    source.close()


def test_the_org_commands_print_json_and_exit_by_outcome(tmp_path):
    db = str(tmp_path / "hubd.db")

    def org(*args):
        done = subprocess.run([sys.executable, "-m", "hubd", "redsyn", "org", *args,
                               "--db", db, "--json"], capture_output=True, text=True,
                              timeout=60)
        return done.returncode, json.loads(done.stdout) if done.stdout.strip() else None

    subprocess.run([sys.executable, "-m", "hubd", "redsyn", "login", "--db", db, "--person",
                    "acme/it/ivan", "--name", "laptop"], check=True, capture_output=True,
                   timeout=60)
    code, made = org("create", "acme")
    assert code == 0 and made["org"] == "acme" and made["redsyn_version"] == "2026-09-25"
    assert org("create", "acme")[0] == 1
    assert org("add-admin", "acme", "acme/it/ivan") == (
        0, {"org": "acme", "principal": "acme/it/ivan", "admin": True, "changed": True})
    code, shown = org("show", "acme")
    assert code == 0 and shown["admins"] == ["acme/it/ivan"]
    code, listed = org("list")
    assert code == 0 and [o["org"] for o in listed["orgs"]] == ["acme"]
    assert org("show", "globex")[0] == 1
    assert org("remove-admin", "acme", "acme/it/ivan")[0] == 0
    assert org("remove-admin", "acme", "acme/it/ivan")[0] == 1
    assert org("add-admin", "globex", "acme/it/ivan")[0] == 2  # no such org
    # hubd principal add gives the same grant
    subprocess.run([sys.executable, "-m", "hubd", "principal", "add", "acme/it/olga", "--seat",
                    "acme/it/olga/*", "--org-admin", "acme", "--db", db], check=True,
                   capture_output=True, timeout=60)
    assert org("show", "acme")[1]["admins"] == ["acme/it/olga"]

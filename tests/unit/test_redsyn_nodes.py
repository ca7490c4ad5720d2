"""Node tokens: `hubd redsyn login/logout` on a real journal file. A node is a
token of the person's principal (docs/identity.md)."""

import json
import sqlite3
import subprocess
import sys

from hubd.doors.redsyn import nodes
from hubd.journal.principals import JournalPrincipals
from hubd.state.principals import token_digest


def run(*args):
    return subprocess.run([sys.executable, "-m", "hubd", "redsyn", *args], capture_output=True,
                          text=True, timeout=60)


def test_login_prints_a_token_once_and_stores_only_its_digest(tmp_path):
    db = tmp_path / "hub.db"
    out = run("login", "--db", str(db), "--person", "acme/dev/joel", "--name", "laptop", "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["node"] == "acme/dev/joel:laptop" and doc["person"] == "acme/dev/joel"
    # Read the file before any connection is open in this process: closing
    # another descriptor of a SQLite file drops this process's locks on it.
    assert doc["token"].encode() not in db.read_bytes()
    conn = sqlite3.connect(db)
    rows = conn.execute("SELECT principal, label, digest FROM principal_tokens").fetchall()
    assert rows == [("acme/dev/joel", "laptop", token_digest(doc["token"]))]
    seats = conn.execute("SELECT seats FROM principals WHERE name = 'acme/dev/joel'").fetchall()
    assert json.loads(seats[0][0]) == ["acme/dev/joel/*"]
    source = JournalPrincipals(db)
    table = source.read(None)
    assert nodes.node_of(table.authenticate(doc["token"])).person == "acme/dev/joel"
    assert table.authenticate("rsn_wrong") is None
    assert source.read(None) is None  # nothing changed
    # a second login replaces the token; logout revokes it
    plain = run("login", "--db", str(db), "--person", "acme/dev/joel", "--name", "laptop")
    token = plain.stdout.strip()
    assert plain.returncode == 0 and token.startswith("rsn_") and "\n" not in token
    table = source.read(None)
    assert table.authenticate(doc["token"]) is None
    assert nodes.node_of(table.authenticate(token)).id == "acme/dev/joel:laptop"
    gone = run("logout", "--db", str(db), "--person", "acme/dev/joel", "--name", "laptop")
    assert gone.returncode == 0 and "revoked" in gone.stdout, gone.stdout + gone.stderr
    assert source.read(None).authenticate(token) is None
    again = run("logout", "--db", str(db), "--person", "acme/dev/joel", "--name", "laptop")
    assert again.returncode == 1
    source.close()
    conn.close()


def test_bad_person_is_refused(tmp_path):
    out = run("login", "--db", str(tmp_path / "x.db"), "--person", "acme/dev", "--name", "m")
    assert out.returncode == 2 and "org/team/user" in out.stderr

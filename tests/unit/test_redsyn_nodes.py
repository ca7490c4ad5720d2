"""Node tokens: `hubd redsyn login/logout` on a real journal file."""

import json
import sqlite3
import subprocess
import sys

from hubd.doors.redsyn import nodes


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
    rows = conn.execute("SELECT node, digest FROM redsyn_nodes").fetchall()
    assert rows == [("acme/dev/joel:laptop", nodes.digest(doc["token"]))]
    table = nodes.TokenTable(db)
    assert table.refresh()
    assert table.node_for(doc["token"]).person == "acme/dev/joel"
    assert table.node_for("rsn_wrong") is None
    assert not table.refresh()  # nothing changed
    # a second login replaces the token; logout revokes it
    plain = run("login", "--db", str(db), "--person", "acme/dev/joel", "--name", "laptop")
    token = plain.stdout.strip()
    assert plain.returncode == 0 and token.startswith("rsn_") and "\n" not in token
    assert table.refresh() and table.node_for(doc["token"]) is None
    assert table.node_for(token).id == "acme/dev/joel:laptop"
    gone = run("logout", "--db", str(db), "--person", "acme/dev/joel", "--name", "laptop")
    assert gone.returncode == 0 and "revoked" in gone.stdout, gone.stdout + gone.stderr
    assert table.refresh() and table.node_for(token) is None
    again = run("logout", "--db", str(db), "--person", "acme/dev/joel", "--name", "laptop")
    assert again.returncode == 1
    table.close()
    conn.close()


def test_bad_person_is_refused(tmp_path):
    out = run("login", "--db", str(tmp_path / "x.db"), "--person", "acme/dev", "--name", "m")
    assert out.returncode == 2 and "org/team/user" in out.stderr

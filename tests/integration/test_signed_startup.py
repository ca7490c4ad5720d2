"""What the reference's identity, ACL and per-message auth flags require,
refused at start with exit 2 and the reason (docs/identity.md, "The
reference's identity files"; docs/reference-observed.md §11.2, §12.1, §13.1)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.procs import free_port


def _start(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "hubd", "--port", str(free_port()),
            "--db", str(tmp_path / "hub.db"), *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def _owner_only(path: Path, text: str, mode: int = 0o600) -> str:
    path.write_text(text)
    path.chmod(mode)
    return str(path)


@pytest.mark.parametrize("args, says", [
    (["--require-identity-binding"], "--require-identity-binding requires --identity-trust"),
    (["--message-auth-key", "justone"], "entries must use KEY_ID:SECRET:SENDER[,SENDER...]"),
    (["--message-auth-key", "k::p/a"], "entries must use KEY_ID:SECRET:SENDER[,SENDER...]"),
    (["--require-acl"], "--require-acl requires --acl-policy"),
    (["--token", "t", "--attachment-root", "/tmp"],
     "--attachment-root requires token, bound identity, durable signed frames, ACL, role "
     "grants, and --db"),
])
def test_a_flag_without_what_it_needs_refuses_the_start(tmp_path, args, says):
    done = _start(tmp_path, *args)
    assert done.returncode == 2, done
    assert says in done.stderr


def test_trust_without_binding_is_the_unbound_multi_seat_refusal(tmp_path):
    trust = _owner_only(tmp_path / "trust.json", json.dumps({"keys": []}))
    done = _start(tmp_path, "--identity-trust", trust)
    assert done.returncode == 2 and "--insecure-unbound-identity" in done.stderr, done


def test_a_key_file_others_can_read_refuses_the_start(tmp_path):
    keys = _owner_only(tmp_path / "keys.txt", "mac-x:secret-x:p/a\n", 0o644)
    done = _start(tmp_path, "--message-auth-key-file", keys)
    assert done.returncode == 2, done
    assert "is accessible by other users" in done.stderr and "secret-x" not in done.stderr


@pytest.mark.parametrize("name, body, says", [
    ("missing.json", None, "identity trust bundle does not exist"),
    ("bad.json", "{not json", "is not JSON"),
    ("badkey.json", json.dumps({"keys": [{"key_id": "k", "public_key": "AA==",
                                          "senders": ["p/a"]}]}), "base64 of 32 bytes"),
])
def test_a_trust_bundle_that_cannot_be_used_refuses_the_start(tmp_path, name, body, says):
    path = tmp_path / name
    if body is not None:
        _owner_only(path, body)
    done = _start(tmp_path, "--identity-trust", str(path), "--require-identity-binding")
    assert done.returncode == 2, done
    assert says in done.stdout + done.stderr


def test_a_bad_acl_rule_refuses_the_start(tmp_path):
    acl = _owner_only(tmp_path / "acl.json", json.dumps({"rules": [
        {"permission": "fly", "target_kind": "k", "target_pattern": "p"}]}))
    done = _start(tmp_path, "--acl-policy", acl, "--require-acl")
    assert done.returncode == 2, done
    assert "ACL rule 0 has unknown permission 'fly'" in done.stdout + done.stderr

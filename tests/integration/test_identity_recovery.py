"""Governed identity recovery against real hubd processes (docs/identity.md,
"Governed identity recovery"): trust-on-first-use pins that survive a
restart, the operator's reclaim through `hubd identity reclaim --json`, and
online enrolment and revocation under --identity-enrollments, each verdict
private and its audit in the journal.

Registrations are signed with independent code (plain `cryptography`, the
construction of docs/reference-observed.md §11.2).
"""

from __future__ import annotations

import asyncio
import base64
import json
import secrets
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import (Encoding, NoEncryption,
                                                          PrivateFormat, PublicFormat)

from tests.support.procs import hubd_process
from tests.support.wsprobe import WsProbe


class Key:
    def __init__(self, key_id: str, folder: Path):
        self.key_id = key_id
        self.private = Ed25519PrivateKey.generate()
        self.public = base64.b64encode(self.private.public_key().public_bytes(
            Encoding.Raw, PublicFormat.Raw)).decode()
        self.pem = folder / f"{key_id}.pem"
        self.pem.write_bytes(self.private.private_bytes(Encoding.PEM, PrivateFormat.PKCS8,
                                                        NoEncryption()))
        self.pem.chmod(0o600)

    def entry(self, sender: str) -> dict:
        return {"key_id": self.key_id, "public_key": self.public, "senders": [sender]}


def signed(name: str, key: Key, present: bool = True) -> dict:
    frame = {"sender": name, "target": "System", "type": "heartbeat", "payload": "online",
             "timestamp": time.time(), "protocol_version": 7,
             "signature": {"version": 1, "key_id": key.key_id, "algorithm": "ed25519",
                           "nonce": secrets.token_urlsafe(18), "sequence": 1,
                           "signed_at": time.time()}}
    if present:
        frame["identity_public_key"] = key.public
    body = json.dumps(frame, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    frame["signature"]["value"] = base64.b64encode(key.private.sign(body.encode())).decode()
    return frame


async def connect(url: str, name: str, key: Key | None = None, present: bool = True):
    """(probe, None) once registered, or (probe, the refusal error frame) once closed."""
    probe = await WsProbe.open(url)
    if key is None:
        await probe.register(name)
    else:
        await probe.send_json(signed(name, key, present))
    got = await probe.recv(lambda f: f.get("type") == "error" or (
        f.get("type") == "presence_update" and f.get("agent") == name), timeout=10)
    if got["type"] == "error":
        await probe.wait_closed()
        return probe, got
    return probe, None


async def ask(probe: WsProbe, sender: str, type_: str, **fields) -> dict:
    result = f"{type_}_result" if type_ != "identity_pin_reclaim" else \
        "identity_pin_reclaim_result"
    await probe.send_json({"sender": sender, "target": "System", "type": type_, "payload": "",
                           "timestamp": time.time(), **fields})
    return await probe.recv(lambda f: f.get("type") in (result, "error"), timeout=10)


def owner_only(path: Path, doc) -> Path:
    path.write_text(json.dumps(doc))
    path.chmod(0o600)
    return path


def events(db: Path, kind: str) -> list[dict]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        rows = conn.execute("SELECT seq, payload FROM events WHERE kind = ? ORDER BY seq",
                            (kind,)).fetchall()
    finally:
        conn.close()
    return [{"seq": seq, **json.loads(payload)} for seq, payload in rows]


def hubd_identity(*args: str) -> tuple[int, str]:
    done = subprocess.run([sys.executable, "-m", "hubd", "identity", *args],
                          capture_output=True, text=True, timeout=60)
    return done.returncode, done.stdout + done.stderr


def test_a_first_signed_registration_pins_the_name_across_a_restart(tmp_path):
    keys = tmp_path / "keys"
    keys.mkdir()
    first, other = Key("tofu-a", keys), Key("tofu-b", keys)
    hub = hubd_process(tmp_path).start()

    async def before():
        probe, refused = await connect(hub.url, "p/tofu", first)
        assert refused is None
        await probe.close()
        probe, refused = await connect(hub.url, "p/tofu")  # unsigned: the pin holds
        assert refused["verification_result"] == "signature missing"
        assert refused["payload"].startswith(
            "identity pin: name 'p/tofu' is pinned to key tofu-a (signature missing).")
        assert "hubd identity reclaim" in refused["payload"]
        assert probe.closed.code == 4013 and probe.closed.reason == "identity pin mismatch"
        probe, refused = await connect(hub.url, "p/tofu", other)  # another key
        assert refused["verification_result"] == "unknown_key"
        assert probe.closed.code == 4013
        probe, refused = await connect(hub.url, "p/plain")  # never signed: not pinned
        assert refused is None
        await probe.close()
        probe, refused = await connect(hub.url, "p/plain")
        assert refused is None
        await probe.close()

    async def after():
        probe, refused = await connect(hub.url, "p/tofu")
        assert refused["verification_result"] == "signature missing"
        probe, refused = await connect(hub.url, "p/tofu", first)
        assert refused is None
        await probe.close()

    try:
        asyncio.run(before())
        hub.stop()
        hub.start()
        asyncio.run(after())
        health = hub.get_json("/health")
        # an operator whose registration is refused gets no verdict: exit 2
        code, out = hubd_identity(
            "reclaim", "p/x", "--operator", "p/tofu", "--identity-key", str(other.pem),
            "--identity-key-id", other.key_id, "--expected-key-id", "k", "--reason", "r",
            "--uri", hub.url, "--json")
        assert code == 2 and out.startswith(
            "pin reclaim failed: identity pin: name 'p/tofu' is pinned to key tofu-a") \
            and out.strip().endswith("(closed 4013)"), out
    finally:
        hub.stop()
    pinned = events(tmp_path / "hubd.db", "identity_pinned")
    assert health["identity_pins"] == {"pins": 1, "pins_max": 16384, "tofu": True,
                                       "enrolment": False, "enrolled_keys": 0,
                                       "enrolled_keys_max": 4096}
    assert [(p["name"], p["key_id"]) for p in pinned] == [("p/tofu", "tofu-a")]


def test_the_operator_reclaims_a_pin_with_the_cli_after_every_gate(tmp_path):
    keys = tmp_path / "keys"
    keys.mkdir()
    tofu, replacement, operator = Key("tofu-a", keys), Key("tofu-b", keys), Key("op-key", keys)
    policy = owner_only(tmp_path / "acl.json", {"rules": [
        {"permission": "identity-pin-reclaim", "target_kind": "agent",
         "target_pattern": "p/*"}]})
    hub = hubd_process(tmp_path, "--acl-policy", str(policy)).start()

    def reclaim(*extra: str, expected: str = "tofu-a", reason: str = "stale laptop"):
        code, out = hubd_identity(
            "reclaim", "p/tofu", "--operator", "p/op", "--identity-key", str(operator.pem),
            "--identity-key-id", operator.key_id, "--expected-key-id", expected,
            "--reason", reason, "--uri", hub.url, "--json", *extra)
        return code, json.loads(out) if out.startswith("{") else out

    async def pin_and_stay():
        probe, refused = await connect(hub.url, "p/tofu", tofu)
        assert refused is None
        watcher, _ = await connect(hub.url, "p/watch")
        return probe, watcher

    async def unbound_operator():
        probe, _ = await connect(hub.url, "p/op2")  # registered, but proves no key
        got = await ask(probe, "p/op2", "identity_pin_reclaim", pin_name="p/tofu",
                        expected_key_id="tofu-a", reason="x")
        await probe.close()
        return got

    async def typed_refusal():
        probe, _ = await connect(hub.url, "p/op3")
        got = await ask(probe, "p/op3", "identity_pin_reclaim", pin_name="p/tofu",
                        expected_key_id="tofu-a", reason="x", break_glass="yes")
        await probe.close()
        return got

    loop = asyncio.new_event_loop()
    try:
        tofu_probe, watcher = loop.run_until_complete(pin_and_stay())
        code, verdict = reclaim(expected="wrong")
        assert code == 1 and verdict == {
            "applied": False, "audit_seq": None, "break_glass": False,
            "detail": "the current pin does not match the expected key id",
            "expected_key_id": "wrong", "pin_name": "p/tofu"}
        code, verdict = reclaim(reason="   ")
        assert verdict["detail"] == "a non-empty operator reason is required"
        code, verdict = reclaim()  # the owner is online
        assert code == 1 and verdict["detail"] == (
            "the pinned identity is online; use explicit break-glass recovery to evict it")
        got = loop.run_until_complete(unbound_operator())
        assert got["type"] == "identity_pin_reclaim_result" and got["applied"] is False
        assert got["payload"] == "the operator identity is not cryptographically bound"
        got = loop.run_until_complete(typed_refusal())
        assert got["type"] == "error" and got["error_code"] == "invalid_field"
        code, verdict = reclaim("--break-glass")
        assert code == 0, verdict
        assert verdict["applied"] is True and verdict["break_glass"] is True
        assert verdict["detail"] == "identity pin reclaimed; the next valid proof may pin the name"
        closed = loop.run_until_complete(tofu_probe.wait_closed(10))
        assert (closed.code, closed.reason) == (4017, "identity pin reclaimed")
        notice = loop.run_until_complete(watcher.recv(
            lambda f: f.get("event_kind") == "identity_pin_reclaim", timeout=10))
        assert notice["type"] == "system" and notice["previous_key_id"] == "tofu-a"
        assert notice["operator"] == "p/op" and notice["audit_seq"] == verdict["audit_seq"]
        assert "public_key" not in notice
        code, verdict = reclaim()
        assert code == 1 and verdict["detail"] == "the target has no identity pin"
        code, out = hubd_identity(
            "reclaim", "p/tofu", "--operator", "p/op", "--identity-key", str(operator.pem),
            "--identity-key-id", operator.key_id, "--expected-key-id", "tofu-a",
            "--reason", "again", "--uri", hub.url)
        assert code == 1 and out.strip() == "pin reclaim refused: the target has no identity pin"

        async def repin():
            probe, refused = await connect(hub.url, "p/tofu", replacement)
            assert refused is None
            await probe.close()
            await watcher.close()
        loop.run_until_complete(repin())
        hub.stop()
        hub.start()

        async def after_restart():
            probe, refused = await connect(hub.url, "p/tofu")
            assert refused["payload"].startswith(
                "identity pin: name 'p/tofu' is pinned to key tofu-b")
        loop.run_until_complete(after_restart())
    finally:
        loop.close()
        hub.stop()
    audits = events(tmp_path / "hubd.db", "identity_pin_reclaim")
    applied = [a for a in audits if a["status"] == "applied"]
    assert len(applied) == 1 and applied[0]["seq"] == verdict_seq(audits)
    approved = [a for a in audits if a["status"] == "approved"]
    assert applied[0]["approved_seq"] == approved[0]["seq"] < applied[0]["seq"]
    assert applied[0]["evicted_live_socket"] is True and applied[0]["break_glass"] is True
    # the operator was bound and granted: its refusals are audited too
    assert {a["detail"] for a in audits if a["status"] == "denied"} >= {
        "the current pin does not match the expected key id",
        "the target has no identity pin"}
    assert all("public_key" not in a for a in audits)
    assert all(a["operator"] == "p/op" for a in audits)  # p/op2 was not bound


def verdict_seq(audits: list[dict]) -> int:
    return next(a["seq"] for a in audits if a["status"] == "applied")


def test_enrolment_and_revocation_take_effect_and_survive_a_restart(tmp_path):
    keys = tmp_path / "keys"
    keys.mkdir()
    op, clerk, new, newer, other = (Key(k, keys) for k in ("op-key", "clerk-key", "k-new",
                                                           "k-newer", "k-other"))
    trust = owner_only(tmp_path / "trust.json",
                       {"keys": [op.entry("p/op"), clerk.entry("p/clerk")]})
    policy = owner_only(tmp_path / "acl.json", {"rules": [
        {"permission": "identity-enroll", "target_kind": "agent", "target_pattern": "p/*"}]})
    grants = owner_only(tmp_path / "roles.json", {"grants": {"p/identity-enroller": ["p/op"]}})
    hub = hubd_process(
        tmp_path, "--identity-trust", str(trust), "--require-identity-binding",
        "--acl-policy", str(policy), "--role-grants", str(grants),
        "--identity-enrollments", str(tmp_path / "enrolled.json"),
        "--identity-enrollment-namespace", "p").start()

    def cli(verb: str, name: str, key_id: str, *extra: str) -> tuple[int, dict]:
        code, out = hubd_identity(
            verb, name, "--operator", "p/op", "--identity-key", str(op.pem),
            "--identity-key-id", op.key_id, "--key-id", key_id, "--reason", "onboard",
            "--uri", hub.url, "--json", *extra)
        return code, json.loads(out)

    async def as_clerk():
        probe, refused = await connect(hub.url, "p/clerk", clerk, present=False)
        assert refused is None
        got = await ask(probe, "p/clerk", "identity_enroll", name="p/x", key_id="k-x",
                        public_key=other.public, reason="r")
        await probe.close()
        return got

    async def online(name: str, key: Key):
        probe, refused = await connect(hub.url, name, key, present=False)
        return probe, refused

    loop = asyncio.new_event_loop()
    try:
        probe, refused = loop.run_until_complete(online("p/new", new))
        assert refused["verification_result"] == "unknown_key"
        code, verdict = cli("enroll", "p/new", "k-new", "--public-key", new.public)
        assert code == 0 and verdict["applied"] is True
        assert verdict["detail"] == "identity key 'k-new' enrolled for 'p/new'"
        enrolled_seq = verdict["audit_seq"]
        new_probe, refused = loop.run_until_complete(online("p/new", new))
        assert refused is None  # the enrolled key proves the name at once
        code, verdict = cli("enroll", "p/new2", "k-new", "--public-key", newer.public)
        assert code == 1 and verdict["detail"] == "key id is already in use"
        assert isinstance(verdict["audit_seq"], int) and verdict["audit_seq"] > enrolled_seq
        code, verdict = cli("enroll", "q/new", "k-q", "--public-key", newer.public)
        assert verdict == {"applied": False, "audit_seq": None,
                           "detail": "not authorised to enrol keys for this name",
                           "expected_key_id": "", "key_id": "k-q", "name": "q/new"}
        code, verdict = cli("enroll", "p/bad", "k-bad", "--public-key", "notbase64")
        assert verdict["detail"] == "public key must be base64 of 32 raw Ed25519 bytes"
        got = loop.run_until_complete(as_clerk())
        assert got["type"] == "identity_enroll_result" and got["audit_seq"] is None
        assert got["payload"] == "enrolment requires the 'identity-enroller' role grant"
        code, verdict = cli("enroll", "p/newer", "k-newer", "--public-key", newer.public)
        assert code == 0
        code, verdict = cli("revoke", "p/new", "k-new")
        assert code == 0 and verdict["detail"] == "identity key 'k-new' for 'p/new' revoked"
        closed = loop.run_until_complete(new_probe.wait_closed(10))
        assert (closed.code, closed.reason) == (4018, "identity key rotated or revoked")
        code, verdict = cli("revoke", "p/new", "k-new")
        assert code == 1 and verdict["detail"] == "the enrolled key is already revoked"
        _, refused = loop.run_until_complete(online("p/new", new))
        assert refused["verification_result"] == "revoked_key"
        hub.stop()
        hub.start()
        _, refused = loop.run_until_complete(online("p/new", new))
        assert refused["verification_result"] == "revoked_key"
        probe, refused = loop.run_until_complete(online("p/newer", newer))
        assert refused is None  # enrolled before the restart, still proves its name
        loop.run_until_complete(probe.close())
    finally:
        loop.close()
        hub.stop()
    assert not (tmp_path / "enrolled.json").exists()  # the journal holds the keys
    audits = events(tmp_path / "hubd.db", "identity_enrollment")
    assert [a["status"] for a in audits if a["action"] == "revoke"] == [
        "approved", "applied", "denied"]
    assert all("public_key" not in a for a in audits)
    assert all(a["operator"] == "p/op" for a in audits)  # the clerk's refusal is not audited


def test_the_enrolment_flags_refuse_a_start_they_cannot_serve(tmp_path):
    trust = owner_only(tmp_path / "trust.json", {"keys": []})

    def check(*args: str) -> tuple[int, str]:
        done = subprocess.run([sys.executable, "-m", "hubd", "--db", str(tmp_path / "h.db"),
                               *args, "--check"], capture_output=True, text=True, timeout=60,
                              cwd=tmp_path)
        return done.returncode, done.stderr

    code, err = check("--identity-enrollments", str(tmp_path / "e.json"))
    assert code == 2 and "online identity enrolment needs an identity trust bundle" in err
    bound = ("--identity-trust", str(trust), "--require-identity-binding")
    assert check(*bound, "--identity-enrollments", str(tmp_path / "e.json"))[0] == 0
    owner_only(tmp_path / "empty.json", {"keys": []})
    assert check(*bound, "--identity-enrollments", str(tmp_path / "empty.json"))[0] == 0
    owner_only(tmp_path / "old.json", {"keys": [{"key_id": "k", "public_key": "x",
                                                 "senders": ["p/a"], "revoked": False}]})
    code, err = check(*bound, "--identity-enrollments", str(tmp_path / "old.json"))
    assert code == 2 and "holds a reference hub's enrolled keys" in err
    code, err = check("--identity-enrollment-namespace", "p")
    assert code == 2 and "require --identity-enrollments" in err


def test_a_reclaim_whose_commit_fails_is_refused_and_changes_nothing(tmp_path):
    """The journal on a full disk: the approved reclaim cannot be committed,
    so the operator hears `could not persist the reclaimed pin table` with
    applied false, no notice is broadcast, the pin stays (also after the
    state is rebuilt), and the same request applies once the disk has room."""
    from hubd.timing import Timing
    from tests.integration.test_attachment_store import _fill_to_the_last_page
    from tests.integration.test_faults import _mount_tmpfs
    from tests.support.procs import timing_file

    keys = tmp_path / "keys"
    keys.mkdir()
    tofu, operator = Key("tofu-a", keys), Key("op-key", keys)
    policy = owner_only(tmp_path / "acl.json", {"rules": [
        {"permission": "identity-pin-reclaim", "target_kind": "agent",
         "target_pattern": "p/*"}]})
    small = tmp_path / "small"
    _mount_tmpfs(small)
    answers: dict = {}
    try:
        timing = timing_file(tmp_path / "timing.json", Timing(journal_retry_first=0.2))
        hub = hubd_process(tmp_path / "hub", "--acl-policy", str(policy), "--timing",
                           str(timing), db=small / "hubd.db").start()
        try:
            async def run():
                probe, _ = await connect(hub.url, "p/tofu", tofu)
                await probe.close()
                op, refused = await connect(hub.url, "p/op", operator)
                assert refused is None
                watcher, _ = await connect(hub.url, "p/watch")
                request = dict(pin_name="p/tofu", expected_key_id="tofu-a", reason="lost")
                filler = _fill_to_the_last_page(small)
                answers["failed"] = await ask(op, "p/op", "identity_pin_reclaim", **request)
                filler.unlink()
                deadline = time.monotonic() + 15
                while True:  # mutations are refused a moment after a failed commit
                    retry = await ask(op, "p/op", "identity_pin_reclaim", **request)
                    if retry["type"] == "identity_pin_reclaim_result":
                        break
                    assert "cannot write its journal" in retry["payload"], retry
                    assert time.monotonic() < deadline, retry
                    await asyncio.sleep(0.1)
                answers["retry"] = retry
                await watcher.drain(0.5)
                answers["notices"] = [f for f in watcher.frames
                                      if f.get("event_kind") == "identity_pin_reclaim"]
                await op.close()
                await watcher.close()

            asyncio.run(run())
        finally:
            hub.stop()
    finally:
        subprocess.run(["umount", "-l", str(small)], check=False)
    failed = answers["failed"]
    assert (failed["type"], failed["applied"], failed["audit_seq"], failed["payload"]) == (
        "identity_pin_reclaim_result", False, None, "could not persist the reclaimed pin table")
    assert answers["retry"]["applied"] is True  # the pin had stayed: the retry removed it
    assert [n["audit_seq"] for n in answers["notices"]] == [answers["retry"]["audit_seq"]]


def test_keygen_makes_an_owner_only_key_and_prints_its_trust_entry(tmp_path):
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    pem = tmp_path / "op.pem"
    code, out = hubd_identity("keygen", "--sender", "p/op", "--key-id", "op-1",
                              "--private-out", str(pem))
    assert code == 0
    entry = json.loads(out)["keys"][0]
    assert (entry["key_id"], entry["senders"]) == ("op-1", ["p/op"])
    assert pem.stat().st_mode & 0o777 == 0o600
    private = load_pem_private_key(pem.read_bytes(), password=None)
    raw = private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    assert base64.b64decode(entry["public_key"]) == raw
    code, out = hubd_identity("keygen", "--sender", "p/op", "--key-id", "op-2",
                              "--private-out", str(pem))
    assert code == 2 and "cannot create" in out  # never overwritten

"""Issues 23 and 24: per-message auth, identity binding, governed identity recovery."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Callable

from .harness import (
    SYNAPSE,
    MAC_SECRET,
    owner_only,
    Workdir,
    Hub,
    running,
    startup_refusal,
    envelope,
    Signer,
    connect,
    show_files,
    RecordingProxy,
)


async def probe_message_auth(work: Workdir) -> None:
    """The `auth` object on claims and the other signed verbs, with and without --require-message-auth."""
    key_file = owner_only(work.path / "mac-keys.txt", f"# kid:secret:senders\nmac-f:{MAC_SECRET}:p/bob,p/carol\n")
    flags = ["--db", str(work.path / "hub.db"), "--hub-id", "src",
             "--message-auth-key", f"mac-0:{MAC_SECRET}:p/alice", "--message-auth-key-file", str(key_file),
             "--require-message-auth", "--message-auth-window-seconds", "10"]
    with running(work, flags) as hub:
        signer = Signer(key_id="mac-0")
        alice = await connect(hub, "p/alice", token=None)
        await alice.drain(0.4)
        print("## unsigned claim", flush=True)
        await alice.send(envelope("p/alice", "claim", target="all", task_id="T-1", idem_key="k1"))
        await alice.recv()
        print("## signed claim", flush=True)
        await alice.send(signer.mac(envelope("p/alice", "claim", target="all", task_id="T-1", idem_key="k2"), "p/alice"))
        await alice.recv()
        print("## replayed (same nonce)", flush=True)
        frame = signer.mac(envelope("p/alice", "task_update", target="all", task_id="T-1", idem_key="k3", status="working"), "p/alice")
        await alice.send(frame)
        await alice.recv()
        await alice.send(frame, " (again)")
        await alice.recv()
        print("## bad value, unknown kid, wrong alg, expired, future, bool sequence, sender-mismatch", flush=True)
        cases: list[tuple[str, Callable[[dict], None]]] = [
            ("bad value", lambda f: f["auth"].__setitem__("value", "00" * 32)),
            ("unknown kid", lambda f: f["auth"].__setitem__("kid", "nope")),
        ]
        for label, mutate in cases:
            f = signer.mac(envelope("p/alice", "checkpoint", target="all", task_id="T-1", checkpoint="c"), "p/alice")
            mutate(f)
            await alice.send(f, f" ({label})")
            await alice.recv()
        for label, override in (("expired", {"timestamp": time.time() - 60}), ("future +5s", {"timestamp": time.time() + 5}),
                                ("sequence 0", {"sequence": 0}), ("alg", {"alg": "hmac-sha1"})):
            f = envelope("p/alice", "checkpoint", target="all", task_id="T-1", checkpoint="c")
            if "alg" in override:
                f = signer.mac(f, "p/alice")
                f["auth"]["alg"] = "hmac-sha1"
            else:
                f = signer.mac(f, "p/alice", **override)
            await alice.send(f, f" ({label})")
            await alice.recv()
        print("## key bound to p/bob used by p/alice", flush=True)
        f = Signer(key_id="mac-f").mac(envelope("p/alice", "checkpoint", target="all", task_id="T-1", checkpoint="c"), "p/alice")
        await alice.send(f)
        await alice.recv()
        print("## unsigned resource / release / handoff / chat / ledger_task", flush=True)
        for msg_type, extra in (("resource", {"kind": "gpu", "name": "a100"}), ("release", {"task_id": "T-1"}),
                                ("handoff", {"task_id": "T-1", "new_owner": "p/bob"}), ("chat", {"payload": "hi"}),
                                ("ledger_task", {"task_id": "B-1", "title": "t"}),
                                ("delivery_cancel", {"operation_key": "0" * 64})):
            await alice.send(envelope("p/alice", msg_type, target="all", **extra))
            await alice.drain(0.5)
        print("## signed release", flush=True)
        await alice.send(signer.mac(envelope("p/alice", "release", target="all", task_id="T-1", idem_key="k9"), "p/alice"))
        await alice.drain(0.5)
        await alice.ws.close()
    print("## without --require-message-auth: an unsigned claim and a badly signed claim", flush=True)
    flags = ["--message-auth-key", f"mac-0:{MAC_SECRET}:p/alice"]
    with running(work, flags, "lenient") as hub:
        alice = await connect(hub, "p/alice", token=None)
        await alice.drain(0.4)
        await alice.send(envelope("p/alice", "claim", target="all", task_id="T-2"))
        await alice.recv()
        f = signer.mac(envelope("p/alice", "claim", target="all", task_id="T-3"), "p/alice")
        f["auth"]["value"] = "1" * 64
        await alice.send(f)
        await alice.recv()
        await alice.ws.close()
    startup_refusal(work, ["--require-message-auth"])
    startup_refusal(work, ["--message-auth-key", "justone"])
    startup_refusal(work, ["--message-auth-key", f"k::p/a"])
    loose = work.path / "loose-keys.txt"
    loose.write_text(f"mac-x:{MAC_SECRET}:p/a\n")
    loose.chmod(0o644)
    startup_refusal(work, ["--message-auth-key-file", str(loose)])


async def probe_message_auth_restart(work: Workdir) -> None:
    """Is a signed frame accepted once more after a restart (durable nonce ledger)?"""
    flags = ["--db", str(work.path / "hub.db"), "--hub-id", "src",
             "--message-auth-key", f"mac-0:{MAC_SECRET}:p/alice", "--require-message-auth"]
    signer = Signer(key_id="mac-0")
    frame = signer.mac(envelope("p/alice", "checkpoint", target="all", task_id="T-1", checkpoint="c"), "p/alice")
    claim = signer.mac(envelope("p/alice", "claim", target="all", task_id="T-1", idem_key="k-1"), "p/alice")
    hub = Hub(work, flags)
    hub.start()
    try:
        a = await connect(hub, "p/alice", token=None)
        await a.drain(0.3)
        await a.send(claim)
        await a.recv()
        await a.send(frame)
        await a.recv()
        await a.ws.close()
        hub.stop()
        print(f"## files beside the db: {sorted(p.name for p in work.path.iterdir() if p.name.startswith('hub.db'))}", flush=True)
        hub.start()
        a = await connect(hub, "p/alice", token=None)
        await a.drain(0.3)
        await a.send(frame, " (the same signed checkpoint after restart)")
        await a.recv()
        await a.ws.close()
    finally:
        hub.stop()


async def probe_identity(work: Workdir) -> None:
    trust = work.path / "identity-trust.json"
    pem = work.identity_key("p/alice", "id-a", trust)
    other = work.identity_key("p/mallory", "id-m", trust)
    show_files(work)
    flags = ["--identity-trust", str(trust), "--require-identity-binding", "--identity-pins", ""]
    with running(work, flags) as hub:
        print("## signed registration", flush=True)
        ok = await connect(hub, "p/alice", signer=Signer(identity_pem=pem, identity_key_id="id-a"), token=None)
        await ok.drain(0.4)
        await ok.ws.close()
        print("## unsigned registration", flush=True)
        bad = await connect(hub, "p/alice", token=None)
        await bad.drain(1.0)
        print("## registration signed by another name's key", flush=True)
        bad = await connect(hub, "p/alice", signer=Signer(identity_pem=other, identity_key_id="id-m"), token=None)
        await bad.drain(1.0)
        print("## registration signed with a key id not in the bundle", flush=True)
        bad = await connect(hub, "p/alice", signer=Signer(identity_pem=pem, identity_key_id="id-zzz"), token=None)
        await bad.drain(1.0)
        print("## a name not in the bundle", flush=True)
        bad = await connect(hub, "p/nobody", token=None)
        await bad.drain(1.0)
    startup_refusal(work, ["--require-identity-binding"])
    startup_refusal(work, ["--identity-trust", str(work.path / "missing.json"), "--require-identity-binding"])


async def probe_identity_recovery(work: Workdir) -> None:
    trust = work.path / "identity-trust.json"
    op_pem = work.identity_key("p/op", "id-op", trust)
    alice_pem = work.identity_key("p/alice", "id-alice", trust)
    acl = owner_only(work.path / "acl.json", json.dumps({"rules": [
        {"permission": "identity-pin-reclaim", "target_kind": "agent", "target_pattern": "p/*"},
        {"permission": "identity-enroll", "target_kind": "agent", "target_pattern": "p/*"},
    ]}))
    roles = work.path / "roles.json"
    work.role_grant("p/identity-enroller", "p/op", roles)
    enroll = work.path / "enrollments.json"
    flags = ["--db", str(work.path / "hub.db"), "--hub-id", "idh", "--identity-trust", str(trust),
             "--acl-policy", str(acl), "--role-grants", str(roles), "--identity-enrollments", str(enroll),
             "--identity-enrollment-namespace", "p", "--require-identity-binding"]
    # A TOFU pin for p/tofu, written before start in the format the hub itself writes
    # ({"pins": {name: {key_id, pinned_at, public_key}}}; see docs/reference-observed.md §1).
    owner_only(work.path / "hub.db.identity-pins.json", json.dumps({"pins": {"p/tofu": {
        "key_id": "id-tofu", "pinned_at": time.time() - 3600,
        "public_key": "oBTimsMKc1xYy6fQCsJNSyZWH+vqKiLFw/S0EIOtKDY="}}}))
    with running(work, flags) as hub:
        pins = work.path / "hub.db.identity-pins.json"
        print(f"## pins file the hub wrote: {pins.read_text() if pins.exists() else '(none)'}", flush=True)
        op = await connect(hub, "p/op", signer=Signer(identity_pem=op_pem, identity_key_id="id-op"), token=None)
        await op.drain(0.4)
        print("## identity_pin_reclaim: wrong expected key, missing reason, ok", flush=True)
        for fields in ({"pin_name": "p/tofu", "expected_key_id": "nope", "reason": "stale"},
                       {"pin_name": "p/tofu", "expected_key_id": "id-tofu"},
                       {"pin_name": "p/tofu", "expected_key_id": "id-tofu", "reason": "stale", "break_glass": "yes"},
                       {"pin_name": "p/tofu", "expected_key_id": "id-tofu", "reason": "stale laptop"},
                       {"pin_name": "p/tofu", "expected_key_id": "id-tofu", "reason": "again"}):
            await op.send(envelope("p/op", "identity_pin_reclaim", **fields))
            await op.drain(0.4)
        print(f"## pins file after the reclaim: {pins.read_text()}", flush=True)
        print("## identity_enroll / identity_revoke", flush=True)
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
        from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

        pub = base64.b64encode(Ed25519PrivateKey.generate().public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)).decode()
        for fields in ({"name": "p/new", "key_id": "k-new", "public_key": pub, "reason": "onboard"},
                       {"name": "p/new", "key_id": "k-new", "public_key": pub, "reason": "again"},
                       {"name": "q/new", "key_id": "k-q", "public_key": pub, "reason": "other ns"},
                       {"name": "p/new2", "key_id": "k-2", "public_key": "notbase64", "reason": "bad key"}):
            await op.send(envelope("p/op", "identity_enroll", **fields))
            await op.drain(0.4)
        await op.send(envelope("p/op", "identity_revoke", name="p/new", key_id="k-new", reason="offboard"))
        await op.drain(0.4)
        await op.send(envelope("p/op", "identity_revoke", name="p/new", key_id="k-new", reason="twice"))
        await op.drain(0.4)
        print("## requester without the grant (p/alice)", flush=True)
        al = await connect(hub, "p/alice", signer=Signer(identity_pem=alice_pem, identity_key_id="id-alice"), token=None)
        await al.drain(0.4)
        await al.send(envelope("p/alice", "identity_enroll", name="p/x", key_id="k-x", public_key=pub, reason="r"))
        await al.drain(0.4)
        await al.send(envelope("p/alice", "identity_pin_reclaim", pin_name="p/op", expected_key_id="id-op", reason="r"))
        await al.drain(0.4)
        await op.ws.close()
        await al.ws.close()
    if enroll.exists():
        print(f"## enrollments file ({oct(enroll.stat().st_mode & 0o777)}): {enroll.read_text()[:600]}", flush=True)


async def probe_operator_cli(work: Workdir) -> None:
    """The frames `synapse identity reclaim|enroll|revoke` send, through a recording relay."""
    trust = work.path / "identity-trust.json"
    work.identity_key("p/watch", "id-watch", trust)
    work.synapse("identity", "machine-key", "--sender", "p/op", "--trust", str(trust))
    acl = owner_only(work.path / "acl.json", json.dumps({"rules": [
        {"permission": "identity-pin-reclaim", "target_kind": "agent", "target_pattern": "p/*"},
        {"permission": "identity-enroll", "target_kind": "agent", "target_pattern": "p/*"}]}))
    roles = work.path / "roles.json"
    work.role_grant("p/identity-enroller", "p/op", roles)
    owner_only(work.path / "hub.db.identity-pins.json", json.dumps({"pins": {"p/tofu": {
        "key_id": "id-tofu", "pinned_at": time.time() - 3600,
        "public_key": "oBTimsMKc1xYy6fQCsJNSyZWH+vqKiLFw/S0EIOtKDY="}}}))
    flags = ["--db", str(work.path / "hub.db"), "--hub-id", "idh", "--identity-trust", str(trust),
             "--require-identity-binding", "--acl-policy", str(acl), "--role-grants", str(roles),
             "--identity-enrollments", str(work.path / "enrollments.json"), "--identity-enrollment-namespace", "p"]
    with running(work, flags) as hub:
        async with RecordingProxy(hub) as proxy:
            uri = f"ws://127.0.0.1:{proxy.port}"
            commands = [
                ["identity", "reclaim", "p/tofu", "--operator", "p/op", "--expected-key-id", "id-tofu",
                 "--reason", "stale laptop", "--uri", uri, "--json"],
                ["identity", "enroll", "p/new", "--operator", "p/op", "--key-id", "k-new", "--public-key",
                 "oBTimsMKc1xYy6fQCsJNSyZWH+vqKiLFw/S0EIOtKDY=", "--reason", "onboard", "--uri", uri, "--json"],
                ["identity", "revoke", "p/new", "--operator", "p/op", "--key-id", "k-new", "--reason", "offboard",
                 "--uri", uri, "--json"],
                ["identity", "reclaim", "p/tofu", "--operator", "p/op", "--expected-key-id", "id-tofu",
                 "--reason", "again", "--uri", uri],
            ]
            for args in commands:
                print(f"## synapse {' '.join(args)}", flush=True)
                proc = await asyncio.create_subprocess_exec(SYNAPSE, *args, env=work.env,
                                                            stdout=asyncio.subprocess.PIPE,
                                                            stderr=asyncio.subprocess.STDOUT)
                out, _ = await asyncio.wait_for(proc.communicate(), 60)
                print(f"## exit {proc.returncode}: {' '.join(out.decode().split())[:700]}", flush=True)


def _sqlite_dump(path) -> None:
    """Schema, rows (secrets cut) and mode of a SQLite file the reference wrote."""
    import os
    import sqlite3
    import stat

    if not path.exists():
        print(f"## {path.name}: absent", flush=True)
        return
    print(f"## {path.name}: mode {stat.S_IMODE(os.stat(path).st_mode):04o}", flush=True)
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        for name, sql in db.execute("SELECT name, sql FROM sqlite_master WHERE sql IS NOT NULL"):
            print(f"schema {name}: {sql}", flush=True)
            if sql.upper().startswith("CREATE TABLE"):
                for row in db.execute(f"SELECT * FROM \"{name}\" LIMIT 8"):
                    print(f"  row {name}: {row}", flush=True)
    finally:
        db.close()


async def probe_message_auth_floor(work: Workdir) -> None:
    """--message-auth-sequence-floor-mode and --message-auth-replay-db: what the
    durable ledger holds, and which sequences each mode refuses, across a restart."""
    for mode in ("off", "compat", "strict"):
        ledger = work.path / f"replay-{mode}.db"
        flags = ["--db", str(work.path / f"hub-{mode}.db"), "--hub-id", "src",
                 "--message-auth-key", f"mac-0:{MAC_SECRET}:p/alice,p/bob",
                 "--message-auth-key", f"mac-1:{MAC_SECRET}:p/alice",
                 "--require-message-auth", "--message-auth-replay-db", str(ledger),
                 "--message-auth-sequence-floor-mode", mode]
        hub = Hub(work, flags, f"hub-{mode}")
        hub.start()
        try:
            print(f"# mode {mode}", flush=True)
            a = await connect(hub, "p/alice", token=None)
            b = await connect(hub, "p/bob", token=None)
            await a.drain(0.3)
            await b.drain(0.3)
            s0, s1 = Signer(key_id="mac-0"), Signer(key_id="mac-1")

            async def check(conn, signer, sender, seq, label, task="T"):
                await conn.send(signer.mac(envelope(sender, "checkpoint", target="all", task_id=task,
                                                     checkpoint="c"), sender, sequence=seq), f" ({label})")
                await conn.recv()

            await a.send(s0.mac(envelope("p/alice", "claim", target="all", task_id="T", idem_key="k"),
                                "p/alice", sequence=100), " (claim seq 100)")
            await a.recv()
            await check(a, s0, "p/alice", 200, "alice mac-0 seq 200")
            await check(a, s0, "p/alice", 150, "alice mac-0 seq 150 (below 200)")
            await check(a, s0, "p/alice", 200, "alice mac-0 seq 200 again, new nonce")
            await check(a, s1, "p/alice", 150, "alice mac-1 seq 150 (other key)")
            await b.send(s0.mac(envelope("p/bob", "claim", target="all", task_id="U", idem_key="kb"),
                                "p/bob", sequence=5), " (bob claim mac-0 seq 5: other sender, same key)")
            await b.recv()
            await a.ws.close()
            await b.ws.close()
            hub.stop()
            print(hub.log.read_text()[-600:], flush=True)
            _sqlite_dump(ledger)
            hub.start()
            a = await connect(hub, "p/alice", token=None)
            await a.drain(0.3)
            await check(a, s0, "p/alice", 201, "after restart: alice mac-0 seq 201")
            await check(a, s0, "p/alice", 1, "after restart: alice mac-0 seq 1")
            twice = s0.mac(envelope("p/alice", "checkpoint", target="all", task_id="T", checkpoint="c"),
                           "p/alice", sequence=10_000)
            await a.send(twice, " (seq 10000)")
            await a.recv()
            await a.send(twice, " (the identical frame again)")
            await a.recv()
            await a.ws.close()
        finally:
            hub.stop()
    print("# startup combinations", flush=True)
    startup_refusal(work, ["--message-auth-replay-db", str(work.path / "x.db")])
    startup_refusal(work, ["--message-auth-sequence-floor-mode", "strict"])
    startup_refusal(work, ["--message-auth-sequence-floor-mode", "off"])
    startup_refusal(work, ["--message-auth-key", f"mac-0:{MAC_SECRET}:p/alice", "--require-message-auth",
                           "--message-auth-sequence-floor-mode", "compat"])
    startup_refusal(work, ["--message-auth-key", f"mac-0:{MAC_SECRET}:p/alice", "--require-message-auth",
                           "--message-auth-sequence-floor-mode", "off"])
    startup_refusal(work, ["--message-auth-key", f"mac-0:{MAC_SECRET}:p/alice", "--require-message-auth",
                           "--message-auth-sequence-floor-mode", "strict"])
    startup_refusal(work, ["--message-auth-key", f"mac-0:{MAC_SECRET}:p/alice", "--require-message-auth",
                           "--message-auth-replay-db", str(work.path / "nodir" / "x.db")])
    open_db = work.path / "loose.db"
    open_db.write_bytes(b"")
    open_db.chmod(0o644)
    startup_refusal(work, ["--message-auth-key", f"mac-0:{MAC_SECRET}:p/alice", "--require-message-auth",
                           "--message-auth-replay-db", str(open_db)])
    startup_refusal(work, ["--db", str(work.path / "d.db"), "--message-auth-key", f"mac-0:{MAC_SECRET}:p/alice",
                           "--require-message-auth", "--message-auth-replay-capacity", "2",
                           "--message-auth-sequence-floor-mode", "compat"])

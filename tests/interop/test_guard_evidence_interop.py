"""The reference client's guard-denial reporter, unchanged, against the
reference hub and hubd (both with --token and a journal): the shipped
`synapse adapters codex-claim-hook` denies an unclaimed edit in a real git
repository and reports it with its own guard_denial frame (its reporter
name claim-hook/<owner>-<slot>, its idem_key guard-denial:<call_sha256>).

The observable answers are the same on both hubs: the hook's deny output,
one guard_denial audit row with the same client digests, provider, reason,
path_count and recorder digest (the credential digest is each hub's own
derivation, so only its form is compared), and a second report of the same
call (a reconnect retry) records nothing more.
"""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
from pathlib import Path

from tests.support.procs import hubd_process, reference_env, reference_hub_process, reference_venv

TOKEN = "s3cret-token"  # the interop suite's secured hubs (conftest.TOKEN)
EVENT_FIELDS = ("actor_sha256", "call_sha256", "scope_sha256", "decision", "path_count",
                "provider", "reason_code", "recorder_sha256")


def git_repo(folder: Path) -> Path:
    folder.mkdir(parents=True)
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t", "PATH": "/usr/bin:/bin"}
    subprocess.run(["git", "init", "-q", str(folder)], check=True, env=env)
    (folder / "a.txt").write_text("a\n")
    subprocess.run(["git", "-C", str(folder), "add", "a.txt"], check=True, env=env)
    subprocess.run(["git", "-C", str(folder), "commit", "-qm", "a"], check=True, env=env)
    return folder


def run_hook(home: Path, url: str, repo: Path) -> str:
    event = {"session_id": "session-1", "tool_use_id": "tool-1", "cwd": str(repo),
             "tool_name": "apply_patch", "hook_event_name": "PreToolUse",
             "tool_input": {"command": "*** Begin Patch\n*** Update File: a.txt\n@@\n-a\n+b\n"
                                       "*** End Patch\n"}}
    synapse = reference_venv() / "bin" / "synapse"
    done = subprocess.run([str(synapse), "adapters", "codex-claim-hook", "--identity", "p/alice",
                           "--uri", url, "--token", TOKEN, "--ready-timeout", "5"],
                          input=json.dumps(event), capture_output=True, text=True, timeout=60,
                          env=reference_env(home), cwd=repo)
    assert done.returncode == 0, done
    return done.stdout


def denial_rows(workdir: Path) -> list[dict]:
    db = workdir / ("ref.db" if workdir.name == "reference" else "hubd.db")
    conn = sqlite3.connect(db)
    try:
        rows = conn.execute("SELECT payload FROM events WHERE kind = 'guard_denial'"
                            " ORDER BY seq").fetchall()
    finally:
        conn.close()
    return [json.loads(p) for (p,) in rows]


def test_reference_reporter_records_the_same_evidence(tmp_path):
    repo = git_repo(tmp_path / "repo")
    hubs = {"reference": reference_hub_process(tmp_path / "reference", "--token", TOKEN,
                                               "--no-durable-ingress-quota", hub_id="iop-east"),
            "hubd": hubd_process(tmp_path / "hubd", "--token", TOKEN, hub_id="iop-east")}
    outputs, observed = {}, {}
    for kind, proc in hubs.items():
        proc.start()
        try:
            home = tmp_path / f"{kind}-home"
            first = run_hook(home, proc.url, repo)
            again = run_hook(home, proc.url, repo)  # the same call reported again
        finally:
            proc.stop()
        assert again == first, kind
        outputs[kind] = first
        rows = denial_rows(tmp_path / kind)
        assert len(rows) == 1, (kind, rows)  # the retry was answered, not appended
        row = rows[0]
        assert set(row) == set(EVENT_FIELDS) | {"credential_principal_sha256"}, (kind, row)
        assert re.fullmatch(r"[0-9a-f]{64}", row["credential_principal_sha256"]), kind
        observed[kind] = {k: row[k] for k in EVENT_FIELDS}
    deny = json.loads(outputs["hubd"])["hookSpecificOutput"]
    assert (deny["permissionDecision"], deny["permissionDecisionReason"]) == \
        ("deny", "Synapse claim required before 'a.txt' can be edited."), outputs
    assert outputs["hubd"] == outputs["reference"]
    assert observed["hubd"] == observed["reference"]
    assert (observed["hubd"]["provider"], observed["hubd"]["reason_code"],
            observed["hubd"]["path_count"]) == ("codex", "GUARD_NO_CLAIM", 1)


SHA = "c0" * 32
FRAMES = [
    {"idem_key": "g-1"},
    {"idem_key": "g-1"},  # a retry: the identical answer
    {"idem_key": "g-1", "reason_code": "GUARD_NOT_EDITABLE"},  # same key, other content
    {"reason_code": "NOPE"}, {"provider": "vim"}, {"path_count": -1}, {"path_count": "1"},
    {"call_sha256": SHA.upper()}, {"scope_sha256": None},
    {"path": "/etc/passwd", "payload": "text"},
]


def _shape(frame: dict) -> dict:
    """What a client can rely on: everything but the hub's clock and id."""
    return {k: v for k, v in frame.items() if k not in ("timestamp", "hub_id")}


async def _answers(url: str, token: str | None) -> list[dict]:
    from tests.support.wsprobe import WsProbe

    probe = await WsProbe.open(url)
    await probe.register("claim-hook/alice-1", **({"token": token} if token else {}))
    await probe.recv_type("welcome")
    got = []
    for over in FRAMES:
        frame = {"sender": "claim-hook/alice-1", "target": "SynapseHub", "type": "guard_denial",
                 "provider": "claude", "reason_code": "GUARD_NO_CLAIM", "path_count": 1,
                 "actor_sha256": SHA, "call_sha256": SHA, "scope_sha256": SHA}
        frame.update(over)
        frame = {k: v for k, v in frame.items() if v is not None}
        probe._cursor = len(probe.frames)
        await probe.send_json(frame)
        got.append(await probe.recv(lambda f: f.get("type") in ("guard_denial_recorded",
                                                                "error"), timeout=10))
    await probe.close()
    return got


def test_raw_frames_get_the_same_answers(tmp_path):
    import asyncio

    results = {}
    for kind in ("reference", "hubd"):
        for token in (TOKEN, None):
            folder = tmp_path / f"{kind}-{'token' if token else 'open'}"
            flags = ["--token", token] if token else []
            proc = (reference_hub_process(folder, *flags, "--no-durable-ingress-quota")
                    if kind == "reference" else
                    hubd_process(folder, *flags, *([] if token else ["--open-network"])))
            proc.start()
            try:
                answers = asyncio.run(_answers(proc.url, token))
            finally:
                proc.stop()
            results[kind, token] = answers
    for token in (TOKEN, None):
        ref, ours = results["reference", token], results["hubd", token]
        # the audit_seq values are each journal's own; their roles must match
        assert [f.get("audit_seq") is None for f in ref] == [f.get("audit_seq") is None
                                                             for f in ours]
        strip = [{k: v for k, v in _shape(f).items() if k != "audit_seq"} for f in ref]
        assert strip == [{k: v for k, v in _shape(f).items() if k != "audit_seq"}
                         for f in ours], (token, ref, ours)
        assert ours[1] == ours[0] if token else True  # the retry is the identical frame

"""hubd's attachment store under faults: a SIGKILL mid-upload leaves nothing
half-written and committed objects read back after the restart; an upload
whose connection closed is discarded; a full root refuses new uploads and
keeps what it holds; a hub without a root answers `attachments disabled`
(docs/attachments.md)."""

from __future__ import annotations

import asyncio
import base64
import errno
import hashlib
import os
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from hubd.timing import Timing
from hubd.wire.envelope import PROTOCOL_VERSION
from tests.integration.test_faults import _mount_tmpfs
from tests.support.procs import hubd_process, timing_file
from tests.support.signed_site import (ATTACH_ACL, SignedProbe, SignedSite, begin_fields,
                                       envelope, mac, read_back, start_signed_hub, upload)

ROLES = {"p/alice": ["p/attachment-read", "p/attachment-write", "p/attachment-admin"]}


@pytest.fixture
def site(tmp_path: Path):
    site = start_signed_hub("hubd", tmp_path, ROLES, ATTACH_ACL, attachments=True,
                            extra=("--attachment-max-bytes", str(200_000)),
                            reference_files=False)
    yield site
    site.proc.stop()


def _root(site) -> Path:
    return site.root / "attachments"


def _ledger_rows(root: Path) -> list[tuple]:
    db = sqlite3.connect(f"file:{root / 'attachments.sqlite3'}?mode=ro", uri=True)
    try:
        return db.execute("SELECT scope, digest, length, filename FROM objects").fetchall()
    finally:
        db.close()


async def _until(check, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.02)


def test_a_sigkill_mid_upload_leaves_nothing_half_written(site):
    seat = site.seats["p/alice"]
    kept = os.urandom(50_000)
    partial = os.urandom(60_000)

    async def before():
        alice = await SignedProbe.open(site.proc.url, seat)
        committed = await upload(alice, kept)
        begun = await alice.ask("attachment_begin", **begin_fields(partial))
        got = await alice.ask("attachment_chunk", scope="p", upload_id=begun["upload_id"],
                              offset=0, body=base64.b64encode(partial[:32768]).decode())
        assert got["received"] == 32768
        # killed while the upload is open (its connection too)
        assert (staging / begun["upload_id"]).stat().st_size == 32768
        site.proc.signal(signal.SIGKILL)
        site.proc.proc.wait()
        await alice.close()
        return committed, begun["upload_id"]

    staging = _root(site) / "staging"
    committed, upload_id = asyncio.run(before())
    assert (staging / upload_id).exists()  # the half-written upload, before the restart
    site.proc.start()

    async def after():
        alice = await SignedProbe.open(site.proc.url, seat)
        back = await read_back(alice, committed["metadata"]["digest"])
        stale = await alice.ask("attachment_chunk", scope="p", upload_id=upload_id,
                                offset=32768, body=base64.b64encode(partial[32768:]).decode())
        await alice.close()
        return back, stale

    back, stale = asyncio.run(after())
    assert back == kept
    assert stale["error"] == "unknown upload"
    assert list(staging.iterdir()) == []
    rows = _ledger_rows(_root(site))
    assert [(r[0], r[1], r[2]) for r in rows] == [("p", hashlib.sha256(kept).hexdigest(),
                                                  len(kept))]
    assert sorted(p.name for p in (_root(site) / "objects").iterdir()) == [rows[0][3]]
    # content lives under the root only: not in the journal
    journal = (site.proc.argv[site.proc.argv.index("--db") + 1])
    assert kept[:64] not in Path(journal).read_bytes()
    assert base64.b64encode(kept[:48]) not in Path(journal).read_bytes()


def test_an_upload_whose_connection_closed_is_discarded(site):
    async def run():
        alice = await SignedProbe.open(site.proc.url, site.seats["p/alice"])
        data = os.urandom(40_000)
        begun = await alice.ask("attachment_begin", **begin_fields(data))
        await alice.ask("attachment_chunk", scope="p", upload_id=begun["upload_id"], offset=0,
                        body=base64.b64encode(data[:32768]).decode())
        staged = _root(site) / "staging" / begun["upload_id"]
        assert staged.exists()
        await alice.close()
        await _until(lambda: not staged.exists())
        # and its reservation is free again: four new uploads may open
        alice = await SignedProbe.open(site.proc.url, site.seats["p/alice"])
        opened = [await alice.ask("attachment_begin", **begin_fields(os.urandom(10)))
                  for _ in range(4)]
        await alice.close()
        return opened

    assert all(answer["ok"] for answer in asyncio.run(run()))


def test_a_full_root_refuses_new_uploads_and_keeps_what_it_holds(site):
    """--attachment-max-bytes 200000: committed and reserved bytes count."""
    async def run():
        alice = await SignedProbe.open(site.proc.url, site.seats["p/alice"])
        first = os.urandom(150_000)
        committed = await upload(alice, first)
        refused = await alice.ask("attachment_begin", **begin_fields(os.urandom(60_000)))
        fits = await upload(alice, os.urandom(40_000))
        back = await read_back(alice, committed["metadata"]["digest"])
        await alice.close()
        return first, committed, refused, fits, back

    first, committed, refused, fits, back = asyncio.run(run())
    assert committed["ok"] and fits["ok"]
    assert refused["error"] == "attachment store full"
    assert back == first


def test_a_hub_without_a_root_answers_attachments_disabled(tmp_path):
    proc = hubd_process(tmp_path / "hub").start()
    try:
        async def run():
            from tests.support.wsprobe import joined

            probe = await joined(proc.url, "p/alice", protocol_version=7)
            await probe.send_json({"sender": "p/alice", "target": "SynapseHub",
                                   "type": "attachment_info", "payload": "", "scope": "p",
                                   "digest": "0" * 64})
            answer = await probe.recv_type("attachment_result")
            await probe.close()
            return answer

        answer = asyncio.run(run())
        assert (answer["operation"], answer["ok"], answer["error"]) == (
            "attachment_info", False, "attachments disabled")
        assert proc.get_json("/health")["protocol_version"] == PROTOCOL_VERSION == 6
    finally:
        proc.stop()


def test_a_root_others_can_read_refuses_the_start(tmp_path):
    files = SignedSite.make(tmp_path / "files", None, ROLES, ATTACH_ACL, attachments=True)
    (files.root / "attachments").chmod(0o755)
    proc = hubd_process(tmp_path / "hub", *files.flags)
    with pytest.raises(Exception):
        proc.start(ready_timeout=15)
    proc.proc.wait(15)
    assert proc.proc.returncode == 2
    assert "attachment directory must be owner-only" in proc.log()


def test_chunks_sent_without_waiting_are_each_counted_in_order(site):
    """A chunk counts only once written and committed, but the next one is
    expected at once: six chunks in flight (the site's root holds 200,000
    bytes) are all taken, in order."""
    data = os.urandom(6 * 32768 - 100)

    async def run():
        alice = await SignedProbe.open(site.proc.url, site.seats["p/alice"])
        begun = await alice.ask("attachment_begin", **begin_fields(data))
        for offset in range(0, len(data), 32768):
            await alice.probe.send_json(mac(envelope(
                "p/alice", "attachment_chunk", scope="p", upload_id=begun["upload_id"],
                offset=offset, body=base64.b64encode(data[offset:offset + 32768]).decode()),
                alice.seat.mac_kid))
        answers = [await alice.probe.recv_type("attachment_result", operation="attachment_chunk")
                   for _ in range(6)]
        committed = await alice.ask("attachment_commit", scope="p",
                                    upload_id=begun["upload_id"])
        back = await read_back(alice, hashlib.sha256(data).hexdigest())
        await alice.close()
        return answers, committed, back

    answers, committed, back = asyncio.run(run())
    assert [a["received"] for a in answers] == [min(n * 32768, len(data)) for n in range(1, 7)]
    assert committed["ok"] and back == data


def _fill_to_the_last_page(path: Path) -> Path:
    """Write until not one more page fits (so even a small journal commit,
    which appends a page to the WAL, fails); return the filler's path."""
    filler, block = path / "filler", 65536
    with open(filler, "wb", buffering=0) as f:
        while block:
            try:
                f.write(b"\0" * block)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
                block //= 16
    return filler


def test_a_chunk_whose_journal_commit_failed_is_taken_again_at_its_offset(tmp_path):
    """The chunk's signed frame journals its nonce; when that commit fails the
    chunk is not counted, its sender hears `attachment unavailable`, and the
    retry at the same offset is accepted once the journal recovers."""
    small = tmp_path / "small"
    _mount_tmpfs(small)
    try:
        # the journal on a small tmpfs, the root beside it; after a failed
        # commit mutations are refused for 0.2 s (production: 1 s)
        timing = timing_file(tmp_path / "timing.json", Timing(journal_retry_first=0.2))
        site = start_signed_hub("hubd", tmp_path, ROLES, ATTACH_ACL, attachments=True,
                                extra=("--db", str(small / "hubd.db"), "--timing", str(timing)),
                                reference_files=False)
        try:
            data, answers = os.urandom(70_000), {}

            def chunk(alice, upload_id, offset):
                return alice.ask("attachment_chunk", scope="p", upload_id=upload_id,
                                 offset=offset,
                                 body=base64.b64encode(data[offset:offset + 32768]).decode())

            async def run():
                alice = await SignedProbe.open(site.proc.url, site.seats["p/alice"])
                begun = await alice.ask("attachment_begin", **begin_fields(data))
                answers["first"] = await chunk(alice, begun["upload_id"], 0)
                filler = _fill_to_the_last_page(small)
                answers["failed"] = await chunk(alice, begun["upload_id"], 32768)
                filler.unlink()
                deadline = time.monotonic() + 15
                while True:  # mutations are refused a moment after a failed commit
                    retry = await chunk(alice, begun["upload_id"], 32768)
                    if retry["type"] == "attachment_result":
                        break
                    assert "cannot write its journal" in retry["payload"], retry
                    assert time.monotonic() < deadline, retry
                    await asyncio.sleep(0.1)
                answers["retry"] = retry
                answers["last"] = await chunk(alice, begun["upload_id"], 65536)
                answers["commit"] = await alice.ask("attachment_commit", scope="p",
                                                    upload_id=begun["upload_id"])
                answers["back"] = await read_back(alice, hashlib.sha256(data).hexdigest())
                answers["unanswered"] = alice.probe.seen("error")
                await alice.close()

            asyncio.run(run())
        finally:
            site.proc.stop()
    finally:
        subprocess.run(["umount", "-l", str(small)], check=False)
    assert answers["first"]["received"] == 32768
    failed = answers["failed"]
    assert (failed["type"], failed["operation"], failed["ok"], failed["error"]) == (
        "attachment_result", "attachment_chunk", False, "attachment unavailable")
    assert (answers["retry"]["ok"], answers["retry"]["received"]) == (True, 65536)
    assert answers["last"]["received"] == 70_000
    assert answers["commit"]["ok"] and answers["back"] == data
    # the failed chunk was answered once, by its attachment_result: no second
    # answer (an `error`) beside it, only the refusals while the journal recovered
    assert all("cannot write its journal" in e["payload"] for e in answers["unanswered"])

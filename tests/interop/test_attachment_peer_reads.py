"""Cross-hub attachment reads (wire v6), the source side: the reference's own
reader (`request_attachment`, run as a recipient hub `dst` with its client
certificate) reads an attachment stored on a source hub over mTLS, and the
same test passes with the reference hub and hubd as the source, started with
the same flags and files (docs/reference-observed.md §14; docs/attachments.md).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import sqlite3
import time
from pathlib import Path

import pytest

from tests.support import ref_forks
from tests.support.federation import make_pki, write_serving_policy
from tests.support.signed_site import (ATTACH_ACL, TOKEN, SignedProbe, owner_only,
                                       start_signed_hub, upload)

pytestmark = pytest.mark.interop

READER = Path(__file__).resolve().parents[1] / "support" / "ref_attachment_reader.py"
ROLES = {"p/alice": ["p/attachment-read", "p/attachment-write", "p/attachment-admin"]}


def _policy(folder: Path, pki) -> Path:
    """The serving policy: dst and other may be served namespace p; only
    dst's record grants read on scope p."""
    policy = write_serving_policy(folder, pki, {"dst": ["p"], "other": ["p"]})
    store = folder / "federation.json"
    doc = json.loads(store.read_text())
    for record in doc["records"]:
        if record["domain_id"] == "dst.test":
            record["scope_grants"] = [{"verb": "read", "namespace": "p"}]
    owner_only(store, json.dumps(doc))
    return policy


@pytest.fixture(params=["reference", "hubd"])
def source(request, tmp_path: Path, reference_venv_status):
    if reference_venv_status[0] is None:
        from tests.support.prereq import missing
        missing(reference_venv_status[1])
    pki = make_pki(tmp_path / "pki", ["iop-east", "dst", "other"], sans=["127.0.0.1"])
    policy = _policy(tmp_path / "policy", pki)
    recipients = owner_only(tmp_path / "recipients.json",
                            json.dumps({"version": 1, "grants": []}))
    flags = ("--tls-certfile", pki.file("iop-east", "server", "cert"),
             "--tls-keyfile", pki.file("iop-east", "server", "key"),
             "--multihub-serving-policy", str(policy),
             "--attachment-recipient-policy", str(recipients))
    site = start_signed_hub(request.param, tmp_path, ROLES, ATTACH_ACL, attachments=True,
                            extra=flags, scheme="wss")
    site.pki, site.recipients, site.kind = pki, recipients, request.param
    yield site
    site.proc.stop()


def _read(site, reader: str, digest: str, actions: list) -> list[dict]:
    args = {"uri": site.proc.url.rstrip("/"), "local_id": reader, "source_hub_id": "iop-east",
            "scope": "p", "digest": digest, "token": TOKEN,
            "certfile": site.pki.file(reader, "client", "cert"),
            "keyfile": site.pki.file(reader, "client", "key"),
            "cafile": str(site.pki.folder / "ca.pem"), "actions": actions}
    code, out, err = ref_forks.run(site.ref.python, [READER, json.dumps(args)], site.ref.env,
                                   Path.cwd(), timeout=120)
    assert code == 0, err
    return [json.loads(line) for line in out.splitlines()]


def _grant(site, digest: str, expires_at: float, recipient: str = "dst") -> None:
    owner_only(site.recipients, json.dumps({"version": 1, "grants": [
        {"recipient_hub": recipient, "scope": "p", "digest": digest,
         "expires_at": expires_at}]}))


def test_a_granted_recipient_reads_byte_identical_and_nothing_else(source):
    data = os.urandom(50_000)

    async def store():
        alice = await SignedProbe.open(source.proc.url, source.seats["p/alice"])
        committed = await upload(alice, data)
        other = await upload(alice, os.urandom(100))
        await alice.close()
        return committed["metadata"]["digest"], other["metadata"]["digest"]

    digest, other_digest = asyncio.run(store())
    before = _read(source, "dst", digest, [["info"]])
    assert before == [{"ok": False, "error": "attachment unavailable",
                       "kind": "AttachmentError"}]
    _grant(source, digest, time.time() + 600)
    info, first, second, past = _read(source, "dst", digest,
                                      [["info"], ["read", 0], ["read", 32768], ["read", 50_001]])
    assert info["result"]["length"] == len(data)  # the reader returns the metadata
    assert first["result"]["eof"] is False and second["result"]["eof"] is True
    body = base64.b64decode(first["result"]["body"]) + base64.b64decode(second["result"]["body"])
    assert body == data
    assert past["error"] == "attachment unavailable"
    # another digest, another hub, an expired grant: the same refusal
    assert _read(source, "dst", other_digest, [["info"]])[0]["error"] == \
        "attachment unavailable"
    assert _read(source, "other", digest, [["info"]])[0]["error"] == "attachment unavailable"
    _grant(source, digest, time.time() - 1)
    assert _read(source, "dst", digest, [["info"]])[0]["error"] == "attachment unavailable"
    source.recipients.write_text("{not json")
    assert _read(source, "dst", digest, [["info"]])[0]["error"] == "attachment unavailable"
    # the reads are audited in the ledger, and no content is in the journal
    db = sqlite3.connect(f"file:{source.root / 'attachments' / 'attachments.sqlite3'}?mode=ro",
                         uri=True)
    audit = db.execute("SELECT recipient, action, allowed FROM peer_read_audit "
                       "ORDER BY seq").fetchall()
    db.close()
    assert ("dst", "read", 1) in audit and ("other", "info", 0) in audit
    journal = Path(source.proc.argv[source.proc.argv.index("--db") + 1]).read_bytes()
    assert data[:64] not in journal and base64.b64encode(data[:48]) not in journal


def test_an_agent_reads_through_its_own_hub_from_the_source(source, tmp_path):
    """hubd `dst` (the recipient) with a pinned message-peer link to the source
    (the reference or hubd): its agent asks its own hub, which asks the source."""
    from tests.support.federation import site_flags

    pki = source.pki
    reader_flags = (*site_flags(pki, "dst", None).connect, "--message-peer",
                    f"iop-east={source.proc.url.rstrip('/')}", "--message-peer-pin",
                    f"iop-east={pki.server_pin('iop-east')}", "--message-peer-token", TOKEN)
    reader = start_signed_hub("hubd", tmp_path, {"p/reader": ["p/attachment-read"],
                                                 "p/nobody": []},
                              ATTACH_ACL, extra=reader_flags, hub_id="dst", folder="dst",
                              reference_files=False)
    data = os.urandom(40_000)
    try:
        async def run():
            alice = await SignedProbe.open(source.proc.url, source.seats["p/alice"])
            digest = (await upload(alice, data))["metadata"]["digest"]
            other = (await upload(alice, os.urandom(10)))["metadata"]["digest"]
            await alice.close()
            agent = await SignedProbe.open(reader.proc.url, reader.seats["p/reader"])

            async def ask(action, digest_, offset=None):
                fields = {"source_hub": "iop-east", "action": action, "scope": "p",
                          "digest": digest_}
                if offset is not None:
                    fields["offset"] = offset
                return await agent.ask("attachment_peer_request", **fields)

            seen = {"ungranted": await ask("info", digest)}
            _grant(source, digest, time.time() + 600)
            seen["info"] = await ask("info", digest)
            body, offset = b"", 0
            while True:
                got = await ask("read", digest, offset)
                assert got.get("ok") is True, got
                chunk = base64.b64decode(got["body"])
                body, offset = body + chunk, offset + len(chunk)
                if got["eof"]:
                    break
            seen["other digest"] = await ask("info", other)
            await agent.close()
            nobody = await SignedProbe.open(reader.proc.url, reader.seats["p/nobody"])
            seen["no role"] = await nobody.ask("attachment_peer_request", source_hub="iop-east",
                                               action="info", scope="p", digest=digest)
            await nobody.close()
            return seen, body

        seen, body = asyncio.run(run())
        assert body == data
        assert seen["info"]["metadata"]["length"] == len(data)
        assert seen["info"]["source_hub"] == "iop-east"
        assert seen["ungranted"]["error"] == seen["other digest"]["error"] == \
            "attachment unavailable"
        assert seen["no role"]["error"] == "attachment access denied"
        reader_journal = Path(reader.proc.argv[reader.proc.argv.index("--db") + 1])
        for blob in (reader_journal.read_bytes(), reader.proc.log().encode(),
                     source.proc.log().encode()):
            assert data[:64] not in blob and base64.b64encode(data[:48]) not in blob
    finally:
        reader.proc.stop()

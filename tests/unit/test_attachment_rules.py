"""The attachment checks as pure decisions (hubd/state/attachment_rules.py)
and the store's crash cleanup on real files (hubd/journal/attachment_store.py)."""

from __future__ import annotations

import base64
import binascii
import os

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from hubd.journal.attachment_store import AttachmentStore, StoreError
from hubd.state import attachment_rules as r
from hubd.state.acl import Rule

NOW = 1_800_000_000.0
RULES = (Rule("attachment-write", "attachment", "p"), Rule("attachment-read", "attachment", "p"))
ROLES = {"p/attachment-write": ("p/alice",), "p/attachment-read": ("p/*",)}


@pytest.mark.parametrize("type_, frame, sender, version, says", [
    ("attachment_info", {"scope": "p"}, "p/alice", 3, r.VERSION_FOUR),
    ("attachment_info", {"scope": "p"}, "p/alice", None, r.VERSION_FOUR),
    ("attachment_info", {"scope": "q"}, "p/alice", 7, r.DENIED),
    ("attachment_info", {}, "p/alice", 7, r.DENIED),
    ("attachment_begin", {"scope": "p"}, "p/bob", 7, r.DENIED),     # no write role
    ("attachment_gc", {"scope": "p"}, "p/alice", 7, r.DENIED),      # no admin rule or role
    ("attachment_info", {"scope": "p"}, "p/bob", 4, None),
    ("attachment_chunk", {"scope": "p"}, "p/alice", 7, None),
])
def test_access_is_version_then_scope_then_role_and_rule(type_, frame, sender, version, says):
    assert r.access_error(type_, frame, sender, version, ROLES, RULES) == says


def _begin(**over):
    return {"scope": "p", "digest": "a" * 64, "length": 10, "media_type": "text/plain",
            "provenance": "ci:run#1", "expires_at": NOW + 60, **over}


@pytest.mark.parametrize("over, says", [
    ({"length": r.MAX_LENGTH + 1}, r.BAD_LENGTH), ({"length": True}, r.BAD_LENGTH),
    ({"length": -1}, r.BAD_LENGTH), ({"digest": "A" * 64}, r.BAD_DIGEST),
    ({"media_type": "text"}, r.BAD_MEDIA), ({"provenance": ""}, r.BAD_PROVENANCE),
    ({"expires_at": NOW}, r.BAD_EXPIRY), ({"expires_at": "soon"}, r.BAD_EXPIRY),
    ({"digest": None}, r.UNAVAILABLE),
])
def test_a_bad_begin_names_its_field(over, says):
    assert r.read_begin(_begin(**over), NOW) == says


def test_a_chunk_must_continue_the_upload_within_its_length():
    body = base64.b64encode(b"x" * 8).decode()
    assert r.read_chunk({"offset": 0, "body": body}, 0, 10) == b"x" * 8
    assert r.read_chunk({"offset": 1, "body": body}, 0, 10) == r.BAD_OFFSET
    assert r.read_chunk({"offset": 4, "body": body}, 4, 10) == r.BAD_CHUNK_LENGTH  # past length
    assert r.read_chunk({"offset": 0, "body": ""}, 0, 10) == r.BAD_CHUNK_LENGTH
    assert r.read_chunk({"offset": 0, "body": "***"}, 0, 10) == r.BAD_CHUNK
    big = base64.b64encode(b"x" * (r.CHUNK_BYTES + 1)).decode()
    assert r.read_chunk({"offset": 0, "body": big}, 0, r.MAX_LENGTH) == r.BAD_CHUNK_LENGTH


def test_a_chunk_counts_only_once_stored_and_next_in_line():
    # stored in order: counted, the next offset stays where the sender is
    assert r.chunk_finished(0, 64, 0, 32, True) == (32, 64, True)
    # its write or its frame's commit failed: the upload expects that offset again
    assert r.chunk_finished(0, 64, 0, 32, False) == (0, 0, False)
    # a chunk sent on after the failed one, stored: not counted (a gap before it)
    assert r.chunk_finished(0, 0, 32, 32, True) == (0, 0, False)
    # ... nor when the retry of the failed one was accepted meanwhile
    assert r.chunk_finished(0, 32, 32, 32, True) == (0, 32, False)
    # an earlier chunk stored after a later one failed: counted, and the
    # upload expects the failed one's offset
    assert r.chunk_finished(0, 32, 0, 32, True) == (32, 32, True)
    # a later failure never moves `expected` below what is counted
    assert r.chunk_finished(32, 96, 0, 32, False) == (32, 32, False)


def test_uploads_and_space_are_bounded():
    assert r.upload_refusal(r.MAX_UPLOADS_PER_SENDER - 1, 0) is None
    assert r.upload_refusal(r.MAX_UPLOADS_PER_SENDER, 0) == r.TOO_MANY
    assert r.upload_refusal(0, r.MAX_UPLOADS_PER_HUB) == r.TOO_MANY
    assert r.space_refusal(10, r.SCOPE_QUOTA_BYTES - 10, 0, 10 ** 12) is None
    assert r.space_refusal(11, r.SCOPE_QUOTA_BYTES - 10, 0, 10 ** 12) == r.SCOPE_QUOTA
    assert r.space_refusal(60, 0, 50, 100) == r.ROOT_FULL
    assert r.space_refusal(50, 0, 50, 100) is None


def test_the_store_refuses_a_shared_root_and_cleans_what_no_commit_finished(tmp_path):
    root = tmp_path / "root"
    root.mkdir(mode=0o755)
    with pytest.raises(StoreError, match="must be owner-only"):
        AttachmentStore(root).open()
    root.chmod(0o700)
    store = AttachmentStore(root)
    assert store.open() == {}
    store.stage("u1")
    store.write("u1", 0, b"hello")
    meta = r.read_begin(_begin(length=5), NOW)
    kept = store.commit("u1", meta)
    store.stage("u2")                                    # an upload in flight at the crash
    (root / "objects" / ("f" * 64)).write_bytes(b"x")    # renamed, but its row never written
    store.close()
    found = AttachmentStore(root).open()
    assert list(found) == [("p", "a" * 64)] and found[("p", "a" * 64)].filename == kept
    assert os.listdir(root / "staging") == []
    assert os.listdir(root / "objects") == [kept]
    assert (root / "objects" / kept).read_bytes() == b"hello"
    assert oct((root / "attachments.sqlite3").stat().st_mode & 0o777) == "0o600"


# -- a chunk's base64: the standard library's verdict, whichever decoder runs

def _stdlib(text):
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return None


@settings(max_examples=3000, deadline=None)
@given(st.text(alphabet="ABCXYZabcxyz0189+/=\n -_\u00e9\x00", max_size=40)
       | st.binary(max_size=40).map(lambda b: base64.b64encode(b).decode()))
@example("0000=")  # pybase64 refuses padding after a full quantum; the standard library does not
@example("AA==AA==")
@example("=AAA")
def test_strict_b64decode_agrees_with_the_standard_library(text):
    assert r.strict_b64decode(text) == _stdlib(text)

"""Scoped attachments (wire v4): the eight verbs, each answered by a private
`attachment_result` (docs/attachments.md; docs/reference-observed.md §13).

Inside the Router: the checks (hubd/state/attachment_rules.py) and the live
bookkeeping (`AttachmentsLive`: open uploads, committed objects, bytes held).
Outside it: every read and write of the root (hubd/journal/attachment_store.py)
runs on one worker thread, in the order the Router asked, and comes back as
an `AttachmentDone` command that applies its effect and sends its answer.
Every answer, refusals included, takes that way, so a connection hears its
answers in the order of its requests.
"""

from __future__ import annotations

import asyncio
import hashlib
import html
import secrets
import sqlite3
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import pybase64
import structlog

from hubd.actors.router import Router
from hubd.core.plugin import Plugin, Verbs
from hubd.journal.attachment_store import AttachmentStore, Stored
from hubd.state import attachment_rules as rules
from hubd.state.acl import ATTACHMENT_VERBS
from hubd.state.attachment_rules import Metadata
from hubd.state.presence import Session

log = structlog.get_logger("hubd.attachments")

RESULT = "attachment_result"
# store operations queued at once, over the whole hub
MAX_PENDING = 1024
BUSY = "attachment store busy"
PREVIEW_BYTES = 512

verbs = Verbs()


class Upload:
    """An open upload: `received` bytes are staged and their frames committed
    (and hashed, in order); `expected` is the offset the next chunk must
    carry (beyond `received` by the chunks still on their way)."""

    __slots__ = ("id", "endpoint", "sender", "meta", "received", "expected", "hasher")

    def __init__(self, id_: str, endpoint: int, sender: str, meta: Metadata):
        self.id, self.endpoint, self.sender, self.meta = id_, endpoint, sender, meta
        self.received = self.expected = 0
        self.hasher = hashlib.sha256()


class AttachmentDone(NamedTuple):
    """A store operation finished (or failed: `error`); run in the Router,
    which sends `type_` to `target` on `endpoint` with `fields`."""

    endpoint: int
    target: str
    type_: str
    fields: dict
    effect: tuple | None
    error: str | None


class AttachmentsLive:
    """The Router's live home for attachments (not journaled: the ledger is
    the record, read back at start)."""

    def __init__(self, router: Router):
        self.router = router
        self.store: AttachmentStore | None = None
        self.worker: ThreadPoolExecutor | None = None
        self.objects: dict[tuple[str, str], Stored] = {}
        self.uploads: dict[str, Upload] = {}
        self.root_limit = 0
        self.pending = 0
        self._root_bytes = 0
        self._scope_bytes: dict[str, int] = {}

    def open(self, store: AttachmentStore, objects: dict, root_limit: int) -> None:
        self.store, self.objects, self.root_limit = store, objects, root_limit
        for (scope, _), stored in objects.items():
            self.reserve(scope, stored.meta.length)
        self.worker = ThreadPoolExecutor(1, thread_name_prefix="attachments")

    def held(self, scope: str | None = None) -> int:
        """Bytes committed and reserved by open uploads (in one scope, or all):
        counted as they change, never summed over the objects."""
        return self._root_bytes if scope is None else self._scope_bytes.get(scope, 0)

    def reserve(self, scope: str, length: int) -> None:
        self._root_bytes += length
        self._scope_bytes[scope] = self._scope_bytes.get(scope, 0) + length

    def release(self, scope: str, length: int) -> None:
        self._root_bytes -= length
        left = self._scope_bytes.get(scope, 0) - length
        if left > 0:
            self._scope_bytes[scope] = left
        else:
            self._scope_bytes.pop(scope, None)

    def drop_upload(self, upload_id: str) -> None:
        """An upload ends without an object (aborted, refused at commit, its
        connection gone, its begin failed): its bytes and reservation go."""
        upload = self.uploads.pop(upload_id, None)
        if upload is not None:
            self.release(upload.meta.scope, upload.meta.length)
            self.background(self.store.discard, upload_id)

    def submit(self, session: Session, operation: str, fn, *args, answer: dict | None = None,
               effect=None) -> None:
        """A v4 verb's store work: fn(*args) on the worker (None: nothing to
        do but answer), then its attachment_result with `answer`."""
        self.run(session.endpoint, session.name, RESULT, {"operation": operation},
                 fn, *args, answer=answer, effect=effect)

    def run(self, endpoint: int, target: str, type_: str, base: dict, fn, *args,
            answer: dict | None = None, effect=None) -> None:
        """fn(*args) on the worker, then AttachmentDone: the answer `type_`
        with `base` and `answer` (an OSError: `attachment unavailable`), and
        `effect` (fn's result appended) applied first.

        A request whose command journals something (a signed frame's nonce)
        touches the store only once that commit succeeded; if it fails, the
        request fails as a whole (`attachment unavailable`, its effect undone)
        and its answer still keeps its place in the worker's order."""
        router = self.router
        if self.pending >= MAX_PENDING:
            router.metrics.count_signed_refusal("attachments", "busy")
            router.send(endpoint, router.frame(type_, target, "", **base, ok=False, error=BUSY))
            return
        self.pending += 1
        fields = {**base, **(answer or {})}

        def queue(work, failed: str | None) -> None:
            future = asyncio.get_running_loop().run_in_executor(self.worker, work)
            future.add_done_callback(lambda done: finished(done, failed))

        def finished(future: asyncio.Future, error: str | None) -> None:
            try:
                result = future.result()
            except (OSError, sqlite3.Error) as exc:  # a full disk, an I/O error
                log.error("attachment store operation failed", type=type_, error=repr(exc))
                result, error = None, rules.UNAVAILABLE
            done = effect + (result,) if effect is not None else None
            router.post_control(AttachmentDone(endpoint, target, type_, fields, done, error))

        def work():
            return fn(*args) if fn is not None else None

        if not router.has_events():
            queue(work, None)
            return
        router.after_release(lambda: queue(work, None))
        router.if_not_committed(lambda: queue(_nothing, rules.UNAVAILABLE))

    def background(self, fn, *args) -> None:
        """Store work nobody waits for (a discard, a gc's delete), in order
        with the rest; a failure is logged (the next start cleans up)."""
        def failed(future) -> None:
            if future.exception() is not None:
                log.error("attachment store cleanup failed", operation=fn.__name__,
                          error=repr(future.exception()))

        self.worker.submit(fn, *args).add_done_callback(failed)

    def close(self) -> None:
        if self.worker is not None:
            self.worker.shutdown(wait=True)
        if self.store is not None:
            self.store.close()


def _nothing() -> None:
    return None


def _refuse(live: AttachmentsLive, session: Session, operation: str, error: str) -> None:
    live.submit(session, operation, None, answer={"ok": False, "error": error})


def done(router: Router, command: AttachmentDone) -> None:
    live = router.live_of(AttachmentsLive)
    live.pending -= 1
    effect, error = command.effect, command.error
    fields = command.fields
    if effect is not None and effect[0] == "chunk":
        error = _chunk_done(live, effect, error)
        if error is None:
            fields = dict(fields, received=live.uploads[effect[1]].received)
    elif effect is not None:
        _apply(live, effect, error is None)
    if error is not None:
        fields = {k: v for k, v in fields.items() if k == "operation"}
        fields.update(ok=False, error=error)
    elif effect is not None and effect[0] == "read":
        fields = _read_answer(fields, effect[-1])
    elif effect is not None and effect[0] == "peer":
        fields = effect[-1]  # the peer read's own answer (federation/handlers/attachment_reads.py)
    router.send(command.endpoint, router.frame(command.type_, command.target, "", **fields))


def _apply(live: AttachmentsLive, effect: tuple, ok: bool) -> None:
    kind = effect[0]
    if kind == "committed":
        _, key, meta, upload_id, filename = effect
        if ok:
            live.objects[key] = Stored(meta, filename, set())
        else:  # the reservation the upload held goes with it
            live.release(meta.scope, meta.length)
            live.background(live.store.discard, upload_id)
    elif kind == "ref" and ok:
        _, key, ref, present, _ = effect
        stored = live.objects.get(key)
        if stored is not None:
            (stored.refs.add if present else stored.refs.discard)(ref)
    elif kind == "upload_failed" and not ok:
        live.drop_upload(effect[1])
    elif kind == "aborted" and ok:
        live.drop_upload(effect[1])
    elif kind == "collected" and ok:
        for key in effect[1]:
            stored = live.objects.pop(key, None)
            if stored is not None:
                live.release(key[0], stored.meta.length)


def _chunk_done(live: AttachmentsLive, effect: tuple, error: str | None) -> str | None:
    """A chunk's write (and its frame's commit) finished: counted if it was
    next in line (rules.chunk_finished); the refusal its sender hears if not."""
    _, upload_id, offset, data, _ = effect
    upload = live.uploads.get(upload_id)
    if upload is None:  # aborted, committed or its connection gone meanwhile
        return error or rules.UNKNOWN_UPLOAD
    upload.received, upload.expected, counted = rules.chunk_finished(
        upload.received, upload.expected, offset, len(data), error is None)
    if counted:
        upload.hasher.update(data)
        return None
    return error or rules.BAD_OFFSET


def _read_answer(fields: dict, data: bytes) -> dict:
    answer = dict(fields, body=pybase64.b64encode_as_string(data),
                  eof=fields["offset"] + len(data) >= fields.pop("_length"))
    if answer.pop("_preview", False):
        answer["preview_html"] = html.escape(data[:PREVIEW_BYTES].decode("utf-8", "replace"))
    return answer


@verbs.handles(*ATTACHMENT_VERBS)
def attachment(router: Router, session: Session, frame: dict, size: int) -> None:
    live = router.live_of(AttachmentsLive)
    type_ = frame["type"]
    if live.store is None:
        router.send(session.endpoint, router.frame(RESULT, session.name, "", operation=type_,
                                                   ok=False, error=rules.DISABLED))
        return
    signed = router.hub.identity.signed
    refused = rules.access_error(type_, frame, session.name, session.protocol_version,
                                 signed.role_grants, signed.acl)
    if refused is not None:
        _refuse(live, session, type_, refused)
        return
    OPERATIONS[type_](router, live, session, frame, type_)


def _upload(live: AttachmentsLive, session: Session, frame: dict) -> Upload | None:
    upload = live.uploads.get(rules.upload_id_of(frame) or "")
    if upload is None or upload.endpoint != session.endpoint \
            or upload.meta.scope != frame["scope"]:
        return None
    return upload


def _begin(router, live, session, frame, op):
    meta = rules.read_begin(frame, router.now)
    if isinstance(meta, str):
        return _refuse(live, session, op, meta)
    if (meta.scope, meta.digest) in live.objects:
        return _refuse(live, session, op, rules.EXISTS)
    mine = sum(1 for u in live.uploads.values() if u.sender == session.name)
    refused = rules.upload_refusal(mine, len(live.uploads)) or rules.space_refusal(
        meta.length, live.held(meta.scope), live.held(), live.root_limit)
    if refused is not None:
        if refused == rules.ROOT_FULL:
            log.warning("attachment root full; upload refused", held=live.held(),
                        limit=live.root_limit, length=meta.length)
        return _refuse(live, session, op, refused)
    upload = Upload(secrets.token_hex(24), session.endpoint, session.name, meta)
    live.uploads[upload.id] = upload
    live.reserve(meta.scope, meta.length)
    live.submit(session, op, live.store.stage, upload.id,
                answer={"ok": True, "upload_id": upload.id},
                effect=("upload_failed", upload.id))


def _chunk(router, live, session, frame, op):
    upload = _upload(live, session, frame)
    if upload is None:
        return _refuse(live, session, op, rules.UNKNOWN_UPLOAD)
    data = rules.read_chunk(frame, upload.expected, upload.meta.length)
    if isinstance(data, str):
        return _refuse(live, session, op, data)
    offset = upload.expected
    upload.expected += len(data)
    # counted (received, hashed) only once written and its frame committed:
    # after a failure the client's retry at the same offset is accepted
    live.submit(session, op, live.store.write, upload.id, offset, data,
                answer={"ok": True}, effect=("chunk", upload.id, offset, data))


def _commit(router, live, session, frame, op):
    upload = _upload(live, session, frame)
    if upload is None:
        return _refuse(live, session, op, rules.UNKNOWN_UPLOAD)
    meta = upload.meta
    if upload.received != meta.length:
        return _refuse(live, session, op, rules.INCOMPLETE)
    if upload.hasher.hexdigest() != meta.digest:
        live.drop_upload(upload.id)
        return _refuse(live, session, op, rules.MISMATCH)
    if (meta.scope, meta.digest) in live.objects:
        live.drop_upload(upload.id)
        return _refuse(live, session, op, rules.EXISTS)
    del live.uploads[upload.id]
    # its reservation stays for the object; a failed commit releases it (the
    # upload is gone either way, as the reference's)
    live.submit(session, op, live.store.commit, upload.id, meta,
                answer={"ok": True, "metadata": meta.as_wire()},
                effect=("committed", (meta.scope, meta.digest), meta, upload.id))


def _abort(router, live, session, frame, op):
    upload = _upload(live, session, frame)
    if upload is None:
        return _refuse(live, session, op, rules.UNKNOWN_UPLOAD)
    live.submit(session, op, None, answer={"ok": True}, effect=("aborted", upload.id))


def _ok(live, session, op, **fields):
    live.submit(session, op, None, answer={"ok": True, **fields})


def _stored(live, frame) -> Stored | None:
    return live.objects.get((frame["scope"], rules.digest_of(frame) or ""))


def _info(router, live, session, frame, op):
    stored = _stored(live, frame)
    if stored is None:
        return _refuse(live, session, op, rules.UNAVAILABLE)
    _ok(live, session, op, metadata=stored.meta.as_wire())


def _read(router, live, session, frame, op):
    stored = _stored(live, frame)
    if stored is None:
        return _refuse(live, session, op, rules.UNAVAILABLE)
    meta = stored.meta
    if meta.expires_at <= router.now:
        return _refuse(live, session, op, rules.EXPIRED)
    offset = rules.read_offset(frame, meta.length)
    if isinstance(offset, str):
        return _refuse(live, session, op, offset)
    size = min(rules.CHUNK_BYTES, meta.length - offset)
    preview = frame.get("preview") is True and offset == 0 and meta.media_type == "text/plain"
    live.submit(session, op, live.store.read, stored.filename, offset, size,
                answer={"ok": True, "offset": offset, "digest": meta.digest,
                        "_length": meta.length, "_preview": preview},
                effect=("read",))


def _ref(router, live, session, frame, op):
    stored = _stored(live, frame)
    if stored is None:
        return _refuse(live, session, op, rules.UNAVAILABLE)
    if stored.meta.expires_at <= router.now:
        return _refuse(live, session, op, rules.EXPIRED)
    ref = rules.ref_of(frame)
    if ref is None:
        return _refuse(live, session, op, rules.BAD_REF)
    present = frame.get("remove") is not True
    key = (stored.meta.scope, stored.meta.digest)
    live.submit(session, op, live.store.set_ref, key[0], key[1], ref, present,
                answer={"ok": True}, effect=("ref", key, ref, present))


def _gc(router, live, session, frame, op):
    scope = frame["scope"]
    expired = sorted(key for key, stored in live.objects.items()
                     if key[0] == scope and stored.meta.expires_at <= router.now
                     and not stored.refs)
    digests = [digest for _, digest in expired]
    if frame.get("dry_run") is not False:
        return _ok(live, session, op, digests=digests)
    doomed = [(key[0], key[1], live.objects[key].filename) for key in expired]
    live.submit(session, op, _delete_all, live.store, doomed,
                answer={"ok": True, "digests": digests}, effect=("collected", expired))


def _delete_all(store: AttachmentStore, doomed: list[tuple[str, str, str]]) -> None:
    for scope, digest, filename in doomed:
        store.delete(scope, digest, filename)


OPERATIONS = {"attachment_begin": _begin, "attachment_chunk": _chunk,
              "attachment_commit": _commit, "attachment_abort": _abort,
              "attachment_info": _info, "attachment_read": _read, "attachment_ref": _ref,
              "attachment_gc": _gc}


def on_unregister(router: Router, session: Session) -> None:
    """An upload belongs to its connection: one whose connection closed is discarded."""
    live = router.live_of(AttachmentsLive)
    for upload_id in [u.id for u in live.uploads.values() if u.endpoint == session.endpoint]:
        live.drop_upload(upload_id)


def attachments_plugin(config) -> Plugin:
    """Always installed (the verbs answer `attachments disabled` without a
    root); with --attachment-root the store opens after the replay."""
    security = config.security
    homes: list[AttachmentsLive] = []

    async def opening(hub) -> None:
        store = AttachmentStore(security.attachment_root)
        objects = await asyncio.to_thread(store.open)
        live = hub.router.live_of(AttachmentsLive)
        live.open(store, objects, security.attachment_max_bytes)
        homes.append(live)
        log.info("attachments", root=str(security.attachment_root), objects=len(objects),
                 bytes=live.held(), limit=security.attachment_max_bytes)

    async def closing() -> None:
        for live in homes:
            await asyncio.to_thread(live.close)

    return Plugin("attachments", verbs=verbs, live=(AttachmentsLive,),
                  commands={AttachmentDone: done}, on_unregister=(on_unregister,),
                  **({"opening": opening, "closing": closing}
                     if security.attachment_root is not None else {}))

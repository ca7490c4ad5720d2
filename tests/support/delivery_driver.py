"""Raw v3 delivery clients for tests: register a delivery session, send
delivery verbs, wait for their private answers; and read the journal's
delivery rows. Built on WsProbe (aiohttp only), so it runs against any hub."""

from __future__ import annotations

import hashlib
import json
import secrets
import sqlite3
import time
from pathlib import Path

from tests.support.wsprobe import WsProbe

CAPS = {"next_turn": "native", "follow_up": "emulated"}


def incarnation(hub_id: str, name: str, token: str) -> str:
    return hashlib.sha256(f"{hub_id}\x00{name}\x00{token}".encode()).hexdigest()


def operation_key(hub_id: str, sender: str, request_id: str) -> str:
    return hashlib.sha256(json.dumps([hub_id, sender, request_id],
                                     separators=(",", ":")).encode()).hexdigest()


def is_answer(frame: dict) -> bool:
    """A private answer to a delivery verb (not a notification, not an offer)."""
    return frame.get("type") == "delivery_refused" or (
        frame.get("type") == "delivery_status" and "audience" not in frame)


class Agent:
    def __init__(self, probe: WsProbe, name: str, token: str | None, inc: str | None):
        self.probe, self.name, self.token, self.incarnation = probe, name, token, inc

    @classmethod
    async def join(cls, url: str, name: str, *, version: int | None = 3,
                   token: str | None = None, caps: dict | None = None,
                   recipient: bool = False, auth: str | None = None,
                   signed_by: tuple | None = None) -> "Agent":
        """`token` is the delivery session token; `auth` the hub token the
        registering frame carries (a principal's, or the shared one)."""
        probe = await WsProbe.open(url)
        if auth is None:  # a secured hub says nothing before the first frame
            await probe.recv_type("welcome")
        extra: dict = {}
        if version is not None:
            extra["protocol_version"] = version
        if auth is not None:
            extra["token"] = auth
        if recipient or token is not None:
            token = token or secrets.token_hex(32)
            extra["delivery_session_token"] = token
            extra["delivery_capabilities"] = CAPS if caps is None else caps
        if signed_by is None:
            await probe.register(name, **extra)
        else:  # (PEM path, key id): a name pinned to that key (docs/identity.md)
            from tests.support.signed_site import sign_registration

            await probe.send_json(sign_registration(
                {"sender": name, "target": "System", "type": "heartbeat", "payload": "online",
                 "timestamp": time.time(), **extra}, *signed_by))
        inc = None
        if token is not None:
            inc = (await probe.recv_type("delivery_session"))["incarnation"]
        else:
            await probe.recv_type("presence_update", agent=name)
        return cls(probe, name, token, inc)

    async def send(self, type_: str, target: str = "System", **fields) -> None:
        frame = {"sender": self.name, "target": target, "type": type_, "payload": "",
                 "timestamp": time.time(), "protocol_version": 3}
        frame.update(fields)
        await self.probe.send_json({k: v for k, v in frame.items() if v is not ...})

    async def answer(self, timeout: float = 5.0) -> dict:
        return await self.probe.recv(is_answer, timeout)

    async def request(self, target: str, inc: str, rid: str, **fields) -> dict:
        body = dict(request_id=rid, idempotency_key=f"idem-{rid}", target_incarnation=inc,
                    mode="next_turn", allowed_fallbacks=[], task_id=f"task-{rid}",
                    body=f"please do {rid}", deadline=time.time() + 600)
        body.update(fields)
        await self.send("delivery_request", target, **body)
        return await self.answer()

    async def status(self, op_key: str) -> dict:
        await self.send("delivery_status_request", operation_key=op_key)
        return await self.answer()

    async def cancel(self, op_key: str, mutation_id: str) -> dict:
        await self.send("delivery_cancel", operation_key=op_key, mutation_id=mutation_id)
        return await self.answer()

    async def report(self, offer: dict, stage: str, mutation_id: str | None = None,
                     **evidence) -> dict:
        verb = {"boundary_delivered": "delivery_boundary",
                "acknowledged": "delivery_ack"}.get(stage, "delivery_outcome")
        if not evidence:
            evidence = {"boundary_delivered": {"boundary": "turn-1"},
                        "acknowledged": {"receipt_id": "rcpt-1"}}.get(
                stage, {"executor_ref": "exec-1", "outcome_code": "ok"})
        await self.send(verb, operation_key=offer["operation_key"],
                        request_id=offer["request_id"], task_id=offer["task_id"],
                        mutation_id=mutation_id or f"{stage}-{offer['request_id']}",
                        stage=stage, evidence=evidence)
        return await self.answer()

    async def offer(self, request_id: str, timeout: float = 5.0) -> dict:
        return await self.probe.recv_type("delivery_offer", timeout, request_id=request_id)

    async def notification(self, request_id: str, stage: str, timeout: float = 5.0) -> dict:
        def pred(f):
            return (f.get("type") == "delivery_status" and "audience" in f
                    and f.get("request_id") == request_id and f.get("stage") == stage)
        return await self.probe.recv(pred, timeout)

    async def close(self) -> None:
        await self.probe.close()


def delivery_rows(db: Path) -> list[tuple[int, str, dict]]:
    """Every delivery event in the journal: (seq, kind, payload)."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        rows = con.execute("SELECT seq, kind, payload FROM events WHERE kind LIKE 'delivery_%'"
                           " ORDER BY seq").fetchall()
    finally:
        con.close()
    return [(seq, kind, json.loads(payload)) for seq, kind, payload in rows]


def chat_rows(db: Path) -> int:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return con.execute("SELECT COUNT(*) FROM events WHERE kind = 'chat'").fetchone()[0]
    finally:
        con.close()

"""Drive one reference-client agent as a separate program (JSON lines in, JSON lines out).

This script is executed by the REFERENCE virtual environment's python, never
imported by the tests or by hubd: the reference package (synapse-channel, AGPL)
is only ever used as a black box in its own process. The test process talks to
it over stdin/stdout:

stdout (one JSON object per line)
    {"event": "started"}                              before connecting
    {"event": "ready", "hub_id": ..., "protocol_version": ...}
    {"event": "not_ready"}                            no welcome within --ready-timeout
    {"event": "frame", "frame": {...}, "cursor": N}   every frame the agent's callback
                                                       sees (the client drops its own
                                                       chat echoes); cursor is the
                                                       agent's mailbox cursor after it
    {"event": "sent", "op": ..., "result": ...}       a command was carried out
    {"event": "closed", "code": ..., "reason": ...}   the connection ended
    {"event": "error", "message": ...}                a command failed locally

stdin (one JSON object per line)
    {"op": "chat", "target": T, "payload": P, ...}    agent.chat(); extra keys: priority,
                                                       metadata, client_msg_id, channel
    {"op": "send", "type": TYPE, "target": T, "payload": P, "fields": {...}}
                                                       agent.send_message() with extra fields
    {"op": "ack", "seq": N}                           agent.ack(seq)
    {"op": "who"} / {"op": "history", "limit": N}     the client's query helpers
    {"op": "gate", "open": bool}                      let the mailbox cursor advance/auto-ack
    {"op": "attach", "type": TYPE, "fields": {...}}   agent.send_attachment(TYPE, **fields)
    {"op": "channel", "method": M, "args": [...], "kwargs": {...}}
                                                       the client's channel helper M
                                                       (agent.channel_create, ...)
    {"op": "close"}                                   close the socket and exit

Options: --uri, --name, --token, --mailbox, --since-seq N, --mailbox-for NAME,
--manual-ack (start with the mailbox gate closed: frames are shown but neither
advance the cursor nor get acked until {"op":"gate","open":true}), --ready-timeout,
--identity-key PEM --identity-key-id ID (a signed registration), --mac-kid KID
--mac-secret SECRET (per-message auth on the signed verbs).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import threading


CHANNEL_METHODS = frozenset(("channel_create", "channel_invite", "channel_join",
                             "channel_leave", "request_channels", "request_channel_history"))


def emit(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj, default=repr) + "\n")
    sys.stdout.flush()


async def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--uri", required=True)
    ap.add_argument("--name", required=True)
    ap.add_argument("--token", default=None)
    ap.add_argument("--mailbox", action="store_true")
    ap.add_argument("--since-seq", type=int, default=0)
    ap.add_argument("--mailbox-for", default="")
    ap.add_argument("--manual-ack", action="store_true")
    ap.add_argument("--ready-timeout", type=float, default=5.0)
    ap.add_argument("--identity-key", default=None)
    ap.add_argument("--identity-key-id", default="")
    ap.add_argument("--mac-kid", default=None)
    ap.add_argument("--mac-secret", default=None)
    ap.add_argument("--card-key", default=None)
    ap.add_argument("--card-key-id", default="")
    ap.add_argument("--card-project", default="")
    args = ap.parse_args()

    from synapse_channel.client.agent import SynapseAgent  # reference venv only

    gate = {"open": not args.manual_ack}
    agent_box: dict = {}

    async def on_message(data: dict) -> None:
        agent = agent_box.get("agent")
        emit({"event": "frame", "frame": data,
              "cursor": agent.mailbox_cursor if agent is not None else None})

    agent = SynapseAgent(
        args.name,
        on_message,
        uri=args.uri,
        verbose=False,
        token=args.token,
        mailbox=args.mailbox,
        mailbox_since_seq=args.since_seq,
        mailbox_for=args.mailbox_for,
        mailbox_advance=(lambda _frame: gate["open"]) if args.mailbox else None,
        identity_key_path=args.identity_key,
        identity_key_id=args.identity_key_id,
        per_message_auth_key_id=args.mac_kid,
        per_message_auth_secret=args.mac_secret,
        **({"capability_card_key_path": args.card_key,
            "capability_card_key_id": args.card_key_id,
            "capability_card_project": args.card_project} if args.card_key else {}),
    )
    agent_box["agent"] = agent
    loop = asyncio.get_running_loop()
    commands: asyncio.Queue = asyncio.Queue()

    def read_stdin() -> None:
        for line in sys.stdin:
            line = line.strip()
            if line:
                loop.call_soon_threadsafe(commands.put_nowait, line)
        loop.call_soon_threadsafe(commands.put_nowait, None)

    threading.Thread(target=read_stdin, daemon=True).start()
    emit({"event": "started", "name": args.name})
    conn = asyncio.create_task(agent.connect())
    ready = await agent.wait_until_ready(timeout=args.ready_timeout)
    if ready:
        emit({"event": "ready", "hub_id": agent.hub_id,
              "protocol_version": agent.hub_protocol_version})
    else:
        emit({"event": "not_ready"})

    async def run_commands() -> None:
        while True:
            line = await commands.get()
            if line is None:
                return
            cmd: dict = {}
            try:
                cmd = json.loads(line)
                op = cmd.get("op")
                result = None
                if op == "close":
                    return
                if op == "chat":
                    extra = {k: cmd[k] for k in ("priority", "metadata", "client_msg_id",
                                                 "channel") if k in cmd}
                    await agent.chat(cmd.get("payload", ""), target=cmd.get("target", "all"), **extra)
                elif op == "send":
                    await agent.send_message(cmd["type"], target=cmd.get("target", "all"),
                                             payload=cmd.get("payload", ""), **cmd.get("fields", {}))
                elif op == "advertise":  # the client's own (signed when built with a card key)
                    await agent.advertise(**cmd.get("kwargs", {}))
                elif op == "channel":
                    # the client's own channel helpers (channel_create, channel_invite,
                    # channel_join, channel_leave, request_channels, request_channel_history)
                    method = cmd["method"]
                    if method not in CHANNEL_METHODS:
                        raise ValueError(f"not a channel method: {method!r}")
                    await getattr(agent, method)(*cmd.get("args", []), **cmd.get("kwargs", {}))
                elif op == "attach":
                    await agent.send_attachment(cmd["type"], **cmd.get("fields", {}))
                elif op == "ack":
                    result = await agent.ack(int(cmd["seq"]), mailbox_for=cmd.get("mailbox_for", ""))
                elif op == "who":
                    await agent.request_who()
                elif op == "history":
                    await agent.request_history(limit=cmd.get("limit", 20))
                elif op == "gate":
                    gate["open"] = bool(cmd.get("open"))
                else:
                    emit({"event": "error", "message": f"unknown op {op!r}", "id": cmd.get("id")})
                    continue
                emit({"event": "sent", "op": op, "result": result, "id": cmd.get("id")})
            except Exception as exc:  # report and keep serving
                emit({"event": "error", "message": f"{type(exc).__name__}: {exc}",
                      "id": cmd.get("id") if isinstance(cmd, dict) else None})

    cmd_task = asyncio.create_task(run_commands())
    done, _ = await asyncio.wait({conn, cmd_task}, return_when=asyncio.FIRST_COMPLETED)
    if cmd_task in done:
        # Asked to stop: close our socket normally and let connect() return.
        agent.running = False
        ws = agent.connection
        if ws is not None:
            try:
                await asyncio.wait_for(ws.close(), 3.0)
            except Exception:
                pass
        try:
            await asyncio.wait_for(conn, 5.0)
        except Exception:
            conn.cancel()
    else:
        cmd_task.cancel()
    emit({"event": "closed", "code": agent.last_close_code, "reason": agent.last_close_reason})
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))

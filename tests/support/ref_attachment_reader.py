"""Read an attachment from a source hub with the reference's own reader
(`synapse_channel.core.attachment_transport.request_attachment`), as a
recipient hub would (docs/reference-observed.md §14.3).

Executed by the REFERENCE virtual environment's python, never imported by
the tests or by hubd (the package is AGPL: a black box in its own process).
argv[1] is a JSON object: uri, local_id, source_hub_id, scope, digest, token,
certfile, keyfile, cafile, actions (a list of ["info"] or ["read", offset]).
stdout: one JSON line per action: {"ok": true, "result": ...} (a read's body
as base64) or {"ok": false, "error": "<the AttachmentError text>"}.
"""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
import sys


def main() -> int:
    from synapse_channel.core.attachment_transport import request_attachment  # reference venv

    args = json.loads(sys.argv[1])
    context = ssl.create_default_context(cafile=args["cafile"])
    context.load_cert_chain(args["certfile"], args["keyfile"])
    for action in args["actions"]:
        try:
            result = asyncio.run(request_attachment(
                action[0], uri=args["uri"], local_id=args["local_id"],
                source_hub_id=args["source_hub_id"], scope=args["scope"],
                digest=args["digest"], offset=action[1] if len(action) > 1 else None,
                token=args.get("token"), ssl_context=context, timeout=15.0))
            if isinstance(result.get("body"), (bytes, bytearray)):
                result = dict(result, body=base64.b64encode(result["body"]).decode())
            print(json.dumps({"ok": True, "result": result}), flush=True)
        except Exception as exc:  # the reader's AttachmentError: its text is the answer
            print(json.dumps({"ok": False, "error": str(exc),
                              "kind": type(exc).__name__}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

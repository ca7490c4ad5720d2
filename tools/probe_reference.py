"""Black-box probes of the reference hub (synapse-channel 0.99.38) for issues 23 and 24.

Run it with the reference's own interpreter, so the reference client API is importable:

    /work/main/.cache/reference-venv/bin/python tools/probe_reference.py attachments

Each probe starts one or more reference hubs on loopback ports it picks, in a fresh
temporary directory (HOME and XDG dirs point into it, so no machine key or pin leaks
between runs), drives them with raw WebSocket frames (signed where needed with the
reference client's own signing helpers) and prints every frame it sends (`>>`) and
receives (`<<`), one JSON object a line. Startup refusals print the hub's stderr.
Every hub it starts is stopped by its PID.

This file only drives the reference; it copies none of its code into hubd.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from refprobe import attachments, identity_auth, peer_read, wire  # noqa: E402
from refprobe.harness import Workdir  # noqa: E402

PROBES = {
    "attachments": attachments.probe_attachments,
    "attachment-lifecycle": attachments.probe_attachment_lifecycle,
    "attachment-disabled": attachments.probe_attachment_disabled,
    "peer-read": peer_read.probe_peer_read,
    "client-api": attachments.probe_client_api,
    "message-auth": identity_auth.probe_message_auth,
    "identity": identity_auth.probe_identity,
    "startup": attachments.probe_startup,
    "resources": wire.probe_resources,
    "guard": wire.probe_guard,
    "planning": wire.probe_planning,
    "guard-window": wire.probe_guard_window,
    "message-auth-restart": identity_auth.probe_message_auth_restart,
    "message-auth-floor": identity_auth.probe_message_auth_floor,
    "channels-private": wire.probe_channels_private,
    "operator-cli": identity_auth.probe_operator_cli,
    "identity-recovery": identity_auth.probe_identity_recovery,
    "channels": wire.probe_channels,
    "entitlement": wire.probe_entitlement,
    "cards": wire.probe_cards,
    "dead-letter": wire.probe_deadletter,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("probe", choices=[*PROBES, "all"])
    args = parser.parse_args()
    names = list(PROBES) if args.probe == "all" else [args.probe]
    for name in names:
        print(f"# probe {name}", flush=True)
        work = Workdir()
        asyncio.run(PROBES[name](work))


if __name__ == "__main__":
    sys.exit(main())

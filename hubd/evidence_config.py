"""The flags of guard-denial evidence and the shared-pool spend ledger
(docs/guard-evidence-and-spend.md): their argparse group and their config."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from hubd.state import guard_evidence as guard


@dataclass(frozen=True)
class EvidenceConfig:
    # the per-credential guard-evidence window (its length is
    # timing.guard_evidence_window)
    window_events: int = guard.WINDOW_EVENTS
    window_bytes: int = guard.WINDOW_BYTES
    # the pool owner's owner-only ledger file (None: every spend_request is
    # answered with the uniform refusal)
    spend_ledger: Path | None = None


def add_evidence_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("guard evidence and shared-pool spend")
    group.add_argument("--guard-evidence-window-events", type=int, default=guard.WINDOW_EVENTS,
                       metavar="N", help="guard_denial evidence one connect credential may "
                       f"record per window (default {guard.WINDOW_EVENTS})")
    group.add_argument("--guard-evidence-window-bytes", type=int, default=guard.WINDOW_BYTES,
                       metavar="BYTES", help="guard_denial frame bytes one connect credential "
                       f"may record per window (default {guard.WINDOW_BYTES})")
    group.add_argument("--spend-ledger", metavar="FILE",
                       help="answer authorised peers' spend_request from this owner-only "
                            "ledger file (needs --hub-id and --multihub-serving-policy)")


def evidence_config(args: argparse.Namespace, problems: list[str]) -> EvidenceConfig:
    for name in ("guard_evidence_window_events", "guard_evidence_window_bytes"):
        if getattr(args, name) <= 0:
            problems.append(f"--{name.replace('_', '-')} must be positive")
    ledger = None
    if args.spend_ledger:
        if not args.hub_id or not args.multihub_serving_policy:
            problems.append("--spend-ledger needs --hub-id and --multihub-serving-policy")
        ledger = Path(args.spend_ledger)
    return EvidenceConfig(args.guard_evidence_window_events, args.guard_evidence_window_bytes,
                          ledger)

"""The reference's shared-pool documents (F02), for tests against hubd's and
the reference's pool owners (hubd/state/spend_ledger.py): a pool
configuration as `synapse spend configure --file` takes it, and the reserve,
settle and query request documents."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

# the one refusal a peer gets, per action, whatever the cause
REFUSED = {"reserve": {"admitted": False, "reason": "not-admitted"},
           "settle": {"settled": False, "reason": "not-admitted"},
           "query": {"found": False}}


def pool_config(pool_id: str = "gpu", owner: str = "owner", grantees=(("east", "PROJ"),),
                hard_bound: str = "100", unit: str = "tokens", max_agents: int = 8,
                fixed_fee: str = "0", minimum_charge: str = "0", hours: float = 1.0) -> dict:
    now = datetime.now(timezone.utc)
    return {"pool_id": pool_id, "owner_hub_id": owner, "epoch": 1, "account_ref": "acct-1",
            "billing_surface": "api", "unit": unit,
            "window_starts_at": (now - timedelta(hours=hours)).isoformat(),
            "window_ends_at": (now + timedelta(hours=hours)).isoformat(),
            "price_revision": "r1", "hard_bound": hard_bound,
            "cost_basis": {"tax": "not_applicable", "fixed_fee": fixed_fee,
                           "minimum_charge": minimum_charge},
            "limits": {"max_depth": 4, "max_agents": max_agents, "max_wall_seconds": 600},
            "grantees": [{"hub": hub, "project": project} for hub, project in grantees],
            "cause": "tests"}


def reserve_doc(key: str, upper_bound: str, pool_id: str = "gpu", seat: str = "PROJ/alice",
                **over) -> dict:
    doc = {"pool_id": pool_id, "seat": seat, "project": "PROJ", "task": "t1",
           "operation": "op1", "key": key, "unit": "tokens", "tax": "not_applicable",
           "price_revision": "r1", "upper_bound": upper_bound, "depth": 1, "wall_seconds": 60}
    doc.update(over)
    return doc


def query_doc(key: str, pool_id: str = "gpu", seat: str = "PROJ/alice") -> dict:
    return {"pool_id": pool_id, "seat": seat, "task": "t1", "operation": "op1", "key": key}


def settle_doc(reservation_id: str, usage_ref: str, amount: str, final: bool = True,
               pool_id: str = "gpu", provenance: str = "measured") -> dict:
    return {"pool_id": pool_id, "reservation_id": reservation_id, "usage_ref": usage_ref,
            "amount": amount, "provenance": provenance, "final": final}


def ledger_file(folder: Path, *configs: dict) -> str:
    """hubd's owner-only ledger file configuring these pools."""
    path = folder / "spend-ledger.json"
    path.write_text(json.dumps({"pools": {c["pool_id"]: c for c in configs}}))
    path.chmod(0o600)
    return str(path)

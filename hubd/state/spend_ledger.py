"""Shared-pool reservations (seed 000, "Shared-pool reservations (F02)"):
the pool owner's private ledger and its pure decisions.

The ledger is an owner-only JSON file (`--spend-ledger`, mode 0600, read
through hubd/owner_only.py), never the replicated journal. The operator
configures its pools; peers only reserve, settle and query:

    {"pools": {"<pool_id>": {"limit": "1000", "unit": "tokens",
                             "grantees": ["<peer hub id>", ...]}},
     "reservations": [{"caller", "pool_id", "key", "upper_bound", "settled",
                       "actual", "reservation_id"}, ...]}

Amounts are decimal strings (no float rounding). `decide(ledger, caller,
action, document)` returns the answer and the new ledger (or the same one):
a reservation is scoped to its caller, so a peer never sees another's. Every
refusal, whatever its cause (no such pool, not a grantee, over the limit, a
malformed document, a full ledger), is the action's uniform `REFUSALS` shape,
so nothing reveals whether a pool, a grant or a reservation exists. A
reserve retried with the same key and the same bound answers the stored
reservation again; a query returns what is stored and creates nothing.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from decimal import Decimal, InvalidOperation

ACTIONS = ("reserve", "settle", "query")
REFUSALS = {
    "reserve": {"admitted": False, "reason": "not-admitted"},
    "settle": {"settled": False, "reason": "not-admitted"},
    "query": {"found": False},
}
# the ACL permission an agent needs to have its hub relay its spend_request
# to the pool owner hub `owner_hub` (target hub:<owner_hub>)
RELAY_PERMISSION = "spend-request"
RESULT = "spend_result"
RESULT_TEXT = "Spend result"
MALFORMED = "Malformed spend request"

MAX_POOLS = 256
MAX_GRANTEES = 256
MAX_RESERVATIONS = 10_000
MAX_FILE_BYTES = 4 * 1024 * 1024  # hubd/owner_only.py reads at most this
MAX_DIGITS = 30

_TOKEN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}")


class LedgerError(ValueError):
    """A ledger file that cannot be used; the text says why."""


def is_request(frame: dict) -> bool:
    """Does the frame have a spend_request's envelope (an action and a document)?"""
    return frame.get("spend_action") in ACTIONS and isinstance(frame.get("spend"), dict)


def _amount(value) -> Decimal | None:
    if not isinstance(value, str) or len(value) > MAX_DIGITS + 2:
        return None
    try:
        amount = Decimal(value)
    except InvalidOperation:
        return None
    if not amount.is_finite() or amount < 0 or len(amount.as_tuple().digits) > MAX_DIGITS:
        return None
    return amount


def _token(value) -> bool:
    return isinstance(value, str) and _TOKEN.fullmatch(value) is not None


def empty() -> dict:
    return {"pools": {}, "reservations": []}


def parse(data: bytes) -> dict:
    """The ledger in a file's bytes (LedgerError says why not)."""
    if len(data) > MAX_FILE_BYTES:
        raise LedgerError(f"the spend ledger is over {MAX_FILE_BYTES} bytes")
    if not data.strip():
        return empty()
    try:
        doc = json.loads(data)
    except ValueError as exc:
        raise LedgerError(f"the spend ledger is not JSON: {exc}") from exc
    if not isinstance(doc, dict) or set(doc) - {"pools", "reservations"}:
        raise LedgerError("the spend ledger holds only 'pools' and 'reservations'")
    pools = doc.get("pools", {})
    if not isinstance(pools, dict) or len(pools) > MAX_POOLS:
        raise LedgerError(f"'pools' must be an object of at most {MAX_POOLS} pools")
    for pool_id, pool in pools.items():
        if not _token(pool_id) or not isinstance(pool, dict):
            raise LedgerError(f"pool {pool_id!r} is malformed")
        if _amount(pool.get("limit")) is None:
            raise LedgerError(f"pool {pool_id!r}: limit must be a decimal string")
        grantees = pool.get("grantees")
        if (not isinstance(grantees, list) or len(grantees) > MAX_GRANTEES
                or not all(_token(g) for g in grantees)):
            raise LedgerError(f"pool {pool_id!r}: grantees must be a list of hub ids")
    reservations = doc.get("reservations", [])
    if not isinstance(reservations, list) or len(reservations) > MAX_RESERVATIONS:
        raise LedgerError(f"'reservations' must be a list of at most {MAX_RESERVATIONS}")
    for entry in reservations:
        if not isinstance(entry, dict) or entry.get("pool_id") not in pools:
            raise LedgerError("a reservation names no configured pool")
    return {"pools": pools, "reservations": reservations}


def dump(ledger: dict) -> bytes:
    return json.dumps(ledger, sort_keys=True, separators=(",", ":")).encode()


def _find(ledger: dict, caller: str, pool_id, key) -> dict | None:
    for entry in ledger["reservations"]:
        if entry["caller"] == caller and entry["pool_id"] == pool_id and entry["key"] == key:
            return entry
    return None


def _exposure(ledger: dict, pool_id: str) -> Decimal:
    total = Decimal(0)
    for entry in ledger["reservations"]:
        if entry["pool_id"] == pool_id:
            total += Decimal(entry["actual"] if entry["settled"] else entry["upper_bound"])
    return total


def _shown(entry: dict) -> dict:
    return {k: entry[k] for k in ("reservation_id", "pool_id", "key", "upper_bound",
                                  "settled", "actual")}


def _reserve(ledger: dict, caller: str, doc: dict) -> tuple[dict, dict]:
    pool_id, key = doc.get("pool_id"), doc.get("key")
    upper = _amount(doc.get("upper_bound"))
    pool = ledger["pools"].get(pool_id) if _token(pool_id) else None
    if (pool is None or caller not in pool["grantees"] or not _token(key)
            or upper is None or upper == 0 or set(doc) != {"pool_id", "key", "upper_bound"}):
        return REFUSALS["reserve"], ledger
    found = _find(ledger, caller, pool_id, key)
    if found is not None:  # a retry: the same reservation, or a refusal
        if Decimal(found["upper_bound"]) == upper and not found["settled"]:
            return {"admitted": True, **_shown(found)}, ledger
        return REFUSALS["reserve"], ledger
    if len(ledger["reservations"]) >= MAX_RESERVATIONS:
        return REFUSALS["reserve"], ledger
    if _exposure(ledger, pool_id) + upper > Decimal(pool["limit"]):
        return REFUSALS["reserve"], ledger
    reservation_id = hashlib.sha256(f"{caller}\x00{pool_id}\x00{key}".encode()).hexdigest()[:32]
    entry = {"caller": caller, "pool_id": pool_id, "key": key, "upper_bound": str(upper),
             "settled": False, "actual": None, "reservation_id": reservation_id}
    new = {"pools": ledger["pools"], "reservations": [*ledger["reservations"], entry]}
    return {"admitted": True, **_shown(entry)}, new


def _settle(ledger: dict, caller: str, doc: dict) -> tuple[dict, dict]:
    actual = _amount(doc.get("actual"))
    if set(doc) != {"pool_id", "key", "actual"} or actual is None:
        return REFUSALS["settle"], ledger
    found = _find(ledger, caller, doc.get("pool_id"), doc.get("key"))
    pool = ledger["pools"].get(doc.get("pool_id")) if found else None
    if found is None or pool is None or caller not in pool["grantees"]:
        return REFUSALS["settle"], ledger
    if found["settled"]:  # a retry of the same settlement answers it again
        if Decimal(found["actual"]) == actual:
            return {"settled": True, **_shown(found)}, ledger
        return REFUSALS["settle"], ledger
    if actual > Decimal(found["upper_bound"]):
        return REFUSALS["settle"], ledger
    new = copy.deepcopy(ledger)
    entry = _find(new, caller, doc["pool_id"], doc["key"])
    entry["settled"], entry["actual"] = True, str(actual)
    return {"settled": True, **_shown(entry)}, new


def _query(ledger: dict, caller: str, doc: dict) -> tuple[dict, dict]:
    if set(doc) != {"pool_id", "key"}:
        return REFUSALS["query"], ledger
    found = _find(ledger, caller, doc.get("pool_id"), doc.get("key"))
    if found is None:
        return REFUSALS["query"], ledger
    return {"found": True, "reservation": _shown(found)}, ledger


def decide(ledger: dict, caller: str, action: str, document: dict) -> tuple[dict, dict]:
    """(answer, ledger after). The ledger after is the same object when
    nothing changed (a refusal, a retry, a query)."""
    if action == "reserve":
        return _reserve(ledger, caller, document)
    if action == "settle":
        return _settle(ledger, caller, document)
    return _query(ledger, caller, document)

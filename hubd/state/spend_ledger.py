"""Shared-pool reservations (seed 000, "Shared-pool reservations (F02)"):
the pool owner's private ledger and its pure decisions, on the reference's
documents (docs/guard-evidence-and-spend.md; observed in
docs/reference-observed.md "Issue 24 item 3: the reference's spend path").

The ledger is an owner-only JSON file (`--spend-ledger`, mode 0600, read
through hubd/owner_only.py), never the replicated journal. The operator
configures its pools, each with the reference's pool configuration document
(the one `synapse spend configure --file` takes); peers only reserve, settle
and query, with the reference's request documents:

    {"pools": {"<pool_id>": {<pool configuration>}},
     "reservations": {"<reservation_id>": {...}},
     "answers": {"<scope>": {"digest": ..., "response": {...}}},
     "sequences": {"<pool_id>": <events so far>}}

Amounts are decimal strings, exact (no float, no rounding). `decide(ledger,
caller, action, document, now)` returns a Decision: the answer, the ledger
after it (the same object when nothing changed) and, for a refusal, why
(for the owner's log, never the peer): a reservation is scoped to its
caller, the peer hub its certificate proved, so a peer never sees or settles
another's. A reserve or settle is idempotent per scope: the same document
again answers the stored answer, another document for the same scope is
refused. Every refusal, whatever its cause, is the action's uniform
`REFUSALS` shape, and (unlike the reference, which also stores a refusal)
a refusal changes nothing here.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from decimal import Decimal, InvalidOperation, localcontext, Context
from typing import NamedTuple

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
MAX_ANSWERS = 2 * MAX_RESERVATIONS  # a reserve's and each settlement's stored answer
MAX_FILE_BYTES = 4 * 1024 * 1024  # hubd/owner_only.py reads at most this
MAX_DIGITS = 30
MAX_LIMIT = 1_000_000
MAX_CAUSE = 500

TAX_BASES = ("pre_tax", "post_tax", "not_applicable")
PROVENANCES = ("measured", "billed")
POOL_FIELDS = frozenset({"pool_id", "owner_hub_id", "epoch", "account_ref", "billing_surface",
                         "unit", "window_starts_at", "window_ends_at", "price_revision",
                         "hard_bound", "cost_basis", "limits", "grantees", "cause"})
POOL_OPTIONAL = frozenset({"revocation_keys"})  # read, not used: hubd has no revocations
COST_FIELDS = frozenset({"tax", "fixed_fee", "minimum_charge"})
LIMIT_FIELDS = frozenset({"max_depth", "max_agents", "max_wall_seconds"})
RESERVE_FIELDS = frozenset({"pool_id", "seat", "project", "task", "operation", "key", "unit",
                            "tax", "price_revision", "upper_bound", "depth", "wall_seconds"})
SETTLE_FIELDS = frozenset({"pool_id", "reservation_id", "usage_ref", "amount", "provenance",
                           "final"})
QUERY_FIELDS = frozenset({"pool_id", "seat", "task", "operation", "key"})

_TOKEN = re.compile(r"[A-Za-z0-9._:/@-]{1,128}")
_CURRENCY = re.compile(r"[A-Z]{3}")
_EXACT = Context(prec=2 * MAX_DIGITS + 20, traps=[InvalidOperation])


class LedgerError(ValueError):
    """A ledger file that cannot be used; the text says why."""


def is_request(frame: dict) -> bool:
    """Does the frame have a spend_request's envelope (an action and a document)?"""
    return frame.get("spend_action") in ACTIONS and isinstance(frame.get("spend"), dict)


# -- reading values (None: not a valid value)

def _token(value) -> str | None:
    return value if isinstance(value, str) and _TOKEN.fullmatch(value) else None


def _amount(value) -> Decimal | None:
    """A finite, non-negative decimal string of at most MAX_DIGITS digits."""
    if not isinstance(value, str) or len(value) > 64:
        return None
    try:
        amount = Decimal(value)
    except InvalidOperation:
        return None
    if not amount.is_finite() or amount < 0 or len(amount.as_tuple().digits) > MAX_DIGITS:
        return None
    return amount


def _count(value, low: int) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= MAX_LIMIT:
        return None
    return value


def _time(value) -> datetime | None:
    if not isinstance(value, str) or len(value) > 40:
        return None
    try:
        parsed = datetime.fromisoformat(value[:-1] + "+00:00" if value.endswith("Z") else value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else None


def _exactly(doc, fields: frozenset, optional: frozenset = frozenset()) -> bool:
    return isinstance(doc, dict) and fields <= set(doc) <= fields | optional


# -- the pool configuration (the operator's)

@dataclass(frozen=True)
class Pool:
    pool_id: str
    owner_hub_id: str
    epoch: int
    unit: str
    starts: datetime
    ends: datetime
    price_revision: str
    hard_bound: Decimal
    tax: str
    fixed_fee: Decimal
    minimum_charge: Decimal
    max_depth: int
    max_agents: int
    max_wall_seconds: int
    grantees: frozenset  # of (hub id, project)

    @property
    def window(self) -> str:
        return f"{self.starts.isoformat()}/{self.ends.isoformat()}"

    def exposure(self, upper_bound: Decimal) -> Decimal:
        """What a call with `upper_bound` holds against the pool."""
        with localcontext(_EXACT):
            return max(upper_bound, self.minimum_charge) + self.fixed_fee


def read_pool(doc) -> Pool | str:
    """A pool configuration, or why it is not one."""
    if not _exactly(doc, POOL_FIELDS, POOL_OPTIONAL):
        return "a pool configuration has exactly the reference's fields"
    cost, limits = doc["cost_basis"], doc["limits"]
    if not _exactly(cost, COST_FIELDS) or not _exactly(limits, LIMIT_FIELDS):
        return "cost_basis or limits has the wrong fields"
    grantees = doc["grantees"]
    if not isinstance(grantees, list) or not 1 <= len(grantees) <= MAX_GRANTEES or not all(
            _exactly(g, frozenset({"hub", "project"})) and _token(g["hub"])
            and _token(g["project"]) for g in grantees):
        return f"grantees must be 1 to {MAX_GRANTEES} {{hub, project}} entries"
    values = (_token(doc["pool_id"]), _token(doc["owner_hub_id"]), _count(doc["epoch"], 1),
              _token(doc["unit"]), _time(doc["window_starts_at"]), _time(doc["window_ends_at"]),
              _token(doc["price_revision"]), _amount(doc["hard_bound"]),
              cost["tax"] if cost["tax"] in TAX_BASES else None, _amount(cost["fixed_fee"]),
              _amount(cost["minimum_charge"]), _count(limits["max_depth"], 1),
              _count(limits["max_agents"], 1), _count(limits["max_wall_seconds"], 1),
              _token(doc["account_ref"]), _token(doc["billing_surface"]))
    if any(v is None for v in values):
        return "a field of the pool configuration is malformed"
    if values[5] <= values[4]:
        return "the window must end after it starts"
    if values[8] == "not_applicable" and _CURRENCY.fullmatch(values[3]):
        return "a monetary pool must declare a pre_tax or post_tax basis"
    cause = doc["cause"]
    if not isinstance(cause, str) or not cause.strip() or len(cause) > MAX_CAUSE:
        return f"cause must be a reason of at most {MAX_CAUSE} characters"
    return Pool(*values[:14], frozenset((g["hub"], g["project"]) for g in grantees))


def empty() -> dict:
    return {"pools": {}, "reservations": {}, "answers": {}, "sequences": {}}


def parse(data: bytes, hub_id: str) -> dict:
    """The ledger in a file's bytes (LedgerError says why not). Every pool
    must be configured for this hub (`owner_hub_id`)."""
    if len(data) > MAX_FILE_BYTES:
        raise LedgerError(f"the spend ledger is over {MAX_FILE_BYTES} bytes")
    if not data.strip():
        return empty()
    try:
        doc = json.loads(data)
    except ValueError as exc:
        raise LedgerError(f"the spend ledger is not JSON: {exc}") from exc
    if not isinstance(doc, dict) or set(doc) - set(empty()):
        raise LedgerError("the spend ledger holds only " + ", ".join(sorted(empty())))
    ledger = {**empty(), **doc}
    pools = ledger["pools"]
    if not isinstance(pools, dict) or len(pools) > MAX_POOLS:
        raise LedgerError(f"'pools' must be an object of at most {MAX_POOLS} pools")
    for pool_id, config in pools.items():
        pool = read_pool(config)
        if isinstance(pool, str):
            raise LedgerError(f"pool {pool_id!r}: {pool}")
        if pool.pool_id != pool_id or pool.owner_hub_id != hub_id:
            raise LedgerError(f"pool {pool_id!r}: its pool_id and owner_hub_id must be "
                              f"{pool_id!r} and this hub's id {hub_id!r}")
    for name, bound in (("reservations", MAX_RESERVATIONS), ("answers", MAX_ANSWERS),
                        ("sequences", MAX_POOLS)):
        if not isinstance(ledger[name], dict) or len(ledger[name]) > bound:
            raise LedgerError(f"'{name}' must be an object of at most {bound} entries")
    for entry in ledger["reservations"].values():
        if not isinstance(entry, dict) or entry.get("pool_id") not in pools:
            raise LedgerError("a reservation names no configured pool")
    return ledger


def dump(ledger: dict) -> bytes:
    return json.dumps(ledger, sort_keys=True, separators=(",", ":")).encode()


# -- decisions

def _digest(caller: str, doc: dict) -> str:
    text = json.dumps({"caller": caller, **doc}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def _reserve_scope(caller: str, doc: dict, pool: Pool | None) -> str:
    """Idempotency scope of a reservation (and what a query names)."""
    return "\x00".join(("reserve", caller, doc["pool_id"], pool.window if pool else "",
                        doc["seat"], doc["task"], doc["operation"], doc["key"]))


def _pool(ledger: dict, pool_id: str) -> Pool | None:
    """The pool's configuration read (`parse` checked that every one reads)."""
    config = ledger["pools"].get(pool_id)
    return None if config is None else read_pool(config)


def _held(ledger: dict, pool: Pool, now: datetime) -> tuple[Decimal, Decimal, set, bool]:
    """(settled in the pool's window, exposure still open, seats holding an
    open unexpired reservation, whether an overrun is unreconciled)."""
    settled, open_exposure, seats, overrun = Decimal(0), Decimal(0), set(), False
    with localcontext(_EXACT):
        for entry in ledger["reservations"].values():
            if entry["pool_id"] != pool.pool_id:
                continue
            spent, exposure = Decimal(entry["settled"]), Decimal(entry["exposure"])
            if entry["window"] == pool.window:
                settled += spent
            if not entry["closed"]:
                open_exposure += max(exposure - spent, Decimal(0))
                if _time(entry["expires_at"]) > now:
                    seats.add(entry["seat"])
            overrun = overrun or entry["overrun"]
    return settled, open_exposure, seats, overrun


def reserve_refusal(ledger: dict, pool: Pool | None, caller: str, doc: dict,
                    upper: Decimal, now: datetime) -> str | None:
    """Why a well-formed reservation is refused (the owner's log), or None;
    checked in the reference's order."""
    if pool is None:
        return "unknown_pool"
    settled, open_exposure, seats, overrun = _held(ledger, pool, now)
    with localcontext(_EXACT):
        over_bound = settled + open_exposure + pool.exposure(upper) > pool.hard_bound
    checks = (
        ((caller, doc["project"]) not in pool.grantees, "caller_not_granted"),
        (doc["unit"] != pool.unit, "unit_mismatch"),
        (doc["tax"] != pool.tax, "tax_basis_mismatch"),
        (doc["price_revision"] != pool.price_revision, "price_revision_mismatch"),
        (not pool.starts <= now < pool.ends, "outside_window"),
        (doc["depth"] > pool.max_depth, "depth_exceeded"),
        (doc["wall_seconds"] > pool.max_wall_seconds, "wall_time_exceeded"),
        (overrun, "unreconciled_overrun"),
        (len(seats | {doc["seat"]}) > pool.max_agents, "agents_exceeded"),
        (over_bound, "bound_exceeded"),
        (len(ledger["reservations"]) >= MAX_RESERVATIONS, "ledger_full"),
    )
    return next((reason for failed, reason in checks if failed), None)


def _read_reserve(doc) -> Decimal | None:
    """The upper bound of a well-formed reservation request, or None."""
    if not _exactly(doc, RESERVE_FIELDS):
        return None
    upper = _amount(doc["upper_bound"])
    if (upper is None or upper == 0 or _count(doc["depth"], 0) is None
            or _count(doc["wall_seconds"], 1) is None or doc["tax"] not in TAX_BASES
            or not all(_token(doc[f]) for f in RESERVE_FIELDS
                       - {"upper_bound", "depth", "wall_seconds", "tax"})):
        return None
    return upper


class Decision(NamedTuple):
    answer: dict
    ledger: dict  # the ledger after the decision
    refused: str | None = None  # why, when the answer is the refusal


def _refused(action: str, ledger: dict, why: str) -> Decision:
    return Decision(REFUSALS[action], ledger, why)


def _stored(ledger: dict, scope: str, digest: str, action: str) -> Decision | None:
    """The stored answer of this scope: itself for the same document, the
    refusal for another one; None when the scope is new."""
    stored = ledger["answers"].get(scope)
    if stored is None:
        return None
    if stored["digest"] != digest:
        return _refused(action, ledger, "idempotency_conflict")
    return Decision(stored["response"], ledger)


def _changed(ledger: dict, pool_id: str, scope: str, digest: str, response: dict,
             reservation_id: str, entry: dict) -> dict:
    """The ledger after a grant or a settlement: the pool's sequence moved on,
    `response` stored for `scope`, the reservation's entry put in. The ledger
    before stays as it was: the three maps are copied, not their entries (an
    entry is replaced, never edited), so a change costs no deep copy of up to
    MAX_RESERVATIONS entries on the Router's task."""
    sequences = ledger["sequences"]
    return {**ledger,
            "sequences": {**sequences, pool_id: sequences.get(pool_id, 1) + 1},
            "answers": {**ledger["answers"], scope: {"digest": digest, "response": response}},
            "reservations": {**ledger["reservations"], reservation_id: entry}}


def _reserve(ledger: dict, caller: str, doc: dict, now: datetime) -> Decision:
    upper = _read_reserve(doc)
    if upper is None:
        return _refused("reserve", ledger, "malformed_document")
    if len(ledger["answers"]) >= MAX_ANSWERS:
        return _refused("reserve", ledger, "ledger_full")
    pool = _pool(ledger, doc["pool_id"])
    scope, digest = _reserve_scope(caller, doc, pool), _digest(caller, doc)
    stored = _stored(ledger, scope, digest, "reserve")
    if stored is not None:
        return stored
    why = reserve_refusal(ledger, pool, caller, doc, upper, now)
    if why is not None:
        return _refused("reserve", ledger, why)
    reservation_id = "rsv-" + hashlib.sha256(scope.encode()).hexdigest()[:32]
    expires_at = min(now + timedelta(seconds=doc["wall_seconds"]), pool.ends).isoformat()
    exposure = str(pool.exposure(upper))
    sequence = ledger["sequences"].get(pool.pool_id, 1) + 1
    answer = {"admitted": True, "reservation_id": reservation_id, "pool_id": pool.pool_id,
              "epoch": pool.epoch, "config_revision": 1, "sequence": sequence,
              "expires_at": expires_at, "exposure": exposure, "unit": pool.unit}
    entry = {"caller": caller, "pool_id": pool.pool_id, "seat": doc["seat"],
             "project": doc["project"], "exposure": exposure, "expires_at": expires_at,
             "window": pool.window, "settled": "0", "closed": False, "overrun": False}
    return Decision(answer, _changed(ledger, pool.pool_id, scope, digest, answer,
                                     reservation_id, entry))


def _settle(ledger: dict, caller: str, doc: dict) -> Decision:
    amount = _amount(doc.get("amount")) if isinstance(doc, dict) else None
    if (amount is None or not _exactly(doc, SETTLE_FIELDS) or not all(
            _token(doc[f]) for f in ("pool_id", "reservation_id", "usage_ref"))
            or doc["provenance"] not in PROVENANCES or not isinstance(doc["final"], bool)):
        return _refused("settle", ledger, "malformed_document")
    if len(ledger["answers"]) >= MAX_ANSWERS:
        return _refused("settle", ledger, "ledger_full")
    scope = "\x00".join(("settle", caller, doc["pool_id"], doc["reservation_id"],
                         doc["usage_ref"]))
    digest = _digest(caller, doc)
    stored = _stored(ledger, scope, digest, "settle")
    if stored is not None:
        return stored
    entry = ledger["reservations"].get(doc["reservation_id"])
    if entry is None or entry["caller"] != caller or entry["pool_id"] != doc["pool_id"]:
        return _refused("settle", ledger, "unknown_reservation")
    if entry["closed"]:
        return _refused("settle", ledger, "reservation_closed")
    with localcontext(_EXACT):
        total = Decimal(entry["settled"]) + amount
        overrun = total > Decimal(entry["exposure"])
    answer = {"settled": True, "reservation_id": doc["reservation_id"],
              "usage_ref": doc["usage_ref"], "overrun": overrun}
    settled = {**entry, "settled": str(total), "overrun": entry["overrun"] or overrun,
               "closed": doc["final"]}
    return Decision(answer, _changed(ledger, doc["pool_id"], scope, digest, answer,
                                     doc["reservation_id"], settled))


def _query(ledger: dict, caller: str, doc: dict) -> Decision:
    if not _exactly(doc, QUERY_FIELDS) or not all(_token(doc[f]) for f in QUERY_FIELDS):
        return _refused("query", ledger, "malformed_document")
    stored = ledger["answers"].get(_reserve_scope(caller, doc, _pool(ledger, doc["pool_id"])))
    if stored is None:
        return _refused("query", ledger, "not_found")
    return Decision({"found": True, "response": stored["response"]}, ledger)


def decide(ledger: dict, caller: str, action: str, document: dict,
           now: datetime) -> Decision:
    """The answer and the ledger after it: the same object when nothing
    changed (a refusal, a retry, a query); a refusal says why, for the
    owner's log only."""
    if action == "reserve":
        return _reserve(ledger, caller, document, now)
    if action == "settle":
        return _settle(ledger, caller, document)
    return _query(ledger, caller, document)


def utc(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, timezone.utc)

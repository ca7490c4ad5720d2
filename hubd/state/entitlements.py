"""Fleet planning input: `entitlement_advert` (seed 000, "Fleet planning
input"). One owner's redacted pool advertisement, checked here, becomes an
audit-only journal row (`entitlement_advert`): never broadcast, no
projection, so a replay keeps its seq and changes nothing else.

The document's shape, vocabularies and refusal texts are the reference's
(docs/reference-observed.md §18); `read_advert` answers the advert or the
refusal text. The gates before it (proven sender, the entitlement-advertise
ACL on target pool-alias:<alias>) are the handler's (hubd/handlers/evidence.py).
"""

from __future__ import annotations

import math
import re
from datetime import datetime

from .hub import Appliers

ENTITLEMENT_ADVERT = "entitlement_advert"
RESULT = "entitlement_advert_result"
ACL_PERMISSION = "entitlement-advertise"
ACL_TARGET_KIND = "pool-alias"

SCHEMA = 1
BUCKETS = ("depleted", "<10%", "10-50%", ">50%", "unknown")
EVIDENCE = ("observed", "estimated", "unknown", "outside_window")
FORECASTS = ("insufficient_data", "depleted", "quiet", "depleting")
CONFIDENCE = ("official", "operator", "inferred")
MAX_WINDOWS = 16
MAX_LIST_ITEMS = 32

TOP_FIELDS = frozenset(("schema", "pool_alias", "unit", "resource_kind", "capabilities",
                        "data_classes", "eligible_projects", "account_usable", "as_of",
                        "windows"))
WINDOW_FIELDS = frozenset(("window_ref", "ends_at", "current", "remaining_bucket",
                           "balance_evidence", "observation_age_seconds", "forecast_state",
                           "confidence"))

NOT_PROVEN = "advertisements require a cryptographically proven sender"
NOT_AUTHORISED = "not authorised to advertise this pool alias"
NOT_DURABLE = "advertisements need a hub with a durable journal"

_TOKEN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/-]{0,63}")
_WINDOW_REF = re.compile(r"[0-9a-f]{16}")


def alias_of(frame: dict) -> str:
    """The pool alias a refusal echoes ("" when there is none to echo)."""
    advert = frame.get("advert")
    alias = advert.get("pool_alias") if isinstance(advert, dict) else None
    return alias if isinstance(alias, str) and _TOKEN.fullmatch(alias) else ""


def _is_token(value) -> bool:
    return isinstance(value, str) and _TOKEN.fullmatch(value) is not None


def _time(value, name: str) -> str | None:
    if not isinstance(value, str) or len(value) > 64:
        return f"{name} must be an ISO-8601 time"
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return f"{name} must be an ISO-8601 time"
    if parsed.tzinfo is None:
        return f"{name} must include a UTC offset"
    return None


def _window(window) -> str | None:
    if not isinstance(window, dict) or set(window) != WINDOW_FIELDS:
        return "a window has exactly the documented fields"
    if not isinstance(window["window_ref"], str) or not _WINDOW_REF.fullmatch(window["window_ref"]):
        return "window_ref must be 16 lowercase hex characters"
    if not isinstance(window["current"], bool):
        return "current must be a boolean"
    for name, allowed in (("remaining_bucket", BUCKETS), ("balance_evidence", EVIDENCE),
                          ("forecast_state", FORECASTS), ("confidence", CONFIDENCE)):
        if window[name] not in allowed:
            return f"{name} must be one of {', '.join(allowed)}"
    age = window["observation_age_seconds"]
    if (isinstance(age, bool) or not isinstance(age, (int, float)) or not math.isfinite(age)
            or age < 0):
        return "observation_age_seconds must be a non-negative number"
    return _time(window["ends_at"], "ends_at")


def read_advert(frame: dict) -> dict | str:
    """The advertisement the frame carries under `advert`, or why not."""
    advert = frame.get("advert")
    if not isinstance(advert, dict) or set(advert) != TOP_FIELDS:
        return "an advertisement has exactly the documented fields"
    if advert["schema"] != SCHEMA or isinstance(advert["schema"], bool):
        return f"advertisement schema must be {SCHEMA}"
    if not _is_token(advert["pool_alias"]):
        return "pool_alias is malformed"
    if not _is_token(advert["unit"]):
        return "unit must be a short plain token"
    if advert["resource_kind"] is not None and not _is_token(advert["resource_kind"]):
        return "resource_kind must be a short plain token or null"
    for name in ("capabilities", "data_classes", "eligible_projects"):
        items = advert[name]
        if not isinstance(items, list) or len(items) > MAX_LIST_ITEMS:
            return f"{name} must be a list of at most {MAX_LIST_ITEMS}"
        if not all(_is_token(item) for item in items):
            return f"{name} entries must be short plain tokens"
    if not isinstance(advert["account_usable"], bool):
        return "account_usable must be a boolean"
    problem = _time(advert["as_of"], "as_of")
    if problem:
        return problem
    windows = advert["windows"]
    if not isinstance(windows, list) or len(windows) > MAX_WINDOWS:
        return f"windows must be a list of at most {MAX_WINDOWS}"
    for window in windows:
        problem = _window(window)
        if problem:
            return problem
    return advert


appliers = Appliers()
appliers.records(ENTITLEMENT_ADVERT)

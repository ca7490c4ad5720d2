"""The projection as bytes and back: what a snapshot's body holds
(docs/journal.md, "Snapshots").

The body is the whole HubState (every plugin's projection in `extensions`,
by the installed plugins' names) with what the replay that built it found
(undecodable rows, events of unknown kinds), pickled. Pickle keeps every
projection's exact shape without a serialiser per class, and shared objects
stay shared; it is read back with an unpickler that only builds hubd's and
federation's classes and a few containers, so a snapshot file cannot name
any other code to run. What is not in it is what the journal does not hold
either: presence, timers, the Router's live homes, quota windows.

A snapshot is only used by a hubd whose `fingerprint` is the one that wrote
it: the same hubd version and source of hubd and federation, the same
appliers, and the same empty projections (which hold the limits the
configuration gives them, such as --max-history). Anything else replays.
"""

from __future__ import annotations

import functools
import hashlib
import io
import pickle
import sys
from collections import Counter, OrderedDict, defaultdict, deque
from dataclasses import fields, is_dataclass
from enum import Enum
from pathlib import Path

import hubd

from .hub import HubState

BODY_FORMAT = 1
# dataclass fields of HubState the body carries (`appliers` is how a state
# changes, given by the installed plugins at load, not what it is)
STATE_FIELDS = tuple(f.name for f in fields(HubState) if f.name != "appliers")

_SAFE_MODULE_PREFIXES = ("hubd.", "federation.")
_SAFE_GLOBALS = {
    ("builtins", "set"), ("builtins", "frozenset"), ("builtins", "bytearray"),
    ("builtins", "complex"), ("builtins", "slice"), ("builtins", "range"),
    ("collections", "OrderedDict"), ("collections", "deque"), ("collections", "defaultdict"),
    ("collections", "Counter"), ("copyreg", "_reconstructor"), ("builtins", "object"),
}


class FrozenStateError(ValueError):
    """A snapshot body that cannot be turned back into a state."""


def freeze(state: HubState, replay_notes: dict) -> bytes:
    """The body of a snapshot of `state`. `replay_notes`: what the replay that
    built it found (corrupt rows, unknown kinds), restored with it."""
    body = {"format": BODY_FORMAT, "notes": replay_notes,
            "state": {name: getattr(state, name) for name in STATE_FIELDS}}
    return pickle.dumps(body, protocol=pickle.HIGHEST_PROTOCOL)


def thaw(body: bytes, appliers: dict) -> tuple[HubState, dict]:
    """(state, replay notes) of a snapshot body, projected by `appliers` from now on."""
    try:
        loaded = _Unpickler(io.BytesIO(body)).load()
    except FrozenStateError:
        raise
    except Exception as exc:  # a damaged or foreign body: say what, never half-load
        raise FrozenStateError(f"body cannot be read: {type(exc).__name__}: {exc}") from None
    if not isinstance(loaded, dict) or loaded.get("format") != BODY_FORMAT \
            or set(loaded.get("state", ())) != set(STATE_FIELDS):
        raise FrozenStateError("body is not a hubd state of this format")
    state = HubState(appliers=appliers, **loaded["state"])
    return state, loaded["notes"]


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if module.startswith(_SAFE_MODULE_PREFIXES) or (module, name) in _SAFE_GLOBALS:
            return super().find_class(module, name)
        raise FrozenStateError(f"body names {module}.{name}, which a state never holds")


def fingerprint(fresh: HubState) -> str:
    """What a snapshot must have been written by to be used with states made
    like `fresh` (an empty state of the hub's installed plugins and config)."""
    digest = hashlib.sha256()
    digest.update(f"hubd {hubd.__version__} body {BODY_FORMAT}\n".encode())
    packages = {"hubd"} | {fn.__module__.partition(".")[0]
                           for fns in fresh.appliers.values() for fn in fns}
    digest.update(source_digest(tuple(sorted(packages))).encode())
    for kind in sorted(fresh.appliers):
        names = [f"{fn.__module__}.{fn.__qualname__}" for fn in fresh.appliers[kind]]
        digest.update(repr((kind, names)).encode())
    digest.update(repr(canonical(fresh)).encode())
    return digest.hexdigest()


@functools.cache
def source_digest(packages: tuple[str, ...]) -> str:
    """A digest of the source of the packages whose appliers project the
    state (hubd, federation): any change to that code makes older snapshots
    unusable (they are replayed past, never trusted)."""
    digest = hashlib.sha256()
    for package in packages:
        root = Path(sys.modules[package].__file__).parent
        for path in sorted(root.rglob("*.py")):
            digest.update(str(path.relative_to(root)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


def canonical(value, _depth: int = 0):
    """A plain, ordered form of a state or any part of it (dicts keyed in
    order, sets sorted, objects as their class and fields): two states with
    equal canonical forms project the journal the same way."""
    if _depth > 200:
        raise ValueError("state nested too deep to compare")
    deeper = _depth + 1
    if value is None or isinstance(value, (bool, int, float, str, bytes)):
        return value
    if isinstance(value, Enum):
        return ("enum", type(value).__qualname__, value.name)
    if isinstance(value, (dict, OrderedDict, defaultdict, Counter)):
        return ("dict", [(canonical(k, deeper), canonical(v, deeper)) for k, v in value.items()])
    if isinstance(value, (list, tuple, deque)) and not hasattr(value, "_fields"):
        return (type(value).__name__, [canonical(v, deeper) for v in value])
    if isinstance(value, (set, frozenset)):
        return ("set", sorted((canonical(v, deeper) for v in value), key=repr))
    if callable(value) and not is_dataclass(value) and not hasattr(value, "__dict__"):
        return ("fn", getattr(value, "__qualname__", repr(value)))
    cls = type(value)
    if hasattr(value, "_fields"):  # a NamedTuple
        items = [(name, getattr(value, name)) for name in value._fields]
    elif is_dataclass(value):
        items = [(f.name, getattr(value, f.name)) for f in fields(value)
                 if f.compare and f.name != "appliers"]
    else:
        slots = [s for c in cls.__mro__ for s in getattr(c, "__slots__", ())]
        items = [(s, getattr(value, s)) for s in slots if hasattr(value, s)]
        items += sorted(getattr(value, "__dict__", {}).items())
    return (f"{cls.__module__}.{cls.__qualname__}",
            [(name, canonical(item, deeper)) for name, item in items])

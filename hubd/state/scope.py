"""Claim scopes: path normalisation, the optional `path_identity` object, and
the overlap index that decides whether two claims' scopes conflict.

Pure and deterministic: no IO, no clocks. The claim projection keeps one
`ScopeIndex` and asks it for conflicts; the same index is rebuilt by replay.

Scope rule (hubd): two claims conflict when they share a worktree and one of
their paths is equal to, or a directory ancestor of, one of the other's. A
claim with no paths covers its whole worktree (the path ""). Worktrees are
compared as the literal strings the clients sent.

`path_identity` (version 1, seed "Canonical claim-path identity") adds, only
ever as extra reasons to conflict, never as a reason to grant:
- the canonical worktree (`worktree_path`, or the filesystem namespace plus the
  worktree-root object id) joins claims whose display worktrees differ;
- `git_path`/`filesystem_path` are compared as well as the display path;
- a case-insensitive worktree compares case-folded strings (and projects a
  legacy claim's display paths under that policy);
- an equal `object_id` in the same filesystem namespace and worktree root is
  the same file under another name (a hard link);
- `object_scope` narrows a claim to a declaration inside a file: a whole
  object conflicts with every declaration in it, a declaration with its
  ancestors and descendants, and sibling declarations stay independent.
Two claims without `path_identity` keep the literal-path behaviour.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, field

MAX_PATH_BYTES = 4096
MAX_ID_BYTES = 256
MAX_SCOPE_BYTES = 1024
IDENTITY_VERSION = 1
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_DRIVE = re.compile(r"^[A-Za-z]:[\\/]")
# Separators inside an object_scope ("Class/method", "mod.Class", "a::b", "f#x").
_SCOPE_SEPARATORS = ("/", ".", "::", "#")


def _utf8_len(text: str) -> int | None:
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError:  # a lone surrogate
        return None


def normalize_path(raw) -> str | None:
    """A repository-relative path in canonical form, or None when malformed.

    NFC; empty and "." segments dropped (so "a//b", "./a" and a trailing "/"
    disappear); "" is the worktree root. Refused: non-strings, absolute paths,
    any ".." segment, control characters, more than 4096 UTF-8 bytes.
    """
    if not isinstance(raw, str):
        return None
    size = _utf8_len(raw)
    if size is None or size > MAX_PATH_BYTES or _CONTROL.search(raw):
        return None
    text = unicodedata.normalize("NFC", raw)
    if text.startswith("/") or text.startswith("\\") or _DRIVE.match(text):
        return None
    parts = []
    for part in text.split("/"):
        if part == "" or part == ".":
            continue
        if part == "..":
            return None
        parts.append(part)
    return "/".join(parts)


def ancestors(path: str):
    """Proper directory ancestors of a normalised path, "" (the root) first."""
    if path == "":
        return
    yield ""
    index = path.find("/")
    while index != -1:
        yield path[:index]
        index = path.find("/", index + 1)


def scope_related(a: str, b: str) -> bool:
    """Do two object scopes overlap? "" is the whole object."""
    if a == "" or b == "" or a == b:
        return True
    short, long_ = (a, b) if len(a) < len(b) else (b, a)
    if not long_.startswith(short):
        return False
    rest = long_[len(short):]
    return any(rest.startswith(sep) for sep in _SCOPE_SEPARATORS)


def valid_scope(raw) -> str | None:
    """"" for the whole object, the scope text, or None when malformed."""
    if raw is None:
        return ""
    if not isinstance(raw, str):
        return None
    if raw == "":
        return ""
    size = _utf8_len(raw)
    if size is None or size > MAX_SCOPE_BYTES or _CONTROL.search(raw):
        return None
    if raw != raw.strip() or unicodedata.normalize("NFC", raw) != raw:
        return None
    for sep in _SCOPE_SEPARATORS:
        if raw.startswith(sep) or raw.endswith(sep) or (sep + sep) in raw:
            return None
    return raw


def _short_string(value, *, allow_empty: bool, limit: int = MAX_ID_BYTES) -> bool:
    if not isinstance(value, str) or (not value and not allow_empty):
        return False
    size = _utf8_len(value)
    return size is not None and size <= limit and "\x00" not in value


@dataclass(frozen=True, slots=True)
class IdentityRow:
    strings: tuple[str, ...]  # normalised git_path and filesystem_path (deduplicated)
    object_id: str
    scope: str


@dataclass(frozen=True, slots=True)
class Identity:
    worktree_path: str
    worktree_object_id: str
    namespace: str
    case_sensitive: bool
    rows: tuple[IdentityRow, ...]


# Why a path_identity was refused (both are PATH_IDENTITY_INVALID on the wire).
INVALID = "invalid"
MISMATCH = "mismatch"


def parse_identity(raw, display: list[str]) -> Identity | str:
    """Validate a path_identity against the claim's normalised display paths
    (one row per display path, in order, before de-duplication). Returns the
    parsed identity, or INVALID / MISMATCH."""
    if not isinstance(raw, dict):
        return INVALID
    version = raw.get("version")
    if isinstance(version, bool) or version != IDENTITY_VERSION:
        return INVALID
    worktree_path = raw.get("worktree_path")
    worktree_object_id = raw.get("worktree_object_id", "")
    namespace = raw.get("filesystem_namespace", "")
    case_sensitive = raw.get("case_sensitive", True)
    rows = raw.get("paths")
    if not (_short_string(worktree_path, allow_empty=False, limit=MAX_PATH_BYTES)
            and _short_string(worktree_object_id, allow_empty=True)
            and _short_string(namespace, allow_empty=True)
            and isinstance(case_sensitive, bool) and isinstance(rows, list)):
        return INVALID
    parsed: list[IdentityRow] = []
    for row in rows:
        if not isinstance(row, dict):
            return INVALID
        git_path = normalize_path(row.get("git_path"))
        fs_path = normalize_path(row.get("filesystem_path", row.get("git_path")))
        object_id = row.get("object_id", "")
        scope = valid_scope(row.get("object_scope"))
        if git_path is None or fs_path is None or scope is None or not _short_string(
                object_id, allow_empty=True):
            return INVALID
        strings = (git_path,) if fs_path == git_path else (git_path, fs_path)
        parsed.append(IdentityRow(strings, object_id, scope))
    if len(parsed) != len(display):
        return MISMATCH
    for row, shown in zip(parsed, display):
        git_path = row.strings[0]
        if git_path != shown and (case_sensitive or git_path.casefold() != shown.casefold()):
            return MISMATCH
    return Identity(worktree_path, worktree_object_id, namespace, case_sensitive, tuple(parsed))


@dataclass(frozen=True, slots=True)
class Item:
    """One path of a claim as the index sees it."""

    strings: tuple[str, ...]
    object_key: tuple[str, str, str] | None
    scope: str


@dataclass(frozen=True, slots=True)
class ScopeSpec:
    """Everything the overlap rule needs to know about one claim."""

    worktrees: tuple[tuple, ...]
    insensitive: bool
    items: tuple[Item, ...]


def spec_for(worktree: str, paths: list[str], identity: Identity | None,
             widened: bool = False) -> ScopeSpec:
    """The scope of a claim. `paths` are normalised and de-duplicated; no
    paths (or a widened claim) means the whole worktree."""
    worktrees: list[tuple] = [("w", worktree)]
    if identity is None:
        items = tuple(Item((p,), None, "") for p in paths) or (Item(("",), None, ""),)
        return ScopeSpec(tuple(worktrees), False, items)
    worktrees.append(("c", identity.worktree_path))
    if identity.namespace and identity.worktree_object_id:
        worktrees.append(("o", identity.namespace, identity.worktree_object_id))
    if widened or not paths:
        items = (Item(("",), None, ""),)
    elif len(identity.rows) != len(paths):
        # rows that do not line up (a foreign or damaged record): compare the
        # display paths, never fewer
        items = tuple(Item((p,), None, "") for p in paths)
    else:
        # one row per display path (the caller aligned them)
        items = tuple(
            Item(tuple(dict.fromkeys((shown,) + row.strings)),
                 (identity.namespace, identity.worktree_object_id, row.object_id)
                 if identity.namespace and identity.worktree_object_id and row.object_id
                 else None,
                 row.scope)
            for shown, row in zip(paths, identity.rows))
    return ScopeSpec(tuple(worktrees), not identity.case_sensitive, items)


@dataclass
class ScopeIndex:
    """Who holds which scope, indexed so a conflict check costs a few dict
    lookups per path (its depth), not a scan over every live claim.

    exact:  (worktree key, folded?, path) -> {task_id: [object scopes]}
    under:  (worktree key, folded?, path) -> {task_id: count of held paths below it}
    objects: (namespace, worktree object id, object id) -> {task_id: [object scopes]}
    """

    exact: dict = field(default_factory=dict)
    under: dict = field(default_factory=dict)
    objects: dict = field(default_factory=dict)
    insensitive: set = field(default_factory=set)
    keys: dict = field(default_factory=dict)  # task_id -> what was added, for removal

    def add(self, task_id: str, spec: ScopeSpec) -> None:
        added: list[tuple] = []
        exact, under = self.exact, self.under
        for wt in spec.worktrees:
            for item in spec.items:
                for literal in item.strings:
                    for folded, text in ((False, literal), (True, literal.casefold())):
                        key = (wt, folded, text)
                        holders = exact.get(key)
                        if holders is None:
                            holders = exact[key] = {}
                        holders.setdefault(task_id, []).append(item.scope)
                        added.append((0, key))
                        for prefix in ancestors(text):
                            key = (wt, folded, prefix)
                            counts = under.get(key)
                            if counts is None:
                                counts = under[key] = {}
                            counts[task_id] = counts.get(task_id, 0) + 1
                            added.append((1, key))
        for item in spec.items:
            if item.object_key is not None:
                self.objects.setdefault(item.object_key, {}).setdefault(task_id, []).append(
                    item.scope)
                added.append((2, item.object_key))
        if spec.insensitive:
            self.insensitive.add(task_id)
        self.keys[task_id] = added

    def remove(self, task_id: str) -> None:
        added = self.keys.pop(task_id, None)
        if added is None:
            return
        tables = (self.exact, self.under, self.objects)
        for which, key in added:
            table = tables[which]
            holders = table.get(key)
            if holders is None or task_id not in holders:
                continue
            if which == 1:
                holders[task_id] -= 1
                if holders[task_id] <= 0:
                    del holders[task_id]
            else:
                del holders[task_id]
            if not holders:
                del table[key]
        self.insensitive.discard(task_id)

    def conflicts(self, spec: ScopeSpec, skip: str, live) -> list[str]:
        """Task ids whose live scope overlaps `spec` (never `skip`), in the
        order found. `live(task_id)` says whether a held scope still counts."""
        found: list[str] = []
        seen = {skip}
        exact, under, insensitive = self.exact, self.under, self.insensitive

        def hit(task_id: str) -> None:
            if task_id not in seen:
                seen.add(task_id)
                if live(task_id):
                    found.append(task_id)

        check_folded = spec.insensitive or bool(insensitive)
        for wt in spec.worktrees:
            for item in spec.items:
                for literal in item.strings:
                    variants = ((False, literal),)
                    if check_folded:
                        variants = ((False, literal), (True, literal.casefold()))
                    for folded, text in variants:
                        def counts(task_id: str) -> bool:
                            # a case-folded match only counts when either side
                            # lives on a case-insensitive worktree
                            return not folded or spec.insensitive or task_id in insensitive
                        holders = exact.get((wt, folded, text))
                        if holders:
                            for task_id, scopes in holders.items():
                                if task_id not in seen and counts(task_id) and any(
                                        scope_related(item.scope, s) for s in scopes):
                                    hit(task_id)
                        for prefix in ancestors(text):
                            holders = exact.get((wt, folded, prefix))
                            if holders:
                                for task_id in holders:
                                    if task_id not in seen and counts(task_id):
                                        hit(task_id)
                        below = under.get((wt, folded, text))
                        if below:
                            for task_id in below:
                                if task_id not in seen and counts(task_id):
                                    hit(task_id)
        for item in spec.items:
            if item.object_key is None:
                continue
            holders = self.objects.get(item.object_key)
            if holders:
                for task_id, scopes in holders.items():
                    if task_id not in seen and any(scope_related(item.scope, s) for s in scopes):
                        hit(task_id)
        return found


def overlaps(a: ScopeSpec, b: ScopeSpec) -> bool:
    """The overlap rule between two claims, stated directly (no index). The
    index must agree with this; the tests check that it does."""
    if set(a.worktrees) & set(b.worktrees):
        fold = a.insensitive or b.insensitive
        for x in a.items:
            for y in b.items:
                for s in x.strings:
                    for t in y.strings:
                        if fold:
                            s, t = s.casefold(), t.casefold()
                        if s == t:
                            if scope_related(x.scope, y.scope):
                                return True
                        elif _is_ancestor(s, t) or _is_ancestor(t, s):
                            return True
    for x in a.items:
        for y in b.items:
            if x.object_key is not None and x.object_key == y.object_key and scope_related(
                    x.scope, y.scope):
                return True
    return False


def _is_ancestor(a: str, b: str) -> bool:
    return a == "" or b.startswith(a + "/")

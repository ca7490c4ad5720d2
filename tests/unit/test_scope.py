"""Claim scopes: path normalisation, path_identity validation, and the overlap
index (which must agree with the overlap rule stated directly)."""

import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hubd.state import scope as sc
from hubd.state.claims import scope_spec


@pytest.mark.parametrize("raw,expected", [
    ("src/a.py", "src/a.py"),
    ("src/b/", "src/b"),
    ("a//b", "a/b"),
    ("./c", "c"),
    ("d/./e/", "d/e"),
    (".", ""),
    ("", ""),
    ("e\u0301", "\u00e9"),  # NFC
    ("*.py", "*.py"),  # a literal, not a glob
])
def test_normalize_path(raw, expected):
    assert sc.normalize_path(raw) == expected


@pytest.mark.parametrize("raw", [
    "../x", "a/../b", "a/..", "/abs/x", "\\\\server\\x", "C:/x", "a\x00b", "a\nb", 5, None,
    ["a"], "x" * 5000,
])
def test_malformed_paths_are_refused(raw):
    assert sc.normalize_path(raw) is None


def identity(rows, *, version=1, wt="/canon/repo", obj="dev:1", ns="sha256:host-a",
             sensitive=True):
    return {"version": version, "worktree_path": wt, "worktree_object_id": obj,
            "filesystem_namespace": ns, "case_sensitive": sensitive,
            "paths": [{"git_path": g, "filesystem_path": f, "object_id": o, "object_scope": s}
                      for g, f, o, s in rows]}


def test_identity_rows_must_match_display_paths():
    good = identity([("src/a.py", "src/a.py", "dev:10", "")])
    assert isinstance(sc.parse_identity(good, ["src/a.py"]), sc.Identity)
    assert sc.parse_identity(good, ["src/b.py"]) == sc.MISMATCH
    assert sc.parse_identity(good, ["src/a.py", "x"]) == sc.MISMATCH
    # a case-insensitive worktree matches case-folded
    loose = identity([("SRC/a.py", "SRC/a.py", "", "")], sensitive=False)
    assert isinstance(sc.parse_identity(loose, ["src/a.py"]), sc.Identity)


@pytest.mark.parametrize("mutate", [
    lambda d: d.update(version=2),
    lambda d: d.update(version=True),
    lambda d: d.update(case_sensitive="yes"),
    lambda d: d.update(worktree_path=""),
    lambda d: d.update(paths="src/a.py"),
    lambda d: d["paths"][0].update(git_path="../a.py"),
    lambda d: d["paths"][0].update(object_id=7),
    lambda d: d["paths"][0].update(object_scope="/leading"),
    lambda d: d["paths"][0].update(object_scope="a..b"),
    lambda d: d["paths"].__setitem__(0, "src/a.py"),
])
def test_malformed_identity_is_invalid(mutate):
    doc = identity([("src/a.py", "src/a.py", "dev:10", "")])
    mutate(doc)
    assert sc.parse_identity(doc, ["src/a.py"]) == sc.INVALID
    assert sc.parse_identity("not an object", ["src/a.py"]) == sc.INVALID


def spec(worktree, paths, ident=None):
    return scope_spec(worktree, paths, ident)


def conflict(a, b):
    return sc.overlaps(a, b)


def test_literal_rule():
    assert conflict(spec("/w", ["lib"]), spec("/w", ["lib/x.py"]))
    assert conflict(spec("/w", ["lib/x.py"]), spec("/w", ["lib/x.py"]))
    assert not conflict(spec("/w", ["lib"]), spec("/w", ["library"]))
    assert not conflict(spec("/w", ["lib"]), spec("/w2", ["lib"]))
    assert not conflict(spec("/w", ["LIB"]), spec("/w", ["lib"]))  # case-sensitive
    assert conflict(spec("/w", []), spec("/w", ["anything/at/all"]))  # no paths: whole worktree
    assert conflict(spec("/w", [""]), spec("/w", ["x"]))


def test_hard_link_alias_conflicts_only_in_the_same_namespace():
    a = spec("/repo", ["a/x.py"], identity([("a/x.py", "a/x.py", "dev:1", "")]))
    b = spec("/repo", ["b/alias.py"], identity([("b/alias.py", "b/alias.py", "dev:1", "")]))
    assert conflict(a, b)
    other_host = spec("/repo", ["b/alias.py"], identity([("b/alias.py", "b/alias.py", "dev:1", "")],
                                                        ns="sha256:host-b"))
    assert not conflict(a, other_host)
    other_root = spec("/repo", ["b/alias.py"], identity([("b/alias.py", "b/alias.py", "dev:1", "")],
                                                        obj="dev:2"))
    assert not conflict(a, other_root)
    # an empty object id means "does not exist yet": never an alias
    c = spec("/repo", ["c.py"], identity([("c.py", "c.py", "", "")]))
    d = spec("/repo", ["d.py"], identity([("d.py", "d.py", "", "")]))
    assert not conflict(c, d)


def test_object_scopes():
    def s(path, scope, oid="dev:5"):
        return spec("/repo", [path], identity([(path, path, oid, scope)]))
    whole = s("m.py", "")
    assert conflict(whole, s("m.py", "Class/method"))
    assert conflict(s("m.py", "Class"), s("m.py", "Class/method"))  # ancestry
    assert not conflict(s("m.py", "Class/a"), s("m.py", "Class/b"))  # siblings
    # siblings stay independent across a hard-link alias too
    assert not conflict(s("m.py", "Class/a"), s("alias.py", "Class/b"))
    assert conflict(s("m.py", "Class/a"), s("alias.py", "Class/a"))
    # a legacy claim on the file is the whole object
    assert conflict(spec("/repo", ["m.py"]), s("m.py", "Class/a"))


def test_canonical_worktree_joins_display_worktrees():
    a = spec("/repo", ["x"], identity([("x", "x", "", "")]))
    b = spec("/repo/", ["x"], identity([("x", "x", "", "")]))
    assert conflict(a, b)
    # a legacy claim keeps literal worktrees
    assert not conflict(spec("/repo", ["x"]), spec("/repo/", ["x"]))


def test_case_insensitive_policy_projects_the_legacy_side():
    loose = spec("/w", ["Readme.md"], identity([("Readme.md", "Readme.md", "", "")],
                                               sensitive=False))
    assert conflict(loose, spec("/w", ["README.md"]))
    strict = spec("/w", ["Readme.md"], identity([("Readme.md", "Readme.md", "", "")]))
    assert not conflict(strict, spec("/w", ["README.md"]))
    assert not conflict(spec("/w", ["Readme.md"]), spec("/w", ["README.md"]))


# -- the index agrees with the rule

PATHS = ["", "a", "a/b", "a/b/c", "a/c", "A/b", "b", "b/x", "ab"]
paths = st.lists(st.sampled_from(PATHS[1:]), max_size=3, unique=True)
object_ids = st.sampled_from(["", "dev:1", "dev:2"])
scopes = st.sampled_from(["", "C", "C/m", "C/n", "D"])


@st.composite
def specs(draw):
    worktree = draw(st.sampled_from(["/w", "/v"]))
    chosen = draw(paths)
    if draw(st.booleans()):
        return spec(worktree, chosen)
    rows = [(p, p, draw(object_ids), draw(scopes)) for p in chosen]
    doc = identity(rows, wt=draw(st.sampled_from(["/canon", "/other"])),
                   ns=draw(st.sampled_from(["sha256:h1", "sha256:h2", ""])),
                   sensitive=draw(st.booleans()))
    return spec(worktree, chosen, doc)


@settings(max_examples=300, deadline=None)
@given(st.lists(specs(), min_size=1, max_size=8), specs(), st.data())
def test_index_agrees_with_the_rule(held, candidate, data):
    index = sc.ScopeIndex()
    for i, s in enumerate(held):
        index.add(f"t{i}", s)
    # remove some again: removal must undo exactly what add did
    removed = set(data.draw(st.lists(st.integers(0, len(held) - 1), unique=True)))
    for i in removed:
        index.remove(f"t{i}")
    found = set(index.conflicts(candidate, "new", lambda t: True))
    expected = {f"t{i}" for i, s in enumerate(held) if i not in removed and sc.overlaps(candidate, s)}
    assert found == expected
    if len(removed) == len(held):
        assert index == sc.ScopeIndex()


@given(st.text(max_size=40))
def test_normalised_paths_are_canonical(raw):
    out = sc.normalize_path(raw)
    if out is None:
        return
    assert sc.normalize_path(out) == out
    assert not out.startswith("/") and not out.endswith("/")
    assert ".." not in out.split("/") and "" not in out.split("/") or out == ""
    assert unicodedata.normalize("NFC", out) == out

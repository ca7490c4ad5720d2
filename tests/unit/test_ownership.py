"""Namespace ownership (federation/ownership.py): parsing --namespace-owner and
resolving a namespace to local / remote / ungoverned / partitioned."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from federation.ownership import (LOCAL, PARTITIONED, REMOTE, UNGOVERNED, NamespaceOwnership,
                                  OwnershipError, namespace_of)


def test_from_flags():
    own = NamespaceOwnership.from_flags([" PROJ = east ", "DOCS=west", "PROJ=east"], "east")
    assert own.owners == {"PROJ": "east", "DOCS": "west"}
    assert own.owned_locally() == ["PROJ"] and own.governed() == ["DOCS", "PROJ"]


@pytest.mark.parametrize("flag", ["PROJ", "=east", "PROJ=", " = ", "A/B=east", "P=a=b"])
def test_malformed_flags(flag):
    with pytest.raises(OwnershipError, match="NS=HUB_ID|namespace|'='"):
        NamespaceOwnership.from_flags([flag], "east")


def test_two_owners_for_one_namespace():
    with pytest.raises(OwnershipError) as info:
        NamespaceOwnership.from_flags(["PROJ=east", "PROJ=west"], "east")
    assert "'PROJ' two owners: 'east' and 'west'" in str(info.value)


def test_resolve():
    own = NamespaceOwnership.from_flags(["PROJ=east", "DOCS=west"], "east")
    r = own.resolve("PROJ")
    assert (r.kind, r.owner_hub_id, r.grants_locally, r.refuses) == (LOCAL, "east", True, False)
    r = own.resolve("DOCS")
    assert (r.kind, r.owner_hub_id, r.refuses) == (REMOTE, "west", False)
    assert own.resolve("OTHER").kind == UNGOVERNED and own.resolve("OTHER").owner_hub_id is None
    assert own.resolve(None).kind == UNGOVERNED
    r = own.resolve("PROJ", {"PROJ"})
    assert (r.kind, r.owner_hub_id, r.refuses) == (PARTITIONED, None, True)
    assert own.resolve("DOCS", {"DOCS"}).kind == PARTITIONED
    assert own.resolve("DOCS", {"PROJ"}).kind == REMOTE
    assert own.resolve_identity("PROJ/alice").kind == LOCAL
    assert own.resolve_identity("alice").kind == UNGOVERNED  # a bare name: no namespace


def test_no_map_grants_everything_locally():
    own = NamespaceOwnership.from_flags([], "east")
    assert not own.configured
    for ns in ("PROJ", None, "X"):
        r = own.resolve(ns)
        assert (r.kind, r.owner_hub_id) == (LOCAL, "east")
    assert own.resolve_identity("alice").kind == LOCAL


def test_contesting():
    own = NamespaceOwnership.from_flags(["PROJ=east", "DOCS=west"], "east")
    assert own.contesting("PROJ", {"east", "north", "west"}) == {"north", "west"}
    assert own.contesting("DOCS", {"east", "west", "north"}) == {"north"}
    assert own.contesting("OTHER", {"north"}) == set()


@given(st.text(min_size=1, max_size=8).filter(lambda s: "/" not in s),
       st.text(max_size=8))
def test_namespace_of_is_the_project_prefix(project, seat):
    assert namespace_of(f"{project}/{seat}") == project
    assert namespace_of(project) is None

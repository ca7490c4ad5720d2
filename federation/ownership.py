"""Namespace ownership: which hub may grant claims in a namespace.

Claims are mutual exclusion, so they are never merged between hubs: each
project namespace has exactly one owning hub, configured by the operator
(``--namespace-owner NS=HUB_ID``, repeatable, as the reference hub spells it).
Resolving a namespace gives one of four answers for the hub holding the map:

    local        this hub owns it and grants here
    remote       a named peer owns it: forward the claim there (or refuse naming it)
    ungoverned   no owner configured (or a bare identity with no namespace): refuse
    partitioned  ownership is contested (PartitionDetector): refuse everything

The last two fail closed. With no map configured at all every namespace is
local: a single hub grants everything, as it always has. The namespace of an
identity is its ``PROJECT/`` prefix (the reference hub's derivation, also used
by its ACL), so ``PROJ/alice`` is in ``PROJ`` and ``alice`` is in none.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

from federation.fold import namespace_of

LOCAL = "local"
REMOTE = "remote"
UNGOVERNED = "ungoverned"
PARTITIONED = "partitioned"
KINDS = (LOCAL, REMOTE, UNGOVERNED, PARTITIONED)

__all__ = ["NamespaceOwnership", "OwnershipError", "Resolution", "namespace_of",
           "LOCAL", "REMOTE", "UNGOVERNED", "PARTITIONED"]


class OwnershipError(ValueError):
    """A --namespace-owner value the hub refuses to start with."""


@dataclass(frozen=True)
class Resolution:
    kind: str  # one of KINDS
    owner_hub_id: str | None  # local hub / the remote owner; None when ungoverned or partitioned
    namespace: str | None = None

    @property
    def grants_locally(self) -> bool:
        return self.kind == LOCAL

    @property
    def refuses(self) -> bool:
        return self.kind in (UNGOVERNED, PARTITIONED)


@dataclass(frozen=True)
class NamespaceOwnership:
    owners: Mapping[str, str]  # namespace -> owning hub id
    local_hub_id: str

    @classmethod
    def from_flags(cls, flags: Iterable[str], local_hub_id: str) -> "NamespaceOwnership":
        """Parse repeatable ``NS=HUB_ID`` values. Whitespace around either side
        is trimmed; a namespace may be repeated only with the same owner."""
        owners: dict[str, str] = {}
        for raw in flags:
            if not isinstance(raw, str):
                raise OwnershipError(f"--namespace-owner must be NS=HUB_ID, got {raw!r}")
            namespace, sep, hub_id = raw.partition("=")
            namespace, hub_id = namespace.strip(), hub_id.strip()
            if not sep or not namespace or not hub_id:
                raise OwnershipError(f"--namespace-owner must be NS=HUB_ID, got {raw!r}")
            if "/" in namespace:
                raise OwnershipError(
                    f"--namespace-owner {raw!r}: a namespace is the PROJECT part of "
                    f"PROJECT/seat and cannot contain '/'")
            if "=" in hub_id:
                raise OwnershipError(f"--namespace-owner {raw!r}: more than one '='")
            previous = owners.get(namespace)
            if previous is not None and previous != hub_id:
                raise OwnershipError(
                    f"--namespace-owner gives namespace {namespace!r} two owners: "
                    f"{previous!r} and {hub_id!r}; a namespace has exactly one owning hub")
            owners[namespace] = hub_id
        return cls(owners, local_hub_id)

    @property
    def configured(self) -> bool:
        return bool(self.owners)

    def owner_of(self, namespace: str | None) -> str | None:
        return self.owners.get(namespace) if namespace is not None else None

    def governed(self) -> list[str]:
        return sorted(self.owners)

    def owned_locally(self) -> list[str]:
        return sorted(ns for ns, hub in self.owners.items() if hub == self.local_hub_id)

    def resolve(self, namespace: str | None, partitioned: Iterable[str] = ()) -> Resolution:
        """Who may grant in `namespace`. `partitioned` is the set of
        namespaces currently contested (PartitionDetector.partitioned())."""
        if not self.owners:
            return Resolution(LOCAL, self.local_hub_id, namespace)
        owner = self.owners.get(namespace) if namespace is not None else None
        if owner is None:
            return Resolution(UNGOVERNED, None, namespace)
        if namespace in set(partitioned):
            return Resolution(PARTITIONED, None, namespace)
        if owner == self.local_hub_id:
            return Resolution(LOCAL, owner, namespace)
        return Resolution(REMOTE, owner, namespace)

    def resolve_identity(self, identity: str, partitioned: Iterable[str] = ()) -> Resolution:
        """resolve() for a claimant's identity (`PROJECT/seat`)."""
        return self.resolve(namespace_of(identity), partitioned)

    def contesting(self, namespace: str, asserting: Iterable[str]) -> set[str]:
        """The hubs in `asserting` that contest `namespace`: every hub observed
        asserting it other than its configured owner and this hub. Empty for
        an ungoverned namespace (nothing to contest)."""
        owner = self.owners.get(namespace)
        if owner is None:
            return set()
        return {hub for hub in asserting if hub != owner and hub != self.local_hub_id}

"""Which handles the broker may speak for (docs/identity.md, "The other doors").

A broker handle H is the hub seat <namespace>/H. The broker speaks as one
principal: the hub's principal named `--broker-principal` when its table
holds one (its seats then decide), else the door's own, whose seats are
<namespace>/*. Either way a seat that a principal of the table holds is
spoken for only with that principal's credentials, on every door: the broker
may use it only when it speaks as one of the principals holding it. So a
principal `lalice` with seat `local/alice` keeps `local/alice` its own even
though the door's own principal covers `local/*`.

Pure: `seat_refusal` decides from the table; `BrokerSeats` remembers its
answers for one table (a table is an immutable snapshot the hub swaps whole
when principals change, so a new table starts a new memory).
"""

from __future__ import annotations

from hubd.state.principals import Principal, PrincipalTable, seat_holders

MEMORY = 4096  # answers remembered per table (past it the memory starts over)


def broker_principal(table: PrincipalTable, name: str, namespace: str) -> Principal:
    """Who the broker speaks as."""
    found = table.principals.get(name)
    if found is not None:
        return found
    return Principal(name, (f"{namespace}/*",), claim=(), board=(), mailbox=())


def seat_refusal(table: PrincipalTable, name: str, namespace: str, handle: str) -> str | None:
    """Why the broker (principal `name`) may not speak for handle `handle`,
    or None when it may."""
    principal = broker_principal(table, name, namespace)
    seat = f"{namespace}/{handle}"
    if not principal.speaks_for(seat):
        return (f"Principal '{principal.name}' may not speak for '{seat}' "
                f"(its seats: {', '.join(principal.seats)}).")
    holders = seat_holders(table, seat)
    if holders and principal.name not in holders:
        return (f"Seat '{seat}' is held by principal '{holders[0]}': only its token speaks "
                f"for it, and the broker speaks as '{principal.name}'.")
    return None


class BrokerSeats:
    def __init__(self, name: str, namespace: str):
        self.name = name
        self.namespace = namespace
        self._table: PrincipalTable | None = None
        self._answers: dict[str, str | None] = {}

    def refusal(self, table: PrincipalTable, handle: str) -> str | None:
        if table is not self._table:
            self._table, self._answers = table, {}
        if handle in self._answers:
            return self._answers[handle]
        if len(self._answers) >= MEMORY:
            self._answers = {}
        answer = self._answers[handle] = seat_refusal(table, self.name, self.namespace, handle)
        return answer

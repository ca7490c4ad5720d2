"""Principals: who may speak for which seat, and what else they may do.

A principal is a name, the digests of its tokens, the seat patterns it may
speak for, and its grants (docs/identity.md). Everything here is pure: the
table is an immutable snapshot a hub swaps whole when its source changes, and
every decision is a function of the table, the principal and the request.

Seat patterns: `*` (every seat), `PROJ/alice` (that seat), `PROJ/*` or
`acme/dev/joel/*` (every seat under that prefix, at any depth). A pattern
that admits a seat also admits the seat's `-rx` wake sidecar.

Grants, each a tuple of patterns, or None for the default:
- `claim`: namespaces it may claim in (default: the namespaces of its seats);
- `board`: namespaces whose board tasks it may post and update (same default);
- `mailbox`: seats whose mailbox it may read with mailbox_for, beyond its own
  seats and their -rx sidecars (default: none);
- `control`: seats whose live turn it may interrupt or steer with a delivery
  request, the seed's DELIVERY_CONTROL grant (default: none, not even its own
  seats: the seed asks for an explicit grant).
A namespace pattern is a namespace (`PROJ`) or `*`.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import re
from dataclasses import dataclass, field

from hubd.state.presence import RX_SUFFIX

EVERY = "*"
SHARED_TOKEN_PRINCIPAL = "shared-token"
GRANTS = ("claim", "board", "mailbox", "control", "org_admin")
# grants whose patterns are seat patterns (the others name namespaces)
SEAT_GRANTS = ("mailbox", "control")
MAX_PRINCIPALS = 10_000
MAX_PATTERNS = 256
MAX_TOKENS_PER_PRINCIPAL = 64
MAX_NAME_BYTES = 128
MAX_LABEL_BYTES = 64

# A principal's name: what the journal records and `hubd principal` names.
# Slashes allowed so a REDSYN person (org/team/user) is one.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]*")
_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_DIGEST = re.compile(r"[0-9a-f]{64}")
# one segment of a seat name or namespace: no glob characters, no '/', no '@'
_SEGMENT = re.compile(r"[^/*?\[\]@\s]+")


class PrincipalError(ValueError):
    """A principal, pattern, grant or principals file that cannot be used."""


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def check_name(name: object) -> str:
    if (not isinstance(name, str) or len(name.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES
            or not _NAME.fullmatch(name) or "//" in name or name.endswith("/")):
        raise PrincipalError(f"a principal's name is letters, digits, '.', '_', '-' and '/' "
                             f"(at most {MAX_NAME_BYTES} bytes): {name!r}")
    return name


def check_label(label: object) -> str:
    if (not isinstance(label, str) or len(label) > MAX_LABEL_BYTES
            or not _LABEL.fullmatch(label)):
        raise PrincipalError(f"a token label is letters, digits, '.', '_', '-' "
                             f"(at most {MAX_LABEL_BYTES}): {label!r}")
    return label


def check_seat_pattern(pattern: object) -> str:
    """`*`, an exact seat, or a prefix ending in `/*`."""
    if not isinstance(pattern, str):
        raise PrincipalError(f"a seat pattern is a string: {pattern!r}")
    if pattern == EVERY:
        return pattern
    body = pattern[:-2] if pattern.endswith("/*") else pattern
    if not body or not all(_SEGMENT.fullmatch(part) for part in body.split("/")):
        raise PrincipalError(f"a seat pattern is '*', a seat (PROJ/alice) or a prefix "
                             f"ending in '/*' (PROJ/*): {pattern!r}")
    return pattern


def check_namespace_pattern(pattern: object) -> str:
    if not isinstance(pattern, str) or not (pattern == EVERY or _SEGMENT.fullmatch(pattern)):
        raise PrincipalError(f"a namespace pattern is a namespace (PROJ) or '*': {pattern!r}")
    return pattern


def seat_matches(pattern: str, name: str) -> bool:
    if pattern == EVERY:
        return True
    if pattern.endswith("/*"):
        prefix = pattern[:-1]  # keeps the '/'
        return name.startswith(prefix) and len(name) > len(prefix)
    return name == pattern


def namespace_of(seat: str) -> str | None:
    head, sep, _ = seat.partition("/")
    return head if sep else None


def _pattern_namespace(pattern: str) -> str | None:
    """The namespace a seat pattern lies in (`*` for every one)."""
    if pattern == EVERY:
        return EVERY
    return namespace_of(pattern if not pattern.endswith("/*") else pattern[:-1])


@dataclass(frozen=True, slots=True)
class Principal:
    name: str
    seats: tuple[str, ...]
    claim: tuple[str, ...] | None = None
    board: tuple[str, ...] | None = None
    mailbox: tuple[str, ...] | None = None
    control: tuple[str, ...] | None = None
    # REDSYN organizations whose links it may propose, accept and change
    # (docs/redsyn.md, "Organizations and links"); None: none
    org_admin: tuple[str, ...] | None = None

    def speaks_for(self, seat: str) -> bool:
        base = seat[:-len(RX_SUFFIX)] if seat.endswith(RX_SUFFIX) else None
        for pattern in self.seats:
            if seat_matches(pattern, seat) or (base and seat_matches(pattern, base)):
                return True
        return False

    def own_namespaces(self) -> tuple[str, ...]:
        found = (_pattern_namespace(p) for p in self.seats)
        return tuple(sorted({n for n in found if n is not None}))

    def may_claim_in(self, namespace: str | None) -> bool:
        return _namespace_granted(self.claim, self, namespace)

    def may_post_board_in(self, namespace: str | None) -> bool:
        return _namespace_granted(self.board, self, namespace)

    def may_read_mailbox(self, identity: str) -> bool:
        if self.speaks_for(identity):
            return True
        return any(seat_matches(p, identity) for p in self.mailbox or ())

    def may_control(self, seat: str) -> bool:
        return any(seat_matches(p, seat) for p in self.control or ())

    def admins_org(self, org: str) -> bool:
        return any(p in (org, EVERY) for p in self.org_admin or ())

    def grants(self) -> dict:
        """The grants as stored and shown (None: the default)."""
        return {g: (list(v) if (v := getattr(self, g)) is not None else None) for g in GRANTS}


def _namespace_granted(grant: tuple[str, ...] | None, principal: Principal,
                       namespace: str | None) -> bool:
    patterns = grant if grant is not None else principal.own_namespaces()
    if EVERY in patterns:
        return True
    return namespace is not None and namespace in patterns


# The shared --token: it may speak for every seat and do everything (the
# reference's one-secret hub) except control a live turn, which needs an
# explicit grant a shared secret is not.
SHARED = Principal(SHARED_TOKEN_PRINCIPAL, (EVERY,), claim=(EVERY,), board=(EVERY,),
                   mailbox=(EVERY,), control=())


def make_principal(name: object, seats, grants: dict | None = None) -> Principal:
    name = check_name(name)
    if name == SHARED_TOKEN_PRINCIPAL:
        raise PrincipalError(f"'{SHARED_TOKEN_PRINCIPAL}' is the shared --token's principal")
    if not isinstance(seats, (list, tuple)) or not seats or len(seats) > MAX_PATTERNS:
        raise PrincipalError(f"principal {name!r}: seats is a list of 1-{MAX_PATTERNS} patterns")
    checked = tuple(dict.fromkeys(check_seat_pattern(s) for s in seats))
    values = {}
    for grant, value in (grants or {}).items():
        if grant not in GRANTS:
            raise PrincipalError(f"principal {name!r}: unknown grant {grant!r} "
                                 f"(grants are {', '.join(GRANTS)})")
        if value is None:
            continue
        if not isinstance(value, (list, tuple)) or len(value) > MAX_PATTERNS:
            raise PrincipalError(f"principal {name!r}: grant {grant} is a list of at most "
                                 f"{MAX_PATTERNS} patterns")
        check = check_seat_pattern if grant in SEAT_GRANTS else check_namespace_pattern
        values[grant] = tuple(dict.fromkeys(check(p) for p in value))
    return Principal(name, checked, **values)


@dataclass(frozen=True, slots=True)
class Credential:
    """What a token proves: the principal, and which of its tokens it was."""
    principal: Principal
    digest: str
    label: str


@dataclass(frozen=True)
class PrincipalTable:
    """One snapshot of the hub's principals (swapped whole on a change).

    `shared` is the shared --token's digest, if the hub has one. With no
    principals and no shared token the hub is open (see `open`)."""
    principals: dict = field(default_factory=dict)    # name -> Principal
    by_digest: dict = field(default_factory=dict)     # token digest -> Credential
    shared: str | None = None
    source: str = "journal"
    # the principals' seat patterns, indexed (build_table): exact seats, the
    # prefixes of `PREFIX/*` patterns (with their '/'), and whether one is `*`
    held_seats: frozenset = frozenset()
    held_prefixes: frozenset = frozenset()
    held_everything: bool = False
    # REDSYN organizations: name -> {"redsyn_version", "created_at"} (`hubd
    # redsyn org create`; kept beside the principals, re-read with them)
    orgs: dict = field(default_factory=dict)

    def org_admins(self, org: str) -> list[str]:
        return sorted(name for name, p in self.principals.items() if p.admins_org(org))

    @property
    def open(self) -> bool:
        return not self.by_digest

    @property
    def tokenless(self) -> bool:
        """Agents may connect without a token: the hub has no shared --token.
        They may use every seat no principal holds (from loopback, or from
        any address with --open-network), as on an open hub; a seat a
        principal holds needs that principal's token."""
        return self.shared is None

    def held(self, seat: str) -> bool:
        """Whether a principal's seat patterns cover this seat (or the seat
        whose -rx wake sidecar it is)."""
        if self.held_everything:
            return True
        names = (seat, seat[:-len(RX_SUFFIX)]) if seat.endswith(RX_SUFFIX) else (seat,)
        for name in names:
            if name in self.held_seats:
                return True
            cut = name.find("/")
            while 0 <= cut < len(name) - 1:
                if name[:cut + 1] in self.held_prefixes:
                    return True
                cut = name.find("/", cut + 1)
        return False

    @property
    def enforcing(self) -> bool:
        """Principals of its own exist: seats are bound, routing is private."""
        return bool(self.principals)

    def authenticate(self, token: str) -> Credential | None:
        wanted = token_digest(token)
        credential = self.by_digest.get(wanted)
        # The dict lookup matched on the digest; compare again in constant
        # time so the answer's timing says nothing about near misses.
        if credential is not None and hmac.compare_digest(wanted, credential.digest):
            return credential
        return None

    def credential(self, digest: str | None) -> Credential | None:
        return self.by_digest.get(digest) if digest is not None else None


def build_table(principals: list[Principal], tokens: list[tuple[str, str, str]],
                shared_token: str | None = None, source: str = "journal",
                orgs: dict | None = None) -> PrincipalTable:
    """principals, and tokens as (principal name, digest, label)."""
    if len(principals) > MAX_PRINCIPALS:
        raise PrincipalError(f"at most {MAX_PRINCIPALS} principals")
    by_name: dict[str, Principal] = {}
    for principal in principals:
        if principal.name in by_name:
            raise PrincipalError(f"principal {principal.name!r} is named twice")
        by_name[principal.name] = principal
    by_digest: dict[str, Credential] = {}
    for name, digest, label in tokens:
        if not _DIGEST.fullmatch(digest):
            raise PrincipalError(f"principal {name!r}: a token digest is 64 lower-case hex")
        principal = by_name.get(name)
        if principal is None:
            raise PrincipalError(f"a token names principal {name!r}, which does not exist")
        if digest in by_digest:
            raise PrincipalError(f"one token digest is given to two principals "
                                 f"({by_digest[digest].principal.name!r}, {name!r})")
        by_digest[digest] = Credential(principal, digest, label)
    shared = None
    if shared_token is not None:
        shared = token_digest(shared_token)
        if shared in by_digest:
            raise PrincipalError("the shared --token is also a principal's token")
        by_digest[shared] = Credential(SHARED, shared, "shared")
    patterns = {p for principal in by_name.values() for p in principal.seats}
    return PrincipalTable(by_name, by_digest, shared, source,
                          held_seats=frozenset(p for p in patterns
                                               if p != EVERY and not p.endswith("/*")),
                          held_prefixes=frozenset(p[:-1] for p in patterns if p.endswith("/*")),
                          held_everything=EVERY in patterns, orgs=dict(orgs or {}))


def parse_principals_file(doc: object, shared_token: str | None = None,
                          source: str = "file") -> PrincipalTable:
    """The declarative form (`--principals FILE`, docs/identity.md):

        {"principals": [{"name": "alice", "seats": ["PROJ/alice"],
                         "tokens": [{"sha256": "<64 hex>", "label": "laptop"}],
                         "grants": {"claim": ["PROJ"], "mailbox": []}}]}
    """
    if not isinstance(doc, dict) or set(doc) - {"principals"} or not isinstance(
            doc.get("principals"), list):
        raise PrincipalError('a principals file is {"principals": [...]}')
    principals, tokens = [], []
    for entry in doc["principals"]:
        if not isinstance(entry, dict) or set(entry) - {"name", "seats", "tokens", "grants"}:
            raise PrincipalError("each principal is {name, seats, tokens, grants}")
        grants = entry.get("grants")
        if grants is not None and not isinstance(grants, dict):
            raise PrincipalError(f"principal {entry.get('name')!r}: grants is an object")
        principal = make_principal(entry.get("name"), entry.get("seats"), grants)
        principals.append(principal)
        listed = entry.get("tokens", [])
        if not isinstance(listed, list) or len(listed) > MAX_TOKENS_PER_PRINCIPAL:
            raise PrincipalError(f"principal {principal.name!r}: tokens is a list of at most "
                                 f"{MAX_TOKENS_PER_PRINCIPAL}")
        for token in listed:
            if not isinstance(token, dict) or set(token) - {"sha256", "label"} or not isinstance(
                    token.get("sha256"), str):
                raise PrincipalError(f"principal {principal.name!r}: a token is "
                                     '{"sha256": "<digest>", "label": "..."} (never the token)')
            tokens.append((principal.name, token["sha256"],
                           check_label(token.get("label", "default"))))
    return build_table(principals, tokens, shared_token, source)


# -- decisions the doors and the Router make


def speak_refusal(table: PrincipalTable, credential: Credential | None, seat: str) -> str | None:
    """Why this connection may not register as `seat`, or None if it may."""
    if not table.enforcing or credential is None:
        return None  # an open or shared-token hub: names are not bound
    principal = credential.principal
    if principal.speaks_for(seat):
        return None
    return (f"Principal '{principal.name}' may not speak for '{seat}' "
            f"(its seats: {', '.join(principal.seats)}).")


def takeover_refusal(holder_principal: str, principal: str, seat: str) -> str | None:
    if holder_principal == principal:
        return None
    return (f"Takeover of '{seat}' denied: it is held by another principal; "
            "a takeover works only within the same principal.")


def seat_holders(table: PrincipalTable, seat: str) -> tuple[str, ...]:
    """The principals of the hub's own table whose seat patterns cover `seat`:
    only their tokens speak for it. The shared --token's principal is no
    one's holder (it speaks for every seat no principal holds)."""
    if not table.held(seat):
        return ()
    return tuple(name for name, principal in table.principals.items()
                 if principal.speaks_for(seat))


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def admission_refusal(table: PrincipalTable, credential: str | None, peer_host: str,
                      open_network: bool, seat: str) -> str | None:
    """Whether an agent may register as `seat` at all (speak_refusal then
    decides which seats a token's principal has). With a token, the
    principal decides. Without one (a connection that came in on a TLS
    client certificate alone may be a peer hub, never an agent with more):
    refused on a hub with a shared --token; on a hub without one, refused on
    a seat a principal holds (it needs that principal's token) and otherwise
    admitted from loopback, or from any address with --open-network, exactly
    as on an open hub."""
    if credential is not None:
        return None
    if not table.tokenless:
        return "Authentication token required."
    if table.held(seat):
        return f"Seat '{seat}' belongs to a principal: it needs that principal's token."
    if open_network or _is_loopback(peer_host):
        return None
    return ("This hub has no --token, so it admits agents without a token from loopback "
            "only (connect with a principal's token, or start the hub with --open-network).")


def session_refusal(table: PrincipalTable, credential: str | None, seat: str | None) -> str | None:
    """Why a live session may no longer stay, after the table changed."""
    if credential is None:
        if not table.tokenless:
            return "This hub now requires a token; reconnect with one."
        if seat is not None and table.held(seat):
            return f"Seat '{seat}' now belongs to a principal; reconnect with its token."
        return None
    found = table.credential(credential)
    if found is None:
        return "Token revoked."
    if seat is None:
        return None
    return speak_refusal(table, found, seat)


# -- grants: the seat-level ACL for claims, the board and mailbox_for
#
# Each check answers None (allowed) or a GrantRefusal. No ACL applies on a hub
# without principals of its own (open, or only the shared --token): there the
# verbs behave exactly as before principals. On a hub with principals a
# session's credential names its principal (the shared --token's holds every
# grant); a session whose token is gone (revoked, awaiting its 4010) holds none.

NOT_GRANTED = "NOT_GRANTED"  # the reason_code of every grant refusal
ERROR_CODE = "not_granted"  # the error_code of a grant refusal sent as `error`
# the audit-only journal kind of a grant refusal (claims keep claim_denial);
# it has no applier, so replay never changes state from it
ACL_DENIAL = "acl_denial"
EVIDENCE_CHARS = 256  # names kept in an acl_denial row are cut to this


@dataclass(frozen=True, slots=True)
class GrantRefusal:
    grant: str  # claim | board | mailbox
    principal: str
    namespace: str | None  # claim, board: the namespace refused
    mailbox: str | None  # mailbox: the seat whose mailbox was asked for
    text: str
    reason_code: str = NOT_GRANTED


def _grantee(table: PrincipalTable, credential: str | None, name: str) -> Principal | None:
    """The principal whose grants decide, or None when no ACL applies."""
    if not table.enforcing:
        return None
    if credential is None and table.tokenless:
        return None  # an agent without a token, on a seat no principal holds: as if open
    found = table.credential(credential)
    if found is None:  # a revoked token (or none, on a shared-token hub): no grants
        return Principal(name or "unknown", (), claim=(), board=(), mailbox=(), control=())
    return found.principal


def _shown(patterns: tuple[str, ...]) -> str:
    return ", ".join(patterns) if patterns else "none"


def _namespace_grant_shown(principal: Principal, grant: str) -> str:
    value = getattr(principal, grant)
    if value is None:
        own = principal.own_namespaces()
        bare = " and seats without a namespace" if _has_bare_seat(principal) else ""
        return f"its own namespaces: {_shown(own)}{bare}"
    return _shown(value)


def _has_bare_seat(principal: Principal) -> bool:
    return any(p != EVERY and "/" not in p for p in principal.seats)


def _namespace_allowed(principal: Principal, grant: str, namespace: str | None) -> bool:
    value = getattr(principal, grant)
    if namespace is None and value is None and _has_bare_seat(principal):
        return True  # a bare seat's own claims and tasks have no namespace
    return _namespace_granted(value, principal, namespace)


def _in(namespace: str | None) -> str:
    return f"namespace '{namespace}'" if namespace is not None else "no namespace"


def _namespace_refusal(grant: str, doing: str, table: PrincipalTable, credential: str | None,
                       principal_name: str, namespaces) -> GrantRefusal | None:
    principal = _grantee(table, credential, principal_name)
    if principal is None:
        return None
    for namespace in namespaces:
        if not _namespace_allowed(principal, grant, namespace):
            return GrantRefusal(grant, principal.name, namespace, None,
                                f"Principal '{principal.name}' may not {doing} "
                                f"{_in(namespace)} (its {grant} grant: "
                                f"{_namespace_grant_shown(principal, grant)})"
                                + ("." if grant == "claim" else "; nothing was changed."))
    return None


def claim_refusal(table: PrincipalTable, credential: str | None, principal_name: str,
                  namespaces) -> GrantRefusal | None:
    """Whether this session may take or give a lease in every one of
    `namespaces` (a claim: the claimant seat's; a handoff: the holder's and the
    recipient's). The first one refused, or None."""
    return _namespace_refusal("claim", "claim in", table, credential, principal_name,
                              namespaces)


def board_refusal(table: PrincipalTable, credential: str | None, principal_name: str,
                  namespaces) -> GrantRefusal | None:
    """Whether this session may post to the board in every one of `namespaces`
    (hubd.state.board.namespaces_touched). The first one refused, or None."""
    return _namespace_refusal("board", "post to the board in", table, credential,
                              principal_name, namespaces)


def mailbox_choice(table: PrincipalTable, credential: str | None, principal_name: str,
                   seat: str, mailbox_for) -> tuple[str, GrantRefusal | None]:
    """Whose mailbox a session may read or ack, and the refusal if it asked for
    one it may not: (identity, None) or (its own seat, refusal).

    Its own seat, or the seat whose -rx wake sidecar it is, needs no grant.
    On a hub without principals of its own any other name falls back to the
    session's own mailbox, as before principals. With principals, another
    name is read when the principal's mailbox grant covers it (its own seats,
    their sidecars, and the `mailbox` patterns), refused otherwise."""
    if not isinstance(mailbox_for, str) or not mailbox_for:
        return seat, None
    if mailbox_for == seat or seat == mailbox_for + RX_SUFFIX:
        return mailbox_for, None
    principal = _grantee(table, credential, principal_name)
    if principal is None:
        return seat, None
    if principal.may_read_mailbox(mailbox_for):
        return mailbox_for, None
    granted = _shown(principal.mailbox or ())
    shown = mailbox_for[:EVIDENCE_CHARS]
    return seat, GrantRefusal("mailbox", principal.name, None, shown,
                              f"Principal '{principal.name}' may not read the mailbox of "
                              f"'{shown}' (beyond its own seats, its "
                              f"mailbox grant: {granted}).")


def control_granted(table: PrincipalTable, credential: str | None, target: str) -> bool:
    """Whether the session's principal holds the `control` grant (the seed's
    DELIVERY_CONTROL) for `target`. A hub without tokens grants nobody, and
    neither does a revoked token."""
    found = table.credential(credential)
    return found is not None and found.principal.may_control(target)


def refusal_evidence(refusal: GrantRefusal, verb: str, seat: str | None,
                     task_id: str | None = None) -> dict:
    """The content-minimised acl_denial row: who (principal, seat), what verb
    and grant, where (namespace, or the mailbox asked for), and why. A task is
    named only by the SHA-256 of its id; no body, note, title or text."""
    row = {
        "decision": "deny",
        "durable": True,
        "grant": refusal.grant,
        "principal": refusal.principal[:EVIDENCE_CHARS],
        "reason_code": refusal.reason_code,
        "seat": (seat or "")[:EVIDENCE_CHARS],
        "verb": verb,
    }
    if refusal.grant == "mailbox":
        row["mailbox"] = refusal.mailbox
    else:
        row["namespace"] = (refusal.namespace[:EVIDENCE_CHARS]
                            if refusal.namespace is not None else None)
    if task_id is not None:
        row["task_id_sha256"] = hashlib.sha256(
            task_id.encode("utf-8", "surrogatepass")).hexdigest()
    return row

"""The reference's ACL policy (`--acl-policy`) and role grants (`--role-grants`):
their file formats and the pure decisions on them (docs/identity.md,
"The reference's identity files"; docs/reference-observed.md §11.3, §11.4).

A rule has no subject: it grants its permission on a target to every sender
(in its namespace, if it names one). Who may do what beyond that comes from
the role grants and the identity binding. First matching rule allows; no
match denies.
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase

from hubd.state.scope import normalize_path

PERMISSIONS = frozenset((
    "message", "claim", "release", "board", "metrics", "dashboard", "a2a", "namespace",
    "sandbox", "observe", "mailbox", "role-claim", "identity-pin-reclaim", "identity-enroll",
    "entitlement-advertise", "evidence", "recall", "delivery-control", "attachment-read",
    "attachment-write", "attachment-admin", "spend-request"))

# bounds on what a file may hold (a wrong path must not become a huge table)
MAX_RULES = 4096
MAX_GRANTS = 4096
MAX_GRANTEES = 4096
MAX_TEXT = 1024

ATTACHMENT_VERBS = {
    "attachment_begin": "attachment-write", "attachment_chunk": "attachment-write",
    "attachment_commit": "attachment-write", "attachment_abort": "attachment-write",
    "attachment_ref": "attachment-write", "attachment_info": "attachment-read",
    "attachment_read": "attachment-read", "attachment_gc": "attachment-admin",
}


class PolicyError(ValueError):
    """A policy or grants file that cannot be used; the text says why."""


@dataclass(frozen=True, slots=True)
class Rule:
    permission: str
    target_kind: str
    target_pattern: str
    namespace: str = ""
    reason: str = ""

    def matches(self, project: str, permission: str, kind: str, value: str) -> bool:
        return (self.permission == permission and self.target_kind == kind
                and (not self.namespace or self.namespace == project)
                and fnmatchcase(value, self.target_pattern))


@dataclass(frozen=True, slots=True)
class Denial:
    """A frame the ACL refuses: the reference's plain `error` says it."""

    permission: str
    kind: str
    value: str
    reason: str = "no rule grants this access (deny by default)"

    @property
    def text(self) -> str:
        return f"access denied: {self.permission} on {self.kind}:{self.value}"


def project_of(sender: str) -> str:
    """A sender's project: what precedes its first '/', or '' (the reference's)."""
    head, slash, _ = sender.partition("/")
    return head if slash else ""


def _text(entry: dict, key: str) -> str:
    value = entry.get(key, "")
    if value is None:
        return ""
    if not isinstance(value, (str, int, float)) or isinstance(value, bool):
        raise PolicyError(f"'{key}' must be text")
    value = str(value).strip()
    if len(value) > MAX_TEXT:
        raise PolicyError(f"'{key}' is over {MAX_TEXT} characters")
    return value


def parse_acl_policy(doc) -> tuple[Rule, ...]:
    """The rules of an ACL policy document ({"rules": [...]}), or PolicyError
    with the reference's sentence for a bad rule."""
    if not isinstance(doc, dict) or not isinstance(doc.get("rules"), list):
        raise PolicyError("ACL policy must be an object with a 'rules' list")
    entries = doc["rules"]
    if len(entries) > MAX_RULES:
        raise PolicyError(f"ACL policy has more than {MAX_RULES} rules")
    rules = []
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise PolicyError(f"ACL rule {index} must be an object")
        try:
            permission = _text(entry, "permission")
            kind, pattern = _text(entry, "target_kind"), _text(entry, "target_pattern")
            namespace, reason = _text(entry, "namespace"), _text(entry, "reason")
        except PolicyError as exc:
            raise PolicyError(f"ACL rule {index}: {exc}") from None
        if permission not in PERMISSIONS:
            raise PolicyError(f"ACL rule {index} has unknown permission '{permission}'")
        if not kind or not pattern:
            raise PolicyError(f"ACL rule {index} needs non-empty target_kind and target_pattern")
        rules.append(Rule(permission, kind, pattern, namespace, reason))
    return tuple(rules)


def parse_role_grants(doc) -> dict[str, tuple[str, ...]]:
    """`{"grants": {"<project>/<role>": [identity or glob, ...]}}` as a table."""
    if not isinstance(doc, dict) or not isinstance(doc.get("grants"), dict):
        raise PolicyError("role grants must be an object with a 'grants' object")
    grants = doc["grants"]
    if len(grants) > MAX_GRANTS:
        raise PolicyError(f"role grants name more than {MAX_GRANTS} roles")
    table = {}
    for role, who in grants.items():
        if not role or len(role) > MAX_TEXT:
            raise PolicyError("a role name must be 1 to 1024 characters")
        if not isinstance(who, list) or len(who) > MAX_GRANTEES or \
                not all(isinstance(w, str) and 0 < len(w) <= MAX_TEXT for w in who):
            raise PolicyError(f"role '{role}' must list identities (at most {MAX_GRANTEES})")
        table[role] = tuple(who)
    return table


def holds_role(grants: dict[str, tuple[str, ...]], sender: str, role: str) -> bool:
    """Does `sender` hold `role` (`<project>/<role>`)? Grantees may be globs."""
    return any(fnmatchcase(sender, who) for who in grants.get(role, ()))


def _task(frame: dict, *fields: str) -> str:
    for name in fields:
        value = frame.get(name)
        if value is not None and value != "":
            return str(value)
    return ""


def required_accesses(type_: str, frame: dict, sender: str) -> list[tuple[str, str, str]]:
    """The (permission, target kind, target value) accesses a frame needs;
    [] for a frame the gate does not look at (reads, keepalives, hubd's own
    verbs). The mapping is the reference's, verb by verb."""
    if type_ in ATTACHMENT_VERBS:
        scope = frame.get("scope")
        return [(ATTACHMENT_VERBS[type_], "attachment", scope if isinstance(scope, str) else "")]
    if type_ == "claim":
        accesses = [("claim", "claim", _task(frame, "task_id", "payload"))]
        paths = frame.get("paths")
        if isinstance(paths, list):
            accesses += [("claim", "path", normalize_path(p) or "") for p in paths
                         if isinstance(p, str) and p]
        return accesses
    if type_ == "release":
        return [("release", "claim", _task(frame, "task_id", "payload"))]
    if type_ in ("task_update", "handoff", "checkpoint"):
        return [("claim", "claim", _task(frame, "task_id", "id", "payload"))]
    if type_ in ("channel_create", "channel_invite", "channel_join", "channel_leave"):
        channel = frame.get("channel")  # the reference's: message on channel:<id>
        return [("message", "channel", channel.strip() if isinstance(channel, str) else "")]
    if type_ in ("chat", "delivery_request"):
        target = frame.get("target")
        return [("message", "agent", target if isinstance(target, str) else "")]
    if type_ in ("ledger_task", "ledger_task_update", "ledger_progress"):
        return [("board", "board", _task(frame, "task_id"))]
    if type_ == "advertise":
        return [("board", "capability", "*")]
    if type_ in ("resource", "resource_offer", "offer_resource"):
        return [("board", "resource", "*")]
    if type_ == "identity_pin_reclaim":
        name = frame.get("pin_name")
        return [("identity-pin-reclaim", "agent", name if isinstance(name, str) else "")]
    if type_ in ("identity_enroll", "identity_revoke"):
        name = frame.get("name")
        return [("identity-enroll", "agent", name if isinstance(name, str) else "")]
    if type_ == "guard_denial":  # seed 000: evidence on target evidence:guard-denial
        return [("evidence", "evidence", "guard-denial")]
    if type_ == "history_request":
        if frame.get("inbox_query") is not None:
            return [("mailbox", "agent", "")]
        return [("recall", "history", "global")]
    return []


def allowed(rules: tuple[Rule, ...], sender: str, permission: str, kind: str,
            value: str) -> bool:
    project = project_of(sender)
    return any(rule.matches(project, permission, kind, value) for rule in rules)


def acl_denial(rules: tuple[Rule, ...], sender: str, type_: str,
               frame: dict) -> Denial | None:
    """The first access of the frame no rule grants, or None."""
    for permission, kind, value in required_accesses(type_, frame, sender):
        if not allowed(rules, sender, permission, kind, value):
            return Denial(permission, kind, value)
    return None

"""The reference hub's identity, ACL, per-message authentication and
attachment flags on the `hubd` command line, with the reference's names and
file formats (docs/identity.md, "The reference's identity files"): an
operator's reference command line starts hubd unchanged. What requires what
is refused here, before anything is opened, with the reference's sentences
where it has one.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from hubd.actors.signed_identity import mac_keyring
from hubd.config import SecurityConfig
from hubd.state.acl import PolicyError
from hubd.state.message_auth import (DEFAULT_CAPACITY, DEFAULT_WINDOW, FLOOR_MODES,
                                     KeyFormatError, MacKey, parse_key)

UNBOUND_MULTI_SEAT = (
    "Refusing to start: this hub declares a multi-seat profile (--identity-trust or "
    "--role-grants) without provisioned identity, so any client that can connect can "
    "register as any seat; enrol each seat's key and pass --identity-trust FILE with "
    "--require-identity-binding, or pass --insecure-unbound-identity to start anyway "
    "(not recommended).")
BINDING_WITHOUT_TRUST = ("--require-identity-binding requires --identity-trust; there is no "
                         "identity key material to verify a registration against.")
ATTACHMENTS_NEED = ("--attachment-root requires token, bound identity, durable signed frames, "
                    "ACL, role grants, and --db")


# --team-secure (the reference's profile; docs/channels.md): what it needs, in
# the reference's check order and words
TEAM_SECURE_NEEDS = (
    ("token", "team-secure mode requires --token or --token-file (identity and role grants "
              "are only as strong as the connect gate)"),
    ("identity_trust", "team-secure mode requires --identity-trust (Ed25519 trust bundle for "
                       "connection identity binding)"),
    ("role_grants", "team-secure mode requires --role-grants (deny-by-default store for which "
                    "identities may claim which roles)"),
)


def team_secure_problem(args: argparse.Namespace, token: str | None) -> str | None:
    """Why --team-secure cannot start (the first missing need), or None."""
    have = {"token": token, "identity_trust": (args.identity_trust or "").strip(),
            "role_grants": (args.role_grants or "").strip()}
    for need, text in TEAM_SECURE_NEEDS:
        if not have[need]:
            return text
    return None


def apply_team_secure(args: argparse.Namespace, token: str | None,
                      problems: list[str]) -> None:
    """--team-secure: refuse to start without a token, an identity trust
    bundle and role grants; else force identity binding and private directed
    messages (the reference's profile, as far as hubd has the gates)."""
    if not getattr(args, "team_secure", False):
        return
    problem = team_secure_problem(args, token)
    if problem is not None:
        problems.append(problem)
        return
    args.require_identity_binding = True
    args.private_directed_messages = True


def add_security_flags(parser: argparse.ArgumentParser) -> None:
    ident = parser.add_argument_group(
        "identity, ACL and signed frames (the reference hub's flags and files; "
        "docs/identity.md)")
    ident.add_argument("--team-secure", action="store_true",
                       help="needs --token, --identity-trust and --role-grants; forces "
                            "--require-identity-binding and --private-directed-messages")
    ident.add_argument("--identity-trust", metavar="FILE",
                       help="trust bundle of Ed25519 identity keys ({\"keys\": [...]})")
    ident.add_argument("--capability-card-trust", metavar="FILE",
                       help="Ed25519 keys that sign capability cards ({\"keys\": [{key_id, "
                            "public_key, agents, projects}]}); a card's verification is "
                            "projected on it, never used to authorise (docs/capabilities.md)")
    ident.add_argument("--require-identity-binding", action="store_true",
                       help="a registration must carry a signature by a key the trust "
                            "bundle binds to its sender")
    ident.add_argument("--insecure-unbound-identity", action="store_true",
                       help="start with --identity-trust or --role-grants but without "
                            "--require-identity-binding (not recommended)")
    ident.add_argument("--acl-policy", metavar="FILE", help="ACL rules ({\"rules\": [...]})")
    ident.add_argument("--require-acl", action="store_true",
                       help="refuse a frame no ACL rule grants, before any state changes")
    ident.add_argument("--role-grants", metavar="FILE",
                       help="role grants ({\"grants\": {\"<project>/<role>\": [...]}})")
    ident.add_argument("--message-auth-key", action="append", default=[],
                       metavar="KEY_ID:SECRET:SENDER[,SENDER...]",
                       help="a per-message HMAC key bound to its senders (repeatable)")
    ident.add_argument("--message-auth-key-file", metavar="PATH",
                       help="owner-only file of KEY_ID:SECRET:SENDER[,...] lines")
    ident.add_argument("--require-message-auth", action="store_true",
                       help="the mutating verbs need a valid `auth` object")
    ident.add_argument("--message-auth-window-seconds", type=float, default=DEFAULT_WINDOW,
                       metavar="SECONDS", help="how old a signed frame may be")
    ident.add_argument("--message-auth-replay-capacity", type=int, default=DEFAULT_CAPACITY,
                       metavar="N", help="fresh nonces remembered at most")
    ident.add_argument("--message-auth-replay-db", metavar="PATH",
                       help="the reference's separate nonce ledger; hubd keeps accepted "
                            "nonces in its journal, with each frame's effects, and does not "
                            "open this file (docs/identity.md)")
    ident.add_argument("--message-auth-sequence-floor-mode", choices=FLOOR_MODES,
                       default="off", help="strict: refuse a signed frame whose sequence is "
                       "at or below the highest its key and sender had accepted (kept in the "
                       "journal, across restarts); off and compat accept it")
    ident.add_argument("--identity-enrollments", metavar="FILE",
                       help="turn on online enrolment (identity_enroll, identity_revoke); "
                            "hubd keeps the enrolled keys in its journal and does not open "
                            "FILE (docs/identity.md); requires --identity-trust")
    ident.add_argument("--identity-enrollment-namespace", action="append", default=[],
                       metavar="PROJECT", help="project namespace online enrolment may add "
                       "names to (repeatable; none by default)")
    ident.add_argument("--identity-enrollment-rate", type=int, default=10, metavar="N",
                       help="enrolment changes one operator may make per window (10)")
    ident.add_argument("--identity-enrollment-window", type=float, default=3600.0,
                       metavar="SECONDS", help="the window of --identity-enrollment-rate (3600)")
    ident.add_argument("--attachment-root", metavar="DIR",
                       help="owner-only directory of scoped attachments (wire v4)")
    ident.add_argument("--attachment-max-bytes", type=int, default=4 * 1024 ** 3,
                       metavar="BYTES", help="bound on the bytes under --attachment-root "
                       "(hubd's; default 4 GiB): a full root refuses new uploads")
    ident.add_argument("--attachment-recipient-policy", metavar="FILE",
                       help="owner-only grants of attachments to recipient hubs (wire v6)")


def _keys(args: argparse.Namespace, problems: list[str]) -> tuple[MacKey, ...]:
    """--message-auth-key's keys; the key file is read here too, to refuse a
    start it cannot serve (the hub reads it again at start and on SIGHUP)."""
    try:
        keys = [parse_key(entry) for entry in args.message_auth_key]
    except KeyFormatError as exc:
        problems.append(str(exc))
        return ()
    path = Path(args.message_auth_key_file) if args.message_auth_key_file else None
    try:
        mac_keyring(SecurityConfig(message_auth_keys=tuple(keys), message_auth_key_file=path))
    except PolicyError as exc:
        problems.append(str(exc))
        return ()
    return tuple(keys)


def security_config(args: argparse.Namespace, token: str | None,
                    problems: list[str]) -> SecurityConfig:
    """The SecurityConfig the flags say; a problem found is appended."""
    apply_team_secure(args, token, problems)
    if args.require_identity_binding and not args.identity_trust:
        problems.append(BINDING_WITHOUT_TRUST)
    if (args.identity_trust or args.role_grants) and not args.require_identity_binding \
            and not args.insecure_unbound_identity:
        problems.append(UNBOUND_MULTI_SEAT)
    if args.require_acl and not args.acl_policy:
        problems.append("--require-acl requires --acl-policy: without rules every frame the "
                        "ACL gates would be refused")
    if not args.message_auth_window_seconds > 0:
        problems.append("--message-auth-window-seconds must be positive")
    if not args.attachment_max_bytes > 0:
        problems.append("--attachment-max-bytes must be positive")
    if not args.message_auth_replay_capacity > 0:
        problems.append("--message-auth-replay-capacity must be positive")
    if args.message_auth_replay_db and not args.require_message_auth:
        problems.append("--message-auth-replay-db requires --require-message-auth")
    if args.message_auth_sequence_floor_mode != "off" and not args.require_message_auth:
        problems.append("--message-auth-sequence-floor-mode requires --require-message-auth")
    keys = _keys(args, problems)
    _enrollment_problems(args, problems)
    if args.attachment_root and not (token and args.require_identity_binding
                                     and args.require_message_auth and args.require_acl
                                     and args.role_grants):
        problems.append(ATTACHMENTS_NEED)
    if args.attachment_recipient_policy and not args.multihub_serving_policy:
        problems.append("attachment recipient policy unavailable or invalid: "
                        "--attachment-recipient-policy needs --multihub-serving-policy")

    def path(value):
        return Path(value) if value else None

    return SecurityConfig(
        identity_trust=path(args.identity_trust),
        capability_card_trust=path(args.capability_card_trust),
        require_identity_binding=args.require_identity_binding,
        acl_policy=path(args.acl_policy), require_acl=args.require_acl,
        role_grants=path(args.role_grants), message_auth_keys=keys,
        message_auth_key_file=path(args.message_auth_key_file),
        require_message_auth=args.require_message_auth,
        message_auth_floor_mode=args.message_auth_sequence_floor_mode,
        message_auth_replay_db=path(args.message_auth_replay_db),
        message_auth_window=args.message_auth_window_seconds,
        message_auth_replay_capacity=args.message_auth_replay_capacity,
        attachment_root=path(args.attachment_root),
        attachment_max_bytes=args.attachment_max_bytes,
        attachment_recipient_policy=path(args.attachment_recipient_policy),
        identity_enrollments=path(args.identity_enrollments),
        identity_enrollment_namespaces=tuple(args.identity_enrollment_namespace),
        identity_enrollment_rate=args.identity_enrollment_rate,
        identity_enrollment_window=args.identity_enrollment_window)


ENROLLMENTS_NEED = ("online identity enrolment needs an identity trust bundle and a durable "
                    "journal: pass --identity-trust and --db with --identity-enrollments")


def _enrollment_problems(args: argparse.Namespace, problems: list[str]) -> None:
    """--identity-enrollments and its companions (docs/identity.md, "Governed
    identity recovery"). hubd always has its journal; a reference store with
    keys in it is refused rather than silently left behind."""
    if args.identity_enrollments and not args.identity_trust:
        problems.append(ENROLLMENTS_NEED)
    if args.identity_enrollment_rate < 0:
        problems.append("--identity-enrollment-rate must not be negative")
    if not args.identity_enrollment_window > 0:
        problems.append("--identity-enrollment-window must be positive")
    if (args.identity_enrollment_namespace or args.identity_enrollment_rate != 10
            or args.identity_enrollment_window != 3600.0) and not args.identity_enrollments:
        problems.append("--identity-enrollment-namespace, -rate and -window require "
                        "--identity-enrollments")
    store = Path(args.identity_enrollments) if args.identity_enrollments else None
    if store is not None and _holds_keys(store):
        problems.append(
            f"--identity-enrollments {store} holds a reference hub's enrolled keys; hubd keeps "
            "enrolled keys in its journal and does not read that file: move its live keys "
            "into --identity-trust (or remove the file) before starting")


def _holds_keys(store: Path) -> bool:
    """Does the reference's enrolment store hold keys (or is it unreadable,
    so that it may)? An absent, empty or `{"keys": []}` file holds none."""
    try:
        if not store.exists() or store.stat().st_size == 0:
            return False
        if store.stat().st_size > 4 * 1024 * 1024:
            return True
        doc = json.loads(store.read_bytes())
    except (OSError, ValueError):
        return True
    return not (isinstance(doc, dict) and doc.get("keys") == [])

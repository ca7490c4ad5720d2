"""`hubd --config FILE`: a hub's flags as a TOML file.

A key is a flag's long name without its dashes, spelled exactly as the flag
(`message-peer`, never `message_peer`: one spelling, so a file can be grepped
for a flag and `--help` documents every key). Values take the flag's type: a
repeatable flag is a list of strings, an on/off flag a boolean, a number a
number. Relative paths resolve beside the file, so a site's folder can move.
Flags on the command line override the file, a repeatable flag's list as a
whole. docs/operations.md, "Configuration file", is the user's page.

Everything here is pure over the parser hubd.cli builds: reading a file into
flag values (every problem at once), layering them under the command line,
rendering the effective configuration, and deciding which changes a SIGHUP
may apply to a running hub.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

# flags that steer the command itself and are no keys
COMMAND_FLAGS = frozenset({"config", "check", "help", "version", "timing"})
# keys naming a file or folder: a relative value resolves beside the config file
PATH_KEYS = frozenset({
    "db", "token-file", "principals", "metrics-token-file", "tls-certfile", "tls-keyfile",
    "multihub-serving-policy", "message-peer-token-file", "multihub-client-certfile",
    "multihub-client-keyfile", "broker-socket", "broker-token-file", "identity-trust",
    "acl-policy", "role-grants", "message-auth-key-file", "attachment-root",
    "attachment-recipient-policy", "message-auth-replay-db", "identity-enrollments", "capability-card-trust",
    "spend-ledger"})
# HUB=PIN or HUB=@FILE: the FILE resolves beside the config file
PIN_KEYS = frozenset({"message-peer-pin", "multihub-watch-pin", "claim-peer-pin",
                      "relay-peer-pin"})
# values never printed, and a file holding one must be owner-only
SECRET_KEYS = frozenset({"token", "metrics-token", "message-peer-token", "multihub-watch-token",
                         "claim-peer-token", "relay-peer-token", "message-auth-key"})
# What a SIGHUP applies to a running hub: federation's peers, pins, tokens,
# certificates and serving policy (re-read files included). Everything else
# is read once at start; a reload that changes it is refused whole, naming it.
LIVE_KEYS = frozenset({
    "message-peer", "message-peer-pin", "message-peer-token", "message-peer-token-file",
    "multihub-client-certfile", "multihub-client-keyfile", "tls-certfile", "tls-keyfile",
    "multihub-serving-policy", "claim-peer-pin", "claim-peer-token", "multihub-watch-pin",
    "multihub-watch-token", "relay-peer-pin", "relay-peer-token"})

DEFAULT, FILE, FLAG = "default", "file", "flag"
MAX_FILE_BYTES = 1024 * 1024  # a hub's flags fit in far less


class ConfigProblems(ValueError):
    """The configuration cannot be used; `problems` names each thing wrong."""

    def __init__(self, problems: Sequence[str]):
        self.problems = list(problems)
        super().__init__("; ".join(self.problems))


@dataclass
class Layers:
    """The effective flag values (argparse dests) and where each came from."""

    args: argparse.Namespace
    sources: dict[str, str]  # dest -> DEFAULT, FILE or FLAG
    actions: dict[str, argparse.Action]  # key (the flag's long name) -> its action
    problems: list[str] = field(default_factory=list)  # in the file's keys and values
    path: str | None = None  # the config file, if any

    def value(self, key: str) -> object:
        return getattr(self.args, self.actions[key].dest, None)


def keys_of(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """key -> action for every flag a config file may set."""
    out = {}
    for action in parser._actions:
        for option in action.option_strings:
            if option.startswith("--") and option[2:] not in COMMAND_FLAGS:
                out[option[2:]] = action
    return out


def read(path: str) -> dict:
    """The TOML document at `path` (ConfigProblems: unreadable or not TOML)."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigProblems([f"config file {path}: cannot read it: {exc.strerror or exc}"]) \
            from None
    if len(data) > MAX_FILE_BYTES:
        raise ConfigProblems([f"config file {path} is over {MAX_FILE_BYTES} bytes"])
    import tomllib  # only a hub started with --config reads TOML

    try:
        return tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise ConfigProblems([f"config file {path} is not UTF-8 text"]) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigProblems([f"config file {path} is not valid TOML: {exc}"]) from None


def file_values(document: dict, parser: argparse.ArgumentParser,
                path: str) -> tuple[dict[str, object], list[str]]:
    """(dest -> value, problems) for a config document: every key checked,
    every problem named, the good keys kept."""
    actions = keys_of(parser)
    base = Path(os.path.abspath(path)).parent
    values: dict[str, object] = {}
    owner: dict[str, str] = {}  # dest -> the key that set it
    problems: list[str] = []
    for key, value in document.items():
        where = f"config file {path}: {key}"
        action = actions.get(key)
        if isinstance(value, dict):
            problems.append(f"config file {path}: [{key}] is a table; the keys are hubd's flag "
                            "names, at the top of the file, in no table")
            continue
        if action is None:
            problems.append(f"config file {path}: unknown key {key!r}{_suggestion(key, actions)}")
            continue
        try:
            converted = _convert(key, action, value, base)
        except _Bad as exc:
            problems.append(f"{where} {exc}")
            continue
        if action.dest in owner:
            problems.append(f"config file {path}: {key} and {owner[action.dest]} set the same "
                            "thing; keep one")
            continue
        owner[action.dest] = key
        values[action.dest] = converted
    return values, problems


class _Bad(Exception):
    """One key's value is wrong; the message says how."""


def _suggestion(key: str, actions: dict) -> str:
    if key.replace("_", "-") in actions:
        return f"; keys are spelled as the flags: {key.replace('_', '-')!r}"
    if key in COMMAND_FLAGS:
        return f"; --{key} is given on the command line only"
    close = difflib.get_close_matches(key, list(actions), n=1)
    return f"; did you mean {close[0]!r}?" if close else " (hubd --help lists the flags)"


def _kind(value: object) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
            list: "a list", dict: "a table"}.get(type(value), type(value).__name__)


def _convert(key: str, action: argparse.Action, value: object, base: Path) -> object:
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        if not isinstance(value, bool):
            raise _Bad(f"must be true or false, not {_kind(value)}")
        return action.const if value else not action.const
    if isinstance(action, argparse._AppendAction):
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise _Bad('must be a list of strings, e.g. ["a", "b"] (it is a repeatable flag)')
        if key in PIN_KEYS:
            return [_pin_beside(v, base) for v in value]
        return list(value)
    if not isinstance(action, argparse._StoreAction):
        raise _Bad("cannot be set in a config file")
    if action.type is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _Bad(f"must be an integer, not {_kind(value)}")
    elif action.type is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _Bad(f"must be a number, not {_kind(value)}")
        value = float(value)
    elif not isinstance(value, str) or not value:
        raise _Bad(f"must be a non-empty string, not {_kind(value)}")
    if action.choices is not None and value not in action.choices:
        raise _Bad(f"must be one of {', '.join(map(str, action.choices))}, not {value!r}")
    if key in PATH_KEYS:
        return str(base / value)
    return value


def _pin_beside(value: str, base: Path) -> str:
    hub, sep, pin = value.partition("=")
    if sep and pin.startswith("@"):
        return f"{hub}=@{os.path.join(base, pin[1:])}"
    return value


def given_on_command_line(make_parser: Callable[[], argparse.ArgumentParser],
                          argv: Sequence[str]) -> set[str]:
    """The dests `argv` sets itself (a parser whose every default is SUPPRESS
    leaves the others out of its namespace)."""
    parser = make_parser()
    for action in parser._actions:
        action.default = argparse.SUPPRESS
    return set(vars(parser.parse_args(list(argv))))


def layer(make_parser: Callable[[], argparse.ArgumentParser], argv: Sequence[str]) -> Layers:
    """The effective flags: the defaults, under the config file (--config),
    under the command line. Argparse exits on a malformed flag; a config file
    that cannot be read at all raises ConfigProblems; problems in its keys
    are returned in Layers.problems with the good keys applied."""
    parser = make_parser()
    args = parser.parse_args(list(argv))
    actions = keys_of(parser)
    given = given_on_command_line(make_parser, argv)
    sources = {action.dest: (FLAG if action.dest in given else DEFAULT)
               for action in actions.values()}
    layers = Layers(args, sources, actions, path=args.config)
    if args.config is None:
        return layers
    values, layers.problems = file_values(read(args.config), parser, args.config)
    for dest, value in values.items():
        if dest not in given:
            setattr(args, dest, value)
            sources[dest] = FILE
    return layers


def changed_keys(before: Layers, after: Layers) -> list[str]:
    """The keys whose effective value differs between two layerings."""
    return sorted(key for key in after.actions if before.value(key) != after.value(key))


def restart_needed(changed: Sequence[str]) -> list[str]:
    """Of the changed keys, those a running hub cannot take on (pure)."""
    return sorted(key for key in changed if key not in LIVE_KEYS)


def render(layers: Layers, header: str, unset: dict | None = None) -> str:
    """The effective configuration as a TOML file hubd reads back: every key
    with a value, its source in a comment, paths absolute, secrets never
    shown. An on/off
    flag prints as the key that is on (`warn-stale-recipients = true`), and
    not at all when none is. `unset` gives the effective value of keys whose
    flag defaults to None (the timing flags: their default is the profile's)."""
    unset = unset or {}
    lines = [f"# {line}".rstrip() for line in header.splitlines()]
    for key, action in layers.actions.items():
        value = layers.value(key)
        source = layers.sources[action.dest]
        if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
            if value != action.const:
                continue
            value = True
        elif value is None and key in unset:
            value = unset[key]
        elif value is None or value == []:
            continue
        elif key in PATH_KEYS:  # absolute: the rendering reads back the same from anywhere
            value = os.path.abspath(value)
        elif key in PIN_KEYS:
            value = [_pin_beside(pin, Path.cwd()) for pin in value]
        if key in SECRET_KEYS:
            lines.append(f"# {key} = (set, not shown)  # {source}")
        else:
            lines.append(f"{key} = {_toml(value)}  # {source}")
    return "\n".join(lines) + "\n"


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return json.dumps(str(value), ensure_ascii=False)

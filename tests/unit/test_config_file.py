"""hubd/config_file.py over hubd's own parser: a TOML file's keys are the
flags, every problem of a file is named at once, paths resolve beside the
file, the command line overrides the file, the effective configuration
renders as a file that reads back the same, and a reload's changes are
sorted into live and restart-only."""

from __future__ import annotations

import argparse
import tomllib
from pathlib import Path

import pytest

from hubd import config_file
from hubd.cli import build_parser, hub_config
from hubd.config_file import (FILE, FLAG, LIVE_KEYS, PATH_KEYS, PIN_KEYS, SECRET_KEYS,
                              ConfigProblems)


def layered(tmp_path, text: str, *argv: str) -> config_file.Layers:
    path = tmp_path / "hub.toml"
    path.write_text(text)
    return config_file.layer(build_parser, ["--config", str(path), *argv])


def test_keys_are_the_flag_names_and_values_take_the_flags_types(tmp_path):
    layers = layered(tmp_path, """
hub-id = "east"
port = 9001
open-network = true
no-warn-stale-recipients = true
durable-ingress-window = 30
message-peer = ["west=ws://127.0.0.1:9002/"]
log-level = "DEBUG"
""")
    args = layers.args
    assert layers.problems == []
    assert (args.hub_id, args.port, args.open_network, args.warn_stale_recipients) == \
        ("east", 9001, True, False)
    assert args.durable_ingress_window == 30.0 and isinstance(args.durable_ingress_window, float)
    assert args.message_peer == ["west=ws://127.0.0.1:9002/"] and args.log_level == "DEBUG"
    assert layers.sources["port"] == FILE and layers.sources["max_clients"] == "default"
    config = hub_config(args)
    assert config.port == 9001 and not config.liveness.enabled


def test_relative_paths_and_pin_files_resolve_beside_the_file(tmp_path):
    layers = layered(tmp_path, """
db = "journal/hub.db"
tls-certfile = "/etc/abs.pem"
message-peer-pin = ["west=@pins/west.pins", "north=sha256:%s"]
""" % ("ab" * 32))
    assert layers.args.db == str(tmp_path / "journal" / "hub.db")
    assert layers.args.tls_certfile == "/etc/abs.pem"
    assert layers.args.message_peer_pin == [f"west=@{tmp_path}/pins/west.pins",
                                            "north=sha256:" + "ab" * 32]


def test_flags_override_the_file_and_a_repeated_flag_replaces_its_list(tmp_path):
    layers = layered(tmp_path, 'port = 9001\nhub-id = "east"\nallow-origin = ["https://a", '
                               '"https://b"]\n', "--port", "9005", "--allow-origin", "https://c")
    assert layers.args.port == 9005 and layers.sources["port"] == FLAG
    assert layers.args.allow_origin == ["https://c"]
    assert layers.args.hub_id == "east" and layers.sources["hub_id"] == FILE
    # a flag's path is the command line's: relative to the working directory
    assert layered(tmp_path, 'db = "a.db"', "--db", "b.db").args.db == "b.db"


def test_every_problem_of_a_file_is_named_at_once(tmp_path):
    layers = layered(tmp_path, """
prot = 9001
message_peer = ["west=ws://x/"]
max-clients = "many"
open-network = 1
log-level = "LOUD"
config = "other.toml"
port = true
allow-origin = "https://a"
warn-stale-recipients = true
no-warn-stale-recipients = true
lease-min-ttl = 5
[federation]
peer = "west"
""")
    said = "\n".join(layers.problems)
    for fragment in ("unknown key 'prot'; did you mean 'port'?",
                     "unknown key 'message_peer'; keys are spelled as the flags: 'message-peer'",
                     "max-clients must be an integer, not a string",
                     "open-network must be true or false, not an integer",
                     "log-level must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL, not 'LOUD'",
                     "unknown key 'config'; --config is given on the command line only",
                     "port must be an integer, not a boolean",
                     "allow-origin must be a list of strings",
                     "no-warn-stale-recipients and warn-stale-recipients set the same thing",
                     "[federation] is a table"):
        assert fragment in said, (fragment, said)
    assert len(layers.problems) == 10, said
    # the good keys still apply, so the flag checks can add theirs
    assert layers.args.lease_min_ttl == 5.0


def test_a_file_that_is_not_toml_or_not_there_is_one_problem(tmp_path):
    (tmp_path / "bad.toml").write_text("port = \n")
    with pytest.raises(ConfigProblems, match=r"bad.toml is not valid TOML: .*line 1"):
        config_file.layer(build_parser, ["--config", str(tmp_path / "bad.toml")])
    (tmp_path / "latin.toml").write_bytes(b'hub-id = "\xe9"\n')
    with pytest.raises(ConfigProblems, match="is not UTF-8 text"):
        config_file.layer(build_parser, ["--config", str(tmp_path / "latin.toml")])
    with pytest.raises(ConfigProblems, match="cannot read it: No such file"):
        config_file.layer(build_parser, ["--config", str(tmp_path / "absent.toml")])
    (tmp_path / "huge.toml").write_text("# padding\n" * 200_000)  # read no further than the bound
    with pytest.raises(ConfigProblems, match="is over 1048576 bytes"):
        config_file.layer(build_parser, ["--config", str(tmp_path / "huge.toml")])


def test_flag_problems_are_all_named_too():
    args = build_parser().parse_args(["--max-clients", "0", "--lease-min-ttl", "0",
                                      "--message-peer", "nope", "--broker-namespace", "a/b"])
    with pytest.raises(ConfigProblems) as refused:
        hub_config(args)
    assert len(refused.value.problems) == 4, refused.value.problems


def test_the_rendered_configuration_reads_back_the_same(tmp_path):
    layers = layered(tmp_path, """
hub-id = "east"
port = 9001
open-network = true
no-warn-stale-recipients = true
no-broker = true
message-peer = ["west=ws://127.0.0.1:9002/"]
message-peer-token = "s3cret"
""", "--max-clients", "7")
    text = config_file.render(layers, "header line")
    assert "s3cret" not in text and "# message-peer-token = (set, not shown)  # file" in text
    assert "max-clients = 7  # flag" in text and "port = 9001  # file" in text
    assert "no-warn-stale-recipients = true" in text and "no-redsyn" not in text
    again = tmp_path / "again.toml"
    again.write_text(text)
    back = config_file.layer(build_parser, ["--config", str(again)])
    assert back.problems == []
    for key in back.actions:
        if key in PATH_KEYS and layers.value(key) is not None:
            assert back.value(key) == str(Path.cwd() / layers.value(key)), key
        elif key not in SECRET_KEYS:
            assert back.value(key) == layers.value(key), key
    assert tomllib.loads(text)  # it is TOML


def test_which_keys_a_reload_may_change():
    assert config_file.restart_needed(["message-peer", "message-peer-pin", "tls-certfile"]) == []
    assert config_file.restart_needed(["message-peer", "port", "db"]) == ["db", "port"]
    assert "hub-id" not in LIVE_KEYS and "namespace-owner" not in LIVE_KEYS


def test_the_key_tables_name_real_flags_and_cover_every_file_flag():
    keys = config_file.keys_of(build_parser())
    for table in (PATH_KEYS, PIN_KEYS, SECRET_KEYS, LIVE_KEYS):
        assert table <= set(keys), table - set(keys)
    filelike = {key for key, action in keys.items()
                if isinstance(action, argparse._StoreAction)
                and (action.metavar in ("FILE", "PATH") or key.endswith(("-file", "file"))
                     or key in ("db",))}
    assert filelike <= PATH_KEYS, filelike - PATH_KEYS
    assert {key for key in keys if key.endswith("-pin")} == PIN_KEYS
    # the per-message HMAC keys hold their secret inline (KEY_ID:SECRET:SENDER)
    assert {key for key in keys if key.endswith("token")} | {"message-auth-key"} == SECRET_KEYS

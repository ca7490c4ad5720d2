"""The timing profile (hubd/timing.py): production's defaults, the overrides
a test gives a hub process with --timing FILE (unknown fields and values
that are not positive seconds are refused whole), and the public flags that
set some of its fields."""

import json
import math
from dataclasses import fields

import pytest

from hubd.cli import build_parser, config_from_args
from hubd.config import HubConfig
from hubd.timing import Timing, TimingError, read_overrides


def config(*argv: str) -> HubConfig:
    parser = build_parser()
    return config_from_args(parser.parse_args(list(argv)), parser)


def refused(*argv: str, capsys) -> str:
    with pytest.raises(SystemExit) as exit_:
        config(*argv)
    assert exit_.value.code == 2
    return capsys.readouterr().err


def test_production_defaults_are_the_documented_ones():
    t = Timing()
    assert all(getattr(t, f.name) > 0 for f in fields(t))
    # a few that docs and seeds name
    assert (t.send_stall, t.forward_answer, t.roster_timeout, t.auth_timeout) == (5, 10, 10, 10)
    assert (t.reaction_window, t.waiter_window, t.dark_seat_after) == (90, 20, 30)
    assert (t.link_ping, t.link_silence, t.stalled_after) == (0.5, 2, 10)
    assert HubConfig().timing == t
    assert config().timing == t


def test_overrides_replace_only_what_they_name():
    t = Timing().overridden({"send_stall": 0.5, "stalled_after": 1})
    assert t.send_stall == 0.5 and t.stalled_after == 1
    assert t.forward_answer == Timing().forward_answer


def test_an_unknown_field_is_refused_and_the_known_ones_are_listed():
    with pytest.raises(TimingError, match=r"unknown timing field\(s\) send_stal;.*send_stall"):
        Timing().overridden({"send_stal": 1.0})


@pytest.mark.parametrize("value", [0, -1, 0.0, math.inf, math.nan, "1", None, True, [1]])
def test_a_value_that_is_not_positive_seconds_is_refused(value):
    with pytest.raises(TimingError, match="sweep must be a positive number of seconds"):
        Timing().overridden({"sweep": value})


def test_a_first_backoff_past_its_cap_is_refused():
    with pytest.raises(TimingError, match="link_backoff_first .* must not exceed link_backoff_max"):
        Timing(link_backoff_first=1.0)
    with pytest.raises(TimingError, match="link_ping .* must not exceed link_silence"):
        Timing(link_ping=3.0)


def test_the_timing_file_shortens_the_hubs_timers(tmp_path):
    path = tmp_path / "timing.json"
    path.write_text(json.dumps({"send_stall": 0.5, "forward_answer": 1.5}))
    timing = config("--timing", str(path)).timing
    assert timing == Timing(send_stall=0.5, forward_answer=1.5)


@pytest.mark.parametrize("content, says", [
    ('{"stalled_afterr": 1}', "unknown timing field(s) stalled_afterr"),
    ('{"stalled_after": 0}', "stalled_after must be a positive number of seconds"),
    ('{"stalled_after": -2}', "stalled_after must be a positive number of seconds"),
    ('[["stalled_after", 1]]', "must hold a JSON object"),
    ('{"stalled_after": 1', "is not JSON"),
])
def test_a_bad_timing_file_stops_the_hub_before_it_starts(tmp_path, capsys, content, says):
    path = tmp_path / "timing.json"
    path.write_text(content)
    err = refused("--timing", str(path), capsys=capsys)
    assert says in err and str(path) in err


def test_a_missing_timing_file_is_refused(tmp_path, capsys):
    err = refused("--timing", str(tmp_path / "absent.json"), capsys=capsys)
    assert "absent.json: cannot read it" in err


def test_the_public_flags_feed_the_same_profile():
    timing = config("--auth-timeout", "3", "--roster-timeout", "1.5",
                    "--recipient-liveness-window", "7", "--waiter-liveness-window", "4",
                    "--dark-seat-after", "2", "--redsyn-webhook-first-retry", "0.01",
                    "--multihub-watch-interval", "5").timing
    assert timing == Timing(auth_timeout=3, roster_timeout=1.5, reaction_window=7,
                            waiter_window=4, dark_seat_after=2, redsyn_webhook_first_retry=0.01,
                            watch_interval=5)
    liveness = config("--no-warn-stale-recipients", "--recipient-liveness-window", "7").liveness
    assert (liveness.enabled, liveness.reaction_window, liveness.waiter_window) == \
        (False, 7, Timing().waiter_window)


def test_the_watch_interval_flag_keeps_its_floor():
    assert config("--multihub-watch-interval", "0.1").timing.watch_interval == 1.0


@pytest.mark.parametrize("flag", ["--auth-timeout", "--dark-seat-after",
                                  "--recipient-liveness-window", "--roster-timeout"])
def test_a_public_flag_that_is_not_positive_is_refused(flag, capsys):
    assert f"{flag} must be positive" in refused(flag, "0", capsys=capsys)


def test_a_timer_set_by_both_a_flag_and_the_file_is_refused(tmp_path, capsys):
    path = tmp_path / "timing.json"
    path.write_text(json.dumps({"roster_timeout": 2}))
    err = refused("--timing", str(path), "--roster-timeout", "3", capsys=capsys)
    assert "--roster-timeout both set roster_timeout" in err
    # a flag and the file that set different timers go together
    path.write_text(json.dumps({"stalled_after": 2}))
    assert config("--timing", str(path), "--roster-timeout", "3").timing == \
        Timing(stalled_after=2, roster_timeout=3)


def test_the_timing_flag_is_not_in_help():
    assert "--timing" not in build_parser().format_help()


def test_read_overrides_bounds_the_file(tmp_path):
    path = tmp_path / "big.json"
    path.write_text(json.dumps({"sweep": 1.0, "pad": "x" * 70_000}))
    with pytest.raises(TimingError, match="is over"):
        read_overrides(path)

"""The Host decision of the DNS-rebinding guard, as a pure function."""

import pytest

from hubd.http.host_trust import (AuthorityError, host_trusted, parse_advertised,
                                  split_authority)


def adv(*values):
    return frozenset(parse_advertised(v) for v in values)


@pytest.mark.parametrize("value, parsed", [
    ("west.example", ("west.example", None)),
    ("West.Example:8443", ("west.example", 8443)),
    ("203.0.113.2:8876", ("203.0.113.2", 8876)),
    ("[2001:db8::1]:443", ("[2001:db8::1]", 443)),
    ("[::1]", ("[::1]", None)),
])
def test_advertised_values_parse(value, parsed):
    assert parse_advertised(value) == parsed


@pytest.mark.parametrize("value", [
    "", " west", "west:", "west:0", "west:65536", "west:12a", "http://west", "west/path",
    "*", "*.example", "0.0.0.0:80", "[::]", "[::1", "2001:db8::1", "a..b", "-a.example",
    "west.example:8443:1",
])
def test_bad_advertised_values_are_refused(value):
    with pytest.raises(AuthorityError):
        parse_advertised(value)


def test_loopback_bind_trusts_loopback_names_on_any_port():
    for host in ("127.0.0.1", "127.0.0.1:8876", "localhost:1", "LOCALHOST", "[::1]:8876"):
        assert host_trusted("127.0.0.1", frozenset(), [host]), host
    for host in ("evil.example", "evil.example:8876", "127.0.0.2", "", "127.0.0.1:99999"):
        assert not host_trusted("127.0.0.1", frozenset(), [host]), host


def test_loopback_bind_trusts_advertised_authorities_exactly():
    trusted = adv("west.example:8443", "203.0.113.2")
    assert host_trusted("127.0.0.1", trusted, ["west.example:8443"])
    assert host_trusted("127.0.0.1", trusted, ["WEST.EXAMPLE:8443"])
    assert host_trusted("127.0.0.1", trusted, ["203.0.113.2"])
    assert host_trusted("127.0.0.1", trusted, ["127.0.0.1:8876"])  # loopback still trusted
    assert not host_trusted("127.0.0.1", trusted, ["west.example"])  # port differs
    assert not host_trusted("127.0.0.1", trusted, ["west.example:8444"])
    assert not host_trusted("127.0.0.1", trusted, ["203.0.113.2:8876"])
    assert not host_trusted("127.0.0.1", trusted, ["evil.example"])


def test_other_bind_with_advertised_trusts_only_those():
    trusted = adv("west.example:8443")
    for bind in ("0.0.0.0", "::", "203.0.113.2"):
        assert host_trusted(bind, trusted, ["west.example:8443"])
        assert not host_trusted(bind, trusted, ["127.0.0.1:8876"])
        assert not host_trusted(bind, trusted, ["localhost"])
        assert not host_trusted(bind, trusted, ["evil.example"])


def test_other_bind_without_advertised_checks_nothing():
    assert host_trusted("0.0.0.0", frozenset(), ["evil.example"])
    assert host_trusted("0.0.0.0", frozenset(), [])


def test_exactly_one_host_header():
    trusted = adv("west.example")
    assert not host_trusted("127.0.0.1", trusted, [])
    assert not host_trusted("127.0.0.1", trusted, ["west.example", "west.example"])
    assert not host_trusted("0.0.0.0", trusted, ["west.example", "evil.example"])


def test_split_authority_refuses_malformed_hosts():
    for bad in ("evil.example\r\n", "a b", "[zz::1]", "x:-1", "host:+80"):
        assert split_authority(bad) is None, bad

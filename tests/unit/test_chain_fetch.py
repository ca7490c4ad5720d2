"""The pure part of `hubd certs fetch`: which URLs it accepts and what it makes of them."""

import pytest

from federation.chain_fetch import (
    CAUSE_URL,
    ChainFetchError,
    Target,
    check_timeout,
    parse_target,
)


@pytest.mark.parametrize(
    ("url", "host", "port"),
    [
        ("wss://west.example:8876/", "west.example", 8876),
        ("wss://west.example", "west.example", 443),
        ("WSS://West.Example:8876/path?x=1", "west.example", 8876),
        ("https://192.0.2.7:9443/", "192.0.2.7", 9443),
        ("wss://[2001:db8::7]:8876/", "2001:db8::7", 8876),
        ("  wss://127.0.0.1:1/  ", "127.0.0.1", 1),
    ],
)
def test_accepted_urls(url, host, port):
    assert parse_target(url) == Target(url=url.strip(), host=host, port=port)


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        ("ws://west:8876/", "plain text"),
        ("http://west:8876/", "plain text"),
        ("tcp://west:8876", "scheme tcp:// is not wss:// or https://"),
        ("west:8876", "expected wss://HOST:PORT/"),
        ("", "expected a URL"),
        ("wss://:8876/", "no host"),
        ("wss://west:port/", "bad URL"),
        ("wss://west:70000/", "bad URL"),
    ],
)
def test_refused_urls_are_url_errors(url, fragment):
    with pytest.raises(ChainFetchError, match=fragment) as caught:
        parse_target(url)
    assert caught.value.cause == CAUSE_URL


@pytest.mark.parametrize("seconds", [0, -1, 301, float("nan")])
def test_timeout_must_be_positive_and_bounded(seconds):
    with pytest.raises(ChainFetchError, match="bad timeout"):
        check_timeout(seconds)
    assert check_timeout(0.1) == 0.1 and check_timeout(300) == 300

"""Which webhook URLs and addresses the hub admits (issue 30 item 3): hosts
read as the resolver reads them, addresses judged as connected to."""

import ipaddress
import socket

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hubd.wire.redsyn.webhook_address import address_refusal, inet_aton, url_refusal

# every spelling from the issue, and more of the resolver's
SPELLINGS = [
    "https://127.1/", "https://0177.0.0.1/", "https://0x7f.0.0.1/", "https://127.000.000.001/",
    "https://127.0.0.1./", "https://169.254.169.254./", "https://10.0.0.1./",
    "https://192.0.513/", "https://2130706433/", "https://0x7f000001/", "https://017700000001/",
    "https://127.0.0.1/", "https://0/", "https://0.0.0.0/", "https://100.64.0.1/",
    "https://224.0.0.1/", "https://255.255.255.255/", "https://8.8.8.8/",
    "https://[::1]/", "https://[::ffff:127.0.0.1]/", "https://[::ffff:7f00:1]:8443/",
    "https://[fe80::1]/", "https://[fc00::1]/", "https://[2002:7f00:1::]/",
    "https://[64:ff9b::a9fe:a9fe]/", "https://[2001:4860:4860::8888]/",
    "https://localhost/", "https://localhost./", "https://LOCALHOST/", "https://a.localhost/",
    "https://printer.local/", "https://db.internal/", "https://router.localdomain/",
    "https://1.0.0.127.in-addr.arpa/", "https://intranet/", "https://%31%32%37.0.0.1/",
    "https://1.2.3.4.5/", "https://a..example.com/",
    "https://user:pw@hooks.example.com/", "https://hooks.example.com:99999/",
    "https://ex_ample.com/", "http://hooks.example.com/", "ftp://hooks.example.com/",
    "https://evil.example\\@127.0.0.1/", "//hooks.example.com/", "hooks.example.com",
    "https://１２７．０．０．１/",
]


@pytest.mark.parametrize("url", SPELLINGS)
def test_addresses_in_any_spelling_and_local_names_are_refused(url):
    assert url_refusal(url) is not None


@pytest.mark.parametrize("url", ["https://hooks.example.com/x", "https://hooks.example.com./x",
                                 "https://HOOKS.Example.COM:8443/a?b=c",
                                 "https://xn--bcher-kva.example/", "https://a-b.c0.example/",
                                 "https://127.0.0.1.example.com/"])
def test_public_names_are_admitted(url):
    assert url_refusal(url) is None


def test_the_loopback_flag_admits_loopback_and_nothing_more():
    for url in ("http://127.0.0.1:9/x", "https://127.0.0.1:9/x", "http://localhost:9/",
                "http://[::1]:9/", "http://127.1:9/"):
        assert url_refusal(url, allow_loopback=True) is None, url
        assert url_refusal(url) is not None, url
    for url in ("http://10.0.0.1/", "http://169.254.169.254/", "http://hooks.example.com/",
                "ftp://127.0.0.1/"):
        assert url_refusal(url, allow_loopback=True) is not None, url


@pytest.mark.parametrize("address", [
    "127.0.0.1", "127.255.0.1", "10.1.2.3", "172.16.0.1", "192.168.1.1", "169.254.169.254",
    "100.64.0.1", "0.0.0.0", "224.0.0.1", "239.255.255.250", "240.0.0.1", "255.255.255.255",
    "192.0.2.1", "198.18.0.1", "::1", "::", "fe80::1", "fc00::1", "fd12::1", "ff02::1",
    "::ffff:127.0.0.1", "::ffff:10.0.0.1", "2002:7f00:1::", "2002:a9fe:a9fe::",
    "64:ff9b::7f00:1", "64:ff9b::a9fe:a9fe", "2001:db8::1",
])
def test_addresses_that_are_not_public_are_refused_at_send_time(address):
    assert address_refusal(address) is not None


def test_public_addresses_are_contacted_and_loopback_only_when_admitted():
    for address in ("93.184.216.34", "8.8.8.8", "2606:2800:220:1:248:1893:25c8:1946",
                    "::ffff:8.8.8.8", "64:ff9b::808:808"):
        assert address_refusal(address) is None, address
    assert address_refusal("127.0.0.1", allow_loopback=True) is None
    assert address_refusal("::1", allow_loopback=True) is None
    assert address_refusal("::ffff:127.0.0.1", allow_loopback=True) is None
    assert address_refusal("10.0.0.1", allow_loopback=True) is not None
    assert address_refusal("169.254.169.254", allow_loopback=True) is not None


@settings(max_examples=2000)
@given(st.text(alphabet="0123456789.xXabcdefg", min_size=1, max_size=18))
def test_inet_aton_reads_as_the_c_library_does(text):
    try:
        expected = ipaddress.IPv4Address(socket.inet_aton(text))
    except OSError:
        expected = None
    assert inet_aton(text) == expected

"""`hubd certs fetch`: a real hubd process serving real TLS, and `hubd certs fetch`
run as its own process, printing the pins `hubd certs` printed for that hub.

Every failure mode is a real one too: a closed port, a plain ws:// hubd, a
listener that never speaks TLS, and (in network namespaces) a host with no
route, a host that drops packets, and a name that does not resolve.
"""

from __future__ import annotations

import datetime
import json
import socket
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from federation import tls
from federation.pins import PinSet, check_peer_pin, pins_for_file
from tests.support.federation import make_pki, site_flags, write_serving_policy
from tests.support.netns import Topology, require_netns, require_nft
from tests.support.procs import free_port, hubd_process

# A guard so that a fetch which ignored its own --timeout fails the test instead
# of hanging it; the assertions are about what fetch says, never how long it took.
RUN_GUARD_SECONDS = 120


def hubd_certs(*argv: str, netns: tuple[Topology, str] | None = None) -> subprocess.CompletedProcess:
    """`hubd certs ARGV...` as a separate process (inside a namespace's site, if given)."""
    command = [sys.executable, "-m", "hubd", "certs", *argv]
    if netns is not None:
        topology, site = netns
        return topology.run(site, command, check=False, timeout=RUN_GUARD_SECONDS)
    return subprocess.run(command, capture_output=True, text=True, timeout=RUN_GUARD_SECONDS)


def fetch_json(url: str, *extra: str, netns=None) -> tuple[int, dict, str]:
    done = hubd_certs("fetch", url, "--json", *extra, netns=netns)
    return done.returncode, json.loads(done.stdout), done.stderr


def assert_fetch_fails(url: str, cause: str, fragment: str, *extra: str, netns=None) -> None:
    status, document, err = fetch_json(url, *extra, netns=netns)
    assert status == 2, (document, err)
    assert document["url"] == url
    assert document["error"]["cause"] == cause, document
    assert fragment in document["error"]["detail"], document
    assert err.count("\n") == 1 and err.startswith(f"hubd certs: error: {cause}: "), err
    # Without --json: the same one line on stderr and nothing on stdout.
    plain = hubd_certs("fetch", url, *extra, netns=netns)
    assert plain.returncode == 2 and plain.stdout == ""
    assert plain.stderr.startswith(f"hubd certs: error: {cause}: ") and fragment in plain.stderr


# --- a hub made by `hubd certs peer-setup` ------------------------------------------


@pytest.fixture(scope="module")
def west(tmp_path_factory):
    """hubd west serving wss:// with peer-setup's certificates and a serving policy
    (whose client CA makes the TLS stack present CA + leaf)."""
    root = tmp_path_factory.mktemp("fetch")
    pki = make_pki(root / "pki", ["east", "west"])
    ca_pins = json.loads(hubd_certs("pin", str(root / "pki" / "ca.pem"), "--json").stdout)
    policy = write_serving_policy(root / "west-policy", pki, {"east": ["EAST"]})
    site = site_flags(pki, "west", policy)
    hub = hubd_process(root / "west", *site.serve, hub_id="west", scheme="wss").start()
    try:
        yield hub, pki, ca_pins
    finally:
        hub.stop()


def test_fetch_prints_the_pins_peer_setup_printed(west):
    hub, pki, ca_pins = west
    status, document, err = fetch_json(hub.url)
    assert status == 0, err
    assert (document["url"], document["host"], document["port"]) == (hub.url, "127.0.0.1", hub.port)
    assert document["address"] == "127.0.0.1"
    assert document["tls_version"] in ("TLSv1.2", "TLSv1.3")
    leaf, ca = document["certificates"]
    printed = pki.hubs["west"]["server"]["pins"]  # what `hubd certs peer-setup` printed
    assert {"sha256": leaf["sha256"], "spki_sha256": leaf["spki_sha256"]} == printed
    assert (leaf["position"], leaf["subject"], leaf["is_ca"]) == (0, "CN=west", False)
    assert leaf["issuer"] == ca["subject"] == "CN=hubd private CA"
    assert {"sha256": ca["sha256"], "spki_sha256": ca["spki_sha256"]} == {
        "sha256": ca_pins["sha256"], "spki_sha256": ca_pins["spki_sha256"]}
    assert (ca["position"], ca["is_ca"]) == (1, True)
    assert leaf["sha256"] != ca["sha256"]


def test_fetch_text_names_every_certificate_and_the_pin_to_configure(west):
    hub, pki, ca_pins = west
    done = hubd_certs("fetch", hub.url)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    out = done.stdout
    printed = pki.hubs["west"]["server"]["pins"]
    assert "presented 2 certificates" in out
    assert "[0] leaf: CN=west" in out and "[1] CA: CN=hubd private CA" in out
    for pin in (printed["sha256"], printed["spki_sha256"], ca_pins["sha256"], ca_pins["spki_sha256"]):
        assert pin in out
    assert f"--message-peer-pin PEER={printed['sha256']}" in out


async def test_fetched_pins_pass_the_peer_link_pin_check(west):
    """The pins fetch prints are the ones pins.check_peer_pin accepts on a live link."""
    hub, pki, _ = west
    status, document, err = fetch_json(hub.url)
    assert status == 0, err
    leaf, ca = document["certificates"]
    client = tls.peer_client_context(pki.file("east", "client", "cert"), pki.file("east", "client", "key"))
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(hub.url, ssl=client) as ws:
            check_peer_pin(ws, PinSet([leaf["sha256"]]), peer="west")
            check_peer_pin(ws, PinSet([leaf["spki_sha256"]]), peer="west")
            # Links check the leaf: a CA pin does not admit it (the text output says so).
            assert not PinSet([ca["sha256"], ca["spki_sha256"]]).matches(
                ws.get_extra_info("ssl_object").getpeercert(binary_form=True))


# --- a chain with an intermediate ---------------------------------------------------


def _certificate(subject: str, issuer_name: x509.Name, issuer_key, key, *, ca: bool,
                 path_length: int | None) -> x509.Certificate:
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=path_length), critical=True)
    )
    if not ca:
        builder = builder.add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
        ).add_extension(
            x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False
        )
    return builder.sign(issuer_key, hashes.SHA256())


def _write_pem(path: Path, *certificates: x509.Certificate) -> Path:
    path.write_bytes(b"".join(c.public_bytes(serialization.Encoding.PEM) for c in certificates))
    path.chmod(0o600)
    return path


def test_fetch_prints_a_chain_with_an_intermediate_in_the_order_presented(tmp_path):
    """A hub whose --tls-certfile is leaf + intermediate (as a public CA issues them)."""
    root_key, intermediate_key, leaf_key = (ec.generate_private_key(ec.SECP256R1()) for _ in range(3))
    root_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test root")])
    intermediate = _certificate("test intermediate", root_name, root_key, intermediate_key,
                                ca=True, path_length=0)
    leaf = _certificate("south", intermediate.subject, intermediate_key, leaf_key,
                        ca=False, path_length=None)
    chain_file = _write_pem(tmp_path / "south-chain.pem", leaf, intermediate)
    leaf_file = _write_pem(tmp_path / "south-server.pem", leaf)
    intermediate_file = _write_pem(tmp_path / "intermediate.pem", intermediate)
    key_file = tmp_path / "south-server.key"
    key_file.write_bytes(leaf_key.private_bytes(serialization.Encoding.PEM,
                                                serialization.PrivateFormat.PKCS8,
                                                serialization.NoEncryption()))
    key_file.chmod(0o600)
    hub = hubd_process(tmp_path / "south", "--tls-certfile", str(chain_file),
                       "--tls-keyfile", str(key_file), hub_id="south", scheme="wss").start()
    try:
        # localhost: a name, so fetch also sends SNI and picks whichever address answers
        url = f"wss://localhost:{hub.port}/"
        status, document, err = fetch_json(url)
    finally:
        hub.stop()
    assert status == 0, err
    presented = document["certificates"]
    assert [c["subject"] for c in presented] == ["CN=south", "CN=test intermediate"]
    assert [c["issuer"] for c in presented] == ["CN=test intermediate", "CN=test root"]
    for certificate, file in zip(presented, (leaf_file, intermediate_file)):
        printed = json.loads(hubd_certs("pin", str(file), "--json").stdout)
        assert (certificate["sha256"], certificate["spki_sha256"]) == (
            printed["sha256"], printed["spki_sha256"])
        assert pins_for_file(file).as_dict() == {
            "sha256": certificate["sha256"], "spki_sha256": certificate["spki_sha256"]}


# --- failures on loopback -----------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        ("ws://127.0.0.1:8443/", "ws:// and http:// are plain text"),
        ("http://127.0.0.1:8443/", "ws:// and http:// are plain text"),
        ("ftp://127.0.0.1:8443/", "scheme ftp:// is not wss:// or https://"),
        ("127.0.0.1:8443", "expected wss://HOST:PORT/"),
        ("wss:///", "no host"),
        ("wss://127.0.0.1:99999/", "bad URL"),
    ],
)
def test_wrong_scheme_or_malformed_url_is_a_url_error(url, fragment):
    assert_fetch_fails(url, "url", fragment)


def test_bad_timeout_is_refused_before_connecting():
    assert_fetch_fails("wss://127.0.0.1:1/", "url", "bad timeout", "--timeout", "0")


def test_closed_port_is_refused():
    port = free_port()  # bound, then closed: nothing listens there now
    assert_fetch_fails(f"wss://127.0.0.1:{port}/", "refused", f"nothing listens on port {port}")


def test_a_plain_ws_hubd_is_not_tls(tmp_path):
    hub = hubd_process(tmp_path / "plain", hub_id="plain").start()
    try:
        assert_fetch_fails(f"wss://127.0.0.1:{hub.port}/", "not_tls",
                           "answered, but not with TLS")
        assert hub.alive()
    finally:
        hub.stop()


def test_a_listener_that_never_answers_times_out_in_the_handshake():
    """The kernel completes the TCP handshake for a listening socket nobody accepts
    from; the ClientHello is never read, so only the deadline ends the handshake."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        assert_fetch_fails(f"wss://127.0.0.1:{port}/", "timeout",
                           "the TLS handshake did not finish within 0.5s", "--timeout", "0.5")


# --- failures across a network (namespaces) -----------------------------------------


@pytest.fixture
def lan():
    require_netns()
    with Topology() as topology:
        topology.network("lan", "192.0.2.0/24", ["operator", "peer"])
        yield topology


def test_a_host_without_route_is_unreachable(lan):
    # 198.51.100.0/24 is on no network of the operator's site: no route at all.
    assert_fetch_fails("wss://198.51.100.7:8443/", "unreachable", "cannot reach 198.51.100.7:8443",
                       netns=(lan, "operator"))


def test_a_host_that_drops_packets_times_out_connecting(lan):
    require_nft()
    peer = lan.addr("peer", "lan")
    lan.block("operator", "peer")
    assert_fetch_fails(f"wss://{peer}:8443/", "timeout",
                       f"connecting to {peer}:8443 took longer than 0.5s", "--timeout", "0.5",
                       netns=(lan, "operator"))


def test_a_name_that_does_not_resolve(lan):
    # No resolver is reachable from the site, and .invalid never resolves anywhere.
    assert_fetch_fails("wss://no-such-hub.invalid:8443/", "resolve",
                       "cannot resolve no-such-hub.invalid", netns=(lan, "operator"))

"""`hubd certs` output driving real TLS: an aiohttp HTTPS/WSS server on loopback
that requests (but does not require) client certificates, and pinned clients.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import json
import shutil
import ssl
import stat
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from federation import tls
from tests.support.prereq import need_tool
from federation.certs_cli import main as certs_main
from federation.pins import (
    PinError,
    PinSet,
    check_peer_pin,
    peer_certificate_der,
    pins_for_certificate,
    pins_for_file,
)

REPO_ROOT = Path(__file__).resolve().parents[2]


# --- helpers ----------------------------------------------------------------


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    status = certs_main(list(argv))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def cli_json(*argv: str) -> dict:
    """Run `hubd certs ... --json` in-process and return its result."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = certs_main([*argv, "--json"])
    assert status == 0, out.getvalue()
    return json.loads(out.getvalue())


def der_file(path: Path) -> bytes:
    return ssl.PEM_cert_to_DER_cert(path.read_text())


@pytest.fixture(scope="module")
def pki_dir(tmp_path_factory) -> Path:
    """A CA, west's server certificate and east's client certificate, made by the CLI."""
    directory = tmp_path_factory.mktemp("pki")
    cli_json("ca", "--dir", str(directory), "--name", "test federation CA", "--days", "30")
    cli_json("server", "--dir", str(directory), "--hub-id", "west", "--days", "20")
    cli_json("client", "--dir", str(directory), "--hub-id", "east", "--days", "20")
    return directory


@pytest.fixture(scope="module")
def other_pki_dir(tmp_path_factory) -> Path:
    """A second, unrelated CA with its own client certificate for east."""
    directory = tmp_path_factory.mktemp("other-pki")
    cli_json("ca", "--dir", str(directory), "--days", "30")
    cli_json("client", "--dir", str(directory), "--hub-id", "east", "--days", "20")
    return directory


def west_server_context(directory: Path) -> ssl.SSLContext:
    return tls.server_context(
        directory / "west-server.pem",
        directory / "west-server.key",
        client_ca_file=directory / "ca.pem",
    )


def east_client_context(directory: Path, max_version: ssl.TLSVersion | None = None) -> ssl.SSLContext:
    context = tls.peer_client_context(directory / "east-client.pem", directory / "east-client.key")
    if max_version is not None:
        context.maximum_version = max_version
    return context


class Seen:
    """What the server learned about each client, in request order."""

    def __init__(self) -> None:
        self.client_certs: list[bytes | None] = []


@contextlib.asynccontextmanager
async def wss_server(context: ssl.SSLContext):
    seen = Seen()

    async def hello(request: web.Request) -> web.Response:
        der = peer_certificate_der(request)
        seen.client_certs.append(der)
        return web.json_response({"client_pins": pins_for_certificate(der).as_dict() if der else None})

    async def socket(request: web.Request) -> web.WebSocketResponse:
        seen.client_certs.append(peer_certificate_der(request))
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        der_via_ws = peer_certificate_der(ws)
        async for message in ws:
            await ws.send_json({
                "echo": message.data,
                "client_sha256": pins_for_certificate(der_via_ws).sha256 if der_via_ws else None,
            })
        return ws

    app = web.Application()
    app.router.add_get("/hello", hello)
    app.router.add_get("/ws", socket)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"https://127.0.0.1:{port}", f"wss://127.0.0.1:{port}", seen
    finally:
        await runner.cleanup()


def memory_handshake(server_ctx: ssl.SSLContext, client_ctx: ssl.SSLContext):
    """A full TLS handshake through memory BIOs: real TLS, no sockets.

    Returns (server SSLObject, client SSLObject); a refusal raises ssl.SSLError.
    """
    client_in, client_out, server_in, server_out = (ssl.MemoryBIO() for _ in range(4))
    client = client_ctx.wrap_bio(client_in, client_out)
    server = server_ctx.wrap_bio(server_in, server_out, server_side=True)
    done = {"client": False, "server": False}
    for _ in range(20):
        for name, side in (("client", client), ("server", server)):
            if not done[name]:
                try:
                    side.do_handshake()
                    done[name] = True
                except ssl.SSLWantReadError:
                    pass
        server_in.write(client_out.read())
        client_in.write(server_out.read())
        if all(done.values()):
            # TLS 1.3: the server checks the client certificate when it reads
            # the client's last flight, so let it read once more.
            with contextlib.suppress(ssl.SSLWantReadError):
                server.read(1)
            return server, client
    raise AssertionError("handshake did not finish")


TLS_VERSIONS = pytest.mark.parametrize(
    "max_version", [ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3], ids=["tls1.2", "tls1.3"]
)


# --- mutual TLS with pins -----------------------------------------------------


async def https_get(url: str, path: str, context: ssl.SSLContext):
    """GET over a raw asyncio TLS stream; returns (server DER seen before sending, JSON body).

    Used instead of aiohttp's client for plain HTTPS because a ClientResponse
    may release its connection (and with it the transport) as soon as a small
    body has arrived, leaving nothing to read the peer certificate from.
    """
    host_port = url.split("//", 1)[1]
    host, port = host_port.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port), ssl=context)
    try:
        server_der = peer_certificate_der(writer.transport)
        assert peer_certificate_der(writer) == server_der  # StreamWriter works too
        writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        await writer.drain()
        raw = await reader.read()
    finally:
        writer.close()
        with contextlib.suppress(ssl.SSLError, ConnectionError):
            await writer.wait_closed()
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    return server_der, json.loads(body)


@TLS_VERSIONS
async def test_https_both_sides_see_the_pinned_certificates(pki_dir, max_version):
    server_pins = pins_for_file(pki_dir / "west-server.pem")
    client_pins = pins_for_file(pki_dir / "east-client.pem")
    async with wss_server(west_server_context(pki_dir)) as (https_url, _, seen):
        server_der, body = await https_get(
            https_url, "/hello", east_client_context(pki_dir, max_version)
        )
    assert PinSet([server_pins.sha256]).matches(server_der)
    assert PinSet([server_pins.spki_sha256]).matches(server_der)
    assert server_der == der_file(pki_dir / "west-server.pem")
    assert seen.client_certs == [der_file(pki_dir / "east-client.pem")]
    assert body["client_pins"] == client_pins.as_dict()
    assert PinSet([client_pins.sha256]).matches(seen.client_certs[0])
    assert PinSet([client_pins.spki_sha256]).matches(seen.client_certs[0])


async def test_wss_pin_checked_before_the_first_frame(pki_dir):
    server_pins = pins_for_file(pki_dir / "west-server.pem")
    client_pins = pins_for_file(pki_dir / "east-client.pem")
    async with wss_server(west_server_context(pki_dir)) as (_, wss_url, seen):
        async with aiohttp.ClientSession() as session:
            async with session.ws_connect(f"{wss_url}/ws", ssl=east_client_context(pki_dir)) as ws:
                check_peer_pin(ws, PinSet([server_pins.spki_sha256]), peer="west")
                await ws.send_str("hello west")
                reply = await ws.receive_json()
    assert reply == {"echo": "hello west", "client_sha256": client_pins.sha256}
    assert seen.client_certs == [der_file(pki_dir / "east-client.pem")]


async def test_wrong_pin_does_not_match_the_live_certificate(pki_dir):
    client_pins = pins_for_file(pki_dir / "east-client.pem")
    wrong = PinSet([client_pins.sha256, client_pins.spki_sha256])  # east's, not west's
    async with wss_server(west_server_context(pki_dir)) as (_, wss_url, _seen):
        async with aiohttp.ClientSession() as session:
            async with session.ws_connect(f"{wss_url}/ws", ssl=east_client_context(pki_dir)) as ws:
                assert not wrong.matches(peer_certificate_der(ws))
                with pytest.raises(PinError, match="west certificate matches none of its 2 pin"):
                    check_peer_pin(ws, wrong, peer="west")


@TLS_VERSIONS
async def test_client_without_certificate_still_connects(pki_dir, max_version):
    """CERT_OPTIONAL: an ordinary local agent has no client certificate."""
    no_cert = tls.peer_client_context()
    no_cert.maximum_version = max_version
    async with wss_server(west_server_context(pki_dir)) as (https_url, _, seen):
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{https_url}/hello", ssl=no_cert) as response:
                assert response.status == 200
                assert await response.json() == {"client_pins": None}
    assert seen.client_certs == [None]


@TLS_VERSIONS
async def test_client_certificate_from_another_ca_is_refused(pki_dir, other_pki_dir, max_version):
    async with wss_server(west_server_context(pki_dir)) as (https_url, _, seen):
        async with aiohttp.ClientSession() as session:
            with pytest.raises(aiohttp.ClientError):
                async with session.get(
                    f"{https_url}/hello", ssl=east_client_context(other_pki_dir, max_version)
                ) as response:
                    await response.read()
    assert seen.client_certs == []  # no request reached the application


def test_foreign_client_certificate_fails_the_server_handshake(pki_dir, other_pki_dir):
    with pytest.raises(ssl.SSLError, match="certificate verify failed"):
        memory_handshake(west_server_context(pki_dir), east_client_context(other_pki_dir))


def test_server_certificate_is_not_accepted_as_a_client_certificate(pki_dir):
    """serverAuth-only certificates cannot pose as a peer hub's client identity."""
    wrong_purpose = tls.peer_client_context(pki_dir / "west-server.pem", pki_dir / "west-server.key")
    with pytest.raises(ssl.SSLError, match="certificate verify failed"):
        memory_handshake(west_server_context(pki_dir), wrong_purpose)


def test_memory_handshake_exposes_both_certificates(pki_dir):
    server, client = memory_handshake(west_server_context(pki_dir), east_client_context(pki_dir))
    assert peer_certificate_der(client) == der_file(pki_dir / "west-server.pem")
    assert peer_certificate_der(server) == der_file(pki_dir / "east-client.pem")
    assert client.version() in ("TLSv1.2", "TLSv1.3")


def test_contexts_refuse_anything_older_than_tls_1_2(pki_dir):
    assert west_server_context(pki_dir).minimum_version == ssl.TLSVersion.TLSv1_2
    client = east_client_context(pki_dir)
    assert client.minimum_version == ssl.TLSVersion.TLSv1_2
    assert client.check_hostname is False and client.verify_mode == ssl.CERT_NONE
    assert west_server_context(pki_dir).verify_mode == ssl.CERT_OPTIONAL
    plain = tls.server_context(pki_dir / "west-server.pem", pki_dir / "west-server.key")
    assert plain.verify_mode == ssl.CERT_NONE


def test_context_errors_name_the_file(pki_dir, tmp_path):
    with pytest.raises(tls.TlsConfigError, match="server key file .* not found"):
        tls.server_context(pki_dir / "west-server.pem", tmp_path / "absent.key")
    with pytest.raises(tls.TlsConfigError, match="cannot load server certificate"):
        tls.server_context(pki_dir / "west-server.pem", pki_dir / "east-client.key")
    with pytest.raises(tls.TlsConfigError, match="client CA file .* not found"):
        tls.server_context(
            pki_dir / "west-server.pem", pki_dir / "west-server.key",
            client_ca_file=tmp_path / "absent.pem",
        )
    with pytest.raises(tls.TlsConfigError, match="both a certificate file and a key file"):
        tls.peer_client_context(pki_dir / "east-client.pem")


# --- re-issuing on the same key -------------------------------------------------


async def test_spki_pin_survives_reissue_with_same_key(tmp_path, capsys):
    directory = tmp_path / "pki"
    cli_json("ca", "--dir", str(directory))
    first = cli_json("server", "--dir", str(directory), "--hub-id", "west")
    first_client = cli_json("client", "--dir", str(directory), "--hub-id", "east")
    key_before = (directory / "west-server.key").read_bytes()

    status, _, err = run_cli(capsys, "server", "--dir", str(directory), "--hub-id", "west",
                             "--key", str(directory / "west-server.key"))
    assert status == 2 and "refusing to overwrite" in err and "west-server.key" not in err

    second = cli_json("server", "--dir", str(directory), "--hub-id", "west",
                      "--key", str(directory / "west-server.key"), "--force")
    second_client = cli_json("client", "--dir", str(directory), "--hub-id", "east",
                             "--key", str(directory / "east-client.key"), "--force")
    assert second["key_reused"] and (directory / "west-server.key").read_bytes() == key_before
    assert second["pins"]["spki_sha256"] == first["pins"]["spki_sha256"]
    assert second["pins"]["sha256"] != first["pins"]["sha256"]

    old_spki = PinSet([first["pins"]["spki_sha256"]])
    old_cert = PinSet([first["pins"]["sha256"]])
    async with wss_server(west_server_context(directory)) as (_, wss_url, seen):
        async with aiohttp.ClientSession() as session:
            async with session.ws_connect(f"{wss_url}/ws", ssl=east_client_context(directory)) as ws:
                live = peer_certificate_der(ws)
                assert old_spki.matches(live)
                assert not old_cert.matches(live)
    assert PinSet([first_client["pins"]["spki_sha256"]]).matches(seen.client_certs[0])
    assert pins_for_certificate(seen.client_certs[0]).sha256 == second_client["pins"]["sha256"]


def test_reissue_with_key_from_elsewhere_copies_it_owner_only(tmp_path):
    directory = tmp_path / "pki"
    cli_json("ca", "--dir", str(directory))
    original = cli_json("client", "--dir", str(directory), "--hub-id", "east")
    moved = tmp_path / "kept.key"
    shutil.copy(directory / "east-client.key", moved)
    result = cli_json("client", "--dir", str(directory), "--hub-id", "east2", "--key", str(moved))
    assert result["pins"]["spki_sha256"] == original["pins"]["spki_sha256"]
    assert (directory / "east2-client.key").read_bytes() == moved.read_bytes()
    assert stat.S_IMODE((directory / "east2-client.key").stat().st_mode) == 0o600


# --- openssl agrees ---------------------------------------------------------


@pytest.mark.parametrize("name", ["west-server.pem", "east-client.pem", "ca.pem"])
def test_openssl_computes_the_same_pins(pki_dir, name):
    need_tool("openssl")
    path = str(pki_dir / name)
    der = subprocess.run(["openssl", "x509", "-in", path, "-outform", "DER"],
                         check=True, capture_output=True).stdout
    public_pem = subprocess.run(["openssl", "x509", "-in", path, "-pubkey", "-noout"],
                                check=True, capture_output=True).stdout
    spki = subprocess.run(["openssl", "pkey", "-pubin", "-outform", "DER"], input=public_pem,
                          check=True, capture_output=True).stdout
    pins = pins_for_file(pki_dir / name)
    assert pins.sha256 == "sha256:" + hashlib.sha256(der).hexdigest()
    assert pins.spki_sha256 == "spki-sha256:" + hashlib.sha256(spki).hexdigest()


def test_reference_recipe_pipeline_matches(pki_dir):
    """`openssl x509 -outform DER | sha256sum`, exactly as the reference documents it."""
    need_tool("openssl")
    need_tool("sha256sum", "coreutils")
    path = pki_dir / "east-client.pem"
    shell = f"openssl x509 -in '{path}' -outform DER | sha256sum"
    digest = subprocess.run(shell, shell=True, check=True, capture_output=True, text=True).stdout.split()[0]
    assert pins_for_file(path).sha256 == f"sha256:{digest}"


# --- the CLI ------------------------------------------------------------------


def test_ca_files_modes_and_refusal_to_overwrite(tmp_path, capsys):
    directory = tmp_path / "new" / "pki"
    status, out, err = run_cli(capsys, "ca", "--dir", str(directory))
    assert status == 0 and err == ""
    assert "ca.pem" in out and "ca.key" in out
    assert stat.S_IMODE((directory / "ca.key").stat().st_mode) == 0o600
    # owner-only: it is what a serving policy's client_ca_file names, which must be
    assert stat.S_IMODE((directory / "ca.pem").stat().st_mode) == 0o600
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    before = (directory / "ca.pem").read_bytes()

    status, out, err = run_cli(capsys, "ca", "--dir", str(directory))
    assert status == 2 and out == ""
    assert err.count("\n") == 1 and "refusing to overwrite" in err and "--force" in err
    assert (directory / "ca.pem").read_bytes() == before

    status, _, _ = run_cli(capsys, "ca", "--dir", str(directory), "--force")
    assert status == 0 and (directory / "ca.pem").read_bytes() != before


def test_server_and_client_print_pins(tmp_path, capsys):
    directory = tmp_path / "pki"
    cli_json("ca", "--dir", str(directory))
    status, out, _ = run_cli(capsys, "server", "--dir", str(directory), "--hub-id", "west",
                             "--san", "west.example", "--san", "192.0.2.7")
    assert status == 0
    pins = pins_for_file(directory / "west-server.pem")
    assert pins.sha256 in out and pins.spki_sha256 in out
    assert "DNS:west.example" in out and "IP:192.0.2.7" in out

    result = cli_json("client", "--dir", str(directory), "--hub-id", "east", "--private-cert")
    assert result["pins"] == pins_for_file(directory / "east-client.pem").as_dict()
    assert result["cert"] == str(directory / "east-client.pem")
    assert stat.S_IMODE((directory / "east-client.pem").stat().st_mode) == 0o600
    assert stat.S_IMODE((directory / "east-client.key").stat().st_mode) == 0o600


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["server", "--hub-id", "west"], "no CA in"),
        (["client", "--hub-id", "east"], "no CA in"),
        (["server", "--hub-id", "west", "--san", "not_a_host"], "bad SAN 'not_a_host'"),
        (["server", "--hub-id", "west", "--san", "IP:999.1.1.1"], "bad SAN"),
        (["client", "--hub-id", "../escape"], "bad hub id"),
        (["client", "--hub-id", "east", "--days", "0"], "bad validity"),
        (["client", "--hub-id", "east", "--key", "/nonexistent/key.pem"], "not found"),
        (["server", "--hub-id", "west", "--days", "many"], "invalid int value"),
    ],
)
def test_cli_errors_are_one_line_and_exit_2(tmp_path, capsys, argv, fragment):
    directory = tmp_path / "pki"
    if "no CA in" not in fragment:
        cli_json("ca", "--dir", str(directory))
    before = sorted(p.name for p in directory.iterdir()) if directory.exists() else []
    status, out, err = run_cli(capsys, argv[0], "--dir", str(directory), *argv[1:])
    assert status == 2
    assert out == ""
    assert err.count("\n") == 1 and fragment in err
    after = sorted(p.name for p in directory.iterdir()) if directory.exists() else []
    assert after == before  # nothing written


def test_pin_command_on_pem_der_and_bad_input(pki_dir, tmp_path, capsys):
    der_path = tmp_path / "west.der"
    der_path.write_bytes(der_file(pki_dir / "west-server.pem"))
    expected = pins_for_file(pki_dir / "west-server.pem")

    status, out, _ = run_cli(capsys, "pin", str(pki_dir / "west-server.pem"))
    assert status == 0 and expected.sha256 in out and expected.spki_sha256 in out
    assert cli_json("pin", str(der_path)) == {"file": str(der_path), **expected.as_dict()}

    for bad, fragment in ((tmp_path / "absent.pem", "not found"),
                          (tmp_path, "cannot read"),
                          (pki_dir / "west-server.key", "not a PEM or DER X.509 certificate")):
        status, out, err = run_cli(capsys, "pin", str(bad))
        assert status == 2 and out == "" and err.count("\n") == 1 and fragment in err


def test_peer_setup_makes_everything_and_prints_flags(tmp_path, capsys):
    directory = tmp_path / "peers"
    status, out, _ = run_cli(capsys, "peer-setup", "--dir", str(directory),
                             "--hub-id", "east", "--hub-id", "west")
    assert status == 0
    for name in ("ca.pem", "ca.key", "east-server.pem", "east-server.key", "east-client.pem",
                 "east-client.key", "west-server.pem", "west-server.key", "west-client.pem",
                 "west-client.key"):
        assert (directory / name).is_file(), name
    west_server = pins_for_file(directory / "west-server.pem")
    east_client = pins_for_file(directory / "east-client.pem")
    assert f"--message-peer-pin west={west_server.sha256}" in out
    assert east_client.sha256 in out and west_server.spki_sha256 in out

    # A later run adds a hub under the same CA; existing hubs need --force.
    ca_before = (directory / "ca.pem").read_bytes()
    status, _, err = run_cli(capsys, "peer-setup", "--dir", str(directory),
                             "--hub-id", "west", "--hub-id", "north")
    assert status == 2 and "refusing to overwrite" in err
    result = cli_json("peer-setup", "--dir", str(directory), "--hub-id", "north")
    assert result["ca_created"] is False and (directory / "ca.pem").read_bytes() == ca_before
    assert result["hubs"][0]["hub_id"] == "north"
    assert result["hubs"][0]["flags"]["accept_certificate_pins"] == {}


async def test_peer_setup_certificates_peer_with_each_other(tmp_path):
    directory = tmp_path / "peers"
    result = cli_json("peer-setup", "--dir", str(directory), "--hub-id", "east", "--hub-id", "west")
    east, west = result["hubs"]
    west_pin = PinSet([east["flags"]["connect"][-1].split("=", 1)[1]])  # east's pin for west
    accepted = PinSet([west["flags"]["accept_certificate_pins"]["east"]])
    async with wss_server(west_server_context(directory)) as (_, wss_url, seen):
        async with aiohttp.ClientSession() as session:
            async with session.ws_connect(f"{wss_url}/ws", ssl=east_client_context(directory)) as ws:
                check_peer_pin(ws, west_pin, peer="west")
                await ws.send_str("ping")
                assert (await ws.receive_json())["echo"] == "ping"
    assert accepted.matches(seen.client_certs[0])


def test_cli_runs_as_a_module(pki_dir):
    done = subprocess.run(
        [sys.executable, "-m", "federation.certs_cli", "pin", str(pki_dir / "ca.pem"), "--json"],
        cwd=REPO_ROOT, capture_output=True, text=True,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["sha256"] == pins_for_file(pki_dir / "ca.pem").sha256


def test_usage_errors_exit_2_and_help_exits_0(capsys):
    assert run_cli(capsys, "server")[0] == 2
    assert run_cli(capsys)[0] == 2
    status, out, _ = run_cli(capsys, "--help")
    assert status == 0 and "peer-setup" in out


def test_default_directory_is_certs_out_and_git_ignores_it(tmp_path):
    """Without --dir every command that writes uses certs/out/ under the working directory."""
    def hubd_certs(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "hubd", "certs", *argv],
                              cwd=tmp_path, capture_output=True, text=True)

    done = hubd_certs("peer-setup", "--hub-id", "east", "--hub-id", "west", "--json")
    assert done.returncode == 0, done.stderr
    out = tmp_path / "certs" / "out"
    assert json.loads(done.stdout)["dir"] == "certs/out"
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["ca.pem", "ca.key"] + [f"{hub}-{role}.{ext}" for hub in ("east", "west")
                                for role in ("server", "client") for ext in ("pem", "key")])
    assert stat.S_IMODE(out.stat().st_mode) == 0o700
    # server/client find the CA there too; ca refuses to replace it
    assert hubd_certs("client", "--hub-id", "north").returncode == 0
    assert (out / "north-client.pem").is_file()
    refused = hubd_certs("ca")
    assert refused.returncode == 2 and "certs/out/ca.pem" in refused.stderr

    ignored = subprocess.run(["git", "check-ignore", "-q", "certs/out/ca.key"], cwd=REPO_ROOT)
    assert ignored.returncode == 0, "certs/out/ must be git-ignored"

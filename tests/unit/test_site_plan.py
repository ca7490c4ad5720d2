"""federation/site.py: what `hubd site setup` decides for each hub, without
writing anything: hub URLs and ports, namespaces, certificate names, and the
documents (a policy and store hubd loads, pin files, a config file whose
keys are hubd's flags and whose peers are every other hub)."""

from __future__ import annotations

import os
import tomllib

import pytest

from federation import site
from federation.policy_loading import load_serving_policy
from federation.site import SiteError
from hubd.cli import build_parser
from hubd.config_file import keys_of

PIN = "sha256:" + "ab" * 32
SPKI = "spki-sha256:" + "cd" * 32


def test_hubs_alone_are_on_this_machine_on_consecutive_ports():
    east, west, north = site.parse_hubs(["east", "west", "north"])
    assert [h.url for h in (east, west, north)] == [
        "wss://127.0.0.1:8876/", "wss://127.0.0.1:8877/", "wss://127.0.0.1:8878/"]
    assert east.loopback and east.bind == "127.0.0.1"


def test_a_hub_with_a_url_is_reached_there_and_listens_everywhere():
    east, west, v6 = site.parse_hubs(["east=wss://east.example:9443/",
                                      "west=wss://203.0.113.2:8876", "v6=wss://[2001:db8::1]:8876/"])
    assert (east.host, east.port, east.url, east.bind) == ("east.example", 9443,
                                                          "wss://east.example:9443/", "0.0.0.0")
    assert west.url == "wss://203.0.113.2:8876/" and not west.loopback
    assert v6.host == "2001:db8::1" and v6.url == "wss://[2001:db8::1]:8876/"
    assert site.server_sans(east, ["extra.example"]) == ["localhost", "127.0.0.1",
                                                        "east.example", "extra.example"]


@pytest.mark.parametrize("values, fragment", [
    (["east"], "at least two --hub"),
    (["east", "east=wss://a:1/"], "same hub twice"),
    (["east=http://a:1/", "west"], "expected ID=wss://HOST:PORT/"),
    (["east=wss://a:1/path", "west"], "expected ID=wss://HOST:PORT/"),
    (["east=wss://a:99999/", "west"], "expected ID=wss://HOST:PORT/"),
    (["east=wss://localhost:8877/", "west"], "share a port"),
    (["", "west"], "--hub ''"),
])
def test_hubs_it_refuses(values, fragment):
    with pytest.raises(SiteError, match=fragment):
        site.parse_hubs(values)


def test_namespaces_granted_include_every_owned_one():
    hubs = site.parse_hubs(["east", "west"])
    assert site.granted_namespaces([], {}) == ["PROJ"]
    owners = site.parse_owners(["EAST=east", "PROJ=west"], hubs)
    assert site.granted_namespaces([], owners) == ["EAST", "PROJ"]
    assert site.granted_namespaces(["OPS", "PROJ"], owners) == ["OPS", "PROJ", "EAST"]
    for bad in (["PROJ=south"], ["PROJ=east", "PROJ=west"], ["a/b=east"], ["PROJ"]):
        with pytest.raises(SiteError):
            site.parse_owners(bad, hubs)
    with pytest.raises(SiteError, match="not a namespace"):
        site.granted_namespaces(["PR OJ"], {})


def test_the_policy_and_store_load_as_hubd_loads_them(tmp_path, pki_ca):
    folder = tmp_path / "west"
    folder.mkdir()
    for name, text in (
            (site.POLICY_FILE, site.json_text(site.serving_policy(["east", "north"], ["PROJ", "OPS"]))),
            (site.STORE_FILE, site.json_text(site.federation_store(
                {"east": [PIN, SPKI], "north": [PIN]}, ["PROJ", "OPS"], now=1))),
            (site.CLIENT_CA_FILE, pki_ca)):
        (folder / name).write_text(text)
        os.chmod(folder / name, 0o600)
    policy = load_serving_policy(folder / site.POLICY_FILE)
    assert sorted(grant.sender for grant in policy.grants) == ["east", "north"]
    record = policy.store.record("east.hubd")
    assert set(record.namespaces) == {"PROJ", "OPS"} and len(record.certificate_pins) == 2


def test_a_pin_file_holds_every_pin_on_its_own_line():
    text = site.pin_file("west", [PIN, SPKI])
    assert [line for line in text.splitlines() if not line.startswith("#")] == [PIN, SPKI]


def test_the_config_file_names_every_other_hub_both_ways_with_flag_keys():
    hubs = site.parse_hubs(["east", "west", "north=wss://north.example:8876/"])
    flags = set(keys_of(build_parser()))
    for hub in hubs:
        document = tomllib.loads(site.config_file(hub, hubs, {}, None))
        assert set(document) <= flags, set(document) - flags
        peers = [h for h in hubs if h is not hub]
        assert document["message-peer"] == [f"{p.hub_id}={p.url}" for p in peers]
        assert document["message-peer-pin"] == [f"{p.hub_id}=@pins/{p.hub_id}.pins" for p in peers]
        assert (document["hub-id"], document["port"], document["host"]) == \
            (hub.hub_id, hub.port, hub.bind)
        assert document["db"] == "hubd.db" and "namespace-owner" not in document
    north = site.config_file(hubs[2], hubs, {}, None)
    assert '# advertised-host = ["north.example:8876"]' in north


def test_with_an_owner_map_claims_go_to_owners_and_every_peer_is_watched():
    hubs = site.parse_hubs(["east", "west", "north"])
    owners = site.parse_owners(["PROJ=west", "EAST=east"], hubs)
    document = tomllib.loads(site.config_file(hubs[0], hubs, owners, "/var/lib/hubd/hubd.db"))
    assert document["namespace-owner"] == ["PROJ=west", "EAST=east"]
    assert document["claim-peer"] == ["west=wss://127.0.0.1:8877/"]  # north owns nothing
    assert document["claim-peer-pin"] == ["west=@pins/west.pins"]
    assert document["multihub-watch"] == document["message-peer"]
    assert document["db"] == "/var/lib/hubd/hubd.db"


def test_the_config_keys_it_writes_need_no_hand_edit_to_pass_hubds_own_checks(tmp_path):
    """Parsed by hubd's own layering: no problem in the file's keys."""
    from hubd import config_file

    hubs = site.parse_hubs(["east", "west"])
    path = tmp_path / "hubd.toml"
    path.write_text(site.config_file(hubs[0], hubs, site.parse_owners(["PROJ=east"], hubs), None))
    layers = config_file.layer(build_parser, ["--config", str(path)])
    assert layers.problems == []
    assert layers.args.tls_certfile == str(tmp_path / "east-server.pem")


@pytest.fixture
def pki_ca(tmp_path):
    from federation import pki

    return pki.certificate_pem(pki.make_ca().certificate).decode()

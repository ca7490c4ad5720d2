"""One link per peer: the routes of every role merge into one per peer hub,
and a peer given two addresses, pin sets or tokens is refused with the flags."""

import pytest

from federation.config import FederationConfigError, build_federation_config, merged_routes

PIN = "sha256:" + "a" * 64
OTHER_PIN = "sha256:" + "b" * 64


def config(**flags):
    base = dict(message_peers=[], message_peer_pins=[], message_peer_token=None,
                client_certfile=None, client_keyfile=None, forward_ttl=60, tls_certfile=None,
                tls_keyfile=None, serving_policy=None, hub_id="west",
                namespace_owners=["PROJ=east"])
    base.update(flags)
    return build_federation_config(**base)


def test_every_role_of_one_peer_shares_one_route():
    built = config(message_peers=["east=wss://e:1/"], message_peer_pins=[f"east={PIN}"],
                   claim_peers=["east=wss://e:1/"], claim_peer_pins=[f"east={PIN}"],
                   watches=["east=wss://e:1/", "north=wss://n:1/"],
                   watch_pins=[f"east={PIN}", f"north={PIN}"], watch_token="t")
    routes = merged_routes(built)
    assert sorted(routes) == ["east", "north"]
    assert routes["east"].uri == "wss://e:1/" and PIN in routes["east"].pins
    assert routes["east"].token == "t"  # the one role that names a token gives it


@pytest.mark.parametrize("flags,words", [
    (dict(claim_peers=["east=wss://elsewhere:1/"], claim_peer_pins=[f"east={PIN}"]),
     "same URI"),
    (dict(claim_peers=["east=wss://e:1/"], claim_peer_pins=[f"east={OTHER_PIN}"]),
     "same pins"),
    (dict(claim_peers=["east=wss://e:1/"], claim_peer_pins=[f"east={PIN}"],
          claim_peer_token="other"), "two different tokens"),
])
def test_one_peer_with_two_routes_is_refused(flags, words):
    with pytest.raises(FederationConfigError, match=words):
        config(message_peers=["east=wss://e:1/"], message_peer_pins=[f"east={PIN}"],
               message_peer_token="mine", **flags)

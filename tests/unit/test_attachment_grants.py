"""Cross-hub read decisions (hubd/state/attachment_grants.py): the recipient
policy's format and bounds, the exact grant, and the request's fields."""

from __future__ import annotations

import json

import pytest

from hubd.state import attachment_grants as g
from hubd.state.acl import PolicyError

NOW = 1_800_000_000.0
D = "d" * 64


def _doc(*grants, **top) -> bytes:
    return json.dumps({"version": 1, "grants": list(grants), **top}).encode()


def _grant(**over) -> dict:
    return {"recipient_hub": "dst", "scope": "p", "digest": D, "expires_at": NOW + 60, **over}


def test_only_the_exact_unexpired_grant_admits():
    grants = g.parse_recipient_policy(_doc(_grant(), _grant(digest="e" * 64,
                                                             expires_at=NOW - 1)))
    assert g.granted(grants, "dst", "p", D, NOW)
    assert not g.granted(grants, "other", "p", D, NOW)
    assert not g.granted(grants, "dst", "q", D, NOW)
    assert not g.granted(grants, "dst", "p", "e" * 64, NOW)   # expired
    assert not g.granted(grants, "dst", "p", D, NOW + 60)      # the expiry itself is outside


@pytest.mark.parametrize("data", [
    b"{not json",
    _doc(_grant(extra=1)),
    _doc({k: v for k, v in _grant().items() if k != "scope"}),
    _doc(_grant(), _grant()),                                   # a repeated grant
    _doc(_grant(digest="XYZ")),
    json.dumps({"version": 2, "grants": []}).encode(),
    b'{"version": 1, "version": 1, "grants": []}',              # a duplicate key
    _doc(*[_grant(digest=f"{i:064x}") for i in range(g.MAX_GRANTS + 1)]),
    b" " * (g.MAX_POLICY_BYTES + 1),
])
def test_a_policy_that_cannot_be_used_is_refused(data):
    with pytest.raises(PolicyError):
        g.parse_recipient_policy(data)


def test_a_request_must_name_an_action_a_scope_a_digest_and_an_int_offset():
    assert g.read_peer_request({"action": "read", "scope": "p", "digest": D, "offset": 5}) == \
        g.PeerRequest("read", "p", D, 5)
    assert g.read_peer_request({"action": "info", "scope": "p", "digest": D}).offset == 0
    for bad in ({"action": "write", "scope": "p", "digest": D},
                {"action": "read", "scope": "p", "digest": D, "offset": "0"},
                {"action": "read", "scope": "p", "digest": D, "offset": -1},
                {"action": "read", "scope": "p", "digest": D, "offset": True},
                {"action": "info", "scope": "../p", "digest": D},
                {"action": "info", "scope": "p", "digest": "d" * 63}):
        assert g.read_peer_request(bad) is None
